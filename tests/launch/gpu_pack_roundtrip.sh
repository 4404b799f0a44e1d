#!/usr/bin/env bash
# gpu_pack_roundtrip.sh BUILD_DIR: jobs/local/gpu_pack.sh packs the build; the stage runner unpacks
# it elsewhere (as on a GPU machine) and the bundle's own so_train runs with only the bundle's
# libraries and its relocated Open MPI: --help, and one rank under the bundle's mpirun printing its
# binding. (The GPU stages themselves need a GPU.)
set -euo pipefail
build=$(cd "$1" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$(cd "$(dirname "$0")/../.." && pwd)
SO_GPU_DIR=$work/carry/.gpu "$root/jobs/local/gpu_pack.sh" "$build"
cd "$work/carry"
export SO_BUNDLE_DIR=$work/bundle
proj=$(tar -xJOf .gpu/bundle.tar.xz ./PROJECT_PATH)
rel=${build#"$proj"/}
bin=$SO_BUNDLE_DIR$proj/$rel/launcher/so_train
bash .gpu/run.sh exec bash -c "ldd '$bin' | grep 'not found' && exit 1; '$bin' --help | head -1; mpirun -np 1 '$bin' --print-binding --bind none; echo \"OPAL_PREFIX=\$OPAL_PREFIX\""
