#!/usr/bin/env python3
"""Generate tests/reference/fixtures/z_loss_torch.h5: cross-entropy with OLMo's z-loss and its gradient.

OLMo (olmo/train.py, cross_entropy_loss) adds z_loss_multiplier * logsumexp(logits)^2 per token,
masked where the label is ignored and reduced like the loss. so_train's op computes
scale * sum over rows of (nll + z_loss * lse^2) (scale = 1 / tokens: the mean), so the oracle is
torch in float64: scale * (F.cross_entropy(..., reduction="sum") + z_loss * sum(mask * lse^2)),
and its gradient with respect to the float32 logits by autograd.

Layout: one group per case, attrs z_loss, scale (float64); logits f32 [rows, V], targets i32 [rows]
(-1 ignored), loss f64 [1], dlogits f32 [rows, V].

Usage (from the repository root, with the project's Python, $SO_PYTHON):
    python tests/reference/make_z_loss_fixture.py [--out tests/reference/fixtures/z_loss_torch.h5]
"""
import numpy as np
import torch
import torch.nn.functional as F

from fixture_file import create_fixture, fixture_out

CASES = [
    # name, rows, V, z_loss, logit std, logit offset (a large offset makes lse, and the z term, large)
    ("olmo_default", 37, 101, 1e-4, 2.0, 0.0),
    ("strong_offset", 29, 67, 0.05, 1.5, 12.0),
    ("off", 16, 50, 0.0, 3.0, 5.0),
]


def main():
    out = fixture_out(__doc__, "z_loss_torch.h5")
    rng = np.random.default_rng(20261125)
    with create_fixture(out) as f:
        for name, rows, V, z_loss, std, offset in CASES:
            logits = (rng.standard_normal((rows, V)) * std + offset).astype(np.float32)
            targets = rng.integers(0, V, rows).astype(np.int32)
            targets[::5] = -1  # ignored positions
            scale = 1.0 / rows
            z = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
            y = torch.tensor(targets, dtype=torch.int64)
            mask = (y != -1).to(torch.float64)
            nll = F.cross_entropy(z, y, ignore_index=-1, reduction="sum")
            z_term = z_loss * (mask * torch.logsumexp(z, dim=-1) ** 2).sum()
            loss = scale * (nll + z_term)
            loss.backward()
            g = f.create_group(name)
            g.attrs["z_loss"], g.attrs["scale"] = float(z_loss), float(scale)
            g["logits"], g["targets"] = logits, targets
            g["loss"] = np.asarray([loss.item()], np.float64)
            g["dlogits"] = z.grad.numpy().astype(np.float32)
            print(f"{name}: loss {loss.item():.9f} (z-loss part {scale * z_term.item():.9f})")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
