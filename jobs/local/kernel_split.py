#!/usr/bin/env python3
"""The GPU time of profiled training steps split by op class, and the device's idle time.

    nsys profile --capture-range=cudaProfilerApi -o P so_train ... --profile-steps A:B --metrics M.jsonl
    nsys stats --report cuda_gpu_kern_sum --format csv --output P P.nsys-rep
    jobs/local/kernel_split.py P_cuda_gpu_kern_sum.csv --metrics M.jsonl --steps A:B

Kernels are classed by name (CLASSES: the first pattern that matches); the wall time of the steps
comes from so_train's metrics (step_seconds of steps A..B). "idle" is wall minus the kernel time:
launch gaps, synchronisations, host work on the compute path (kernels on concurrent streams can
overlap, so with copies or NCCL beside compute it is a lower bound).
"""
import argparse
import csv
import json
import re
import sys

CLASSES = [
    ("attention", r"attention|sdpa|flash|fmha|cudnn"),
    ("gemm", r"gemm|cutlass|xmma|nvjet|cublas|sm90_|sm100_"),
    ("optimizer", r"adam"),
    ("norm", r"rmsnorm"),
    ("rope", r"rope"),
    ("embedding", r"embedding|radix|DeviceRadixSort|onesweep"),
    ("loss", r"cross_entropy"),
    ("swiglu", r"swiglu"),
    ("reductions", r"sum_squares|reduce"),
    ("copies and casts", r"cast|transpose|replicate|gather|scatter|copy|memcpy|memset"),
    ("communication", r"nccl"),
]


def fail(msg):
    print(f"kernel_split: {msg}", file=sys.stderr)
    sys.exit(1)


def classify(name):
    for cls, pattern in CLASSES:
        if re.search(pattern, name, re.IGNORECASE):
            return cls
    return "other"


def read_kernels(path):
    """(name, total ns) per row of an nsys cuda_gpu_kern_sum CSV."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        fail(f"cannot read {path}: {e}")
    if not rows or "Name" not in rows[0] or "Total Time (ns)" not in rows[0]:
        fail(f"{path} is not an nsys cuda_gpu_kern_sum CSV (no 'Name' and 'Total Time (ns)' columns)")
    out = []
    for i, r in enumerate(rows):
        try:
            out.append((r["Name"], float(r["Total Time (ns)"])))
        except (TypeError, ValueError):
            fail(f"{path} row {i + 2}: 'Total Time (ns)' is {r['Total Time (ns)']!r}")
    return out


def step_wall_seconds(path, first, last):
    try:
        rows = [json.loads(l) for l in open(path) if l.strip()]
    except (OSError, ValueError) as e:
        fail(f"cannot read metrics {path}: {e}")
    got = {r["step"]: r["step_seconds"] for r in rows if first <= r.get("step", 0) <= last}
    missing = [s for s in range(first, last + 1) if s not in got]
    if missing:
        fail(f"{path} has no step_seconds for steps {missing}")
    return sum(got.values())


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kern_sum_csv")
    p.add_argument("--metrics", required=True, help="so_train --metrics file of the profiled run")
    p.add_argument("--steps", required=True, help="A:B, as given to so_train --profile-steps")
    a = p.parse_args()
    m = re.fullmatch(r"(\d+):(\d+)", a.steps)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < int(m.group(1)):
        fail(f"--steps is {a.steps!r}; give A:B with 1 <= A <= B")
    first, last = int(m.group(1)), int(m.group(2))
    wall = step_wall_seconds(a.metrics, first, last)
    per = {}
    for name, ns in read_kernels(a.kern_sum_csv):
        per[classify(name)] = per.get(classify(name), 0.0) + ns * 1e-9
    busy = sum(per.values())
    steps = last - first + 1
    print(f"# steps {first}..{last}: {1e3 * wall / steps:.2f} ms per step, kernels {1e3 * busy / steps:.2f} ms")
    print("| op class | ms per step | of kernel time | of the step |")
    print("|---|---|---|---|")
    for cls, t in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f"| {cls} | {1e3 * t / steps:.2f} | {100 * t / busy:.1f}% | {100 * t / wall:.1f}% |")
    idle = max(0.0, wall - busy)
    print(f"| idle (gaps, syncs, host work) | {1e3 * idle / steps:.2f} | | {100 * idle / wall:.1f}% |")


if __name__ == "__main__":
    main()
