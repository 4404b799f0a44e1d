#!/usr/bin/env bash
# run_tests.sh TREE: the unit and mpi tests of the sanitizer tree (build_tree.sh), with the
# settings of sanitizer_env.sh: everything a sanitizer reports fails the test that triggered it.
set -euo pipefail
tree=$1
source "$(dirname "$0")/sanitizer_env.sh"
# The sanitizer tree's own copies of the slow, cross and gpu tests, and of the end-to-end
# comparisons with a live PyTorch loop (label torch: their C++ is that of the data and gtest cases
# run here, their time mostly torch's), are left to the main tree.
ctest --test-dir "$tree" -L "unit|mpi" -LE "cross|gpu|slow|torch" -j2 --output-on-failure --timeout 900
