#!/usr/bin/env bash
# Bit-exact resume: 8 steps straight versus 4 steps, save, a new process resuming from the
# checkpoint for 4 more. Every loss and every tensor of the two step-8 checkpoints (master
# weights and both Adam moments) must be identical bit for bit.
# usage: resume_bit_exact.sh SO_TRAIN WORKDIR [--set key=value ...]
set -euo pipefail
python=${SO_PYTHON:?SO_PYTHON is not set: run under ctest, or set it to the interpreter scripts/python_env.sh makes}
so_train=$1 work=$2
shift 2
rm -rf "$work" && mkdir -p "$work"
# Two runs compared bit for bit: on a CUDA backend attention must be deterministic (not the default).
common=(--config configs/runs/tiny-demo.json --set data.seq_len=32 --set train_micro_batch_size_per_gpu=4
        --set backend.deterministic_attention=true
        --set steps_per_print=1 --set scheduler.params.warmup_num_steps=2 "$@")
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
for group in /model /optim/exp_avg /optim/exp_avg_sq; do
  h5diff -r "$work/straight/step-00000008.h5" "$work/split/step-00000008.h5" "$group" "$group" >/dev/null ||
    { echo "tensors under $group differ"; exit 1; }
done
echo "resume bit-exact: losses and all tensors identical"
