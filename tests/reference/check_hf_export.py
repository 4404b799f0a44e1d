#!/usr/bin/env python3
"""Load Hugging Face model directories with transformers and compare their loss with so_train's.

The interop test (hf_interop.sh) runs it on the directories `so_ckpt export --hf` wrote;
make_hf_models.py uses hf_loss() for the reference losses of the committed fixtures,
so both sides compute the loss the same way.

Usage:
    python3 tests/reference/check_hf_export.py MANIFEST.json [--rtol 1e-5]

MANIFEST.json: {"tokens": [t0, t1, ...], "exports": [{"dir": DIR, "loss": so_train's loss}, ...]}.
The loss is the mean next-token cross-entropy over the len(tokens) - 1 positions of the one
sequence, computed in float32 with eager attention. Prints one line per directory.
Exit status: 0 all match, 1 a loss differs, 77 torch or transformers cannot be imported (the
test is skipped: CI does not install them).
"""
import argparse
import json
import os
import sys


def hf_loss(model_dir, tokens):
    """Mean next-token cross-entropy of the model in model_dir on one token sequence (float32)."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    ids = torch.tensor([tokens], dtype=torch.long)
    with torch.no_grad():
        logits = model(input_ids=ids[:, :-1]).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1)).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("manifest")
    ap.add_argument("--rtol", type=float, default=1e-5)
    args = ap.parse_args()
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        print(f"SKIPPED: torch/transformers not importable ({e}); the interop check needs PyPI torch + transformers")
        return 77
    with open(args.manifest) as f:
        manifest = json.load(f)
    base = os.path.dirname(os.path.abspath(args.manifest))
    failures = 0
    for e in manifest["exports"]:
        model_dir = os.path.join(base, e["dir"])
        got = hf_loss(model_dir, manifest["tokens"])
        rel = abs(got - e["loss"]) / abs(e["loss"])
        ok = rel <= args.rtol
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {e['dir']}: transformers loss {got:.7f}, so_train {e['loss']:.7f}, "
              f"rel {rel:.2e} (bound {args.rtol:.0e})")
    print(f"{len(manifest['exports']) - failures}/{len(manifest['exports'])} exports match")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
