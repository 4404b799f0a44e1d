#!/usr/bin/env bash
# one_rank_fails.sh MPIRUN SO_TRAIN: only rank 1 of a 2-rank job has a bad input (a data file that
# does not exist; MPMD gives it its own arguments). The whole job must end within 60 s with a
# non-zero exit, rank 1's message printed exactly once, and no other rank reporting an error.
set -u
mpirun=$1 so_train=$2
fail() { echo "FAIL: $*"; exit 1; }
config=(--config configs/runs/tiny-demo.json --set data.seq_len=32)
start=$(date +%s)
out=$(timeout 80 "$mpirun" --oversubscribe -np 1 "$so_train" "${config[@]}" --steps 100000 \
      : -np 1 "$so_train" "${config[@]}" --set data.path=data/corpus/missing.txt 2>&1)
rc=$?
elapsed=$(($(date +%s) - start))
echo "$out"
[ $rc -ne 0 ] || fail "the job exited 0"
[ $rc -ne 124 ] || fail "the job was still running after 80 s"
[ $elapsed -lt 60 ] || fail "the job took ${elapsed} s to end (limit 60 s)"
[ "$(printf '%s\n' "$out" | grep -c 'missing.txt')" -eq 1 ] || fail "the missing file should be named exactly once"
[ "$(printf '%s\n' "$out" | grep -c 'error:')" -eq 1 ] || fail "expected one error line (rank 1's)"
printf '%s\n' "$out" | grep -q "error: \[rank 1\] .*missing.txt" || fail "the error is not rank 1's"
echo "ok: exit $rc after ${elapsed} s"
