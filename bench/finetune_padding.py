#!/usr/bin/env python3
"""The fine-tuning data layouts on the same samples: packed and masked (the default) against the
public example's padding (--example-compatible), so_train's throughput on each (docs/perf.md).

    $SO_PYTHON bench/finetune_padding.py WORK SO_TRAIN [--max-length 512] [--steps 12]

Makes the tiny chat model (tests/data/make_chat_model.py), prepares the shipped demo samples
both ways, trains each for --steps steps (micro-batch 2, ZeRO 0, AdamW, fp32, CPU backend) and
prints one table row per layout: rows, padding, means over steps 2.. of tokens/s and supervised
tokens/s, real (non-padding) tokens/s, the time of one epoch at that rate, and the response
tokens (the same in both) per second of it.
"""
import argparse
import json
import os
import subprocess
import sys

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(ROOT, "jobs", "local", "finetune-demo", "alpaca-demo.jsonl")


def prepare(model, out, max_length, extra):
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "prepare_data.py"), "--model-dir", model, "--input",
                    DEMO, "--out", out, "--max-length", str(max_length)] + extra, check=True, stdout=subprocess.DEVNULL)
    with h5py.File(out) as f:
        tokens = f["train/tokens"].shape
        real = int(f["train/padding_start"][...].sum())
    return tokens[0], real, tokens[0] * tokens[1]


def train(so_train, work, name, model, data, steps):
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "bf16": {"enabled": False},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}, "zero_optimization": {"stage": 0},
           "model": {"hf_dir": model}, "data": {"type": "prepared", "path": data}, "train": {"steps": steps}}
    path = os.path.join(work, f"{name}.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    metrics = os.path.join(work, f"{name}.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    subprocess.run([so_train, "--config", path, "--metrics", metrics, "--quiet"], check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in open(metrics)][1:]  # step 1 warms up
    return (float(np.mean([r["tokens_per_s"] for r in rows])),
            float(np.mean([r["supervised_tokens_per_s"] for r in rows])))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("work")
    p.add_argument("so_train")
    p.add_argument("--max-length", type=int, default=512)
    p.add_argument("--steps", type=int, default=12)
    a = p.parse_args()
    os.makedirs(a.work, exist_ok=True)
    model = os.path.join(a.work, "model")
    if not os.path.exists(os.path.join(model, "model.safetensors")):
        subprocess.run([sys.executable, os.path.join(ROOT, "tests", "data", "make_chat_model.py"), model], check=True)
    responses = None
    print("| data | rows | padding | tokens/s | supervised tokens/s | real tokens/s | one epoch | response tokens/s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, extra in (("packed", []), ("example", ["--example-compatible"])):
        data = os.path.join(a.work, f"{name}.h5")
        rows, real, total = prepare(model, data, a.max_length, extra)
        if responses is None:  # the default layout's labels are exactly the responses (+ EOS)
            with h5py.File(data) as f:
                responses = int(f["train/loss_mask"][...].sum())
        tps, sps = train(a.so_train, a.work, name, model, data, a.steps)
        epoch = total / tps
        print(f"| {name} | {rows} | {100 * (1 - real / total):.1f}% | {tps:,.0f} | {sps:,.0f} | {real / epoch:,.0f} | "
              f"{epoch:.2f} s | {responses / epoch:,.0f} |")


if __name__ == "__main__":
    main()
