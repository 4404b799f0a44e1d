#!/usr/bin/env python3
"""torch.optim.AdamW(foreach=True) on one fp32 parameter of N elements, for `so_bench adam`.

Prints one line, `median_s=<seconds> torch=<version>`, or `unavailable: <reason>` and exits 3.
The process is pinned to --cores before torch starts its OpenMP threads.
"""
import argparse
import os
import statistics
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--elements", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--cores", default="", help="comma-separated core ids to run on")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    a = ap.parse_args()
    if a.cores:
        os.sched_setaffinity(0, {int(c) for c in a.cores.split(",")})
    try:
        import torch
    except Exception as e:  # not installed, or broken: the benchmark goes on without it
        print(f"unavailable: cannot import torch ({type(e).__name__}: {e})")
        return 3
    torch.set_num_threads(a.threads)
    gen = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.randn(a.elements, generator=gen))
    p.grad = torch.randn(a.elements, generator=gen) * 1e-2
    opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, foreach=True)
    times = []
    for i in range(a.warmup + a.iters):
        t0 = time.perf_counter()
        opt.step()
        t1 = time.perf_counter()
        if i >= a.warmup:
            times.append(t1 - t0)
    print(f"median_s={statistics.median(times):.6f} torch={torch.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
