#!/usr/bin/env python3
"""capacity_table.py SO_TRAIN [--machine gh200-96] [--json OUT]: the capacity table of docs/configs.md.

Plans every model config in configs/models/ with the public SuperOffload example's DeepSpeed config
(tests/cli/configs/deepspeed_superoffload_qwen3_14b.json: ZeRO-3, SuperOffload ratio 0.9, bf16) at
sequences of 4096 tokens and micro-batch 4 per rank, activation checkpointing on and
`train.activation_offload: "auto"`, on the example's GH200 count for the seven models it fine-tunes
and otherwise on the fewest of 1, 2, 4, 8 that fits; the paper's 25B and a 30B Llama shape on one
GH200 at micro-batch 1 and ratio 1.0. Prints a markdown table (and, with --json, the numbers)."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = "tests/cli/configs/deepspeed_superoffload_qwen3_14b.json"
# The public example's GH200 counts (its finetune_*.sh scripts).
EXAMPLE_RANKS = {"llama-3.1-8b": 1, "qwen3-14b": 1, "phi-4": 1, "gpt-oss-20b": 1, "qwen3-30b-a3b": 2,
                 "seed-oss-36b": 2, "llama-3.3-70b": 4}
# The paper's single-GH200 models: micro-batch 1, every bucket's optimizer on the CPU.
PAPER = {"llama-25b": "the paper's 25B", "llama-30b": "beyond the paper"}
GIB = 1024 ** 3


def plan(so_train, model, ranks, micro, ratio, machine):
    # 4096 tokens, or the model's longest where that is shorter (the small test shapes).
    seq = min(4096, json.load(open(os.path.join(ROOT, f"configs/models/{model}.json"))).get("max_position_embeddings", 4096))
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [so_train, "--config", EXAMPLE, "--model", f"configs/models/{model}.json",
               "--data", "data/corpus/austen.txt", "--seq-len", str(seq),
               "--set", "train.activation_checkpointing=true", "--set", "train.activation_offload=auto",
               "--set", f"train_batch_size={micro * ranks}",
               "--set", f"zero_optimization.offload_optimizer.ratio={ratio}",
               "--plan", "--plan-machine", machine, "--plan-ranks", str(ranks), "--plan-json", out.name]
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"capacity_table.py: {' '.join(cmd)} failed:\n{r.stderr}")
        j = json.load(open(out.name))
    text = r.stdout
    fits = "does NOT fit" not in text
    per = next((l.split(":")[1].split("(")[0].strip() for l in text.splitlines()
                if l.startswith("host bytes per parameter")), "")
    auto = next((l[len("memory (auto): "):] for l in text.splitlines() if l.startswith("memory (auto): ")), "")
    return {"model": model, "seq": seq, "ranks": ranks, "micro_batch": micro, "ratio": ratio, "parameters": j["model"]["parameters"],
            "device_gib": j["device_peak_bytes"] / GIB, "host_gib": j["host_bytes"] / GIB,
            "host_bytes_per_param": float(per) if per else None, "fits": fits, "auto": auto}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("so_train")
    ap.add_argument("--machine", default="gh200-96")
    ap.add_argument("--json")
    a = ap.parse_args()
    so_train = os.path.abspath(a.so_train)
    models = sorted(f[:-5] for f in os.listdir(os.path.join(ROOT, "configs/models")) if f.endswith(".json"))
    rows = []
    for m in models:
        if m in PAPER:
            rows.append(plan(so_train, m, 1, 1, 1.0, a.machine) | {"why": PAPER[m]})
        elif m in EXAMPLE_RANKS:
            rows.append(plan(so_train, m, EXAMPLE_RANKS[m], 4, 0.9, a.machine) | {"why": "the example's count"})
        else:
            for n in (1, 2, 4, 8):
                r = plan(so_train, m, n, 4, 0.9, a.machine)
                if r["fits"] or n == 8:
                    rows.append(r | {"why": "fewest that fit" if r["fits"] else "none of 1-8 fits"})
                    break
    print("| file | parameters | GH200s | tokens | micro-batch | ratio | device GiB | host GiB | host bytes / param | fits |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        per = f"{r['host_bytes_per_param']:.1f}" if r["host_bytes_per_param"] is not None else ""
        print(f"| `{r['model']}.json` | {r['parameters'] / 1e9:.2f} B | {r['ranks']} ({r['why']}) | {r['seq']} | "
              f"{r['micro_batch']} | {r['ratio']} | {r['device_gib']:.1f} | {r['host_gib']:.1f} | {per} | "
              f"{'yes' if r['fits'] else '**no**'} |")
    chosen = [r for r in rows if "offloaded" in r["auto"] or "cast" in r["auto"]]
    if chosen:
        print("\nWhere \"auto\" chose more than the defaults: " + "; ".join(f"`{r['model']}`: {r['auto']}" for r in chosen) + ".")
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
