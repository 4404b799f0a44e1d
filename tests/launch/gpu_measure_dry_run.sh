#!/usr/bin/env bash
# gpu_measure_dry_run.sh BUILD_DIR: jobs/local/gpu_measure.py --dry-run runs every part on the CPU
# backend with tiny shapes through the commands a GPU run uses (so_bench gpu-peaks, attention and
# step, so_train, the torch peers with --device cpu, the gate's ctest selection, whose gpu tests
# skip here) and writes the one table with every row measured, its date, card and commit, and
# each row's commands. Then the ways a part can give no result: a command past its timeout is
# killed with its children and its row says so, the parts after it still run; parts the budget
# has no time left for say "not started"; bench_json.py reads so_bench's compact JSON.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
python=${SO_PYTHON:?SO_PYTHON: the project interpreter (ctest sets it)}
cd "$root"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

BUILD=$build OUT=$work/full "$python" jobs/local/gpu_measure.py --dry-run > "$work/full.out"
"$python" - "$work/full" <<'PY'
import json, sys
d = sys.argv[1]
doc = json.load(open(f"{d}/measure.json"))
md = open(f"{d}/measure.md").read()
assert doc["dry_run"] and doc["date"] and doc["card"] and doc["commit"], doc
parts = {r["part"] for r in doc["rows"]}
assert parts == {"gate", "peaks", "attention", "train-1b", "train-3b", "moe", "step"}, parts
for r in doc["rows"]:
    assert r["status"] == "measured", f"{r['measurement']}: {r['why']}"
    assert r["commands"], r
    assert all(1 <= c <= len(doc["commands"]) for c in r["commands"]), r
    if r["part"] not in ("gate", "peaks") and not r["key"].endswith("packed"):
        assert isinstance(r["ratio"], float) and r["ratio"] > 0, r  # ours and the baseline both measured
gate = next(r for r in doc["rows"] if r["key"] == "gate")
assert " 0 failed" in gate["ours"] and " of 0" not in gate["ours"] and "not run" not in gate["ours"], gate
for p, v in doc["parts"].items():
    assert v["status"] == "measured" and not v["why"], (p, v)
assert f"commit: {doc['commit']}" in md and "not measured" not in md, md
# Both sides count attention FLOPs alike: causal within each row's equal documents (the last one
# taking the remainder), forward 4*B*Hq*D*sum(L^2)/2, backward 2.5x.
att = doc["raw"]["attention"]
for side in ("ours", "torch"):
    shapes = {(r["D"], r["docs"]) for r in att[side] if "fwd_ms" in r}
    assert shapes == {(16, 1), (16, 4), (32, 1), (32, 4)}, (side, shapes)
    for r in att[side]:
        if "fwd_ms" not in r:
            continue
        n = r["S"] // r["docs"]
        lengths = [n] * (r["docs"] - 1) + [r["S"] - (r["docs"] - 1) * n]
        flop = 4 * r["B"] * r["Hq"] * r["D"] * sum(x * x for x in lengths) / 2
        assert abs(r["fwd_tflops"] * r["fwd_ms"] * 1e9 / flop - 1) < 1e-6, (side, r)
        assert abs(r["bwd_tflops"] * r["bwd_ms"] * 1e9 / (2.5 * flop) - 1) < 1e-6, (side, r)
print(f"dry run table: {len(doc['rows'])} rows, {len(doc['commands'])} commands; gate: {gate['ours']}")
PY
# The gate's reading of ctest's progress lines: every status ctest prints, parameterised names.
"$python" - <<'PY'
import sys
sys.path.insert(0, "jobs/local")
from gpu_measure import ctest_counts
text = """Test project /b
        Start  445: Small/CudaOps.MatchesCpu/attention_forward  # GetParam() = attention_forward
  1/7 Test  #445: Small/CudaOps.MatchesCpu/attention_forward  # GetParam() = x ..........   Passed    0.52 sec
  2/7 Test    #3: a ...................................***Failed  Required regular expression not found. Regex=[ok]  0.50 sec
  3/7 Test  #117: b/c  # GetParam() = 40-byte object <A0-D3 10-E4> ..........***Skipped   0.66 sec
  4/7 Test   #12: d ...................................***Not Run (Disabled)   0.00 sec
  5/7 Test   #13: e ...................................***Timeout 100.01 sec
  6/7 Test   #14: f ...................................***Exception: SegFault  0.12 sec
some output of a failed test: 1/1 Test #1: inner .... Passed 0.1 sec
"""
total, counts, failed = ctest_counts(text)
assert (total, counts) == (7, {"passed": 1, "failed": 3, "skipped": 2}), (total, counts)
assert failed == ["a (Failed)", "e (Timeout)", "f (Exception:)"], failed
assert ctest_counts("No tests were found!!!")[0] is None
PY
peak=$("$python" jobs/local/bench_json.py nominal-peak "$work/full/measure.log")
"$python" -c "import sys; assert float(sys.argv[1]) > 0, sys.argv[1]" "$peak"

# A peer that hangs (an interpreter that sleeps, with a child) is killed at the part's timeout; the
# row names the timeout; the part after it runs.
printf '#!/bin/sh\necho $$ >> %s/hang.pids\nsleep 300 &\necho $! >> %s/hang.pids\nsleep 300\n' "$work" "$work" > "$work/hang"
chmod +x "$work/hang"
start=$SECONDS
SO_PYTHON=$work/hang BUILD=$build OUT=$work/cut "$python" jobs/local/gpu_measure.py --dry-run --parts train-1b,peaks \
  --part-budget train-1b=20 > "$work/cut.out"
[ $((SECONDS - start)) -lt 120 ] || { echo "the hung peer was not stopped at its timeout" >&2; exit 1; }
"$python" - "$work/cut" <<'PY'
import json, sys
doc = json.load(open(f"{sys.argv[1]}/measure.json"))
rows = {r["key"]: r for r in doc["rows"]}
t = rows["train-1b-tokens"]
assert t["status"] == "measured" and t["baseline"] == "not measured" and "timed out after" in t["note"], t
assert rows["gemm"]["status"] == "measured", rows["gemm"]
PY
alive() {  # running, not a zombie waiting for a parent to reap it
  [ -r "/proc/$1/stat" ] && [ "$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null)" != Z ]
}
for pid in $(cat "$work/hang.pids"); do
  if alive "$pid"; then echo "the hung peer's process $pid outlived its timeout" >&2; exit 1; fi
done

# so_train failing: its error line stands in the row, the peer's number beside it.
mkdir -p "$work/broken/launcher"
printf '#!/bin/sh\necho "so_train: error: a crafted failure" >&2\nexit 1\n' > "$work/broken/launcher/so_train"
chmod +x "$work/broken/launcher/so_train"
BUILD=$work/broken OUT=$work/broken-out "$python" jobs/local/gpu_measure.py --dry-run --parts train-1b > "$work/broken.out"
"$python" - "$work/broken-out" <<'PY'
import json, sys
doc = json.load(open(f"{sys.argv[1]}/measure.json"))
rows = {r["key"]: r for r in doc["rows"]}
t = rows["train-1b-tokens"]
assert t["ours"] == "not measured: exit 1: so_train: error: a crafted failure" and float(t["baseline"].replace(",", "")) > 0, t
assert doc["parts"]["train-1b"]["status"] == "not measured" and "crafted failure" in doc["parts"]["train-1b"]["why"]
PY

# No time left: every part says it was not started, and why.
BUILD=$build OUT=$work/none "$python" jobs/local/gpu_measure.py --dry-run --budget-s 5 > "$work/none.out"
"$python" - "$work/none" <<'PY'
import json, sys
doc = json.load(open(f"{sys.argv[1]}/measure.json"))
assert all(r["status"] == "not measured" and "not started" in r["why"] for r in doc["rows"]), doc["rows"]
assert open(f"{sys.argv[1]}/measure.md").read().count("not measured: not started") == len(doc["rows"])
PY
echo "gpu measure dry run ok"
