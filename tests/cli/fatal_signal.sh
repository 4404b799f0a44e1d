#!/usr/bin/env bash
# A rank that crashes (SIGSEGV, SIGABRT, heap corruption caught by glibc, SIGBUS, SIGFPE, SIGILL)
# ends the process, and with it the job, within seconds, naming the signal and the rank: alone
# (MPI's singleton mode) and as rank 1 of `mpirun -np 2` while rank 0 waits for it in a barrier.
# usage: fatal_signal.sh MPIRUN CRASH_AFTER_INIT
set -uo pipefail
mpirun=$1 crash=$2
declare -A name=([segv]=SIGSEGV [abort]=SIGABRT [heap]=SIGABRT [bus]=SIGBUS [fpe]=SIGFPE [ill]=SIGILL)
failures=0
check() {  # label how rank command...
  local label=$1 how=$2 rank=$3
  shift 3
  local start out rc
  start=$(date +%s%N)
  out=$(timeout -k 2 15 "$@" "$crash" "$how" "$rank" 2>&1)
  rc=$?
  local took=$((($(date +%s%N) - start) / 1000000))
  if [ $rc -eq 124 ] || [ $rc -eq 137 ] || [ $rc -eq 0 ] || [ $took -gt 10000 ] ||
     ! echo "$out" | grep "fatal signal ${name[$how]} (.*) on rank $rank: exiting" >/dev/null; then
    echo "BAD $label $how: exit $rc after ${took} ms: $(echo "$out" | tail -4)"
    failures=$((failures + 1))
  else
    echo "ok  $label $how: exit $rc after ${took} ms"
  fi
}
for how in segv abort heap bus fpe ill; do
  check singleton "$how" 0
  check "mpirun -np 2" "$how" 1 "$mpirun" --oversubscribe -np 2
done
[ $failures -eq 0 ] && echo "fatal signals ok" || echo "$failures failures"
