#!/usr/bin/env bash
# gpu_cases_without_gpu.sh BINARY FILTER: the gpu cases of a gtest binary on a machine without a
# GPU, all in one process (tests/gpu/gpu_cases.cmake). Exit 77 (ctest: skipped) when the binary
# ran the cases of FILTER and some skipped, 0 when all passed; 1 when the filter selects no case, a
# case failed or the binary crashed.
set -uo pipefail
binary=$1 filter=$2
out=$("$binary" --gtest_filter="$filter" 2>&1)
rc=$?
echo "$out"
ran=$(sed -n 's/^\[==========\] \([0-9]*\) tests\? from .* ran\..*/\1/p' <<<"$out")
skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\?, listed below:$/\1/p' <<<"$out")
if [ "$rc" -ne 0 ]; then
  echo "FAILED: $binary --gtest_filter='$filter' exited with $rc"
  exit 1
fi
if [ -z "$ran" ] || [ "$ran" -eq 0 ]; then
  echo "FAILED: $binary --gtest_filter='$filter' ran no case"
  exit 1
fi
if [ -n "$skipped" ] && [ "$skipped" -gt 0 ]; then
  echo "$skipped of $ran cases skipped (no GPU here)"
  exit 77
fi
echo "all $ran cases passed"
