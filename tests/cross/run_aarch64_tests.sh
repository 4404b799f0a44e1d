#!/usr/bin/env bash
# The aarch64 optimizer kernels, cross-built and run under qemu-user: builds test_grace_adam with
# SO_KERNELS_ONLY and Debian's aarch64 cross compiler into BUILD_DIR/aarch64, then runs it as
#   NEON        -cpu max,sve=off   SO_SIMD=neon
#   SVE x3      -cpu max,sveN=on    SO_SIMD=sve, N = 128, 256, 512 bits (checked inside the test)
#   scalar      -cpu max           SO_SIMD=scalar
# usage: tests/cross/run_aarch64_tests.sh BUILD_DIR
# Fails, naming what is missing, when the cross compiler, qemu or the GoogleTest sources are.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build="${1:?usage: $0 BUILD_DIR}/aarch64"

for tool in aarch64-linux-gnu-g++ qemu-aarch64; do
  if ! command -v "$tool" >/dev/null; then
    echo "FAILED: $tool not found (scripts/install-deps.sh installs g++-aarch64-linux-gnu and qemu-user)"
    exit 1
  fi
done
if [ ! -f /usr/src/googletest/googletest/CMakeLists.txt ]; then
  echo "FAILED: GoogleTest sources missing in /usr/src/googletest (Debian package googletest)"
  exit 1
fi

mkdir -p "$build"
if ! cmake -S "$root" -B "$build" -DCMAKE_TOOLCHAIN_FILE="$root/cmake/toolchains/aarch64-linux-gnu.cmake" \
       -DSO_KERNELS_ONLY=ON -DCMAKE_BUILD_TYPE=Release >"$build/configure.log" 2>&1; then
  cat "$build/configure.log"
  echo "FAILED: configuring the aarch64 build"
  exit 1
fi
if ! cmake --build "$build" -j2 --target test_grace_adam >"$build/build.log" 2>&1; then
  cat "$build/build.log"
  echo "FAILED: building test_grace_adam for aarch64"
  exit 1
fi
bin="$build/tests/test_grace_adam"
readelf -h "$bin" | grep "Machine: *AArch64" >/dev/null || { echo "FAILED: $bin is not an aarch64 binary"; exit 1; }

failures=0
# run NAME QEMU_CPU ISA [SVE_BITS]
run() {
  local name=$1 cpu=$2 isa=$3 bits=${4:-} log="$build/$1.log"
  env SO_SIMD="$isa" ${bits:+SO_TEST_SVE_BITS=$bits} QEMU_LD_PREFIX=/usr/aarch64-linux-gnu \
    qemu-aarch64 -cpu "$cpu" "$bin" >"$log" 2>&1
  local rc=$?
  local why=""
  [ $rc -eq 0 ] || why="exit code $rc"
  # The ISA's parameterised tests must have run and passed, not been filtered away.
  grep -q "^\[       OK \] Isas/KernelTest\.StepEqualsTheScalarReferenceBitForBit/$isa " "$log" ||
    why="${why:+$why; }no passing Isas/KernelTest.*/$isa"
  if [ -n "$bits" ] && ! grep -q "^SVE vector length: $bits bits" "$log"; then
    why="${why:+$why; }SVE vector length is not $bits bits"
  fi
  if [ -n "$why" ]; then
    cat "$log"
    echo "FAILED: $name (qemu-aarch64 -cpu $cpu, SO_SIMD=$isa): $why"
    failures=$((failures + 1))
  else
    echo "passed: $name (qemu-aarch64 -cpu $cpu, SO_SIMD=$isa) $(grep -o '[0-9]* tests\? from [0-9]* test suites\? ran' "$log")"
    grep -E "^\[ (rollback|redo|scaled_sqrt)|^SVE vector length" "$log" | sed 's/^/    /'
  fi
}

run neon "max,sve=off" neon
run sve128 "max,sve128=on" sve 128
run sve256 "max,sve256=on" sve 256
run sve512 "max,sve512=on" sve 512
run scalar "max" scalar
[ $failures -eq 0 ] || { echo "aarch64: $failures configuration(s) failed"; exit 1; }
echo "aarch64: all configurations passed"
