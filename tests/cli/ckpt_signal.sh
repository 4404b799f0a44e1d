#!/usr/bin/env bash
# Preemption: SIGTERM to so_train (what Slurm sends every task) and SIGUSR1 to mpirun (which
# forwards it to every rank) make the job finish its step, save, and exit 0 with a message; the
# checkpoint verifies and a new run resumes from it.
# usage: ckpt_signal.sh MPIRUN SO_TRAIN SO_CKPT WORKDIR
set -uo pipefail
mpirun=$1 so_train=$2 so_ckpt=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
args=(--config configs/runs/tiny-demo.json --set data.seq_len=32 --set train_micro_batch_size_per_gpu=2)
check() {  # name signal command...
  local name=$1 sig=$2
  shift 2
  "$@" "${args[@]}" --steps 100000 --save-dir "$work/$name" >"$work/$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 240); do grep -q "^step " "$work/$name.log" && break; sleep 0.25; done
  grep -q "^step " "$work/$name.log" || fail "$name: training never started"
  kill -s "$sig" "$pid"
  wait "$pid"
  local rc=$?
  [ $rc -eq 0 ] || fail "$name: exit $rc after $sig: $(tail -3 "$work/$name.log")"
  grep -q "stopping after step [0-9]* on a termination signal" "$work/$name.log" || fail "$name: no stop message"
  "$so_ckpt" verify "$work/$name" >/dev/null || fail "$name: checkpoint does not verify"
  local at
  at=$(grep -o "stopping after step [0-9]*" "$work/$name.log" | grep -o "[0-9]*$")
  "$so_train" "${args[@]}" --steps $((at + 1)) --resume "$work/$name" 2>&1 | grep "done: $((at + 1)) steps" >/dev/null ||
    fail "$name: resume from step $at"
  echo "$name: $sig -> saved at step $at, exit 0, resumed"
}
check sigterm TERM "$so_train"
check sigusr1_mpirun USR1 "$mpirun" --oversubscribe -np 2 "$so_train"
echo "signals ok"
