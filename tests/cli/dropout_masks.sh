#!/usr/bin/env bash
# dropout_masks.sh residual|attention SO_TRAIN [MPIEXEC]: Seed-OSS's residual or attention dropout
# (the save_pretrained model seed_oss_tied_fp32, residual_dropout or attention_dropout 0.1 through
# model.override) draws the same masks however the step is computed. Three steps each, losses
# compared:
#   without MPIEXEC: activation recompute equals the plain run bitwise, the tiled MLP to fp32
#   round-off; p = 1e-9 (every value kept, scale 1) runs the dropout path and equals p = 0 (the
#   path without dropout) to round-off; p = 0.1 changes the losses (the masks do something).
#   with MPIEXEC: two Ulysses ranks (each half of every sequence, then half the heads in
#   attention) equal one rank to round-off.
set -eu
python=${SO_PYTHON:?SO_PYTHON is not set: run under ctest, or set it to the interpreter scripts/python_env.sh makes}
kind=$1; so_train=$2; mpiexec=${3:-}; dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
case "$kind" in residual|attention) ;; *) echo "dropout_masks.sh: kind '$kind' is not residual or attention" >&2; exit 2;; esac
run() {  # run NAME [launcher...] -- [so_train settings...]
  local name=$1; shift
  local launcher=()
  while [ "$1" != "--" ]; do launcher+=("$1"); shift; done
  shift
  "${launcher[@]}" "$so_train" --config tests/cli/configs/hf_dir_train.json \
    --set model.hf_dir=tests/reference/hf_models/seed_oss_tied_fp32 --set train_micro_batch_size_per_gpu=2 \
    --metrics "$dir/$name.jsonl" "$@" > "$dir/$name.out" 2>&1 || { cat "$dir/$name.out"; exit 1; }
}
key=model.override.${kind}_dropout
p=--set=$key=0.1
if [ -z "$mpiexec" ]; then
  run plain -- $p
  run recompute -- $p --set train.activation_checkpointing=true
  run tiled -- $p --set train.mlp_tile_tokens=16
  run none -- --set $key=0
  run tiny -- --set $key=1e-9
  checks="recompute=plain:0 tiled=plain:2e-6 tiny=none:2e-6 plain!none"
else
  run plain -- $p
  run sp2 "$mpiexec" --oversubscribe -np 2 -- $p --set sequence_parallel_size=2
  checks="sp2=plain:2e-6"
fi
"$python" - "$dir" $checks <<'PY'
import json, sys
d = sys.argv[1]
loss = lambda r: [json.loads(l)["loss"] for l in open(f"{d}/{r}.jsonl")]
for check in sys.argv[2:]:
    if "!" in check:
        a, b = check.split("!")
        la, lb = loss(a), loss(b)
        assert len(la) == 3 and max(abs(x - y) for x, y in zip(la, lb)) > 1e-4, f"{a} {la} ~ {b} {lb}: dropout changed nothing"
        print(f"{a} differs from {b}: {la} vs {lb}")
        continue
    pair, tol = check.split(":")
    a, b = pair.split("=")
    la, lb = loss(a), loss(b)
    assert len(la) == 3 and len(lb) == 3, (la, lb)
    worst = max(abs(x - y) / abs(y) for x, y in zip(la, lb))
    assert worst <= float(tol), f"{a} {la} != {b} {lb} (worst relative {worst:.3g} > {tol})"
    print(f"{a} = {b}: {la} (worst relative difference {worst:.3g}, allowed {tol})")
PY
