#!/usr/bin/env python3
"""One peer CPU AdamW, timed on request, for `so_bench adam` (which interleaves it with GraceAdam).

    cpu_adam_peer.py --impl torch-fused|torch-foreach|deepspeed --threads T [--cores 0,1]

Start-up prints one line: `ready <impl> <version>`, or `unavailable: <reason>` and exits 3. Then
it reads requests from stdin, one per line, `<elements> <mode> <warmup> <iters>`, and answers each
with `median_s=<seconds>` (or `error: <reason>`). The arrays and the optimizer state of the last
`<elements> <mode>` are kept, so that a request of one warm-up and one timed step can be paired
with one of GraceAdam's (a VM's memory bandwidth can move by 1.6x between runs seconds apart; only
steps timed side by side compare). Modes, for the same element count:
    fp32     fp32 params and grads, no copy out: p, m, v read and written + the grad read (28 B/param)
    bf16-io  SuperOffload's job done the peer's way: bf16 grads cast to fp32, the fp32 step, the
             weights cast to bf16; the two casts are timed with the step
DeepSpeed's CPUAdam builds its C++ op on first use (ninja + the host compiler, -march=native).
The process is pinned to --cores and its thread pools sized to --threads before torch starts.
"""
import argparse
import os
import statistics
import sys
import time


def make_step(impl, n, mode, torch):
    p = torch.nn.Parameter(torch.full((n,), 0.5))
    p.grad = torch.full((n,), 1e-3)
    kw = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    if impl == "deepspeed":
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        opt = DeepSpeedCPUAdam([p], adamw_mode=True, **kw)
    else:
        opt = torch.optim.AdamW([p], fused=impl == "torch-fused", foreach=impl == "torch-foreach", **kw)
    if mode == "fp32":
        return opt.step
    g16 = torch.full((n,), 1e-3, dtype=torch.bfloat16)
    w16 = torch.empty((n,), dtype=torch.bfloat16)

    def step():
        p.grad.copy_(g16)  # bf16 gradients arrive; the fp32 optimizer needs them widened
        opt.step()
        w16.copy_(p.detach())  # the device copy of the weights, narrowed
    return step


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--impl", required=True, choices=["torch-fused", "torch-foreach", "deepspeed"])
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--cores", default="")
    a = ap.parse_args()
    if a.cores:
        os.sched_setaffinity(0, {int(c) for c in a.cores.split(",")})
    os.environ["OMP_NUM_THREADS"] = str(a.threads)  # DeepSpeed's op is OpenMP-parallel
    try:
        import torch
        torch.set_num_threads(a.threads)
        version = f"torch {torch.__version__}"
        if a.impl == "deepspeed":
            import logging
            logging.disable(logging.WARNING)  # DeepSpeed's accelerator notices go to stdout otherwise
            import deepspeed
            from deepspeed.ops.adam import DeepSpeedCPUAdam
            # Build (or load) the op now, so no request pays for the compilation.
            probe = torch.nn.Parameter(torch.zeros(16))
            probe.grad = torch.zeros(16)
            DeepSpeedCPUAdam([probe]).step()
            version = f"deepspeed {deepspeed.__version__} (cpu_adam op), {version}"
    except Exception as e:  # not installed, or its op does not build: the benchmark goes on without it
        print(f"unavailable: {a.impl}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
        return 3
    print(f"ready {a.impl} {version}", flush=True)
    kept_key, step = None, None
    for line in sys.stdin:
        try:
            n, mode, warmup, iters = line.split()
            if (n, mode) != kept_key:
                kept_key, step = None, None  # the old arrays go before the new ones are made
                step = make_step(a.impl, int(n), mode, torch)
                kept_key = (n, mode)
            times = []
            for i in range(int(warmup) + int(iters)):
                t0 = time.perf_counter()
                step()
                if i >= int(warmup):
                    times.append(time.perf_counter() - t0)
            print(f"median_s={statistics.median(times):.6f}", flush=True)
        except Exception as e:
            print(f"error: {type(e).__name__}: {e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
