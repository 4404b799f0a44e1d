#!/usr/bin/env bash
# jobs_dry_run.sh: every job script parses (bash -n); each GH200 template's dry run prints the srun
# line it would run: 4 ranks per node, no srun binding (so_train binds itself), the config and
# so_train arguments passed through, metrics under the run's logs/; MPAM only when asked for.
set -u
fail() { echo "FAIL: $*"; exit 1; }
unset SLURM_JOB_NUM_NODES SLURM_JOB_ID SLURM_JOB_NAME SO_MPAM SO_TRACE SO_RUN_DIR
for f in jobs/local/*.sh jobs/slurm/*.sh jobs/slurm/*.sbatch; do bash -n "$f" || fail "$f does not parse"; done

check() {  # check NODES SCRIPT
  local out
  out=$("$2" --dry-run configs/runs/tiny-demo.json --steps 5) || fail "$2 --dry-run exited $?"
  echo "$out"
  printf '%s\n' "$out" | grep -qE "^srun --mpi=pmix --nodes=$1 --ntasks=$((4 * $1)) --ntasks-per-node=4 --cpu-bind=none .*/so_train --config configs/runs/tiny-demo.json --metrics [^ ]+/logs/metrics.jsonl --steps 5 ?$" ||
    fail "$2: unexpected command"
  if printf '%s\n' "$out" | grep -q mpam-setup; then fail "$2: MPAM set up without SO_MPAM=1"; fi
}
check 1 jobs/slurm/gh200-1node.sbatch
check 2 jobs/slurm/gh200-2node.sbatch
check 4 jobs/slurm/gh200-4node.sbatch
SLURM_JOB_NUM_NODES=16 check 16 jobs/slurm/gh200-Nnode.sbatch
SLURM_JOB_NUM_NODES=3 check 3 jobs/slurm/gh200-2node.sbatch  # sbatch --nodes=3 wins over the template's 2
if jobs/slurm/gh200-Nnode.sbatch --dry-run configs/runs/tiny-demo.json 2>/dev/null; then fail "gh200-Nnode ran without a node count"; fi

out=$(SO_MPAM=1 SO_TRACE=1 jobs/slurm/gh200-2node.sbatch --dry-run configs/runs/tiny-demo.json) || fail "SO_MPAM=1 dry run"
printf '%s\n' "$out" | grep -qE "^srun --nodes=2 --ntasks-per-node=1 .*/jobs/slurm/mpam-setup.sh" || fail "no MPAM step"
printf '%s\n' "$out" | grep -qE -- "--trace [^ ]+/logs/trace.json" || fail "SO_TRACE=1 passes no --trace"
out=$(jobs/slurm/mpam-setup.sh --dry-run) || fail "mpam-setup.sh --dry-run"
echo "$out"
printf '%s\n' "$out" | grep -qE "^echo [0-9,]+ > /sys/fs/resctrl/p1/cpus_list" || fail "mpam: no p1 cpus_list"
printf '%s\n' "$out" | grep -qF "'MB:1=20' 'L3:1=f' > /sys/fs/resctrl/p2/schemata" || fail "mpam: not the seeds' p2 schemata"

jobs/local/train.sh --dry-run 2 configs/runs/tiny-demo.json --steps 5 | grep -qE "^mpirun .*--bind-to none -np 2 .*so_train --config configs/runs/tiny-demo.json --steps 5" ||
  fail "jobs/local/train.sh"
echo "ok"
