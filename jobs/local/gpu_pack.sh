#!/usr/bin/env bash
# Packs a CUDA-enabled build made on this machine for a GPU machine that has the CUDA runtime,
# cuBLAS, cuDNN and NCCL (the toolkit, or PyTorch's NVIDIA wheels) but none of our Debian
# libraries and no package access — the lent GPU machines (docs/perf.md, "GPU (CUDA backend)").
#   jobs/local/gpu_pack.sh [BUILD_DIR]      (default: build)  ->  .gpu/bundle.tar.xz + .gpu/run.sh
#   SO_PACK_TESTS=REGEX jobs/local/gpu_pack.sh   only the executables of the gpu tests ctest -R REGEX
#       selects travel (the smaller bundle when the carry is tight; e.g. the one-call measurement's
#       gate: SO_PACK_TESTS="$(jobs/local/gpu_measure.py --print-gate)")
# The bundle holds the build tree's executables and CTest files (no objects, not the sanitizer
# tree; debug info stripped), every shared library they need except those the GPU machine
# brings, and Open MPI's tree under a relocatable prefix. The sources are not in it: the device
# tool carries the tracked tree beside it, and the two must fit its 64 MiB carry together, so this
# fails above 62 MiB of bundle + tracked files. On the GPU machine, from that copy of
# the repository at the bundle's commit (device tool: carry [".gpu"]):
#   bash .gpu/run.sh env ctest-gpu peaks ops ...     (jobs/local/gpu_stage.sh: the stages)
# .gpu/ is kept out of git (.git/info/exclude).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$root/build}" 2>/dev/null && pwd) || { echo "gpu_pack.sh: no build directory '${1:-build}'" >&2; exit 2; }
out=${SO_GPU_DIR:-$root/.gpu}
so_train=$build/launcher/so_train
[ -x "$so_train" ] || { echo "gpu_pack.sh: $so_train is missing: build first" >&2; exit 2; }
case $(ldd "$so_train") in *libcudart*) ;; *)
  echo "gpu_pack.sh: $so_train is not linked with CUDA (configure where /usr/local/cuda exists)" >&2; exit 2 ;;
esac
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
tree=$stage/tree
mkdir -p "$tree/build" "$tree/lib"
echo "$root" > "$tree/PROJECT_PATH"
rel=${build#"$root"/}
echo "$rel" > "$tree/BUILD_DIR"  # where the build sits under the project root (CTest's paths)
git -C "$root" rev-parse HEAD > "$tree/COMMIT"
# 1. The build tree's executables, scripts and CTest files: no objects, archives or test outputs,
#    nothing large but executables; what is left out for its size is named.
candidates=(-type f ! -name '*.o' ! -name '*.a' ! -path '*/CMakeFiles/*' ! -path './Testing/*' ! -path './sanitize/*'
            ! -name '*.log' ! -name '*.h5' ! -name '*.safetensors')
small=(\( -perm -u+x -size -60M -o -size -2M \))
(cd "$build" && find . "${candidates[@]}" ! "${small[@]}" -printf 'gpu_pack.sh: skipped for size: %p (%s bytes)\n')
(cd "$build" && find . "${candidates[@]}" "${small[@]}" -print0 | tar --null -T - -c) | tar -x -C "$tree/build"
#    Only the test executables the gpu-labelled tests run travel (the GPU stages run only those and
#    so_train/so_bench/so_ckpt); the fuzzers and the cross build stay here. Each test binary holds
#    the whole backend, and the carry is small.
#    CTest names them by the build directory's physical path; the gpu cases are listed one by one
#    (tests/gpu/gpu_cases.cmake: this machine has no GPU), as SO_PACK_TESTS selects them.
built_at=$(cd "$build" && pwd -P)
selection=(-L gpu)
[ -n "${SO_PACK_TESTS:-}" ] && selection+=(-R "$SO_PACK_TESTS")
gpu_tests=$(SO_TEST_GPU_CASES=each ctest --test-dir "$build" -N "${selection[@]}" --show-only=json-v1 2>/dev/null | grep -o "\"$built_at/[^\"]*\"" | tr -d '"' | sort -u || true)
[ -n "$gpu_tests" ] || { echo "gpu_pack.sh: ctest lists no gpu-labelled test in $build${SO_PACK_TESTS:+ matching '$SO_PACK_TESTS'}" >&2; exit 2; }
[ -z "${SO_PACK_TESTS:-}" ] || echo "gpu_pack.sh: the test executables of ctest -L gpu -R '$SO_PACK_TESTS' only:" $gpu_tests
rm -rf "$tree/build/fuzz" "$tree/build/aarch64"
(cd "$tree/build" && find tests -type f -perm -u+x -exec sh -c 'head -c4 "$1" | grep ELF >/dev/null' _ {} \; -print) |
  while read -r f; do
    echo "$gpu_tests" | grep -x "$built_at/$f" >/dev/null || rm -f "$tree/build/$f"
  done
# 2. Shared libraries, but those the GPU machine has (CUDA, NVIDIA's, the C and C++ runtimes).
machine_has='linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread|librt\.so|libcuda\.so|libcudart|libcublas|libnccl|libcudnn|libnvidia|libstdc\+\+|libgcc_s'
ompi=/usr/lib/x86_64-linux-gnu/openmpi
elves=$(find "$tree/build" -type f -perm -u+x -exec sh -c 'head -c4 "$1" | grep ELF >/dev/null && echo "$1"' _ {} \;)
# h5diff: the checkpoint tests compare files with it (Debian's hdf5-tools; not on the GPU machine).
mkdir -p "$tree/bin"
cp -L /usr/bin/h5diff "$tree/bin/"
for f in $elves $(find "$ompi" -name '*.so') /usr/bin/orted /usr/bin/orterun /usr/bin/h5diff; do
  { ldd "$f" 2>/dev/null || true; } | awk '/=> \//{print $3}'
done | sort -u | grep -Ev "$machine_has" | while read -r lib; do cp -L "$lib" "$tree/lib/"; done
# 3. Open MPI's tree (plugins, help files) under a prefix the stage runner points OPAL_PREFIX at.
mkdir -p "$tree/ompi/lib/x86_64-linux-gnu" "$tree/ompi/share" "$tree/ompi/bin"
cp -a "$ompi" "$tree/ompi/lib/x86_64-linux-gnu/"
#    Its headers and libtool files are for building against Open MPI, which nothing there does.
rm -rf "$tree/ompi/lib/x86_64-linux-gnu/openmpi/include"
find "$tree/ompi" -name '*.la' -delete
cp -a /usr/share/openmpi "$tree/ompi/share/"
cp -L /usr/bin/orted /usr/bin/orterun "$tree/ompi/bin/"
ln -s orterun "$tree/ompi/bin/mpirun"
# 4. Debug info off every ELF file (symbols stay: backtraces still name functions).
find "$tree" -type f -exec sh -c 'head -c4 "$1" | grep ELF >/dev/null && strip --strip-debug "$1"' _ {} \; 2>/dev/null || true
mkdir -p "$out"
if [ "$out" = "$root/.gpu" ]; then
  # A worktree's .git is a file: ask git where its exclude file is.
  exclude=$(git -C "$root" rev-parse --git-path info/exclude)
  case $exclude in /*) ;; *) exclude=$root/$exclude ;; esac
  mkdir -p "$(dirname "$exclude")"
  grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
fi
tar -C "$tree" -c . | xz -T2 -9 > "$out/bundle.tar.xz"
cp "$root/jobs/local/gpu_stage.sh" "$out/run.sh"
# The device tool carries the tracked tree and .gpu/ in 64 MiB: kept under 62 for what else travels.
bundle=$(stat -c %s "$out/bundle.tar.xz")
tracked=$(git -C "$root" ls-files -z | (cd "$root" && xargs -0 stat -c %s 2>/dev/null) | awk '{t += $1} END {print t + 0}')
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
echo "gpu_pack.sh: $(mib "$bundle") MiB in $out/bundle.tar.xz (commit $(cut -c1-12 "$tree/COMMIT")) + $(mib "$tracked") MiB of tracked files = $(mib $((bundle + tracked))) MiB to carry"
if [ $((bundle + tracked)) -gt $((62 * 1048576)) ]; then
  echo "gpu_pack.sh: over the 62 MiB kept for the device tool's 64 MiB carry" >&2
  exit 1
fi
echo "on the GPU machine: bash .gpu/run.sh env ctest-gpu STAGE...   (jobs/local/gpu_stage.sh)"
