#!/usr/bin/env python
"""so_train on a prepared, masked, padded dataset against a torch loop fed the same batches.

The model directory (tests/data/make_chat_model.py) and the data (scripts/prepare_data.py, padded
rows, prompts masked) are made here. so_train trains 10 steps from the directory's weights; the
torch loop trains LlamaForCausalLM from the same weights on the same rows, in the order so_train's
epoch sampler documents (docs/finetuning.md), with labels = -100 where the mask says, the loss
normalised as train.loss_normalization says. Checked: step 1's loss equals HF's (before any
update) to 1e-6, and every step's loss to 1e-4. --packed: packed rows against their documents run
one by one. --example-compatible: the public example's rows (everything supervised, padding
included) against transformers given the padding as attention_mask = 0, which hides the padding
keys from every query; the same loop without that mask must differ (so the check sees the mask).

  check_masked_training.py WORK SO_TRAIN [--normalization step|micro_batch] [--packed | --example-compatible]
                           [--mpiexec MPIEXEC --np 2 [--sp 2]]
"""
import argparse
import json
import os
import subprocess
import sys

import h5py
import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STEPS, GLOBAL_BATCH, MICRO, LR, CLIP, SEED = 10, 4, 2, 2e-3, 1.0, 7
MASK64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def random_u64(seed, stream, i):
    return splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ i)


def epoch_order(rows, seed, epoch):
    """The rows of one epoch in the order so_train reads them (EpochSampler)."""
    perm = list(range(rows))
    key = (seed ^ (epoch * 0x9E3779B97F4A7C15)) & MASK64
    for i in range(rows - 1, 0, -1):
        j = random_u64(key, 0xE90C, i) % (i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def make_data(work, kind="padded"):
    model = os.path.join(work, "model")
    if not os.path.exists(os.path.join(model, "model.safetensors")):
        subprocess.run([sys.executable, os.path.join(HERE, "make_chat_model.py"), model], check=True)
    import random
    rng = random.Random(0)
    words = open(os.path.join(ROOT, "data", "corpus", "austen.txt")).read().split()
    src = os.path.join(work, "alpaca.jsonl")
    with open(src, "w") as f:
        for _ in range(12):
            a = rng.randrange(0, len(words) - 60)
            f.write(json.dumps({"instruction": "Continue: " + " ".join(words[a:a + 6]), "input": "",
                                "output": " ".join(words[a + 6:a + 6 + rng.randrange(2, 25)])}) + "\n")
    out = os.path.join(work, f"{kind}.h5")
    layout = {"packed": ["--pack", "--max-length", "400"], "padded": ["--pad", "--max-length", "160"],
              "example": ["--example-compatible", "--max-length", "160"]}[kind]
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "prepare_data.py"), "--model-dir", model, "--input",
                    src, "--out", out] + layout, check=True)
    return model, out


def labels_of(tokens, mask, counts, lengths):
    """HF labels: the token where it is supervised and not the first of its document, else -100."""
    labels = np.full(tokens.shape, -100, dtype=np.int64)
    d = 0
    for r in range(tokens.shape[0]):
        at = 0
        for _ in range(counts[r]):
            n = lengths[d]
            for t in range(at + 1, at + n):
                if mask[r, t]:
                    labels[r, t] = tokens[r, t]
            at, d = at + n, d + 1
    return labels


def documents_of(tokens, labels, counts, lengths):
    """Per row, its documents as (input ids, labels) cut out of the row."""
    rows, d = [], 0
    for r in range(tokens.shape[0]):
        docs, at = [], 0
        for _ in range(counts[r]):
            n = lengths[d]
            docs.append((tokens[r, at:at + n], labels[r, at:at + n]))
            at, d = at + n, d + 1
        rows.append(docs)
    return rows


def torch_losses(model_dir, data, normalization, accumulation, dp, separate=False, padding_mask=False):
    """separate: each row's documents run as sequences of their own (positions from 0, attending
    only within themselves), which is what a packed row must equal. padding_mask: transformers gets
    attention_mask = 0 from each row's padding_start on."""
    from transformers import LlamaForCausalLM
    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    with h5py.File(data) as f:
        tokens, mask = f["train/tokens"][...], f["train/loss_mask"][...]
        counts, lengths = f["train/row_documents"][...], f["train/document_lengths"][...]
        labels = labels_of(tokens, mask, counts, lengths)
        padding_start = f["train/padding_start"][...]
    attention = torch.tensor(np.arange(tokens.shape[1])[None, :] < padding_start[:, None], dtype=torch.long)
    docs = documents_of(tokens, labels, counts, lengths)
    rows = tokens.shape[0]
    params = [p for p in model.parameters()]
    opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    losses, sample = [], 0
    for _ in range(STEPS):
        idx = [epoch_order(rows, SEED, s // rows)[s % rows] for s in range(sample, sample + GLOBAL_BATCH)]
        sample += GLOBAL_BATCH
        x, y = torch.tensor(tokens[idx], dtype=torch.long), torch.tensor(labels[idx])
        am = attention[idx] if padding_mask else None
        opt.zero_grad()
        total = 0.0
        n_step = int((y[:, 1:] != -100).sum())
        # Micro-batch m of rank r holds samples (m * dp + r) * MICRO onwards.
        for m in range(accumulation):
            for r in range(dp):
                sl = slice((m * dp + r) * MICRO, (m * dp + r + 1) * MICRO)
                n_micro = int((y[sl, 1:] != -100).sum())
                if separate:
                    total_sum = 0
                    for row in idx[sl]:
                        for ids, lab in docs[row]:
                            logits = model(input_ids=torch.tensor(ids[None], dtype=torch.long)).logits[0, :-1]
                            target = torch.tensor(lab[1:], dtype=torch.long)
                            total_sum = total_sum + torch.nn.functional.cross_entropy(
                                logits, target, ignore_index=-100, reduction="sum")
                    denominator = n_step if normalization == "step" else max(n_micro, 1) * accumulation * dp
                    loss = total_sum / denominator
                elif normalization == "step":
                    out = model(input_ids=x[sl], attention_mask=None if am is None else am[sl], labels=y[sl],
                                num_items_in_batch=n_step)
                    loss = out.loss
                else:
                    loss = model(input_ids=x[sl], attention_mask=None if am is None else am[sl],
                                 labels=y[sl]).loss / (accumulation * dp)
                    if n_micro == 0:
                        loss = loss * 0
                loss.backward()
                total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        opt.step()
        losses.append(total)
    return losses


def main():
    p = argparse.ArgumentParser()
    p.add_argument("work")
    p.add_argument("so_train")
    p.add_argument("--normalization", default="step")
    p.add_argument("--mpiexec")
    p.add_argument("--np", type=int, default=1)
    p.add_argument("--sp", type=int, default=1, help="Ulysses ranks among the np (data-parallel size np / sp)")
    p.add_argument("--packed", action="store_true", help="packed rows, against the documents run separately")
    p.add_argument("--example-compatible", action="store_true",
                   help="the public example's padded, all-supervised rows, against transformers' attention_mask")
    a = p.parse_args()
    os.makedirs(a.work, exist_ok=True)
    kind = "packed" if a.packed else "example" if a.example_compatible else "padded"
    model, data = make_data(a.work, kind)
    dp = a.np // a.sp
    accumulation = GLOBAL_BATCH // (MICRO * dp)
    config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": accumulation,
              "gradient_clipping": CLIP, "bf16": {"enabled": False},
              "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": [0.9, 0.95], "eps": 1e-8,
                                                        "weight_decay": 0.0}},
              "zero_optimization": {"stage": 0}, "model": {"hf_dir": model},
              "data": {"type": "prepared", "path": data, "seed": SEED},
              "train": {"steps": STEPS, "loss_normalization": a.normalization}, "seed": 1,
              "sequence_parallel_size": a.sp}
    cfg = os.path.join(a.work, f"config_{kind}_{a.normalization}_np{a.np}_sp{a.sp}.json")
    with open(cfg, "w") as f:
        json.dump(config, f)
    metrics = os.path.join(a.work, f"metrics_{kind}_{a.normalization}_np{a.np}_sp{a.sp}.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [a.so_train, "--config", cfg, "--metrics", metrics, "--quiet"]
    if a.mpiexec:
        cmd = [a.mpiexec, "--oversubscribe", "-np", str(a.np)] + cmd
    subprocess.run(cmd, check=True)
    ours = [json.loads(line)["loss"] for line in open(metrics)]
    ref = torch_losses(model, data, a.normalization, accumulation, dp, separate=a.packed,
                       padding_mask=a.example_compatible)
    print("step  so_train      torch         |diff|")
    worst = 0.0
    for i, (o, r) in enumerate(zip(ours, ref)):
        print(f"{i + 1:4d}  {o:.8f}  {r:.8f}  {abs(o - r):.2e}")
        worst = max(worst, abs(o - r))
    ok = len(ours) == STEPS and abs(ours[0] - ref[0]) <= 1e-6 and worst <= 1e-4
    if a.example_compatible:  # without transformers' padding mask the padding's losses differ
        unmasked = torch_losses(model, data, a.normalization, accumulation, dp)[0]
        print(f"transformers without the padding mask: step 1 loss {unmasked:.8f}, |diff| {abs(unmasked - ref[0]):.2e} "
              f"(must exceed 1e-4: the padding mask matters here)")
        ok = ok and abs(unmasked - ref[0]) > 1e-4
    print(f"step 1 |diff| {abs(ours[0] - ref[0]):.2e} (<= 1e-6), worst {worst:.2e} (<= 1e-4): "
          f"{'masked training matches torch' if ok else 'MISMATCH'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
