#!/usr/bin/env bash
# A monitor whose files stop taking writes mid-run (here: a file-size limit, the effect of a full
# disk, EFBIG instead of ENOSPC) is reported once and training goes on to its last step: the
# TensorBoard event file (what was written before stays readable by TensorBoard), then the
# csv_monitor files.
# usage: monitor_disk_full.sh SO_TRAIN PYTHON WORK_DIR
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
echo "$out" | grep "^done: 8 steps" >/dev/null || { echo "FAIL: the run did not finish its 8 steps"; exit 1; }
"$python" - "$dir/DeepSpeedJobName" <<'PY' || exit 1
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
ea = EventAccumulator(sys.argv[1]); ea.Reload()
steps = [e.step for e in ea.Scalars("train/loss")]
assert steps and steps == list(range(1, len(steps) + 1)) and len(steps) < 8, steps
print(f"steps {steps} readable before the write failed")
PY

# csv_monitor: 60 steps of rows pass 1 KiB.
rm -rf "$dir/csv"
out=$(export PMIX_MCA_gds=hash; trap '' XFSZ; ulimit -f 1; "$so_train" --config configs/runs/tiny-demo.json --steps 60 \
        --set data.seq_len=32 --set "csv_monitor={\"enabled\": true, \"output_path\": \"$dir/csv\"}" 2>&1)
rc=$?
echo "$out" | grep -E "csv_monitor|^done"
[ $rc -eq 0 ] || { echo "FAIL: so_train exited $rc"; exit 1; }
warnings=$(echo "$out" | grep -c "csv_monitor: writing to .* failed; no more CSV rows are written, training goes on")
[ "$warnings" -eq 1 ] || { echo "FAIL: $warnings csv_monitor failure reports, want 1"; exit 1; }
echo "$out" | grep "^done: 60 steps" >/dev/null || { echo "FAIL: the run did not finish its 60 steps"; exit 1; }
echo "monitors on a full disk ok"
