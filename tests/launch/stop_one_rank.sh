#!/usr/bin/env bash
# stop_one_rank.sh MPIRUN SO_TRAIN: SIGSTOP one rank of a 2-rank training run once it is training.
# The other rank's next collective waits; with train.collective_timeout_s = 5 its watchdog must end
# the job within seconds, naming the rank and the collective, with a non-zero exit.
set -u
mpirun=$1 so_train=$2
fail() { echo "FAIL: $*"; [ -s "$log" ] && tail -20 "$log"; kill -9 "${ranks[@]}" "$job" 2>/dev/null; exit 1; }
source "$(dirname "$0")/two_rank_job.sh"
start_two_rank_job "$mpirun" "$so_train" --set train.collective_timeout_s=5
start=$(date +%s)
kill -STOP "${ranks[1]}"
for _ in $(seq 600); do  # up to 60 s for the watchdog (5 s) and mpirun to end the job
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
elapsed=$(($(date +%s) - start))
kill -0 "$job" 2>/dev/null && fail "the job still runs 60 s after a rank was stopped"
wait "$job"
rc=$?
[ $rc -ne 0 ] || fail "mpirun exited 0 after a rank was stopped"
grep -Eq "so_train: error: .*rank [01] of 2\).* has waited [0-9]+ s for the other ranks \(train.collective_timeout_s = 5\)" "$log" ||
  fail "no watchdog message naming the rank and the collective"
grep -E "has waited" "$log" | head -2
kill -9 "${ranks[@]}" 2>/dev/null  # the stopped rank, should mpirun have left it behind
echo "ok: mpirun exited $rc ${elapsed} s after rank pid ${ranks[1]} was stopped"
