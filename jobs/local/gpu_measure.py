#!/usr/bin/env python3
"""One GPU call that measures everything, most important first, in a fixed time budget:

    bash .gpu/run.sh measure [--dry-run] [--parts a,b] [--budget-s N] [--part-budget PART=S]
    jobs/local/gpu_measure.py --dry-run          (here: every part on the CPU backend, tiny shapes)
    jobs/local/gpu_measure.py --render FILE.json (the markdown table of a finished run)
    jobs/local/gpu_measure.py --template         (the table of a GPU run, every row "not measured")

Parts, in this order (--parts picks some), each under its own timeout within --budget-s (480 s in
all; a part that would start with under 10 s left is not started):
  gate       ctest -L gpu over $SO_MEASURE_GATE (default: every small op case against the CPU, the
             attention cases again with cuDNN required and with its atomic backward, the MoE block
             against transformers, the memory plan and the offload modes on the GPU, the cast and
             attention-choice checks, the Transformers fixtures on the GPU), -j 12: pass/fail/skip
             counts
  peaks      so_bench gpu-peaks: bf16 GEMM 8192^3 on random operands (and on constant ones, and the
             backend's start-up measurement), device copy GB/s
  attention  so_bench attention vs bench/peers/sdpa_attention.py: causal GQA forward and backward
             TFLOP/s at S 4096, D 64 and 128, unpacked rows and rows of 4 documents
  train-1b, train-3b   so_train vs bench/peers/torch_train.py (configs/runs/llama-{1b,3b}-seq4096.json,
             seq 4096): tokens/s and MFU, 10 steps each, means over the steps after the first 2
  moe        the same for configs/runs/qwen3-moe-stack-seq4096.json (a Qwen3-MoE-shaped stack)
  step       so_bench step --clip always: SuperOffload vs ZeRO-Offload exposed optimizer time
Writes $OUT/measure.md and $OUT/measure.json (rewritten after every part, so a run stopped early
keeps what it measured; parts not reached say so) and $OUT/measure.log (every command's output).
Our binaries run with $SO_BUNDLE_LD_LIBRARY_PATH when set (the stage runner's bundle libraries),
the peers and nvidia-smi with this process's environment (the GPU machine's own libraries).
Environment: BUILD (build), OUT (results/gpu-measure), SO_PYTHON (the peers' interpreter),
SO_MEASURE_GATE / SO_MEASURE_GATE_EXCLUDE (ctest -R / -E of the gate), SO_MEASURE_GATE_JOBS (12),
SO_BUNDLE_COMMIT (the bundle's commit, set by the stage runner).
"""
import argparse
import datetime
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_json import first, json_lines  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
PARTS = ["gate", "peaks", "attention", "train-1b", "train-3b", "moe", "step"]
# Seconds each part may take at most (the whole run is capped by --budget-s as well). The gate's
# timeout stops ctest; the tests it had not run are counted as not run.
PART_BUDGET_S = {"gate": 150, "peaks": 30, "attention": 100, "train-1b": 100, "train-3b": 130, "moe": 120,
                 "step": 100}
MIN_START_S = 10
DEFAULT_GATE = (r"^(Small/CudaOps\.MatchesCpu/|attention_cudnn(_atomic)?\.Small/CudaOps\.MatchesCpu/attention"
                r"|Cuda/|CudaTraining\.|CudaCast\.|Attention(Choice|Workspace)\.|TransformersCuda/)")
DEFAULT_GATE_EXCLUDE = r"memcheck|racecheck|LongContext"

TRAIN_CONFIGS = {"train-1b": "configs/runs/llama-1b-seq4096.json", "train-3b": "configs/runs/llama-3b-seq4096.json",
                 "moe": "configs/runs/qwen3-moe-stack-seq4096.json"}
STEP_CONFIG = "configs/runs/llama-1b-seq4096.json"


class Mode:
    """The shapes and step counts of a GPU run, or of the dry run (the CPU backend, tiny shapes)."""

    def __init__(self, dry):
        self.dry = dry
        self.train_steps, self.skip_steps = (4, 2) if dry else (10, 2)
        self.step_bench_steps = 3 if dry else 6
        # so_bench attention and the SDPA peer: the same shapes.
        self.attention = ({"batch": 2, "seq": 128, "hidden": 64, "gqa": 2, "head_dims": [16, 32], "docs": [1, 4]}
                          if dry else
                          {"batch": 4, "seq": 4096, "hidden": 2048, "gqa": 4, "head_dims": [64, 128], "docs": [1, 4]})
        self.attention_iters = ["--warmup", "1", "--iters", "2"] if dry else ["--warmup", "2", "--iters", "5"]
        self.torch_backends = "math" if dry else "flash,cudnn"
        self.peaks_args = (["--backend", "cpu", "--gemm-size", "256", "--copy-mib", "16", "--warmup", "1", "--iters", "3"]
                           if dry else [])
        # Tiny models for the dry run: the same configs with these fields replaced.
        tiny = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "vocab_size": 512}
        self.model_overrides = {k: dict(tiny) for k in TRAIN_CONFIGS} if dry else {k: {} for k in TRAIN_CONFIGS}
        if dry:
            self.model_overrides["moe"].update({"moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2,
                                                "head_dim": 16})
        self.seq_len, self.batch = (64, 2) if dry else (None, None)

    def so_train_sets(self, part):
        sets = []
        if self.dry:
            sets += ["backend.type=cpu", f"data.seq_len={self.seq_len}", f"train_micro_batch_size_per_gpu={self.batch}"]
        sets += [f"model.inline.{k}={v}" for k, v in self.model_overrides[part].items()]
        return [a for s in sets for a in ("--set", s)]

    def peer_args(self, part):
        args = ["--device", "cpu", "--seq-len", str(self.seq_len), "--batch", str(self.batch)] if self.dry else []
        return args + [a for k, v in self.model_overrides[part].items() for a in ("--model-set", f"{k}={v}")]


def mean(xs):
    return statistics.fmean(xs) if xs else None


def fmt(x):
    """A rate as the table shows it: thousands separated, else four significant digits."""
    if x is None:
        return "—"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


class Table:
    """The one table: its rows declared up front (a part that does not run still lists its rows,
    "not measured" and why), filled as parts finish, both files rewritten each time."""

    def __init__(self, out, meta):
        self.out, self.meta, self.rows, self.commands, self.parts = out, meta, [], [], {}
        self.meta.setdefault("written", "—")

    def declare(self, part, key, measurement, target=""):
        self.rows.append({"part": part, "key": key, "measurement": measurement, "ours": None, "baseline": None,
                          "ratio": None, "target": target, "meets": None, "status": "not measured",
                          "why": "not reached: the run stopped before this part", "commands": [], "note": ""})

    def row(self, key):
        return next(r for r in self.rows if r["key"] == key)

    def command(self, argv, env=None):
        """Numbers a command for the table's command list (paths under the project root relative
        to it, as the commands run from there; the variables it is given first); returns its number."""
        shown = [os.path.relpath(a, ROOT) if os.path.isabs(a) and a.startswith(ROOT + os.sep) else a for a in argv]
        self.commands.append(" ".join([f"{k}={shlex.quote(v)}" for k, v in (env or {}).items()] +
                                      [shlex.quote(a) for a in shown]))
        return len(self.commands)

    def fill(self, key, ours, baseline=None, ratio=None, meets=None, note="", commands=()):
        r = self.row(key)
        r.update({"ours": ours, "baseline": baseline, "ratio": ratio, "meets": meets, "status": "measured", "why": "",
                  "note": note})
        r["commands"] = sorted(set(r["commands"]) | set(commands))

    def skip(self, key, why, commands=()):
        """One row not measured, and why."""
        r = self.row(key)
        r["why"] = why
        r["commands"] = sorted(set(r["commands"]) | set(commands))

    def not_measured(self, part, why, commands=()):
        """Every row of part not yet filled: not measured, and why."""
        for r in self.rows:
            if r["part"] == part and r["status"] != "measured":
                r.update({"why": why})
                r["commands"] = sorted(set(r["commands"]) | set(commands))

    def not_measured_all(self, why):
        for r in self.rows:
            r["why"] = why

    def write(self):
        doc = dict(self.meta, rows=self.rows, commands=self.commands, parts=self.parts)
        doc["written"] = now_utc()
        tmp = os.path.join(self.out, ".measure.json.tmp")
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, os.path.join(self.out, "measure.json"))
        tmp = os.path.join(self.out, ".measure.md.tmp")
        with open(tmp, "w") as f:
            f.write(render(doc))
        os.replace(tmp, os.path.join(self.out, "measure.md"))


def render(doc):
    """The markdown table of a measure.json."""
    m = doc
    lines = [f"# {'Dry run (CPU backend, tiny shapes): ' if m.get('dry_run') else ''}GPU measurements", "",
             f"- date: {m.get('date', '—')}" + (f" (table written {m['written']})" if m.get("written", "—") != "—" else ""),
             f"- card: {m.get('card', '—')}; driver {m.get('driver', '—')}",
             f"- commit: {m.get('commit', '—')}" + (f" (sources {m['sources_commit']})"
                                                   if m.get("sources_commit") not in (None, m.get("commit")) else ""),
             f"- budget: {m.get('budget_s', '—')} s; parts: {', '.join(m.get('parts_selected', []))}", "",
             "| # | measurement | so_train | baseline | ratio | target | meets | commands |",
             "|---|---|---|---|---|---|---|---|"]
    notes = []
    for i, r in enumerate(m.get("rows", []), 1):
        cmds = ", ".join(f"c{c}" for c in r["commands"]) or "—"
        if r["status"] == "measured":
            ours = r["ours"] if r["ours"] is not None else "—"
            base = r["baseline"] if r["baseline"] is not None else "—"
            ratio = f"{r['ratio']:.2f}x" if isinstance(r["ratio"], (int, float)) else (r["ratio"] or "—")
            meets = {True: "yes", False: "no", None: "—"}[r["meets"]]
            lines.append(f"| {i} | {r['measurement']} | {ours} | {base} | {ratio} | {r['target'] or '—'} | "
                         f"{meets} | {cmds} |")
            if r["note"]:
                notes.append(f"- {i}: {r['note']}")
        else:
            lines.append(f"| {i} | {r['measurement']} | not measured: {r['why']} | | | {r['target'] or '—'} | | "
                         f"{cmds} |")
    if notes:
        lines += ["", "Notes by row:", ""] + notes
    if m.get("commands"):
        lines += ["", "Commands (from the repository root, in the stage runner's environment: "
                  "`bash .gpu/run.sh exec COMMAND`):", ""]
        lines += [f"- c{i}: `{c}`" for i, c in enumerate(m["commands"], 1)]
    if m.get("parts"):
        lines += ["", "Parts:", ""]
    for name, p in m.get("parts", {}).items():
        lines.append(f"- {name}: {p.get('status', '—')} in {p.get('seconds', 0):.0f} s" +
                     (f" — {p['why']}" if p.get("why") else ""))
    return "\n".join(lines) + "\n"


def now_utc():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


class Runner:
    """Runs the commands of the parts: output appended to measure.log, a process group per command
    (killed whole at its timeout), the run's deadline kept."""

    def __init__(self, out, budget_s, table):
        self.log_path = os.path.join(out, "measure.log")
        self.deadline = time.monotonic() + budget_s
        self.table = table
        ours = os.environ.get("SO_BUNDLE_LD_LIBRARY_PATH")
        self.ours_env = dict(os.environ, **({"LD_LIBRARY_PATH": ours} if ours is not None else {}))

    def left(self):
        return self.deadline - time.monotonic()

    def log(self, text):
        line = f"[gpu_measure {datetime.datetime.now().strftime('%H:%M:%S')}] {text}"
        print(line, flush=True)
        with open(self.log_path, "a") as f:
            f.write(line + "\n")

    def run(self, argv, timeout_s, ours=True, env=None):
        """Runs argv from the project root (ours: with our binaries' libraries; env: more
        variables) for at most timeout_s and what is left of the run's budget."""
        n = self.table.command(argv, env)
        timeout_s = max(1, int(min(timeout_s, self.left())))
        self.log(f"c{n} (timeout {timeout_s} s): {self.table.commands[-1]}")
        t0 = time.monotonic()
        with open(self.log_path, "a") as log:
            start = log.tell()
            try:
                p = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=dict(self.ours_env if ours else os.environ, **(env or {})),
                                     start_new_session=True)
            except OSError as e:
                log.write(f"cannot start: {e}\n")
                return Result(n, 127, f"cannot start {argv[0]}: {e}", timeout_s)
            try:
                rc = p.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                # The whole group: SIGTERM (so_train and the peers exit cleanly), then SIGKILL for
                # whatever of it is left, children that outlived their parent included.
                rc = None
                for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
                    try:
                        os.killpg(p.pid, sig)
                    except ProcessLookupError:
                        break
                    try:
                        p.wait(timeout=grace)
                    except subprocess.TimeoutExpired:
                        pass
        seconds = time.monotonic() - t0
        with open(self.log_path, errors="replace") as f:
            f.seek(start)
            text = f.read()
        self.log(f"c{n}: {'timed out' if rc is None else f'exit {rc}'} after {seconds:.1f} s")
        return Result(n, rc, text, timeout_s)


class Result:
    """A command's number in the table's list, exit status (None: stopped at its timeout), output."""

    def __init__(self, n, rc, text, timeout_s):
        self.n, self.rc, self.text, self.timeout_s = n, rc, text, timeout_s

    def why(self):
        """Why it gave no result: its timeout, or its exit and its last error line."""
        if self.rc is None:
            return f"timed out after {self.timeout_s:.0f} s"
        lines = [l.strip() for l in self.text.splitlines() if l.strip()]
        err = next((l for l in reversed(lines) if "error" in l.lower() or "Traceback" in l), None)
        err = err or (lines[-1] if lines else "no output")
        return f"exit {self.rc}: {err[:300]}"


# ---- the parts ----------------------------------------------------------------------------------

def declare_rows(table, mode, parts):
    a = mode.attention
    shape = f"B {a['batch']} S {a['seq']} hidden {a['hidden']} GQA {a['gqa']}"
    for part in parts:
        if part == "gate":
            table.declare(part, "gate", "correctness gate: ctest -L gpu (the selection in the command)", "all pass")
        elif part == "peaks":
            table.declare(part, "gemm", "bf16 GEMM TFLOP/s, random operands (of the datasheet peak)", "reference")
            table.declare(part, "gemm-constant", "bf16 GEMM TFLOP/s, constant operands (vs random)", "")
            table.declare(part, "gemm-startup", "bf16 GEMM TFLOP/s at so_train's start-up (vs random)", "")
            table.declare(part, "copy", "device copy GB/s (read + write)", "")
        elif part == "attention":
            for d in a["head_dims"]:
                for docs in a["docs"]:
                    rows = "unpacked rows" if docs == 1 else f"{docs} documents per row"
                    for pas in ("forward", "backward"):
                        table.declare(part, f"attn-{d}-{docs}-{pas}",
                                      f"attention {pas} TFLOP/s, causal, {shape} D {d}, {rows}: ours vs torch SDPA",
                                      ">= 0.9x")
                if len(a["docs"]) > 1:
                    table.declare(part, f"attn-{d}-packed", f"attention D {d}: packed rows' TFLOP/s over unpacked "
                                  "(ours, forward / backward)", ">= 0.9x")
        elif part in ("train-1b", "train-3b", "moe"):
            what = {"train-1b": "Llama 1B", "train-3b": "Llama 3B", "moe": "Qwen3-MoE stack"}[part]
            table.declare(part, f"{part}-tokens", f"{what} ({TRAIN_CONFIGS[part]}) tokens/s: so_train vs torch",
                          ">= 1.0x" if part == "moe" else ">= 1.2x")
            if part != "moe":
                table.declare(part, f"{part}-mfu", f"{what} MFU (datasheet peak, attention causal): so_train vs torch",
                              ">= 45%" if part == "train-1b" else "")
        elif part == "step":
            table.declare(part, "step", f"exposed optimizer ms per step, clipping every step ({STEP_CONFIG}): "
                          "SuperOffload vs ZeRO-Offload", "<= 0.5x")


def ctest_counts(text):
    """(tests selected or None when ctest listed none, {passed, failed, skipped}, failed names
    with their status) from ctest's progress lines, which are there even when ctest is killed."""
    counts, failed, total = {"passed": 0, "failed": 0, "skipped": 0}, [], None
    for line in text.splitlines():
        # "  3/120 Test  #17: Name [# GetParam() = ...] ......   Passed    0.52 sec", or after the
        # dots "***Failed ...", "***Skipped", "***Not Run (Disabled)", "***Timeout", "***Exception: ..."
        m = re.match(r"\s*\d+/(\d+) Test\s+#\d+: (\S+)", line)
        if not m:
            continue
        total, name, tail = int(m.group(1)), m.group(2), line[m.end():]
        if "***" in tail:
            status = tail.rsplit("***", 1)[1].strip()
        elif re.search(r"\sPassed\s+[\d.]+ sec\s*$", tail):
            status = "Passed"
        else:
            status = tail.strip() or "?"
        if status.startswith("Passed"):
            counts["passed"] += 1
        elif status.startswith("Skipped") or "Disabled" in status:
            counts["skipped"] += 1
        else:
            counts["failed"] += 1
            failed.append(f"{name} ({status.split()[0]})")
    return total, counts, failed


def part_gate(ctx):
    build = ctx.build
    sel = os.environ.get("SO_MEASURE_GATE", DEFAULT_GATE)
    excl = os.environ.get("SO_MEASURE_GATE_EXCLUDE", DEFAULT_GATE_EXCLUDE)
    jobs = os.environ.get("SO_MEASURE_GATE_JOBS", "12")
    budget = ctx.budget("gate")
    argv = ["ctest", "--test-dir", build, "-L", "gpu", "-R", sel, "-j", jobs, "--timeout", str(max(10, budget - 10)),
            "--output-on-failure"] + (["-E", excl] if excl else [])
    # Parallel singleton MPI processes (Open MPI's isolated singletons, as the stage runner sets them)
    # share one session directory and race on creating and removing it: none is made (mpirun needs
    # them: a selection with mpirun tests sets OMPI_MCA_orte_create_session_dirs=1).
    env = {"OMPI_MCA_orte_create_session_dirs": os.environ.get("OMPI_MCA_orte_create_session_dirs", "0"),
           # The selection names gpu cases: each its own ctest entry, with a GPU or without (dry run).
           "SO_TEST_GPU_CASES": os.environ.get("SO_TEST_GPU_CASES", "each")}
    res = ctx.runner.run(argv, budget, env=env)
    n = res.n
    total, counts, failed = ctest_counts(res.text)
    if total is None:
        if "No tests were found" in res.text:
            ctx.table.fill("gate", "no test matches the selection", meets=None, commands=[n])
            return "measured", ""
        why = res.why()
        ctx.table.not_measured("gate", why, [n])
        return "not measured", why
    done = sum(counts.values())
    summary = f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped of {total}"
    if done < total:
        summary += f"; {total - done} not run ({'the part timed out' if res.rc is None else 'ctest stopped'})"
    note = ("failed: " + ", ".join(failed[:10]) + (f" and {len(failed) - 10} more" if len(failed) > 10 else "")
            if failed else "")
    ctx.table.fill("gate", summary, meets=counts["failed"] == 0 and done == total and counts["passed"] > 0, note=note,
                   commands=[n])
    return "measured", "" if res.rc is not None else res.why()


def part_peaks(ctx):
    argv = [ctx.so_bench, "gpu-peaks"] + ctx.mode.peaks_args
    budget = ctx.budget("peaks")
    res = ctx.runner.run(argv, budget)
    n = res.n
    p = first(json_lines(res.text), bench="gpu-peaks")
    if res.rc != 0 or p is None:
        why = res.why()
        ctx.table.not_measured("peaks", why, [n])
        return "not measured", why
    ctx.peaks = p
    g = p["gemm_tflops"]
    ctx.table.fill("gemm", f"{fmt(g)} TFLOP/s", f"datasheet {fmt(p['nominal_tflops'])}", g / p["nominal_tflops"],
                   note=p.get("device", ""), commands=[n])
    ctx.table.fill("gemm-constant", f"{fmt(p['gemm_constant_tflops'])} TFLOP/s", f"random {fmt(g)}",
                   p["gemm_constant_tflops"] / g, commands=[n])
    ctx.table.fill("gemm-startup", f"{fmt(p['startup_gemm_tflops'])} TFLOP/s", f"random {fmt(g)}",
                   p["startup_gemm_tflops"] / g, commands=[n])
    ctx.table.fill("copy", f"{fmt(p['copy_gbps'])} GB/s", commands=[n])
    return "measured", ""


def attention_args(mode):
    a = mode.attention
    return ["--batch", str(a["batch"]), "--seq", str(a["seq"]), "--hidden", str(a["hidden"]), "--gqa", str(a["gqa"]),
            "--head-dims", ",".join(map(str, a["head_dims"])), "--docs", ",".join(map(str, a["docs"]))] + \
        mode.attention_iters


def part_attention(ctx):
    mode, a = ctx.mode, ctx.mode.attention
    budget = ctx.budget("attention")
    t0 = time.monotonic()
    json_path = os.path.join(ctx.work, "attention.jsonl")
    ours_argv = [ctx.so_bench, "attention", "--backend", "cpu" if mode.dry else "cuda", "--impls", "flash,cudnn",
                 "--json", json_path] + attention_args(mode)
    res_ours = ctx.runner.run(ours_argv, budget / 2)
    n_ours = res_ours.n
    ours = []
    if os.path.exists(json_path):
        with open(json_path) as f:
            ours = json_lines(f.read())
    peer_argv = [ctx.python, "bench/peers/sdpa_attention.py", "--device", "cpu" if mode.dry else "cuda",
                 "--backends", mode.torch_backends] + attention_args(mode)
    res_peer = ctx.runner.run(peer_argv, budget - (time.monotonic() - t0), ours=False)
    n_peer = res_peer.n
    peer = [r for r in json_lines(res_peer.text) if r.get("peer") == "torch-sdpa"]
    ctx.raw["attention"] = {"ours": ours, "torch": peer}
    why_ours = "" if ours else res_ours.why()
    why_peer = "" if peer else res_peer.why()
    measured_any = False

    def best(rows, d, docs, key):
        """The row of the fastest implementation at this shape, and the rows that did not run."""
        ok = [r for r in rows if r.get("D") == d and r.get("docs") == docs and r.get(key)]
        return max(ok, key=lambda r: r[key], default=None), \
            [r for r in rows if r.get("D") == d and r.get("docs") == docs and not r.get(key)]

    for d in a["head_dims"]:
        for docs in a["docs"]:
            for pas, key in (("forward", "fwd_tflops"), ("backward", "bwd_tflops")):
                row_key = f"attn-{d}-{docs}-{pas}"
                o, o_missing = best(ours, d, docs, key)
                t, _ = best(peer, d, docs, key)
                if o is None:
                    refused = "; ".join(f"{r['impl']}: {r.get('not_run') or r.get('error')}" for r in o_missing)
                    why = refused or why_ours or "no row"
                    if t is None:
                        ctx.table.skip(row_key, f"ours: {why}; torch: {why_peer or 'no row for this shape'}",
                                       [n_ours, n_peer])
                    else:  # the baseline's number kept beside the reason ours has none
                        ctx.table.fill(row_key, f"not measured: {why[:300]}", f"{fmt(t[key])} ({t['backend']})",
                                       note=f"torch via {t.get('path', '?')}", commands=[n_ours, n_peer])
                    continue
                all_ours = ", ".join(f"{r['impl']} {fmt(r[key])}" for r in ours
                                     if r.get("D") == d and r.get("docs") == docs and r.get(key))
                note = [f"ours: {all_ours} ({o.get('implementation', '')})"]
                note += [f"{r['impl']} not run: {(r.get('not_run') or r.get('error', ''))[:160]}" for r in o_missing]
                if t is not None:
                    all_peer = ", ".join(f"{r['backend']} {fmt(r[key])}" for r in peer
                                         if r.get("D") == d and r.get("docs") == docs and r.get(key))
                    note.append(f"torch: {all_peer} via {t.get('path', '?')}" +
                                (f"; {t['note']}" if t.get("note") else ""))
                else:
                    note.append(f"torch: not measured ({why_peer or 'no row for this shape'})")
                ratio = o[key] / t[key] if t else None
                ctx.table.fill(row_key, f"{fmt(o[key])} ({o['impl']})",
                               f"{fmt(t[key])} ({t['backend']})" if t else "not measured",
                               ratio, None if ratio is None else ratio >= 0.9, "; ".join(note), [n_ours, n_peer])
                measured_any = True
        if len(a["docs"]) > 1:
            ratios = []
            for key in ("fwd_tflops", "bwd_tflops"):
                unpacked, _ = best(ours, d, 1, key)
                packed, _ = best(ours, d, max(a["docs"]), key)
                ratios.append(packed[key] / unpacked[key] if packed and unpacked else None)
            if None not in ratios:
                ctx.table.fill(f"attn-{d}-packed", f"{ratios[0]:.2f}x / {ratios[1]:.2f}x", ratio=min(ratios),
                               meets=min(ratios) >= 0.9, note="FLOPs counted within documents", commands=[n_ours])
            else:
                ctx.table.skip(f"attn-{d}-packed", f"ours: {why_ours or 'a packed or unpacked row did not run'}",
                               [n_ours])
    if not measured_any:
        return "not measured", f"ours: {why_ours or 'no row'}; torch: {why_peer or 'ok'}"
    return "measured", "; ".join(w for w in (why_ours and f"ours: {why_ours}", why_peer and f"torch: {why_peer}") if w)


def so_train_means(path, skip):
    """Means over the steps after the first `skip` of so_train's --metrics file."""
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            rows = [r for r in json_lines(f.read()) if "tokens_per_s" in r and r.get("step", 0) > skip]
    if not rows:
        return None
    return {"steps": len(rows), "tokens_per_s": mean([r["tokens_per_s"] for r in rows]),
            "tflops": mean([r["tflops"] for r in rows]), "mfu": mean([r["mfu"] for r in rows]),
            "peak_mem_mib": max(r.get("peak_mem_mib", 0) for r in rows)}


def part_train(ctx, part):
    mode, config = ctx.mode, TRAIN_CONFIGS[part]
    budget = ctx.budget(part)
    t0 = time.monotonic()
    metrics = os.path.join(ctx.work, f"{part}.jsonl")
    ours_argv = [ctx.so_train, "--config", config, "--steps", str(mode.train_steps), "--metrics", metrics] + \
        mode.so_train_sets(part)
    res_ours = ctx.runner.run(ours_argv, budget / 2)
    # Steps that finished before a failure or the timeout are measured; the note says it stopped.
    ours = so_train_means(metrics, mode.skip_steps)
    why_ours = "" if ours else res_ours.why()
    attention = next((l.split("attention:", 1)[1].strip() for l in res_ours.text.splitlines() if "attention:" in l),
                     "")
    peak = (ctx.peaks or {}).get("nominal_tflops") or (ours["tflops"] / ours["mfu"] if ours and ours["mfu"] else 0)
    peer_argv = [ctx.python, "bench/peers/torch_train.py", "--config", config, "--steps",
                 str(mode.train_steps - mode.skip_steps), "--warmup", str(mode.skip_steps),
                 "--peak-tflops", f"{peak:.6g}"] + mode.peer_args(part)
    res_peer = ctx.runner.run(peer_argv, budget - (time.monotonic() - t0), ours=False)
    peer = first(json_lines(res_peer.text), peer="torch")
    why_peer = "" if peer else res_peer.why()
    ctx.raw[part] = {"ours": ours, "torch": peer}
    cmds = [res_ours.n, res_peer.n]
    if not ours:
        why = f"so_train: {why_ours}" + (f"; torch: {why_peer}" if why_peer else "")
        if not peer:
            ctx.table.not_measured(part, why, cmds)
            return "not measured", why
        # The baseline's number is kept beside the reason ours has none.
        ctx.table.fill(f"{part}-tokens", f"not measured: {why_ours}", fmt(peer["tokens_per_s"]), commands=cmds)
        if part != "moe":
            ctx.table.fill(f"{part}-mfu", f"not measured: {why_ours}",
                           f"{100 * peer['mfu']:.1f}%" if peer.get("mfu") else "—", commands=cmds)
        return "not measured", why
    note = [f"so_train means over steps {mode.skip_steps + 1}..{mode.skip_steps + ours['steps']}"
            + ("" if res_ours.rc == 0 else f" (it stopped: {res_ours.why()})"),
            f"peak memory {ours['peak_mem_mib']:.0f} MiB"]
    if attention:
        note.append(f"attention: {attention[:160]}")
    if peer:
        note.append(f"torch {peer.get('steps')} steps after {mode.skip_steps}, {peer.get('attention', '')}, "
                    f"peak memory {peer.get('peak_mem_mib', '—')} MiB" +
                    (f", experts: {peer['experts']}" if peer.get("experts") else ""))
    else:
        note.append(f"torch not measured: {why_peer}")
    ratio = ours["tokens_per_s"] / peer["tokens_per_s"] if peer else None
    target = 1.0 if part == "moe" else 1.2
    ctx.table.fill(f"{part}-tokens", f"{fmt(ours['tokens_per_s'])}",
                   fmt(peer["tokens_per_s"]) if peer else "not measured", ratio,
                   None if ratio is None else ratio >= target, "; ".join(note), cmds)
    if part != "moe":
        peer_mfu = peer.get("mfu") if peer else None
        ctx.table.fill(f"{part}-mfu", f"{100 * ours['mfu']:.1f}%",
                       f"{100 * peer_mfu:.1f}%" if peer_mfu else "not measured",
                       ours["mfu"] / peer_mfu if peer_mfu else None,
                       ours["mfu"] >= 0.45 if part == "train-1b" else None,
                       f"peak {peak:.6g} TFLOP/s; so_train {ours['tflops']:.4g} TFLOP/s", cmds)
    return "measured", f"torch: {why_peer}" if why_peer else ""


def part_step(ctx):
    mode = ctx.mode
    budget = ctx.budget("step")
    json_path = os.path.join(ctx.work, "step.json")
    sets = ["--set", "zero_optimization.offload_optimizer.cpuadam_cores_perc=0.9"]
    if mode.dry:
        sets += mode.so_train_sets("train-1b")
    argv = [ctx.so_bench, "step", "--config", STEP_CONFIG, "--steps", str(mode.step_bench_steps), "--modes",
            "zero-offload:1,superoffload:1", "--clip", "always", "--json", json_path] + sets
    res = ctx.runner.run(argv, budget)
    n = res.n
    doc = None
    if res.rc == 0 and os.path.exists(json_path):
        with open(json_path) as f:
            doc = json.load(f)
    if not doc:
        why = res.why()
        ctx.table.not_measured("step", why, [n])
        return "not measured", why
    ctx.raw["step"] = doc
    rows = {r["placement"].split(":")[0]: r for r in doc["rows"]}
    z, s = rows["zero-offload"], rows["superoffload"]
    ratio = s["exposed_of_zero_offload"]
    ctx.table.fill("step", f"{s['exposed_optimizer_ms']:.1f} ms (SuperOffload)",
                   f"{z['exposed_optimizer_ms']:.1f} ms (ZeRO-Offload)", ratio,
                   None if ratio is None else ratio <= 0.5,
                   f"clipped {s['clipped_steps']}/{s['steps']} and {z['clipped_steps']}/{z['steps']} steps; "
                   f"tokens/s {s['tokens_per_s']:.0f} vs {z['tokens_per_s']:.0f}; CPU optimizer "
                   f"{s['optimizer_cpu_ms']:.1f} vs {z['optimizer_cpu_ms']:.1f} ms", [n])
    return "measured", ""


class Context:
    def __init__(self, args, mode, table, runner, work):
        self.mode, self.table, self.runner, self.work = mode, table, runner, work
        self.build = args.build
        self.so_train = os.path.join(args.build, "launcher", "so_train")
        self.so_bench = os.path.join(args.build, "bench", "so_bench")
        self.python = os.environ.get("SO_PYTHON") or sys.executable
        self.part_budget = dict(PART_BUDGET_S, **args.part_budget)
        self.peaks = None
        self.raw = {}

    def budget(self, part):
        return min(self.part_budget[part], self.runner.left())


def card_and_driver(dry):
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        if out.returncode == 0 and out.stdout.strip():
            name, memory, driver = [x.strip() for x in out.stdout.strip().splitlines()[0].split(",")]
            return f"{name} ({memory})", driver
        why = (out.stderr or out.stdout).strip().splitlines()[-1:] or [f"exit {out.returncode}"]
    except (OSError, subprocess.TimeoutExpired) as e:
        why = [str(e)]
    return ("none: dry run on the CPU backend" if dry else f"unknown (nvidia-smi: {why[0][:120]})"), "—"


def git_commit():
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", default=os.environ.get("SO_MEASURE_DRY_RUN") == "1",
                   help="every part on the CPU backend with tiny shapes and step counts (also SO_MEASURE_DRY_RUN=1)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, among {','.join(PARTS)}")
    p.add_argument("--budget-s", type=float, default=480, help="seconds for all the parts together")
    p.add_argument("--part-budget", action="append", default=[], metavar="PART=SECONDS",
                   help="a part's own cap (repeatable; defaults: " +
                   ", ".join(f"{k} {v}" for k, v in PART_BUDGET_S.items()) + ")")
    p.add_argument("--build", default=os.environ.get("BUILD", os.path.join(ROOT, "build")))
    p.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "results", "gpu-measure"))
    p.add_argument("--render", metavar="MEASURE_JSON", help="print the markdown table of a measure.json and exit")
    p.add_argument("--template", action="store_true",
                   help="print the table of a GPU run with every row not measured (for docs/perf.md) and exit")
    p.add_argument("--print-gate", action="store_true",
                   help="print the gate's ctest -R selection and exit (for SO_PACK_TESTS of jobs/local/gpu_pack.sh)")
    args = p.parse_args()
    if args.render or args.template or args.print_gate:
        return args
    args.parts = [x for x in args.parts.split(",") if x]
    for x in args.parts:
        if x not in PARTS:
            p.error(f"--parts: '{x}' is not one of {','.join(PARTS)}")
    budgets = {}
    for spec in args.part_budget:
        name, _, secs = spec.partition("=")
        try:
            budgets[name] = float(secs)
        except ValueError:
            p.error(f"--part-budget: '{spec}' is not PART=SECONDS")
        if name not in PARTS:
            p.error(f"--part-budget: '{name}' is not one of {','.join(PARTS)}")
    args.part_budget = budgets
    args.build = os.path.abspath(args.build)
    return args


def main():
    args = parse_args()
    if args.render:
        with open(args.render) as f:
            sys.stdout.write(render(json.load(f)))
        return 0
    if args.print_gate:
        print(os.environ.get("SO_MEASURE_GATE", DEFAULT_GATE))
        return 0
    if args.template:
        table = Table(None, {"date": "—", "card": "—", "driver": "—", "commit": "—", "budget_s": 480,
                             "parts_selected": PARTS, "written": "—"})
        declare_rows(table, Mode(False), PARTS)
        table.not_measured_all("no run on a GPU yet")
        sys.stdout.write(render(dict(table.meta, rows=table.rows, commands=[], parts={})))
        return 0
    mode = Mode(args.dry_run)
    os.makedirs(args.out, exist_ok=True)
    for name in ("measure.log", "measure.md", "measure.json"):
        if os.path.exists(os.path.join(args.out, name)):
            os.remove(os.path.join(args.out, name))
    work = os.path.join(args.out, ".work")  # the commands' own files, folded into measure.json
    os.makedirs(work, exist_ok=True)
    for name in os.listdir(work):
        os.remove(os.path.join(work, name))
    card, driver = card_and_driver(args.dry_run)
    commit = os.environ.get("SO_BUNDLE_COMMIT") or git_commit()
    meta = {"schema": 1, "date": now_utc(), "card": card, "driver": driver, "commit": commit,
            "sources_commit": git_commit(), "dry_run": args.dry_run, "budget_s": args.budget_s,
            "parts_selected": args.parts, "build": args.build}
    table = Table(args.out, meta)
    declare_rows(table, mode, args.parts)
    runner = Runner(args.out, args.budget_s, table)
    ctx = Context(args, mode, table, runner, work)
    table.write()
    runner.log(f"{'dry run, ' if mode.dry else ''}card {card}, driver {driver}, commit {commit}, "
               f"budget {args.budget_s:.0f} s, parts {','.join(args.parts)}")
    run_part = {"gate": part_gate, "peaks": part_peaks, "attention": part_attention, "step": part_step,
                "train-1b": lambda c: part_train(c, "train-1b"), "train-3b": lambda c: part_train(c, "train-3b"),
                "moe": lambda c: part_train(c, "moe")}
    for part in args.parts:
        t0 = time.monotonic()
        if runner.left() < MIN_START_S:
            status, why = "not measured", f"not started: {runner.left():.0f} s of the {args.budget_s:.0f} s budget left"
            table.not_measured(part, why)
        else:
            runner.log(f"part {part} (up to {ctx.budget(part):.0f} s)")
            try:
                status, why = run_part[part](ctx)
            except Exception as e:  # a part's parsing error must not lose the other parts
                status, why = "not measured", f"{type(e).__name__} reading its output: {e}"
                table.not_measured(part, why)
        table.parts[part] = {"status": status, "seconds": round(time.monotonic() - t0, 1), "why": why}
        table.meta["raw"] = ctx.raw
        table.write()
        runner.log(f"part {part}: {status} in {time.monotonic() - t0:.0f} s{' — ' + why if why else ''}")
    for name in os.listdir(work):
        os.remove(os.path.join(work, name))
    os.rmdir(work)
    runner.log(f"table: {os.path.join(args.out, 'measure.md')}")
    sys.stdout.write(render(dict(table.meta, rows=table.rows, commands=table.commands, parts=table.parts,
                                 written=now_utc())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
