#!/usr/bin/env bash
# run_sanitizer.sh TOOL BINARY [GTEST_FILTER]: BINARY under `compute-sanitizer --tool TOOL`, failing
# on any hazard it reports. Exits 77 (ctest: skipped) when compute-sanitizer or a GPU is missing.
set -u
tool=$1 binary=$2 filter=${3:-*}
sanitizer=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
if [[ ! -x $sanitizer ]]; then echo "compute-sanitizer not found (PATH, \$CUDA_HOME/bin): skipped"; exit 77; fi
if ! nvidia-smi -L >/dev/null 2>&1; then echo "no GPU (nvidia-smi -L failed): skipped"; exit 77; fi
echo "$sanitizer --tool $tool --error-exitcode 1 $binary --gtest_filter=$filter"
exec "$sanitizer" --tool "$tool" --error-exitcode 1 "$binary" --gtest_filter="$filter" --gtest_brief=1
