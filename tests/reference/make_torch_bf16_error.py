#!/usr/bin/env python3
"""How far PyTorch's own bf16 lands from its fp32 on the reference fixtures: the bar so_train's bf16
runs are held to (test_reference.cpp, bf16 cases).

For each fixture of make_fixtures.py that test_reference.cpp runs in bf16, the same model, weights
and batch as the fixture's single forward/backward, run twice by transformers: in fp32 (the
fixture's reference) and cast to bf16 (`model.to(torch.bfloat16)`, how a bf16 fine-tune loads a
model and what DeepSpeed's bf16 mode computes in; the fp32 master weights do not enter one step).
Written to fixtures/torch_bf16_error.json, per fixture, with test_reference.cpp's measure
(||a - b|| / ||b|| against fp32):
    loss         relative error of the loss
    logits       of the logits the fixture keeps (first N_LOGITS positions of each row)
    worst_grad   the largest over every parameter's gradient, and which parameter it is

    ~/.cache/so_train/python/bin/python tests/reference/make_torch_bf16_error.py
"""
import json
import os

import numpy as np
import torch
from transformers.models.llama import modeling_llama

import make_fixtures as mf

# The fixtures test_reference.cpp runs in bf16.
BF16_FIXTURES = ["llama_gqa_untied", "llama_tied_mqa", "qwen3_tied", "qwen2_gqa_untied", "seed_oss_qdim_bias",
                 "mistral_window_short", "llama_packed", "qwen3_moe_routed"]


def forward_backward(spec, dtype):
    """make_fixtures' single forward/backward (same seeds, same draws), the model cast to dtype."""
    model, ids, _, gen = mf.seeded_model_and_batches(spec)
    model = model.to(dtype)
    loss, logits, _ = mf.single_step_loss(spec, model, ids, gen)
    loss.backward()
    grads = mf.split_fused(model.config, {n: mf.np32(p.grad) for n, p in model.named_parameters()})
    return float(loss.item()), mf.np32(logits[:, :mf.N_LOGITS, :]), grads


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    num, den = np.sqrt(((a - b) ** 2).sum()), np.sqrt((b ** 2).sum())
    return float(num / den if den > 0 else num)


def measure(spec):
    plain = modeling_llama.eager_attention_forward
    if spec.get("sinks"):  # as make_fixture does
        modeling_llama.eager_attention_forward = mf.gpt_oss_attention
    try:
        l32, x32, g32 = forward_backward(spec, torch.float32)
        l16, x16, g16 = forward_backward(spec, torch.bfloat16)
    finally:
        modeling_llama.eager_attention_forward = plain
    worst, name = max((rel(g16[n], g32[n]), n) for n in g32)
    return {"loss": abs(l16 - l32) / abs(l32), "logits": rel(x16, x32), "worst_grad": worst, "worst_grad_name": name}


def main():
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    specs = {s["name"]: s for s in mf.FIXTURES}
    out = {"what": "PyTorch bf16 (model.to(torch.bfloat16)) against PyTorch fp32 on each fixture; "
                   "written by make_torch_bf16_error.py",
           "torch_version": torch.__version__, "fixtures": {}}
    for name in BF16_FIXTURES:
        out["fixtures"][name] = measure(specs[name])
        r = out["fixtures"][name]
        print(f"{name}: loss {r['loss']:.2e} logits {r['logits']:.2e} worst grad {r['worst_grad']:.2e} "
              f"({r['worst_grad_name']})")
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "torch_bf16_error.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
