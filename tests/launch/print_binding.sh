#!/usr/bin/env bash
# print_binding.sh MPIRUN SO_TRAIN: `so_train --print-binding` under mpirun with 2 ranks prints, on
# rank 0, one line per rank in rank order, each rank bound to exactly the cores it asked for
# ("bound": so_train read its affinity back); with --bind none every rank says "not bound".
set -u
mpirun=$1 so_train=$2
fail() { echo "FAIL: $*"; exit 1; }
host=$(hostname)
config=(--config configs/runs/tiny-demo.json)

out=$("$mpirun" --oversubscribe -np 2 "$so_train" "${config[@]}" --print-binding 2>&1) || fail "exit $?: $out"
echo "$out"
[ "$(printf '%s\n' "$out" | wc -l)" -eq 2 ] || fail "expected one line per rank"
for r in 0 1; do
  printf '%s\n' "$out" | sed -n "$((r + 1))p" | grep -qE "^rank $r/2 host $host \(local $r/2\): gpu [^,]+, numa node [0-9]+, cores [0-9,-]+ \(compute [0-9,-]+, no optimizer pool\), bound$" ||
    fail "line $((r + 1)) is not rank $r's binding, bound"
done
cores() { printf '%s\n' "$out" | sed -n "$1p" | sed -E 's/.*, cores ([0-9,-]+) .*/\1/'; }
if [ "$(nproc)" -ge 2 ] && [ "$(cores 1)" = "$(cores 2)" ]; then fail "both ranks on cores $(cores 1) of $(nproc)"; fi

# With an optimizer pool (offload), the line shows the compute/optimizer split.
out=$("$so_train" "${config[@]}" --print-binding --set zero_optimization.offload_optimizer.device=cpu 2>&1) || fail "exit $?: $out"
echo "$out"
printf '%s\n' "$out" | grep -qE "^rank 0/1 .*\(compute [0-9,-]+, optimizer [0-9,-]+\), bound" || fail "no optimizer pool shown"

out=$("$mpirun" --oversubscribe -np 2 "$so_train" "${config[@]}" --print-binding --bind none 2>&1) || fail "exit $?: $out"
echo "$out"
[ "$(printf '%s\n' "$out" | grep -c 'not bound (--bind none)$')" -eq 2 ] || fail "--bind none: expected 2 'not bound' lines"
echo "ok"
