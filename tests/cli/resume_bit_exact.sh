#!/usr/bin/env bash
# Bit-exact resume: 8 steps straight versus 4 steps, save, a new process resuming from the
# checkpoint for 4 more. Every loss and every tensor of the two step-8 checkpoints (master
# weights and both Adam moments) must be identical bit for bit.
# usage: resume_bit_exact.sh SO_TRAIN WORKDIR [--set key=value ...]
set -euo pipefail
source "$(dirname "$0")/bit_exact_runs.sh"
common=("${tiny_run[@]}" --set scheduler.params.warmup_num_steps=2 "$@")
"$so_train" "${common[@]}" --steps 8 --save-dir "$work/straight" --save-every 8 --metrics "$work/straight.jsonl" >/dev/null
"$so_train" "${common[@]}" --steps 4 --save-dir "$work/split" --save-every 4 --metrics "$work/split.jsonl" >/dev/null
"$so_train" "${common[@]}" --steps 8 --save-dir "$work/split" --save-every 4 --resume "$work/split" \
  --metrics "$work/split.jsonl" >/dev/null
"$python" - "$work/straight.jsonl" "$work/split.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
la, lb = [r["loss"] for r in a], [r["loss"] for r in b]
assert [r["step"] for r in b] == list(range(1, 9)), f"split run steps: {[r['step'] for r in b]}"
assert la == lb, f"losses differ:\n straight {la}\n resumed  {lb}"
print(f"losses identical over 8 steps: {lb[0]:.6f} -> {lb[-1]:.6f}")
PY
same_tensors "$work/straight/step-00000008.h5" "$work/split/step-00000008.h5" "step 8"
echo "resume bit-exact: losses and all tensors identical"
