#!/usr/bin/env bash
# Reshard: a checkpoint written by 2 ranks (ZeRO-3, dp = 2) resumes on 1 rank, on 4 ranks
# (dp = 4) and on (dp, sp) = (2, 2); the losses of the resumed steps equal those of the
# uninterrupted 2-rank run within 1e-6 relative (the global batch is the same everywhere).
# usage: resume_reshard.sh MPIRUN SO_TRAIN WORKDIR [--set key=value ...]
set -euo pipefail
python=${SO_PYTHON:?SO_PYTHON is not set: run under ctest, or set it to the interpreter scripts/python_env.sh makes}
mpirun=$1 so_train=$2 work=$3
shift 3
rm -rf "$work" && mkdir -p "$work"
run() {  # ranks micro-batch extra-args...
  local np=$1 mb=$2
  shift 2
  "$mpirun" --oversubscribe -np "$np" "$so_train" --config configs/runs/tiny-demo.json --set data.seq_len=32 \
    --set steps_per_print=1 --set scheduler.params.warmup_num_steps=2 --set zero_optimization.sub_group_size=100000 \
    --set zero_optimization.stage=3 --set train_micro_batch_size_per_gpu="$mb" "${extra[@]}" "$@" >/dev/null
}
extra=("$@")
run 2 2 --steps 8 --metrics "$work/straight.jsonl"
run 2 2 --steps 4 --save-dir "$work/ckpt" --save-every 4
run 1 4 --steps 8 --resume "$work/ckpt" --metrics "$work/np1.jsonl"
run 4 1 --steps 8 --resume "$work/ckpt" --metrics "$work/np4.jsonl"
run 4 2 --steps 8 --resume "$work/ckpt" --set sequence_parallel_size=2 --metrics "$work/dp2sp2.jsonl"
"$python" - "$work" <<'PY'
import json, sys
work = sys.argv[1]
ref = {r["step"]: r["loss"] for r in map(json.loads, open(f"{work}/straight.jsonl"))}
for name in ("np1", "np4", "dp2sp2"):
    got = {r["step"]: r["loss"] for r in map(json.loads, open(f"{work}/{name}.jsonl"))}
    assert sorted(got) == [5, 6, 7, 8], f"{name}: resumed steps {sorted(got)}"
    worst = max(abs(got[s] - ref[s]) / ref[s] for s in got)
    print(f"{name}: steps 5-8 worst loss rel diff vs uninterrupted 2 ranks {worst:.2e}")
    assert worst <= 1e-6, f"{name}: {worst}"
print("reshard ok")
PY
