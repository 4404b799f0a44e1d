# shellcheck shell=bash
# Sourced by kill_one_rank.sh and stop_one_rank.sh: start_two_rank_job MPIRUN SO_TRAIN [so_train args]
# starts a 2-rank training run of the tiny demo in the background ($job: mpirun's pid, $log: its
# output), waits up to 60 s for its first step and sets $ranks to the two rank pids. `fail` (the
# caller's) reports what went wrong.
start_two_rank_job() {
  local mpirun=$1 so_train=$2
  shift 2
  log=$(mktemp)
  ranks=()
  trap 'rm -f "$log"' EXIT
  "$mpirun" --oversubscribe -np 2 "$so_train" --config configs/runs/tiny-demo.json --steps 100000 \
    --set data.seq_len=32 --set steps_per_print=1 "$@" >"$log" 2>&1 &
  job=$!
  for _ in $(seq 600); do  # up to 60 s for the first step
    grep -q "^step " "$log" && break
    kill -0 "$job" 2>/dev/null || fail "the job ended before training"
    sleep 0.1
  done
  grep -q "^step " "$log" || fail "no training step within 60 s"
  mapfile -t ranks < <(pgrep -P "$job")
  [ ${#ranks[@]} -eq 2 ] || fail "expected mpirun to have 2 rank processes, found: ${ranks[*]}"
}
