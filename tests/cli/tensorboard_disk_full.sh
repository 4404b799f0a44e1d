#!/usr/bin/env bash
# A TensorBoard event file that stops taking writes mid-run (here: a 2 KiB file-size limit, the
# effect of a full disk, EFBIG instead of ENOSPC) is reported once and training goes on to its last
# step; what was written before stays readable by TensorBoard.
# usage: tensorboard_disk_full.sh SO_TRAIN PYTHON WORK_DIR
set -uo pipefail
so_train=$1 python=$2 dir=$3
rm -rf "$dir" && mkdir -p "$dir"
# Ignored, SIGXFSZ lets the write past the limit fail with EFBIG rather than kill the process; the
# limit applies to regular files only (the log goes to a pipe). PMIx's hash store keeps MPI's
# start-up off the files it would otherwise write (its ds21 store's lock files).
out=$(export PMIX_MCA_gds=hash; trap '' XFSZ; ulimit -f 2; "$so_train" --config configs/runs/tiny-demo.json --steps 8 --set data.seq_len=32 \
        --tensorboard "$dir" 2>&1)
rc=$?
echo "$out" | grep -E "tensorboard|^done"
[ $rc -eq 0 ] || { echo "FAIL: so_train exited $rc"; exit 1; }
warnings=$(echo "$out" | grep -c "tensorboard: writing .* failed (File too large); no more TensorBoard events are written, training goes on")
[ "$warnings" -eq 1 ] || { echo "FAIL: $warnings failure reports, want 1"; exit 1; }
echo "$out" | grep -q "^done: 8 steps" || { echo "FAIL: the run did not finish its 8 steps"; exit 1; }
"$python" - "$dir/DeepSpeedJobName" <<'PY' || exit 1
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
ea = EventAccumulator(sys.argv[1]); ea.Reload()
steps = [e.step for e in ea.Scalars("train/loss")]
assert steps and steps == list(range(1, len(steps) + 1)) and len(steps) < 8, steps
print(f"steps {steps} readable before the write failed")
PY
echo "tensorboard disk full ok"
