#!/usr/bin/env python3
"""moe_expert_tokens.py SO_TRAIN MODEL_DIR [so_train args...]: the tokens-per-expert figures of
so_train's metrics file (expert_tokens_min / _max / expert_imbalance, docs/configs.md) equal those
transformers' routers give on the same tokens: so_train trains one step of hf_models' one window
(tests/cli/configs/hf_dir_train.json) from MODEL_DIR; transformers runs the same tokens through
the same model (fp32) and counts each layer's top-k choices (the router's indices) per expert."""
import json
import os
import subprocess
import sys
import tempfile

import torch
from transformers import AutoModelForCausalLM


def main():
    so_train, model_dir, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "metrics.jsonl")
        subprocess.run([so_train, "--config", "tests/cli/configs/hf_dir_train.json", "--set",
                        f"model.hf_dir={model_dir}", "--steps", "1", "--metrics", metrics, *extra],
                       check=True, stdout=subprocess.DEVNULL)
        ours = json.loads(open(metrics).readline())
    tokens = json.load(open("tests/reference/hf_models/reference.json"))["tokens"]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    counts = []
    for layer in model.model.layers:
        router = getattr(layer.mlp, "router", None) or getattr(layer.mlp, "gate", None)
        E = router.weight.shape[0]
        router.register_forward_hook(lambda mod, i, o, E=E: counts.append(torch.bincount(o[2].flatten(), minlength=E)))
    with torch.no_grad():
        model(input_ids=torch.tensor([tokens[:-1]]))
    theirs = dict(expert_tokens_min=min(c.min().item() for c in counts),
                  expert_tokens_max=max(c.max().item() for c in counts),
                  expert_imbalance=max((c.max() / c.float().mean()).item() for c in counts))
    print("so_train:", {k: ours[k] for k in theirs}, "transformers:", theirs)
    for k, v in theirs.items():
        assert abs(ours[k] - v) <= 1e-9 * abs(v), f"{k}: so_train {ours[k]}, transformers {v}"
    print("expert tokens equal")


if __name__ == "__main__":
    main()
