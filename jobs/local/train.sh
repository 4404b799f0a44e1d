#!/usr/bin/env bash
# Local launcher: jobs/local/train.sh NRANKS CONFIG [so_train args...]
# Runs so_train under mpirun on this node. --dry-run prints the command instead of running it.
# SO_TRAIN: the binary (default build/launcher/so_train).
# mpirun places nothing (--bind-to none): so_train binds each rank itself (docs/launching.md).
set -euo pipefail
dry=0
if [ "${1:-}" = "--dry-run" ]; then dry=1; shift; fi
[ $# -ge 2 ] || { echo "usage: $0 [--dry-run] NRANKS CONFIG [so_train args...]" >&2; exit 2; }
nranks=$1; config=$2; shift 2
root=$(cd "$(dirname "$0")/../.." && pwd)
extra=()
[ "$(id -u)" -eq 0 ] && extra+=(--allow-run-as-root)
[ "$nranks" -gt "$(nproc)" ] && extra+=(--oversubscribe)
cmd=(mpirun "${extra[@]}" --bind-to none -np "$nranks" "${SO_TRAIN:-$root/build/launcher/so_train}" --config "$config" "$@")
if [ $dry -eq 1 ]; then printf '%q ' "${cmd[@]}"; echo; else exec "${cmd[@]}"; fi
