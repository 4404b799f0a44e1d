#!/usr/bin/env python3
"""The performance model of so_train runs: step time from the work of one step and a machine
profile (configs/machines/*.json; `so_bench calibrate` writes a measured one, docs/perf-model.md).

    jobs/sweeps/perf_model.py predict --machine M.json CONFIG [so_train args...] [--ranks N]
    jobs/sweeps/perf_model.py validate SWEEP_DIR --machine M.json        # predicted vs measured, per point
    jobs/sweeps/perf_model.py table --machine M.json --ranks N CONFIG [args] [-- CONFIG args ...]

The run comes from `so_train --plan --plan-json` (the same config and flags as the run; the memory
side is the planner's). The work of one step, per rank:
  - GEMMs by shape (forward; backward twice; the recompute of activation checkpointing; tiled
    MLP's gate/up again), each at the calibrated TFLOP/s for its FLOP count;
  - causal attention forward and backward at the calibrated TFLOP/s for its length and head dim;
  - the memory-bound ops (RMSNorm, RoPE, SwiGLU, residual copies, cross-entropy, embedding,
    Ulysses' transposes) by the bytes each moves, at their calibrated GB/s;
  - the optimizer: AdamW of the device-resident parameters at the device's params/s, of the
    offloaded ones at GraceAdam's params/s on the optimizer cores, their gradient and weight copies
    over the link;
  - collectives: ZeRO's all-gathers / reduce-scatters / all-reduces and Ulysses' all-to-alls, each
    latency + bytes x bus factor / bus bandwidth.
Overlap rules (what the engine schedules beside what): on a GPU the optimizer's device work,
copies and collectives run on their own streams. ZeRO-Offload's CPU step starts after backward
(all exposed); SuperOffload's runs during backward, exposed only for the buckets that become ready
in the last unit. On the CPU backend a lane only hides work when it has cores of its own: the
compute threads of a rank, its optimizer pool and the other ranks share the machine's cores, and
work sharing a core adds up.
"""
import argparse
import bisect
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SO_TRAIN = os.environ.get("SO_TRAIN", os.path.join(ROOT, "build/launcher/so_train"))


class ModelError(Exception):
    pass


# ---- the machine -----------------------------------------------------------------------------

def interp_log(xs, ys, x):
    """Piecewise-linear in log x, flat outside the table."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)
    f = (math.log(x) - math.log(xs[i - 1])) / (math.log(xs[i]) - math.log(xs[i - 1]))
    return ys[i - 1] + f * (ys[i] - ys[i - 1])


class Machine:
    def __init__(self, path):
        if not os.path.isfile(path):  # a FIFO would block the read, a directory fail obscurely
            raise ModelError(f"machine profile '{path}' is not a regular file")
        try:
            with open(path) as f:
                self.p = json.load(f)
        except (OSError, ValueError, RecursionError) as e:  # unreadable, not JSON, nested too deep
            raise ModelError(f"machine profile '{path}': {e}")
        for key in ("name", "backend", "compute", "link", "cpu_adam"):
            if key not in self.p:
                raise ModelError(f"machine profile '{path}': '{key}' is missing")
        self.name = self.p["name"]
        self.gpu = self.p["backend"] != "cpu"
        self.cores = self.p.get("cores", 1)
        self.attention_override = None  # (forward, backward) TFLOP/s replacing the table

    def table(self, threads):
        """The compute table calibrated with the most threads not above `threads` (GPU: the one)."""
        rows = sorted(self.p["compute"], key=lambda c: c["threads"])
        fit = [c for c in rows if c["threads"] <= max(threads, 1)] or rows[:1]
        return fit[-1] if not self.gpu else rows[0]

    def gemm_s(self, threads, flops):
        g = self.table(threads)["gemm"]
        return flops / (1e12 * interp_log([r["flops"] for r in g], [r["tflops"] for r in g], flops))

    def attention_s(self, threads, flops, S, D, backward):
        if self.attention_override:
            return flops / (1e12 * self.attention_override[1 if backward else 0])
        rows = self.table(threads)["attention"]
        d = min({r["D"] for r in rows}, key=lambda x: abs(math.log(x / D)))
        rows = sorted((r for r in rows if r["D"] == d), key=lambda r: r["S"])
        key = "bwd_tflops" if backward else "fwd_tflops"
        return flops / (1e12 * interp_log([r["S"] for r in rows], [r[key] for r in rows], S))

    def mem_s(self, threads, op, nbytes):
        return nbytes / (1e9 * self.table(threads)["memory_gbps"][op])

    def device_adam_s(self, threads, params):
        return params / self.table(threads)["memory_gbps"]["device_adam_params_per_s"]

    def cpu_adam_s(self, threads, params):
        rows = sorted(self.p["cpu_adam"], key=lambda r: r["threads"])
        fit = [r for r in rows if r["threads"] <= max(threads, 1)] or rows[:1]
        return params / fit[-1]["params_per_s"]

    def link_s(self, nbytes, up):
        return nbytes / (1e9 * self.p["link"]["h2d_gbps" if up else "d2h_gbps"])

    def collective_s(self, op, nbytes, ranks):
        if ranks <= 1 or nbytes == 0:
            return 0.0
        coll = self.p.get("collectives", {})
        if op not in coll:  # measured per rank count: the nearest one
            counts = sorted(coll, key=lambda k: abs(int(k) - ranks)) if coll else []
            coll = coll[counts[0]] if counts else {}
        c = coll.get(op)
        if not c:
            raise ModelError(f"machine profile '{self.name}' has no '{op}' collective "
                             "(mpirun -np N so_bench calibrate --collectives --out PROFILE)")
        factor = 2.0 * (ranks - 1) / ranks if op == "all_reduce" else (ranks - 1) / ranks
        return c["latency_s"] + nbytes * factor / (1e9 * c["busbw_gbps"])


# ---- the run ---------------------------------------------------------------------------------

def plan_of(args, ranks, machine):
    """so_train --plan --plan-json for these so_train arguments on `ranks` ranks of the machine (its
    planner profile: "this" for a profile calibrated here)."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "plan.json")
        cmd = [SO_TRAIN, "--plan", "--plan-ranks", str(ranks), "--plan-json", out,
               "--plan-machine", machine.p.get("planner_profile", "this")] + args
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise ModelError(f"so_train --plan failed: {r.stderr.strip() or r.stdout.strip()}")
        with open(out) as f:
            return json.load(f)


def cores_of(run, machine):
    """(compute threads, optimizer threads, whether they share a core, core share per thread) of a rank."""
    if machine.gpu:
        return 0, max(1, int(machine.cores * run["offload"]["cpu_cores_fraction"])), False, 1.0
    world = run["world"]
    per_rank = machine.cores / world
    n = max(1, int(per_rank))
    share = min(1.0, per_rank)  # several ranks on one core: each runs part of the time
    if run["offload"]["mode"] == "on-device optimizer":
        return n, 0, False, share
    k = min(max(1, round(run["offload"]["cpu_cores_fraction"] * n)), max(1, n - 1))
    shared = n == 1
    return (n if shared else n - k), k, shared, share


def step_work(run, machine):
    """Seconds of each kind of work in one step of one rank, before overlap."""
    m = run["model"]
    e = 4 if run["dtype"] == "fp32" else 2
    L, H, I, V, D = m["layers"], m["hidden"], m["intermediate"], m["vocab"], m["head_dim"]
    qd, kvd = m["heads"] * D, m["kv_heads"] * D
    sp, micro, S = run["sp"], run["micro_batch"], run["seq_len"]
    T = micro * S // sp
    tile = min(run["mlp_tile"], T)
    ckpt = run["activation_checkpointing"]
    threads, opt_threads, shared, share = cores_of(run, machine)
    w = dict(gemm=0.0, attention=0.0, memory=0.0, optimizer_device=0.0, optimizer_cpu=0.0, copies=0.0, comm=0.0)

    def gemm(mm, n, k, times=1):
        w["gemm"] += times * machine.gemm_s(threads, 2.0 * mm * n * k)

    def mem(op, nbytes):
        w["memory"] += machine.mem_s(threads, op, nbytes)

    tiles = [(tile, T // tile)] + ([(T % tile, 1)] if T % tile else [])
    passes = 2 if ckpt else 1  # forward, and its recompute in backward
    for _ in range(passes + 2):  # the forward passes, then backward's dX and dW (each the forward's FLOPs)
        gemm(T, qd, H), gemm(T, kvd, H, 2), gemm(T, H, qd)
        for rows, count in tiles:
            gemm(rows, I, H, 2 * count), gemm(rows, H, I, count)
    if tile < T:  # tiled backward recomputes each tile's gate and up
        for rows, count in tiles:
            gemm(rows, I, H, 2 * count)
    attn = 4.0 * micro * (m["heads"] // sp) * S * S * D / 2.0
    w["attention"] += passes * machine.attention_s(threads, attn, S, D, False)
    w["attention"] += machine.attention_s(threads, 2.5 * attn, S, D, True)
    for _ in range(passes):
        mem("rmsnorm_forward", 2 * 2 * T * H * e)
        mem("rope", 2 * T * (qd + kvd) * e)
        mem("copy", 2 * 2 * T * H * e)
        mem("swiglu_forward", 3 * T * I * e)
        if m["qk_norm"]:
            mem("rmsnorm_forward", 2 * T * (qd + kvd) * e)
    mem("swiglu_forward", 3 * T * I * e)
    mem("swiglu_backward", 5 * T * I * e)
    mem("rmsnorm_backward", 2 * 3 * T * H * e)
    mem("rope", 2 * T * (qd + kvd) * e)
    if m["qk_norm"]:
        mem("rmsnorm_backward", 3 * T * (qd + kvd) * e)
    if sp > 1:  # Ulysses: q, k, v out and attention back per forward pass; dout in, dq, dk, dv out in backward
        mem("copy", 2 * 2 * (2 * qd + 2 * kvd) * T * e * (passes + 1))
        w["comm"] += (passes + 1) * (2 * machine.collective_s("all_to_all", qd * T * e, sp)
                                     + 2 * machine.collective_s("all_to_all", kvd * T * e, sp))
    for k in ("gemm", "attention", "memory", "comm"):
        w[k] *= L
    # Head: final norm, logits + cross-entropy + their gradients chunk by chunk, embedding.
    chunk = min(T, max(1, (16 << 20) // V))
    gemm(chunk, V, H, 3 * (T // chunk))
    if T % chunk:
        gemm(T % chunk, V, H, 3)
    mem("rmsnorm_forward", 2 * T * H * e)
    mem("rmsnorm_backward", 3 * T * H * e)
    mem("cross_entropy", T * V * (4 + e))
    mem("copy", 4 * T * H * e)
    for k in w:
        w[k] *= run["accumulation"]

    # Optimizer: this rank's shard of the device-resident and the offloaded parameters.
    shard = run["world"] if run["zero_stage"] >= 1 and run["world"] > 1 else 1
    dev, host = run["offload"]["device_params"] / shard, run["offload"]["host_params"] / shard
    w["optimizer_device"] = machine.device_adam_s(threads, dev) if dev else 0.0
    if host:
        w["optimizer_cpu"] = machine.cpu_adam_s(opt_threads, host)
        w["copies"] = machine.link_s(host * 4, False) + machine.link_s(host * e, True)
    # ZeRO over the data-parallel ranks (sequence-parallel ranks hold the same model: all ranks).
    P, params = run["world"], m["parameters"]
    if P > 1:
        stage = run["zero_stage"]
        if stage <= 1:
            w["comm"] += machine.collective_s("all_reduce", params * e, P)
        else:
            w["comm"] += machine.collective_s("reduce_scatter", params * e, P)
            gathers = 1 if stage == 2 else (3 if ckpt else 2)
            w["comm"] += gathers * run["accumulation"] ** (stage == 3) * machine.collective_s("all_gather", params * e, P)
    for k in w:
        w[k] /= share
    return w, dict(threads=threads, optimizer_threads=opt_threads, shared_core=shared, core_share=share)


def predict(run, machine):
    w, cores = step_work(run, machine)
    compute = w["gemm"] + w["attention"] + w["memory"]
    mode = run["offload"]["mode"]
    host_share = run["offload"]["host_params"] / max(1, run["model"]["parameters"])
    if machine.gpu:
        # Device AdamW beside compute (speculative) but after validation for the tail; collectives
        # prefetched / reduced beside compute: exposed where they exceed it.
        exposed_comm = max(0.0, w["comm"] - 0.5 * compute)
        if mode == "ZeRO-Offload":
            exposed_opt = w["optimizer_cpu"] + w["copies"] + w["optimizer_device"]
        elif mode == "SuperOffload":
            tail = 1.0 / max(1, run["buckets"])
            exposed_opt = tail * (w["optimizer_cpu"] + w["copies"]) + w["optimizer_device"] * 0.1
        else:
            exposed_opt = w["optimizer_device"] * 0.1
        step = compute + exposed_comm + exposed_opt
    else:
        # The CPU: the device AdamW runs on the compute threads' cores; collectives on the ranks'
        # cores; the optimizer pool hides its work only on cores of its own.
        exposed_comm = w["comm"]
        if mode == "on-device optimizer":
            exposed_opt = w["optimizer_device"]
        elif cores["shared_core"] or mode == "ZeRO-Offload":
            exposed_opt = w["optimizer_cpu"] + w["copies"] + w["optimizer_device"]
        else:
            tail = 1.0 / max(1, round(run["buckets"] * host_share))
            exposed_opt = max(tail * w["optimizer_cpu"], w["optimizer_cpu"] - compute) + w["optimizer_device"] + w["copies"]
        step = compute + exposed_comm + exposed_opt
    tflops = run["tokens_per_step"] * run["flops_per_token"] / step / 1e12 / run["world"]
    # The paper's convention for checkpointed runs also counts the recomputed forward (1/3 of 6N).
    with_recompute = tflops * (4.0 / 3.0 if run["activation_checkpointing"] else 1.0)
    peak = machine.p.get("peak_tflops", 0)
    return dict(step_s=step, tokens_per_s=run["tokens_per_step"] / step, tflops=tflops,
                tflops_counting_recompute=with_recompute, mfu=tflops / peak if peak else None,
                device_peak_gib=run["device_peak_bytes"] / 2**30, host_gib=run["host_bytes"] / 2**30,
                fits_device=not machine.p.get("device_bytes") or run["device_peak_bytes"] <= machine.p["device_bytes"],
                compute_s=compute, exposed_comm_s=exposed_comm, exposed_optimizer_s=exposed_opt, work=w, cores=cores)


# ---- commands ----------------------------------------------------------------------------------

def so_train_args(config, rest):
    return ["--config", config] + rest


def machine_of(a):
    machine = Machine(a.machine)
    if getattr(a, "attention", None):
        try:
            fwd, bwd = (float(x) for x in a.attention.split(","))
        except ValueError:
            raise ModelError(f"--attention '{a.attention}': give FORWARD,BACKWARD TFLOP/s, e.g. 80,67")
        machine.attention_override = (fwd, bwd)
    return machine


def cmd_predict(a):
    machine = machine_of(a)
    run = plan_of(so_train_args(a.config, a.args), a.ranks, machine)
    p = predict(run, machine)
    print(json.dumps({k: v for k, v in p.items()}, indent=2))


def sweep_points(sweep_dir):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import sweep as sw  # noqa: E402  (jobs/sweeps/sweep.py: the same points and commands)
    with open(os.path.join(sweep_dir, "sweep.json")) as f:
        spec = json.load(f)
    pts = sw.points_of(spec)
    rows = {}
    import csv
    with open(os.path.join(sweep_dir, "results.csv")) as f:
        for r in csv.DictReader(f):
            rows[int(r["point"])] = r
    for i, point in enumerate(pts):
        cmd, ranks = sw.point_command(spec, point, "/nonexistent", "local")
        args = cmd[2:]  # train.sh RANKS CONFIG args...
        config, rest = args[0], args[1:]
        drop = {"--metrics"}
        clean, skip = [], False
        for x in rest:
            if skip:
                skip = False
                continue
            if x in drop:
                skip = True
                continue
            clean.append(x)
        yield i, point, ranks, so_train_args(config, clean), rows.get(i)


def cmd_validate(a):
    machine = machine_of(a)
    worst, table = 0.0, []
    for i, point, ranks, args, row in sweep_points(a.dir):
        if not row or row.get("status") != "ok":
            table.append((i, point, None, None, "not measured: " + (row or {}).get("status", "missing")))
            continue
        run = plan_of(args, ranks, machine)
        p = predict(run, machine)
        measured = float(row["tokens_per_s_mean"])
        err = p["tokens_per_s"] / measured - 1
        worst = max(worst, abs(err))
        table.append((i, point, p, measured, f"{100 * err:+.1f}%"))
    print(f"| point | {' | '.join(table[0][1])} | predicted tokens/s | measured tokens/s | error | compute / comm / optimizer ms |")
    print("|" + "---|" * (len(table[0][1]) + 5))
    for i, point, p, measured, err in table:
        vals = " | ".join(os.path.basename(str(v)).replace(".json", "") for v in point.values())
        if p is None:
            print(f"| {i} | {vals} | | | {err} | |")
            continue
        print(f"| {i} | {vals} | {p['tokens_per_s']:.0f} | {measured:.0f} | {err} | "
              f"{1e3 * p['compute_s']:.1f} / {1e3 * p['exposed_comm_s']:.1f} / {1e3 * p['exposed_optimizer_s']:.1f} |")
    print(f"\nlargest error: {100 * worst:.1f}% over {sum(1 for t in table if t[2] is not None)} points")
    if a.limit and worst > a.limit:
        sys.exit(f"error above {100 * a.limit:.0f}%")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("predict", help="one run's predicted step")
    p.add_argument("--machine", required=True)
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--attention", help="FORWARD,BACKWARD attention TFLOP/s instead of the profile's table")
    p.add_argument("config")
    p.add_argument("args", nargs=argparse.REMAINDER, help="so_train flags (--set ...)")
    v = sub.add_parser("validate", help="a gathered sweep: predicted vs measured tokens/s per point")
    v.add_argument("dir")
    v.add_argument("--machine", required=True)
    v.add_argument("--limit", type=float, default=0.0, help="exit non-zero when an error exceeds this fraction")
    a = ap.parse_args()
    try:
        {"predict": cmd_predict, "validate": cmd_validate}[a.cmd](a)
    except ModelError as e:
        sys.exit(f"perf_model.py: {e}")
    except (KeyError, TypeError, IndexError, ZeroDivisionError) as e:  # a profile missing or mangling a table
        sys.exit(f"perf_model.py: machine profile '{a.machine}' lacks or mangles an entry the model reads: {e!r}")


if __name__ == "__main__":
    main()
