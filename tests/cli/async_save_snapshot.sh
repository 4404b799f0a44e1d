#!/usr/bin/env bash
# Asynchronous saves hold the state of the step that saved: 8 steps saving at steps 4 and 8,
# once synchronously and once asynchronously with a writer slowed down (SO_CKPT_TEST_WRITER_DELAY)
# so that the steps after step 4 overtake it and copy buckets aside, some while it writes them, and
# clipping on every step, so that the CPU optimizer redoes the saving step's buckets while the
# writer may already want them.
# Losses and every tensor of both checkpoints must be identical bit for bit.
# usage: async_save_snapshot.sh SO_TRAIN WORKDIR [--set key=value ...]
set -euo pipefail
source "$(dirname "$0")/bit_exact_runs.sh"
common=("${tiny_run[@]}" --set gradient_clipping=0.05 --steps 8 --save-every 4 --keep 3 "$@")
"$so_train" "${common[@]}" --async-save off --save-dir "$work/sync" --metrics "$work/sync.jsonl" >/dev/null
SO_CKPT_TEST_WRITER_DELAY=0.02 "$so_train" "${common[@]}" --async-save on --save-dir "$work/async" \
  --metrics "$work/async.jsonl" >/dev/null
"$python" - "$work/sync.jsonl" "$work/async.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:3])
assert len(a) == 8 and a == b, f"losses differ:\n sync  {a}\n async {b}"
PY
for step in 00000004 00000008; do
  same_tensors "$work/sync/step-$step.h5" "$work/async/step-$step.h5" "step $step"
done
echo "async save snapshot: losses and all tensors of both checkpoints identical"
