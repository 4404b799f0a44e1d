#!/usr/bin/env bash
# A monitor whose files stop taking writes mid-run (here: a file-size limit, the effect of a full
# disk, EFBIG instead of ENOSPC) is reported once and training goes on to its last step: the
# TensorBoard event file (what was written before stays readable by TensorBoard), then the
# csv_monitor files.
# usage: monitor_disk_full.sh SO_TRAIN PYTHON WORK_DIR
set -uo pipefail
so_train=$1 python=$2 dir=$3
rm -rf "$dir" && mkdir -p "$dir"
# full_disk_run KIB STEPS MONITOR REPORT ARGS...: so_train for STEPS steps with files limited to KIB
# KiB finishes them and reports MONITOR's failed write once (REPORT, a grep pattern).
# Ignored, SIGXFSZ lets the write past the limit fail with EFBIG rather than kill the process; the
# limit applies to regular files only (the log goes to a pipe). PMIx's hash store keeps MPI's
# start-up off the files it would otherwise write (its ds21 store's lock files).
full_disk_run() {
  local kib=$1 steps=$2 monitor=$3 report=$4 out rc warnings
  shift 4
  out=$(export PMIX_MCA_gds=hash; trap '' XFSZ; ulimit -f "$kib"
        "$so_train" --config configs/runs/tiny-demo.json --steps "$steps" --set data.seq_len=32 "$@" 2>&1)
  rc=$?
  echo "$out" | grep -E "$monitor|^done"
  [ $rc -eq 0 ] || { echo "FAIL: so_train exited $rc"; exit 1; }
  warnings=$(echo "$out" | grep -c "$report")
  [ "$warnings" -eq 1 ] || { echo "FAIL: $warnings $monitor failure reports, want 1"; exit 1; }
  echo "$out" | grep "^done: $steps steps" >/dev/null || { echo "FAIL: the run did not finish its $steps steps"; exit 1; }
}

full_disk_run 2 8 tensorboard \
  "tensorboard: writing .* failed (File too large); no more TensorBoard events are written, training goes on" \
  --tensorboard "$dir"
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
full_disk_run 1 60 csv_monitor "csv_monitor: writing to .* failed; no more CSV rows are written, training goes on" \
  --set "csv_monitor={\"enabled\": true, \"output_path\": \"$dir/csv\"}"
echo "monitors on a full disk ok"
