#!/usr/bin/env bash
# MPAM on one Grace-Hopper node, as the SuperOffload authors recommend (seeds: project page,
# "How to enable MPAM on Nvidia Superchips"): the cores that drive the GPU keep full memory
# bandwidth and most of the L3; the GraceAdam cores are throttled so that their streaming does
# not slow the GPU's feed. Needs root and an MPAM kernel (NVIDIA's NV-Kernels); run once per node
# (gh200-common.sh with SO_MPAM=1 does, through srun). Undo: rmdir /sys/fs/resctrl/p1 /sys/fs/resctrl/p2.
#
#   mpam-setup.sh [--dry-run] [COMPUTE_CORES]
#
# On every NUMA node with CPUs, the first COMPUTE_CORES cores (default 7) form partition p1 and
# the rest p2: with one rank per Grace (72 cores) and cpuadam_cores_perc 0.9 these are exactly
# so_train's compute (0-6) and optimizer (7-71) cores, as `so_train --print-binding` shows.
set -euo pipefail
dry=0
if [ "${1:-}" = "--dry-run" ]; then dry=1; shift; fi
compute=${1:-7}
resctrl=/sys/fs/resctrl

run() { if [ $dry -eq 1 ]; then echo "$*"; else eval "$*"; fi; }

if [ $dry -eq 0 ]; then
  [ "$(id -u)" -eq 0 ] || { echo "mpam-setup.sh: needs root (or a Slurm prolog)" >&2; exit 1; }
  for opt in CONFIG_ARM64_MPAM CONFIG_ACPI_MPAM CONFIG_ARM64_MPAM_DRIVER CONFIG_ARM64_MPAM_RESCTRL_FS; do
    grep -q "^$opt=y" "/boot/config-$(uname -r)" ||
      { echo "mpam-setup.sh: kernel $(uname -r) lacks $opt=y (install NVIDIA's NV-Kernels)" >&2; exit 1; }
  done
fi

# "0-3,8" -> "0 1 2 3 8"
expand() { local part; for part in ${1//,/ }; do seq -s ' ' "${part%-*}" "${part#*-}"; done | tr '\n' ' '; }
p1=() p2=()
for list in /sys/devices/system/node/node*/cpulist; do
  read -ra cpus <<<"$(expand "$(cat "$list")")"
  [ ${#cpus[@]} -gt 0 ] || continue  # GH200's HBM nodes have no CPUs
  p1+=("${cpus[@]:0:compute}")
  p2+=("${cpus[@]:compute}")
done
join() { local IFS=,; echo "$*"; }

# The seeds' schemata (MB: % of bandwidth, L3: way mask), for every domain the root group lists.
domains() { local line; line=$(grep "^ *$1:" "$resctrl/schemata" 2>/dev/null || echo "$1:1=0"); line=${line#*:};
            local d out=(); for d in ${line//;/ }; do out+=("${d%%=*}=$2"); done; local IFS=';'; echo "$1:${out[*]}"; }

mountpoint -q "$resctrl" || run mount -t resctrl resctrl "$resctrl"
run mkdir -p "$resctrl/p1" "$resctrl/p2"
run "echo $(join "${p1[@]}") > $resctrl/p1/cpus_list"
run "echo $(join "${p2[@]}") > $resctrl/p2/cpus_list"
run "printf '%s\n' '$(domains MB 100)' '$(domains L3 ff0)' > $resctrl/p1/schemata"
run "printf '%s\n' '$(domains MB 20)' '$(domains L3 f)' > $resctrl/p2/schemata"
