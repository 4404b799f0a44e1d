#!/usr/bin/env bash
# Packs a CUDA-enabled build made on this machine for a GPU machine that has the CUDA runtime,
# cuBLAS, cuDNN and NCCL (the toolkit, or PyTorch's NVIDIA wheels) but none of our Debian
# libraries and no package access — the lent GPU machines (docs/perf.md, "GPU runs").
#   jobs/local/gpu_pack.sh [BUILD_DIR]      (default: build)  ->  .gpu/bundle.tar.xz + .gpu/run.sh
# The bundle holds the committed source tree (tests read its configs, fixtures and data), the build
# tree's executables and CTest files (no objects, not the sanitizer tree), every shared library they need except those the
# GPU machine brings, and Open MPI's tree under a relocatable prefix. On the GPU machine, from a
# copy of the repository that carries .gpu/ (device tool: carry [".gpu"]):
#   bash .gpu/run.sh env ctest-gpu peaks ops ...     (jobs/local/gpu_stage.sh: the stages)
# .gpu/ is kept out of git (.git/info/exclude). About 45 MB.
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
mkdir -p "$tree$root" "$tree/lib"
echo "$root" > "$tree/PROJECT_PATH"
git -C "$root" rev-parse HEAD > "$tree/COMMIT"
# 1. The committed sources at HEAD (uncommitted changes are not packed: commit first).
git -C "$root" archive HEAD | tar -x -C "$tree$root"
# 2. The build tree's executables, scripts and CTest files: no objects, archives or test outputs.
rel=${build#"$root"/}
(cd "$build" && find . -type f ! -name '*.o' ! -name '*.a' ! -path '*/CMakeFiles/*' ! -path './Testing/*' ! -path './sanitize/*' \
    ! -name '*.log' ! -name '*.h5' ! -name '*.safetensors' \( -perm -u+x -size -60M -o -size -2M \) -print0 |
  tar --null -T - -c) | tar -x -C "$tree$root" --transform "s,^\./,$rel/,"
# 3. Shared libraries, but those the GPU machine has (CUDA, NVIDIA's, the C and C++ runtimes).
machine_has='linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread|librt\.so|libcuda\.so|libcudart|libcublas|libnccl|libcudnn|libnvidia|libstdc\+\+|libgcc_s'
ompi=/usr/lib/x86_64-linux-gnu/openmpi
elves=$(find "$tree$root/$rel" -type f -perm -u+x -exec sh -c 'head -c4 "$1" | grep -q ELF && echo "$1"' _ {} \;)
for f in $elves $(find "$ompi" -name '*.so') /usr/bin/orted /usr/bin/orterun; do
  { ldd "$f" 2>/dev/null || true; } | awk '/=> \//{print $3}'
done | sort -u | grep -Ev "$machine_has" | while read -r lib; do cp -L "$lib" "$tree/lib/"; done
# 4. Open MPI's tree (plugins, help files) under a prefix the stage runner points OPAL_PREFIX at.
mkdir -p "$tree/ompi/lib/x86_64-linux-gnu" "$tree/ompi/share" "$tree/ompi/bin"
cp -a "$ompi" "$tree/ompi/lib/x86_64-linux-gnu/"
cp -a /usr/share/openmpi "$tree/ompi/share/"
cp -L /usr/bin/orted /usr/bin/orterun "$tree/ompi/bin/"
ln -s orterun "$tree/ompi/bin/mpirun"
mkdir -p "$out"
if [ "$out" = "$root/.gpu" ]; then
  mkdir -p "$root/.git/info"
  grep -qx '/.gpu/' "$root/.git/info/exclude" 2>/dev/null || echo '/.gpu/' >> "$root/.git/info/exclude"
fi
tar -C "$tree" -c . | xz -T2 -1 > "$out/bundle.tar.xz"
cp "$root/jobs/local/gpu_stage.sh" "$out/run.sh"
echo "gpu_pack.sh: $(du -h "$out/bundle.tar.xz" | cut -f1) in $out/bundle.tar.xz (commit $(cut -c1-12 "$tree/COMMIT"))"
echo "on the GPU machine: bash .gpu/run.sh env ctest-gpu STAGE...   (jobs/local/gpu_stage.sh)"
