# shellcheck shell=bash
# The body of the GH200 sbatch templates (gh200-*.sbatch source it; it is not run on its own).
# One rank per GH200 (4 per node); so_train binds each rank to its GPU's Grace and splits that
# Grace's cores between compute and GraceAdam itself, so srun places nothing (--cpu-bind=none).
#
#   sbatch jobs/slurm/gh200-2node.sbatch CONFIG [so_train args...]            # from the checkout
#   jobs/slurm/gh200-2node.sbatch --dry-run CONFIG [so_train args...]         # print the commands
#
# Settings (environment): SO_TRAIN (the binary; default build/launcher/so_train), SO_RUN_DIR (default
# runs/<job name>-<job id>: logs/ and checkpoints/), SO_TRACE=1 (a per-rank Chrome trace in logs/),
# SO_MPAM=1 (partition each Grace with MPAM first: jobs/slurm/mpam-setup.sh, needs root),
# SO_GPUS_PER_NODE (default 4), SO_SITE_ENV (a file sourced last: the site's network settings).
set -euo pipefail

dry=0
if [ "${1:-}" = "--dry-run" ]; then dry=1; shift; fi
[ $# -ge 1 ] || { echo "usage: [sbatch] $0 [--dry-run] CONFIG [so_train args...]" >&2; exit 2; }
config=$1; shift

nodes=${SLURM_JOB_NUM_NODES:-${SO_NODES:-}}
[ -n "$nodes" ] || { echo "$0: how many nodes? submit with sbatch --nodes=N (a dry run: SLURM_JOB_NUM_NODES=N)" >&2; exit 2; }
per_node=${SO_GPUS_PER_NODE:-4}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
so_train=${SO_TRAIN:-$root/build/launcher/so_train}
run_dir=${SO_RUN_DIR:-$root/runs/${SLURM_JOB_NAME:-so_train}-${SLURM_JOB_ID:-dry-run}}

# so_train sizes its own pools (BLAS, GraceAdam) from the cores it binds to: no OpenMP runtime
# of any library should start another.
export OMP_NUM_THREADS=1
# Compute, D2H, H2D and comm streams must overlap; Megatron's habitual 1 would serialise them.
export CUDA_DEVICE_MAX_CONNECTIONS=8
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
# The network (NCCL over InfiniBand or, on Slingshot, the aws-ofi-nccl plugin with FI_PROVIDER=cxi)
# is the site's business: set it in SO_SITE_ENV.
# shellcheck source=/dev/null
if [ -n "${SO_SITE_ENV:-}" ]; then source "$SO_SITE_ENV"; fi

args=(--config "$config" --metrics "$run_dir/logs/metrics.jsonl")
if [ "${SO_TRACE:-0}" = 1 ]; then args+=(--trace "$run_dir/logs/trace.json"); fi
# Every rank's output in one file, each line tagged with its rank; a failing rank ends the step.
cmd=(srun --mpi=pmix --nodes="$nodes" --ntasks=$((nodes * per_node)) --ntasks-per-node="$per_node" --cpu-bind=none
     --kill-on-bad-exit=1 --label --output="$run_dir/logs/so_train.log" "$so_train" "${args[@]}" "$@")
mpam=(srun --nodes="$nodes" --ntasks-per-node=1 "$root/jobs/slurm/mpam-setup.sh")

if [ $dry -eq 1 ]; then
  echo "# run dir: $run_dir (logs/, checkpoints/)"
  echo "export OMP_NUM_THREADS=$OMP_NUM_THREADS CUDA_DEVICE_MAX_CONNECTIONS=$CUDA_DEVICE_MAX_CONNECTIONS NCCL_DEBUG=$NCCL_DEBUG"
  if [ "${SO_MPAM:-0}" = 1 ]; then printf '%q ' "${mpam[@]}"; echo; fi
  printf '%q ' "${cmd[@]}"; echo
  exit 0
fi
# checkpoints/ waits for so_train's checkpoint option; logs/ gets the output, metrics and traces.
mkdir -p "$run_dir/logs" "$run_dir/checkpoints"
echo "so_train on $nodes node(s) x $per_node GH200: $run_dir"
if [ "${SO_MPAM:-0}" = 1 ]; then "${mpam[@]}"; fi
"${cmd[@]}"
