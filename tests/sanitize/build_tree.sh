#!/usr/bin/env bash
# build_tree.sh SRC TREE: configures and builds TREE, a second build of SRC with clang,
# AddressSanitizer + UndefinedBehaviorSanitizer and the libFuzzer targets (CPU backend only: the
# CUDA code is built and checked by the main tree and compute-sanitizer on a GPU). Fails,
# naming them, when clang or its runtime libraries are missing (scripts/install-deps.sh installs them).
set -euo pipefail
src=$1 tree=$2
probe='extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }'
if ! command -v clang++ >/dev/null || ! echo "$probe" | clang++ -x c++ -fsanitize=fuzzer,address,undefined - \
    -o /dev/null 2>/dev/null; then
  echo "FAILED: clang++ with the sanitizer and libFuzzer runtimes is not installed (Debian: clang libclang-rt-14-dev)"
  exit 1
fi
CC=clang CXX=clang++ cmake -S "$src" -B "$tree" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSO_CUDA=OFF -DSO_SANITIZE=ON \
  -DSO_FUZZ=ON >"$tree.configure.log" 2>&1 || { cat "$tree.configure.log"; exit 1; }
# The build runs the gtest binaries to list their tests: with the sanitizers' run-time settings.
source "$(dirname "$0")/sanitizer_env.sh"
cmake --build "$tree" -j2 2>&1 | grep -E "error|warning: .*\[-W" || true
cmake --build "$tree" -j2 >/dev/null  # fails (and shows why) if the build above did not finish
echo "sanitize tree built: $tree"
