#!/usr/bin/env python3
"""Qwen3-MoE checkpoints whose experts are fused 3-D tensors (transformers 5's in-memory layout:
per layer mlp.experts.gate_up_proj [E, 2I, H], each expert's gate rows then its up rows, and
mlp.experts.down_proj [E, H, I]) load as the per-expert ones do: the save_pretrained directory
hf_models/qwen3_moe_untied_bf16 rewritten with fused experts trains to the same losses. A fused
tensor of the wrong shape is refused by name.

Usage: fused_experts.py WORK SO_TRAIN"""
import os
import re
import shutil
import subprocess
import sys

import torch
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SOURCE = os.path.join(ROOT, "tests", "reference", "hf_models", "qwen3_moe_untied_bf16")


def fused_copy(dst, break_shape=False):
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    shutil.copy(os.path.join(SOURCE, "config.json"), dst)
    tensors = load_file(os.path.join(SOURCE, "model.safetensors"))
    out, experts = {}, {}
    for name, t in tensors.items():
        m = re.match(r"(.*\.mlp\.experts\.)(\d+)\.(gate_proj|up_proj|down_proj)\.weight$", name)
        if m:
            experts.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = t
        else:
            out[name] = t
    for prefix, by_expert in experts.items():
        order = sorted(by_expert)
        out[prefix + "gate_up_proj"] = torch.stack(
            [torch.cat([by_expert[e]["gate_proj"], by_expert[e]["up_proj"]]) for e in order])
        out[prefix + "down_proj"] = torch.stack([by_expert[e]["down_proj"] for e in order])
        if break_shape:
            out[prefix + "down_proj"] = out[prefix + "down_proj"][:, :, :-1].contiguous()
            break_shape = False
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})


def train(so_train, model_dir):
    return subprocess.run([so_train, "--config", os.path.join(ROOT, "tests", "cli", "configs", "hf_dir_train.json"),
                           "--set", f"model.hf_dir={model_dir}"], cwd=ROOT, capture_output=True, text=True)


def main():
    work, so_train = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    per_expert = train(so_train, SOURCE)
    fused_dir = os.path.join(work, "fused")
    fused_copy(fused_dir)
    fused = train(so_train, fused_dir)
    done = [re.search(r"done: 3 steps, loss \S+ -> \S+", r.stdout) for r in (per_expert, fused)]
    if not all(done) or done[0].group(0) != done[1].group(0):
        print("per-expert:", per_expert.stdout[-400:], per_expert.stderr[-400:])
        print("fused:", fused.stdout[-400:], fused.stderr[-400:])
        sys.exit(1)
    broken_dir = os.path.join(work, "broken")
    fused_copy(broken_dir, break_shape=True)
    broken = train(so_train, broken_dir)
    refused = broken.returncode != 0 and re.search(r"tensor 'model\.layers\.0\.mlp\.experts\.down_proj' .* has shape",
                                                     broken.stderr)
    if not refused:
        print("a fused tensor of the wrong shape was not refused by name:", broken.stderr[-600:])
        sys.exit(1)
    print(f"fused experts ok: per-expert and fused directories both give '{done[0].group(0)}'; "
          f"a wrong fused shape refused by name")


if __name__ == "__main__":
    main()
