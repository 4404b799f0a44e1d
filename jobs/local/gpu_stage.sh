#!/usr/bin/env bash
# The GPU machine's side of jobs/local/gpu_pack.sh (copied there as .gpu/run.sh). From the root of
# the repository copy that carries .gpu/:
#   bash .gpu/run.sh env            the GPU, libraries the loader cannot find, so_train --help
#   bash .gpu/run.sh measure [OPT]  everything measured in one call of at most 8 minutes, one table
#                                   under $OUT (jobs/local/gpu_measure.py; the rest of the line is
#                                   its options)
#   bash .gpu/run.sh ctest-gpu      every gpu-labelled test but the compute-sanitizer ones
#   bash .gpu/run.sh STAGE...       any stage of jobs/local/gpu_bench.sh but build (peaks, ops,
#                                   train-1b, long-512k, trace, ...)
#   bash .gpu/run.sh exec CMD...    any command, in the project root, with the environment set
# It unpacks the bundle once into SO_BUNDLE_DIR (default /opt/so-bundle); this copy of the sources
# is reached at the build machine's path (CTest's and the tests' paths are absolute: the copy itself
# when it landed there, else a link to it) and the bundle's build at its place under it (a link,
# unless the copy carries a build there). Libraries: ours and Open MPI's from the bundle (Open MPI
# relocated with OPAL_PREFIX), CUDA, cuBLAS, cuDNN and NCCL from /usr/local/cuda or PyTorch's
# NVIDIA wheels. Results of the gpu_bench stages go to $OUT when set.
set -u
here=$(pwd)
B=${SO_BUNDLE_DIR:-/opt/so-bundle}
[ -f "$here/CMakeLists.txt" ] || { echo "gpu_stage.sh: run from the root of the repository copy that carries .gpu/ (not $here)" >&2; exit 2; }
if [ ! -f "$B/PROJECT_PATH" ]; then
  [ -f "$here/.gpu/bundle.tar.xz" ] || { echo "gpu_stage.sh: no .gpu/bundle.tar.xz here ($here): run jobs/local/gpu_pack.sh and carry .gpu" >&2; exit 2; }
  mkdir -p "$B" && tar -xJf "$here/.gpu/bundle.tar.xz" -C "$B" || { echo "gpu_stage.sh: unpacking into $B failed" >&2; exit 1; }
fi
proj=$(cat "$B/PROJECT_PATH")
rel=$(cat "$B/BUILD_DIR")
if [ "$(cd "$proj" 2>/dev/null && pwd -P)" != "$(pwd -P)" ]; then
  if [ -e "$proj" ] && [ ! -L "$proj" ]; then
    echo "gpu_stage.sh: the build's project path $proj exists and is not this copy ($here)" >&2; exit 2
  fi
  mkdir -p "$(dirname "$proj")" && ln -sfn "$here" "$proj"
fi
if [ -d "$here/$rel" ] && [ ! -L "$here/$rel" ]; then
  echo "gpu_stage.sh: $here/$rel is carried: running that build, not the bundle's"
else
  mkdir -p "$(dirname "$here/$rel")" && ln -sfn "$B/build" "$here/$rel"
fi
# The GPU machine has no project environment (scripts/python_env.sh): its PyTorch interpreter
# stands in for it, for the peers and the stages' Python.
export SO_PYTHON=${SO_PYTHON:-$(command -v python3)}
site=$("$SO_PYTHON" -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null)
nv=$(find "$site/nvidia" -maxdepth 3 -type d -name lib 2>/dev/null | tr '\n' ':')
export SO_SYSTEM_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
export LD_LIBRARY_PATH=$B/lib:$B/ompi/lib/x86_64-linux-gnu/openmpi/lib:/usr/local/cuda/lib64:$nv${LD_LIBRARY_PATH:-}
export OPAL_PREFIX=$B/ompi PATH=$B/ompi/bin:$B/bin:$PATH
export OMPI_MCA_ess_singleton_isolated=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader
cd "$proj" || exit 1
build=${BUILD:-$proj/$rel}
commit=$(cat "$B/COMMIT")
echo "gpu_stage.sh: commit ${commit:0:12}, build $build"
here_commit=$(git rev-parse HEAD 2>/dev/null) && [ "$here_commit" != "$commit" ] &&
  echo "gpu_stage.sh: warning: these sources are at ${here_commit:0:12}, the bundle's build at ${commit:0:12}"
status=0
while [ $# -gt 0 ]; do
  stage=$1
  shift
  case $stage in
    env)
      nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 || status=1
      for f in "$build/launcher/so_train" "$build/bench/so_bench"; do
        echo "== ldd $f"
        ldd "$f" | grep -E 'not found|cublas|nccl|cudart|cudnn|libmpi\.so|hdf5'
      done
      # cuDNN is the machine's (dlopen'ed at run time, never in ldd): without it attention falls back.
      "$SO_PYTHON" -c 'import ctypes; ctypes.CDLL("libcudnn.so.9"); print("libcudnn.so.9 loads")' ||
        { echo "gpu_stage.sh: libcudnn.so.9 does not load: attention would run our flash kernels"; status=1; }
      timeout 60 "$build/launcher/so_train" --help 2>&1 | head -3 ;;
    ctest-gpu)
      ctest --test-dir "$build" -L gpu -E 'memcheck|racecheck' -j "${CTEST_JOBS:-4}" --output-on-failure --timeout 400 \
        ${OUT:+--output-junit "$OUT/ctest-gpu-junit.xml"} || status=1 ;;
    exec)
      "$@"
      exit $? ;;
    measure)  # the driver and the peers on the machine's libraries; our binaries on the bundle's
      LD_LIBRARY_PATH=$SO_SYSTEM_LD_LIBRARY_PATH SO_BUNDLE_LD_LIBRARY_PATH=$LD_LIBRARY_PATH SO_BUNDLE_COMMIT=$commit \
        BUILD=$build "$SO_PYTHON" jobs/local/gpu_measure.py "$@"
      exit $? ;;
    build)
      echo "gpu_stage.sh: no building here: the bundle carries the build (jobs/local/gpu_pack.sh)" >&2
      exit 2 ;;
    peers-*)  # PyTorch with the machine's own libraries, not ours
      LD_LIBRARY_PATH=$SO_SYSTEM_LD_LIBRARY_PATH BUILD=$build bash jobs/local/gpu_bench.sh "$stage" || status=1 ;;
    *)
      BUILD=$build bash jobs/local/gpu_bench.sh "$stage" || status=1 ;;
  esac
done
exit $status
