#!/usr/bin/env bash
# Installs the Debian packages so_train builds against and the project's Python environment
# (scripts/python_env.sh, from scripts/requirements.txt). Idempotent and quick when everything is
# already there. The CUDA toolkit is not a Debian package here: when /usr/local/cuda exists the
# build enables the CUDA backend by itself.
set -euo pipefail
packages=(
  build-essential cmake pkg-config
  python3 python3-venv                  # the base of the project's Python environment (python_env.sh)
  libopenmpi-dev openmpi-bin            # MPI: launch, CPU-backend collectives, NCCL bootstrap
  libhwloc-dev libnuma-dev              # topology and NUMA-local placement
  libboost-program-options-dev          # command line
  libhdf5-openmpi-dev hdf5-tools        # parallel HDF5: checkpoints, fixtures, token datasets
  libopenblas-pthread-dev               # CPU GEMM; pthread build chosen on purpose (see cmake/SoDependencies.cmake)
  nlohmann-json3-dev libgtest-dev googletest
  libprotobuf-dev protobuf-compiler     # TensorBoard event files (src/train/tensorboard_event.proto)
  libre2-dev                            # linear-time regular expressions (train.weight_decay_exclude)
  g++-aarch64-linux-gnu qemu-user       # Arm NEON/SVE optimizer kernels: cross build + emulated tests (tests/cross)
  clang libclang-rt-14-dev              # the ASan+UBSan tree and the libFuzzer targets (tests/sanitize, tests/fuzz)
  clang-format-14                       # the C++/CUDA style (.clang-format), checked by lint.clang_format
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" >/dev/null || missing+=("$p")
done
sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

"$(dirname "$0")/python_env.sh" ensure
python="$("$(dirname "$0")/python_env.sh" path)/bin/python"

# cuDNN's C++ frontend (the CUDA backend's fused attention) is header-only and published on PyPI
# only: the wheel's include/ goes to /opt, at the version cmake/SoDependencies.cmake pins and looks for.
cfe_version=$(sed -n 's/^ *set(SO_CUDNN_FRONTEND_VERSION \([0-9.]*\)).*/\1/p' "$(dirname "$0")/../cmake/SoDependencies.cmake")
[ -n "$cfe_version" ] || { echo "install-deps: no SO_CUDNN_FRONTEND_VERSION in cmake/SoDependencies.cmake" >&2; exit 1; }
cfe_dir=/opt/cudnn-frontend-$cfe_version
if [ -x /usr/local/cuda/bin/nvcc ] && [ ! -f "$cfe_dir/include/cudnn_frontend.h" ]; then
  echo "install-deps: unpacking nvidia-cudnn-frontend $cfe_version into $cfe_dir"
  tmp=$(mktemp -d)
  "$python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: -d "$tmp" "nvidia-cudnn-frontend==$cfe_version"
  $sudo "$python" - "$tmp" "$cfe_dir" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("include/")])
PY
  rm -rf "$tmp"
fi
