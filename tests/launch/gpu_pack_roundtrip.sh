#!/usr/bin/env bash
# gpu_pack_roundtrip.sh BUILD_DIR: jobs/local/gpu_pack.sh packs the build (failing when the bundle
# and the tracked files would not fit the device tool's carry); the stage runner, run from a copy
# of the committed tree as on a GPU machine, finds the bundle's build both when the copy lands
# elsewhere and when it lands at the build machine's path, and the bundle's own so_train runs with
# only the bundle's libraries and its relocated Open MPI: --help, its CTest files, and one rank
# under the bundle's mpirun printing its binding. (The GPU stages themselves need a GPU.)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
rel=${build#"$root"/}
[ "$rel" != "$build" ] || { echo "gpu_pack_roundtrip.sh: the build $build is not under $root" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Packed through a link to the project, so that a copy can stand at the packed path afterwards.
ln -s "$root" "$work/proj"
SO_GPU_DIR=$work/gpu "$work/proj/jobs/local/gpu_pack.sh" "$work/proj/$rel"
rm "$work/proj"
export SO_BUNDLE_DIR=$work/bundle
bin=$work/proj/$rel/launcher/so_train
for lands in "$work/elsewhere" "$work/proj"; do
  echo "== the copy at $lands"
  mkdir -p "$lands"
  git -C "$root" archive HEAD | tar -x -C "$lands"
  cp -r "$work/gpu" "$lands/.gpu"
  out=$(cd "$lands" && bash .gpu/run.sh exec bash -c "ldd '$bin' | grep 'not found' && exit 1; '$bin' --help | head -1; ctest --test-dir '$work/proj/$rel' -N | tail -1; mpirun -np 1 '$bin' --print-binding --bind none; echo \"OPAL_PREFIX=\$OPAL_PREFIX\"")
  echo "$out"
  grep -q "^OPAL_PREFIX=$SO_BUNDLE_DIR/ompi$" <<<"$out"
  grep -q "^Total Tests: [1-9]" <<<"$out"
  [ "$lands" = "$work/proj" ] || rm "$work/proj"  # the link the stage runner made
done
echo "gpu pack roundtrip ok"
