#!/usr/bin/env bash
# Installs the Debian packages so_train builds against. Idempotent and quiet when everything is
# already there. The CUDA toolkit is not a Debian package here: when /usr/local/cuda exists the
# build enables the CUDA backend by itself.
set -euo pipefail
packages=(
  build-essential cmake pkg-config python3
  libopenmpi-dev openmpi-bin            # MPI: launch, CPU-backend collectives, NCCL bootstrap
  libhwloc-dev libnuma-dev              # topology and NUMA-local placement
  libboost-program-options-dev          # command line
  libhdf5-openmpi-dev hdf5-tools        # parallel HDF5: checkpoints, fixtures, token datasets
  libopenblas-pthread-dev               # CPU GEMM; pthread build chosen on purpose (see cmake/SoDependencies.cmake)
  nlohmann-json3-dev libgtest-dev googletest
  python3-h5py python3-numpy            # checkpoint interop test (h5py reads so_train checkpoints)
  python3-matplotlib                    # sweep plots (jobs/sweeps/sweep.py gather)
  g++-aarch64-linux-gnu qemu-user       # Arm NEON/SVE optimizer kernels: cross build + emulated tests (tests/cross)
  clang libclang-rt-14-dev              # the ASan+UBSan tree and the libFuzzer targets (tests/sanitize, tests/fuzz)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}"
sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
