#!/usr/bin/env python3
"""The sweep tool end to end on the CPU backend: tests/sweeps/check_sweep.py OUT_DIR.

A 2 ranks x 2 offload modes x 2 sequence lengths sweep of the tiny model runs, resumes (every point
skipped the second time) and gathers into a CSV and plots whose series are checked; a sweep of
bad inputs records each bad point with its reason and runs the others; the Slurm dry run prints
the array script. Prints "sweep ok".
"""
import csv
import json
import os
import shutil
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))
tool = [sys.executable, os.path.join(root, "jobs/sweeps/sweep.py")]


def run(args, **kw):
    p = subprocess.run(tool + args, capture_output=True, text=True, cwd=root, **kw)
    if p.returncode != 0:
        sys.exit(f"FAIL: sweep.py {' '.join(args)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p.stdout


def expect(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")


def rows_of(d):
    with open(os.path.join(d, "results.csv")) as f:
        return list(csv.DictReader(f))


out = sys.argv[1]
shutil.rmtree(out, ignore_errors=True)
good, bad, unknown = (os.path.join(out, n) for n in ("good", "bad", "unknown"))

# 1. The CI sweep: every point ok, resumable, gathered.
run(["run", os.path.join(here, "ci_sweep.json"), "--out", good])
again = run(["run", os.path.join(here, "ci_sweep.json"), "--out", good])
expect("sweep: 8 skipped" in again, f"a second run skips every finished point, printed: {again!r}")
run(["gather", good])
rows = rows_of(good)
expect(len(rows) == 8, f"8 rows, got {len(rows)}")
for r in rows:
    expect(r["status"] == "ok", f"point {r['point']} is {r['status']}: {r['reason']}")
    expect(int(r["steps"]) == 4, f"point {r['point']} has {r['steps']} steps")
    for col in ("tokens_per_s_mean", "tflops_mean", "mfu_mean", "peak_mem_mib", "final_loss"):
        expect(float(r[col]) > 0, f"point {r['point']}: {col} = {r[col]!r}")
    expect(r["scaling_efficiency"] != "", f"point {r['point']} has no scaling efficiency")
# Longer sequences need more of the device pool, the same data the same losses at 1 and 2 ranks.
by = {(r["ranks"], r["offload"], r["data.seq_len"]): r for r in rows}
for ranks in ("1", "2"):
    for mode in ("zero-offload", "superoffload:0.9"):
        expect(float(by[(ranks, mode, "64")]["peak_mem_mib"]) > float(by[(ranks, mode, "32")]["peak_mem_mib"]),
               f"peak memory grows with seq_len ({ranks} ranks, {mode})")
with open(os.path.join(good, "plots", "plots.json")) as f:
    plots = json.load(f)
expect(set(plots) == {"scaling_vs_ranks", "peak_memory_vs_seq_len", "loss"}, f"plots drawn: {sorted(plots)}")
expect(len(plots["scaling_vs_ranks"]) == 4 and all(n == 2 for n in plots["scaling_vs_ranks"].values()),
       f"scaling plot: 4 series of 2 points, got {plots['scaling_vs_ranks']}")
expect(len(plots["peak_memory_vs_seq_len"]) == 4, f"memory plot series: {plots['peak_memory_vs_seq_len']}")
expect(len(plots["loss"]) == 8 and all(n == 4 for n in plots["loss"].values()), f"loss curves: {plots['loss']}")
for name in plots:
    with open(os.path.join(good, "plots", name + ".png"), "rb") as f:
        expect(f.read(8) == b"\x89PNG\r\n\x1a\n", f"{name}.png is a PNG")
with open(os.path.join(good, "summary.md")) as f:
    expect("| 7 |" in f.read(), "summary.md has a row per point")

# 2. Bad inputs: each bad point recorded with its reason, the others run.
run(["run", os.path.join(here, "bad_sweep.json"), "--out", bad])
run(["gather", bad])
st = {(r["offload"], r["backend.device_memory_limit_mb"]): r for r in rows_of(bad)}
expect(st[("zero-offload", "256")]["status"] == "ok", f"the good point: {st[('zero-offload', '256')]}")
expect(st[("zero-offload", "1")]["status"] == "oom" and "does not fit" in st[("zero-offload", "1")]["reason"],
       f"the point that cannot fit: {st[('zero-offload', '1')]}")
for mem in ("256", "1"):
    r = st[("superoffload:2.0", mem)]
    expect(r["status"] == "failed" and "ratio" in r["reason"] and "[0, 1]" in r["reason"], f"refused ratio: {r}")
    r = st[("warp-drive", mem)]
    expect(r["status"] == "refused" and "warp-drive" in r["reason"], f"unknown offload mode: {r}")
run(["run", os.path.join(here, "unknown_axis.json"), "--out", unknown])
run(["gather", unknown])
for r in rows_of(unknown):
    expect(r["status"] == "failed" and "unknown key 'train.no_such_key'" in r["reason"], f"unknown axis: {r}")

# 3. Slurm: the dry run prints one command per point through the GH200 templates and the array.
dry = run(["run", os.path.join(here, "ci_sweep.json"), "--out", os.path.join(out, "slurm"), "--slurm", "--dry-run"])
expect("#SBATCH --array=0-7" in dry and dry.count("gh200-1node.sbatch") == 8, f"slurm dry run:\n{dry}")
# 4. The performance model predicts every measured point of the sweep (accuracy is shown on the
# calibration machine, docs/perf-model.md; here: a prediction per point, all positive).
model = subprocess.run([sys.executable, os.path.join(root, "jobs/sweeps/perf_model.py"), "validate", good,
                        "--machine", os.path.join(root, "configs/machines/dev-cpu.json")],
                       capture_output=True, text=True, cwd=root)
expect(model.returncode == 0, f"perf_model.py validate: {model.stderr}")
predicted = [l for l in model.stdout.splitlines() if l.split("|")[1:2] and l.split("|")[1].strip().isdigit()
             and l.split("|")[-3].strip().endswith("%")]
expect(len(predicted) == 8 and all(float(l.split("|")[-5]) > 0 for l in predicted),
       f"a prediction for each of the 8 points:\n{model.stdout}")
print("sweep ok")
