#!/usr/bin/env bash
# aux_loss_dp.sh SO_TRAIN MPIEXEC: the load-balancing loss is per micro-batch and per data-parallel
# rank (as transformers computes it), the step's loss their mean: two data-parallel ranks with one
# micro-batch each train to the losses of one rank accumulating the same two micro-batches (to fp32
# round-off over 3 steps); router_aux_loss_coef 0 changes them (the aux loss does something).
set -eu
python=${SO_PYTHON:?SO_PYTHON is not set: run under ctest, or set it to the interpreter scripts/python_env.sh makes}
so_train=$1; mpiexec=$2; dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
run() {  # run NAME COEF [launcher...] -- [settings...]
  local name=$1 coef=$2; shift 2
  local launcher=()
  while [ "$1" != "--" ]; do launcher+=("$1"); shift; done
  shift
  "${launcher[@]}" "$so_train" --config tests/cli/configs/hf_dir_train.json \
    --set model.hf_dir=tests/reference/hf_models/qwen3_moe_untied_bf16 --set model.override.output_router_logits=true \
    --set model.override.router_aux_loss_coef="$coef" --data data/corpus/austen.txt --seq-len 32 \
    --set train_micro_batch_size_per_gpu=1 --steps 3 --metrics "$dir/$name.jsonl" "$@" > "$dir/$name.out" 2>&1 ||
    { cat "$dir/$name.out"; exit 1; }
}
run accumulated 0.5 -- --set gradient_accumulation_steps=2
run dp2 0.5 "$mpiexec" --oversubscribe -np 2 -- --set gradient_accumulation_steps=1
run no_aux 0 -- --set gradient_accumulation_steps=2
"$python" - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
loss = lambda r: [json.loads(l)["loss"] for l in open(f"{d}/{r}.jsonl")]
a, b, c = loss("accumulated"), loss("dp2"), loss("no_aux")
print("accumulated", a, "dp2", b, "coef 0", c)
assert len(a) == len(b) == 3 and all(abs(x - y) <= 2e-6 * abs(x) for x, y in zip(a, b)), (a, b)
assert all(abs(x - y) > 1e-3 for x, y in zip(a, c)), (a, c)
print("aux loss dp ok")
PY
