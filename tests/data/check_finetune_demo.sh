#!/usr/bin/env bash
# check_finetune_demo.sh WORK: jobs/local/finetune.sh on the shipped demo (jobs/local/finetune-demo)
# with a tiny model made here: prepare -> train (SuperOffload, ZeRO-3, 2 epochs, validation) ->
# export; the exported directory loads in transformers with its tokenizer, and the validation loss
# went down. SO_TRAIN, SO_CKPT, SO_PYTHON as for finetune.sh; finetune.sh's default Python (the
# project's environment, when SO_PYTHON is not set) is checked in a dry run.
set -euo pipefail
work=$1
rm -rf "$work" && mkdir -p "$work"
default_python="$(scripts/python_env.sh path)/bin/python"
# (The whole dry run is read before grep: grep -q stopping at its match would end finetune.sh by
# SIGPIPE, a failure under pipefail.)
dry_run=$(env -u SO_PYTHON jobs/local/finetune.sh --dry-run "$work/model" data.json ds.json "$work/out")
grep -q "^$(printf '%q' "$default_python") .*/scripts/prepare_data.py " <<<"$dry_run" ||
  { echo "finetune.sh does not default to the project's Python ($default_python)"; exit 1; }
SO_PYTHON=${SO_PYTHON:-$default_python}
export SO_PYTHON
"$SO_PYTHON" tests/data/make_chat_model.py "$work/model" >/dev/null
jobs/local/finetune.sh --epochs 2 "$work/model" jobs/local/finetune-demo/alpaca-demo.jsonl \
  jobs/local/finetune-demo/ds_config.json "$work/out" --max-length 256 --validation-fraction 0.125 -- --quiet
"$SO_PYTHON" - "$work/out" <<'PY'
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
out = sys.argv[1]
evals = [json.loads(l)["eval_loss"] for l in open(f"{out}/metrics.jsonl") if "eval_loss" in l]
tok = AutoTokenizer.from_pretrained(f"{out}/hf", local_files_only=True)
model = AutoModelForCausalLM.from_pretrained(f"{out}/hf", local_files_only=True)
ids = tok.apply_chat_template([{"role": "user", "content": "Who is Elinor?"}], add_generation_prompt=True,
                              return_tensors="pt", return_dict=True)["input_ids"]
with torch.no_grad():
    logits = model(ids).logits
assert torch.isfinite(logits).all(), "exported model gives non-finite logits"
assert len(evals) >= 2 and evals[-1] < evals[0], f"validation loss did not go down: {evals}"
print(f"finetune demo ok: validation loss {evals[0]:.4f} -> {evals[-1]:.4f}, exported model loads with its tokenizer")
PY
