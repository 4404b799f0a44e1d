#!/usr/bin/env python3
"""so_train sweeps: run a grid of training runs, gather them into a CSV, draw the plots.

    jobs/sweeps/sweep.py run SWEEP.json --out DIR [--dry-run]          # locally, point after point
    jobs/sweeps/sweep.py run SWEEP.json --out DIR --slurm [--dry-run]  # a Slurm job array (GH200 templates)
    jobs/sweeps/sweep.py point DIR INDEX                                # one point (what an array task runs)
    jobs/sweeps/sweep.py gather DIR                                     # DIR/results.csv, DIR/plots/*.png, DIR/summary.md

A sweep file (docs/sweeps.md):
    {"base": "configs/runs/tiny-demo.json", "steps": 5, "timeout_s": 600,
     "set": {"data.seq_len": 64},                                # fixed overrides of every point
     "axes": {"ranks": [1, 2], "offload": ["device", "superoffload:0.9"],
              "model.config": ["configs/models/tiny.json"], "data.seq_len": [32, 64]}}
Axes are so_train config paths (passed as --set PATH=VALUE, so so_train validates them and a value
it refuses fails that point only, with its message), plus "ranks" (processes) and "offload"
("device", "zero-offload", "superoffload" or "superoffload:RATIO"). Every point keeps its command,
log, metrics JSONL and status.json in DIR/points/NNN-*/; a point whose status is "ok" is skipped
when the sweep is run again, so an interrupted sweep resumes.
"""
import argparse
import csv
import itertools
import json
import math
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPECIAL_AXES = ("ranks", "offload")


class SweepError(Exception):
    pass


# ---- the sweep file -------------------------------------------------------------------------

def load_sweep(path):
    try:
        with open(path) as f:
            sweep = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise SweepError(f"sweep file '{path}': {e}")
    if not isinstance(sweep, dict):
        raise SweepError(f"sweep file '{path}': expected a JSON object")
    unknown = set(sweep) - {"base", "steps", "timeout_s", "set", "axes", "name"}
    if unknown:
        raise SweepError(f"sweep file '{path}': unknown key(s) {sorted(unknown)} "
                         "(known: base, steps, timeout_s, set, axes, name)")
    if not isinstance(sweep.get("base"), str):
        raise SweepError(f"sweep file '{path}': 'base' (the run config every point starts from) is required")
    axes = sweep.get("axes", {})
    if not isinstance(axes, dict) or not axes:
        raise SweepError(f"sweep file '{path}': 'axes' must be an object of non-empty lists")
    for name, values in axes.items():
        if not isinstance(values, list) or not values:
            raise SweepError(f"sweep file '{path}': axis '{name}' must be a non-empty list")
    for key in ("steps", "timeout_s"):
        if key in sweep and (not isinstance(sweep[key], int) or sweep[key] < 1):
            raise SweepError(f"sweep file '{path}': '{key}' must be a positive integer")
    if not isinstance(sweep.get("set", {}), dict):
        raise SweepError(f"sweep file '{path}': 'set' must be an object of config paths")
    return sweep


def points_of(sweep):
    names = list(sweep["axes"])
    return [dict(zip(names, values)) for values in itertools.product(*(sweep["axes"][n] for n in names))]


def point_dir_name(index, point):
    label = "-".join(f"{k.split('.')[-1]}={os.path.basename(str(v)).replace('.json', '')}" for k, v in point.items())
    return f"{index:03d}-" + re.sub(r"[^A-Za-z0-9=.:_-]", "_", label)[:120]


def offload_sets(value):
    """The config values one 'offload' axis value stands for."""
    value = str(value)
    if value == "device":
        return {"zero_optimization.offload_optimizer.device": "none"}
    if value == "zero-offload":
        return {"zero_optimization.offload_optimizer.device": "cpu",
                "zero_optimization.offload_optimizer.super_offload": False}
    m = re.fullmatch(r"superoffload(?::([0-9.]+))?", value)
    if m:
        out = {"zero_optimization.offload_optimizer.device": "cpu",
               "zero_optimization.offload_optimizer.super_offload": True}
        if m.group(1):
            out["zero_optimization.offload_optimizer.ratio"] = float(m.group(1))
        return out
    raise SweepError(f"offload '{value}': choose device, zero-offload, superoffload or superoffload:RATIO")


def point_command(sweep, point, pdir, launcher):
    """The so_train arguments of a point, and its rank count."""
    ranks = point.get("ranks", 1)
    if not isinstance(ranks, int) or ranks < 1:
        raise SweepError(f"ranks {ranks!r}: must be a positive integer")
    sets = dict(sweep.get("set", {}))
    for name, value in point.items():
        if name == "ranks":
            continue
        sets.update(offload_sets(value) if name == "offload" else {name: value})
    args = [os.path.join(ROOT, sweep["base"]) if not os.path.isabs(sweep["base"]) else sweep["base"],
            "--metrics", os.path.join(pdir, "metrics.jsonl")]
    if "steps" in sweep:
        args += ["--steps", str(sweep["steps"])]
    for path, value in sets.items():
        args += ["--set", f"{path}={json.dumps(value)}"]
    if launcher == "local":
        return [os.path.join(ROOT, "jobs/local/train.sh"), str(ranks)] + args, ranks
    nodes = max(1, math.ceil(ranks / 4))  # 4 GH200 per node
    template = {1: "gh200-1node", 2: "gh200-2node", 4: "gh200-4node"}.get(nodes, "gh200-Nnode")
    return ["bash", os.path.join(ROOT, "jobs/slurm", template + ".sbatch")] + args, ranks


# ---- running --------------------------------------------------------------------------------

def failure_reason(log_text):
    lines = [l.strip() for l in log_text.splitlines() if l.strip()]
    for l in reversed(lines):
        if "error" in l.lower():
            return l[:400]
    return lines[-1][:400] if lines else "no output"


def run_point(sweep, points, out, index, launcher="local"):
    point = points[index]
    pdir = os.path.join(out, "points", point_dir_name(index, point))
    os.makedirs(pdir, exist_ok=True)
    status_path = os.path.join(pdir, "status.json")
    if os.path.exists(status_path):
        with open(status_path) as f:
            if json.load(f).get("status") == "ok":
                return "skipped"
    status = {"index": index, "point": point}
    try:
        cmd, ranks = point_command(sweep, point, pdir, launcher)
    except SweepError as e:
        status.update(status="refused", reason=str(e))
        cmd = None
    if cmd:
        status["ranks"] = ranks
        status["command"] = " ".join(shlex.quote(c) for c in cmd)
        metrics = os.path.join(pdir, "metrics.jsonl")
        if os.path.exists(metrics):
            os.remove(metrics)  # a rerun of a failed point starts clean
        t0 = time.time()
        with open(os.path.join(pdir, "log.txt"), "w") as log:
            try:
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                    timeout=sweep.get("timeout_s", 600)).returncode
            except subprocess.TimeoutExpired:
                rc = None
        status["seconds"] = round(time.time() - t0, 2)
        with open(os.path.join(pdir, "log.txt")) as f:
            text = f.read()
        if rc is None:
            status.update(status="timeout", reason=f"killed after {sweep.get('timeout_s', 600)} s")
        elif rc == 0:
            status.update(status="ok", returncode=0)
        else:
            reason = failure_reason(text)
            oom = re.search(r"out of (device |host )?memory|capacity|does not fit|cannot allocate", reason, re.I)
            status.update(status="oom" if oom else "failed", returncode=rc, reason=reason)
        # The start-up lines (binding, placement, casts, plan) are kept apart from the per-step ones.
        with open(os.path.join(pdir, "startup.txt"), "w") as f:
            f.writelines(l + "\n" for l in text.splitlines() if not re.match(r"\s*step\s+\d+", l))
    with open(status_path, "w") as f:
        json.dump(status, f, indent=1)
    return status["status"]


def slurm_script(sweep_path, out, n):
    return f"""#!/usr/bin/env bash
#SBATCH --job-name=so_sweep
#SBATCH --array=0-{n - 1}
#SBATCH --output={out}/slurm-%A_%a.out
# One sweep point per array task; the point runs through the GH200 template for its rank count
# inside this allocation (submit with the --nodes the largest point needs).
set -euo pipefail
{sys.executable} {ROOT}/jobs/sweeps/sweep.py point {out} "$SLURM_ARRAY_TASK_ID" --launcher slurm
"""


def cmd_run(a):
    sweep = load_sweep(a.sweep)
    points = points_of(sweep)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "sweep.json"), "w") as f:
        json.dump(sweep, f, indent=1)
    launcher = "slurm" if a.slurm else "local"
    if a.dry_run:
        for i, p in enumerate(points):
            pdir = os.path.join(a.out, "points", point_dir_name(i, p))
            try:
                cmd, _ = point_command(sweep, p, pdir, launcher)
                print(f"[{i}] " + " ".join(shlex.quote(c) for c in cmd))
            except SweepError as e:
                print(f"[{i}] refused: {e}")
        if a.slurm:
            print(slurm_script(a.sweep, a.out, len(points)))
        return 0
    if a.slurm:
        script = os.path.join(a.out, "sweep.sbatch")
        with open(script, "w") as f:
            f.write(slurm_script(a.sweep, a.out, len(points)))
        print(subprocess.run(["sbatch", script], check=True, capture_output=True, text=True).stdout.strip())
        return 0
    counts = {}
    for i in range(len(points)):
        s = run_point(sweep, points, a.out, i)
        counts[s] = counts.get(s, 0) + 1
        print(f"sweep: point {i + 1}/{len(points)} {points[i]}: {s}", flush=True)
    print("sweep: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    return 0


def cmd_point(a):
    sweep = load_sweep(os.path.join(a.dir, "sweep.json"))
    points = points_of(sweep)
    if not 0 <= a.index < len(points):
        raise SweepError(f"point {a.index}: the sweep has {len(points)} points")
    print(run_point(sweep, points, a.dir, a.index, a.launcher))
    return 0


# ---- gathering ------------------------------------------------------------------------------

def mean_sd(values):
    if not values:
        return "", ""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def machine_and_commit():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.+)", f.read())
            cpu = m.group(1).strip() if m else cpu
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip() or "unknown"
    except OSError:
        commit = "unknown"
    return f"{platform.node()} ({os.cpu_count()} cpus, {cpu})", commit


def gather_rows(out):
    sweep = load_sweep(os.path.join(out, "sweep.json"))
    axes = list(sweep["axes"])
    rows, curves = [], {}
    for i, point in enumerate(points_of(sweep)):
        pdir = os.path.join(out, "points", point_dir_name(i, point))
        row = {"point": i, **{a: point[a] for a in axes}}
        try:
            with open(os.path.join(pdir, "status.json")) as f:
                st = json.load(f)
        except OSError:
            st = {"status": "not run"}
        row["status"], row["reason"], row["ranks"] = st["status"], st.get("reason", ""), st.get("ranks", point.get("ranks", 1))
        steps = []
        try:
            with open(os.path.join(pdir, "metrics.jsonl")) as f:
                steps = [json.loads(l) for l in f if l.strip()]
        except (OSError, json.JSONDecodeError):
            pass
        timed = steps[1:] if len(steps) > 1 else steps  # the first step warms up caches and pools
        row["steps"] = len(steps)
        for key, col in (("tokens_per_s", "tokens_per_s"), ("tflops", "tflops"), ("mfu", "mfu")):
            row[col + "_mean"], row[col + "_sd"] = mean_sd([s[key] for s in timed if key in s])
        row["exposed_optimizer_ms_mean"], _ = mean_sd([1e3 * s["exposed_optimizer_s"] for s in timed if "exposed_optimizer_s" in s])
        row["peak_mem_mib"] = max((s.get("peak_mem_mib", 0) for s in steps), default="")
        row["host_peak_mib"] = host_peak(pdir)
        row["final_loss"] = steps[-1]["loss"] if steps else ""
        rows.append(row)
        curves[i] = [(s["step"], s["loss"]) for s in steps]
    return sweep, axes, rows, curves


def host_peak(pdir):
    """The resident peak the start-up lines report, when so_train printed one."""
    try:
        with open(os.path.join(pdir, "log.txt")) as f:
            found = re.findall(r"host peak ([0-9.]+) MiB", f.read())
        return max(float(v) for v in found) if found else ""
    except OSError:
        return ""


def plots(out, sweep, axes, rows, curves):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    machine, commit = machine_and_commit()
    os.makedirs(os.path.join(out, "plots"), exist_ok=True)
    ok = [r for r in rows if r["status"] == "ok" and r["tokens_per_s_mean"] != ""]
    made = {}

    def series_by(x_axis, y_key):
        # One series per combination of the other axes, named by their values.
        series = {}
        for r in ok:
            if r.get(y_key, "") == "":
                continue
            g = ", ".join(f"{a.split('.')[-1]}={os.path.basename(str(r[a])).replace('.json', '')}"
                          for a in axes if a != x_axis) or "all"
            series.setdefault(g, []).append((r[x_axis], r[y_key]))
        return {g: sorted(v, key=lambda p: (str(type(p[0])), p[0])) for g, v in series.items()}

    def draw(name, title, x_axis, y_keys, ylabel, hline=None):
        if x_axis not in axes or len(sweep["axes"][x_axis]) < 2 or not ok:
            return
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        entry = {}
        for y_key, suffix in y_keys:
            for g, pts in series_by(x_axis, y_key).items():
                xs = [os.path.basename(str(p[0])).replace(".json", "") if isinstance(p[0], str) else p[0] for p in pts]
                label = f"{g}{suffix}"
                ax.plot(xs, [p[1] for p in pts], marker="o", label=label)
                entry[label] = len(pts)
        if hline:
            ax.axhline(hline[0], color="gray", linestyle="--", label=hline[1])
        ax.set_xlabel(x_axis)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
        fig.text(0.01, 0.01, f"{machine}, commit {commit}", fontsize=6, color="gray")
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        fig.savefig(os.path.join(out, "plots", name + ".png"), dpi=110)
        plt.close(fig)
        made[name] = entry

    size_axis = "model.config" if "model.config" in axes else None
    if size_axis:
        draw("tokens_per_s_vs_model", "tokens/s by model", size_axis, [("tokens_per_s_mean", "")], "tokens/s")
        draw("mfu_vs_model", "MFU by model", size_axis, [("mfu_mean", "")], "MFU (datasheet peak)")
    if "ranks" in axes:
        # Scaling efficiency: tokens/s per rank over the 1-rank point of the same series.
        for r in ok:
            base = [b for b in ok if b["ranks"] == min(sweep["axes"]["ranks"]) and
                    all(b[a] == r[a] for a in axes if a != "ranks")]
            r["scaling_efficiency"] = (r["tokens_per_s_mean"] / r["ranks"]) / (base[0]["tokens_per_s_mean"] / base[0]["ranks"]) \
                if base else ""
        draw("scaling_vs_ranks", "scaling efficiency (tokens/s per rank vs the fewest ranks)", "ranks",
             [("scaling_efficiency", "")], "efficiency")
    ratio_axis = next((a for a in axes if a.endswith("offload_optimizer.ratio")), None)
    if ratio_axis:
        draw("exposed_optimizer_vs_ratio", "exposed optimizer time by ratio", ratio_axis,
             [("exposed_optimizer_ms_mean", "")], "ms per step")
    if "data.seq_len" in axes:
        draw("peak_memory_vs_seq_len", "device pool peak by sequence length", "data.seq_len",
             [("peak_mem_mib", "")], "MiB")
    if curves and any(curves.values()):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        entry = {}
        for r in rows:
            c = curves.get(r["point"])
            if c:
                label = ", ".join(f"{a.split('.')[-1]}={os.path.basename(str(r[a]))}" for a in axes)
                ax.plot([p[0] for p in c], [p[1] for p in c], label=label)
                entry[label] = len(c)
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.set_title("loss by point", fontsize=10)
        ax.legend(fontsize=6)
        fig.text(0.01, 0.01, f"{machine}, commit {commit}", fontsize=6, color="gray")
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        fig.savefig(os.path.join(out, "plots", "loss.png"), dpi=110)
        plt.close(fig)
        made["loss"] = entry
    return made, machine, commit


def cmd_gather(a):
    sweep, axes, rows, curves = gather_rows(a.dir)
    made, machine, commit = plots(a.dir, sweep, axes, rows, curves)
    cols = ["point"] + axes + (["ranks"] if "ranks" not in axes else []) + ["status", "steps", "tokens_per_s_mean", "tokens_per_s_sd", "tflops_mean",
                               "tflops_sd", "mfu_mean", "mfu_sd", "exposed_optimizer_ms_mean", "peak_mem_mib",
                               "host_peak_mib", "final_loss", "scaling_efficiency", "reason"]
    with open(os.path.join(a.dir, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({c: (f"{r[c]:.6g}" if isinstance(r.get(c), float) else r.get(c, "")) for c in cols})
    with open(os.path.join(a.dir, "plots", "plots.json"), "w") as f:
        json.dump(made, f, indent=1)
    with open(os.path.join(a.dir, "summary.md"), "w") as f:
        f.write(f"# Sweep {sweep.get('name', os.path.basename(os.path.abspath(a.dir)))}\n\n")
        f.write(f"Machine: {machine}; commit {commit}; base `{sweep['base']}`, axes "
                + ", ".join(f"`{k}` {v}" for k, v in sweep["axes"].items()) + ".\n\n")
        f.write("| point | " + " | ".join(axes) + " | status | tokens/s | MFU | exposed opt ms | peak MiB |\n")
        f.write("|" + "---|" * (len(axes) + 6) + "\n")
        for r in rows:
            fmt = lambda v, p: (f"{v:{p}}" if isinstance(v, float) else str(v))
            f.write(f"| {r['point']} | " + " | ".join(str(r[x]) for x in axes)
                    + f" | {r['status']} | {fmt(r['tokens_per_s_mean'], '.0f')} | {fmt(r['mfu_mean'], '.4f')} | "
                    + f"{fmt(r['exposed_optimizer_ms_mean'], '.1f')} | {fmt(r['peak_mem_mib'], '.1f')} |\n")
        failed = [r for r in rows if r["status"] != "ok"]
        if failed:
            f.write("\nNot ok:\n\n" + "".join(f"- point {r['point']} ({r['status']}): {r['reason']}\n" for r in failed))
        f.write("\nPlots: " + ", ".join(f"`plots/{n}.png`" for n in made) + "\n")
    print(f"sweep: {len(rows)} rows in {os.path.join(a.dir, 'results.csv')}; plots: {', '.join(made) or 'none'}")
    return 0


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run every point (or submit a Slurm array)")
    r.add_argument("sweep")
    r.add_argument("--out", required=True)
    r.add_argument("--slurm", action="store_true", help="submit a job array through the GH200 templates")
    r.add_argument("--dry-run", action="store_true", help="print the commands (and the array script)")
    q = sub.add_parser("point", help="run one point of a sweep directory")
    q.add_argument("dir")
    q.add_argument("index", type=int)
    q.add_argument("--launcher", choices=["local", "slurm"], default="local")
    g = sub.add_parser("gather", help="results.csv, plots/*.png and summary.md of a sweep directory")
    g.add_argument("dir")
    a = p.parse_args(argv)
    try:
        return {"run": cmd_run, "point": cmd_point, "gather": cmd_gather}[a.cmd](a)
    except SweepError as e:
        print(f"sweep: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
