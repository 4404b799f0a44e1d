#!/usr/bin/env python3
"""Generate tests/reference/fixtures/adamw_torch.h5: torch.optim.AdamW's state over 5 steps.

GraceAdam's reference (optim::adamw_reference) follows torch's operation order and derives its
floats from the hyper-parameters as torch does (Python floats rounded once). This fixture is the
oracle: for each case, the initial weights, the gradient and clip scale of every step, and p, m, v
after every step, from two torch implementations (the default CPU path and fused=True).

Layout (one group per case, e.g. /b2_0.999_wd_0.1):
    attrs lr, beta1, beta2, eps, weight_decay (float64), grad_dtype ("fp32" | "bf16")
    p0 [N] f32; grads [STEPS, N] f32 (bf16-representable when grad_dtype is bf16)
    scales [STEPS] f32: each step's gradient is multiplied by it first (as clip_grad_norm_ does)
    <impl>/p, <impl>/m, <impl>/v [STEPS, N] f32 for impl in {default, fused}

Usage (from the repository root; needs torch and h5py from PyPI):
    python3 tests/reference/make_adamw_fixture.py [--out tests/reference/fixtures/adamw_torch.h5]
"""
import numpy as np
import torch

from fixture_file import create_fixture, fixture_out

N = 4099           # not a multiple of any vector width: tails are covered
STEPS = 5
CASES = [
    # name, lr, beta1, beta2, eps, weight_decay, grad dtype, clip scales per step
    ("b2_0.999_wd_0.1", 1e-3, 0.9, 0.999, 1e-8, 0.1, "fp32", [1.0, 0.37, 1.0, 0.8125, 1.0]),
    ("b2_0.95_wd_0", 3e-4, 0.9, 0.95, 1e-8, 0.0, "fp32", [1.0] * STEPS),
    ("b2_0.98_lr_1e-2", 1e-2, 0.8, 0.98, 1e-6, 0.01, "bf16", [0.5, 1.0, 0.25, 1.0, 0.9]),
]
IMPLS = {"default": dict(foreach=False), "fused": dict(fused=True)}


def run(p0, grads, scales, lr, b1, b2, eps, wd, impl):
    p = torch.nn.Parameter(torch.from_numpy(p0.copy()))
    opt = torch.optim.AdamW([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, **IMPLS[impl])
    out = {k: np.zeros((STEPS, N), np.float32) for k in "pmv"}
    for t in range(STEPS):
        p.grad = torch.from_numpy(grads[t].copy())
        p.grad.mul_(torch.tensor(scales[t], dtype=torch.float32))  # clip_grad_norm_'s in-place scaling
        opt.step()
        st = opt.state[p]
        out["p"][t] = p.detach().numpy()
        out["m"][t] = st["exp_avg"].numpy()
        out["v"][t] = st["exp_avg_sq"].numpy()
    return out


def main():
    out = fixture_out(__doc__, "adamw_torch.h5")
    rng = np.random.default_rng(20261123)
    with create_fixture(out) as f:
        for name, lr, b1, b2, eps, wd, gdt, scales in CASES:
            p0 = (rng.standard_normal(N) * 0.05).astype(np.float32)
            # Gradients with a spread of magnitudes (as real ones have), some exactly zero.
            grads = (rng.standard_normal((STEPS, N)) * np.exp2(rng.integers(-14, -2, (STEPS, N)))).astype(np.float32)
            grads[:, ::97] = 0.0
            if gdt == "bf16":  # round to the nearest bf16 (even), kept as fp32 values
                bits = grads.view(np.uint32).astype(np.uint64)
                bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
                grads = bits.astype(np.uint32).view(np.float32)
            g = f.create_group(name)
            for k, val in dict(lr=lr, beta1=b1, beta2=b2, eps=eps, weight_decay=wd).items():
                g.attrs[k] = float(val)
            g.attrs["grad_dtype"] = gdt
            g["p0"], g["grads"], g["scales"] = p0, grads, np.asarray(scales, np.float32)
            for impl in IMPLS:
                res = run(p0, grads, scales, lr, b1, b2, eps, wd, impl)
                for k, arr in res.items():
                    g[f"{impl}/{k}"] = arr
    print(f"wrote {out} (torch {torch.__version__})")


if __name__ == "__main__":
    main()
