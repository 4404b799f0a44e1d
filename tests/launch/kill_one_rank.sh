#!/usr/bin/env bash
# kill_one_rank.sh MPIRUN SO_TRAIN: SIGKILL one rank of a 2-rank training run once it is training.
# mpirun must end the job (the other rank included) with a non-zero exit within 60 s: a rank that
# dies without a word must not leave its peers waiting in a collective forever.
set -u
mpirun=$1 so_train=$2
fail() { echo "FAIL: $*"; [ -s "$log" ] && cat "$log"; kill "$job" 2>/dev/null; exit 1; }
source "$(dirname "$0")/two_rank_job.sh"
start_two_rank_job "$mpirun" "$so_train"
alive() { local s; s=$(ps -o stat= -p "$1") && [[ $s != Z* ]]; }  # a zombie has ended
start=$(date +%s)
kill -9 "${ranks[1]}"
for _ in $(seq 600); do  # up to 60 s for mpirun and the surviving rank to end
  alive "$job" || alive "${ranks[0]}" || break
  sleep 0.1
done
elapsed=$(($(date +%s) - start))
alive "$job" && fail "mpirun still running 60 s after the kill"
alive "${ranks[0]}" && fail "rank 0 (pid ${ranks[0]}) still running 60 s after the kill"
wait "$job"
rc=$?
tail -5 "$log"
[ $rc -ne 0 ] || fail "mpirun exited 0 after a rank was killed"
echo "ok: mpirun exited $rc ${elapsed} s after rank pid ${ranks[1]} was killed"
