#!/usr/bin/env bash
# same_losses.sh SO_TRAIN CONFIG: two runs of the same config print identical losses, and the
# loss falls between the first and the last step.
set -eu
python=${SO_PYTHON:?SO_PYTHON is not set: run under ctest, or set it to the interpreter scripts/python_env.sh makes}
so_train=$1; config=$2; dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
for run in a b; do
  "$so_train" --config "$config" --steps 12 --set train_micro_batch_size_per_gpu=4 --set data.seq_len=64 \
    --metrics "$dir/$run.jsonl" > "$dir/$run.out"
done
"$python" - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
runs = [[json.loads(l)["loss"] for l in open(f"{d}/{r}.jsonl")] for r in "ab"]
assert len(runs[0]) == 12, runs
assert runs[0] == runs[1], f"losses differ between identical runs: {runs}"
assert runs[0][-1] < runs[0][0], f"loss did not fall: {runs[0]}"
print(f"identical losses over 12 steps; {runs[0][0]:.4f} -> {runs[0][-1]:.4f}")
PY
