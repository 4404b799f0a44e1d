#!/usr/bin/env bash
# The user's path from training to Hugging Face: so_train starts from a save_pretrained directory,
# trains two steps and checkpoints; `so_ckpt export --hf` turns the checkpoint into a model
# directory (fp32 in one file, bf16 sharded); PyPI transformers loads each export and gives the
# loss so_train computes on the same tokens when it starts from that export (within 1e-5
# relative). Python is the project's environment ($SO_PYTHON, set by ctest).
#   hf_interop.sh SO_TRAIN SO_CKPT OUT_DIR
set -euo pipefail
so_train=$1 so_ckpt=$2 out=$3
here=$(cd "$(dirname "$0")" && pwd)
python=${SO_PYTHON:?SO_PYTHON is not set: run under ctest, or set it to the interpreter scripts/python_env.sh makes}
rm -rf "$out"
mkdir -p "$out"
config=tests/cli/configs/hf_dir_train.json  # one window of hf_models/tokens.sotokens
tokens=$("$python" -c "import json; print(json.load(open('$here/hf_models/reference.json'))['tokens'])")

# First-step loss (before any update) of so_train started from model directory $1.
first_loss() {
  rm -f "$out/metrics.jsonl"  # so_train appends to a metrics file
  "$so_train" --config "$config" --set model.hf_dir="$1" --steps 1 --metrics "$out/metrics.jsonl" > /dev/null
  "$python" -c "import json; print(json.loads(open('$out/metrics.jsonl').readline())['loss'])"
}

exports=()
for model in llama_untied_fp32 qwen3_tied_bf16 qwen2_untied_bf16 mistral_untied_fp32 phi3_untied_bf16 \
             seed_oss_tied_fp32 qwen3_moe_untied_bf16 gpt_oss_untied_bf16; do
  "$so_train" --config "$config" --set model.hf_dir="$here/hf_models/$model" --steps 2 \
    --save-dir "$out/$model-ckpt" --save-every 2 > /dev/null
  for variant in "fp32 0" "bf16 100000"; do
    read -r dtype shard <<< "$variant"
    dir=${model}_$dtype
    "$so_ckpt" export --hf "$out/$dir" --dtype "$dtype" --max-shard-size "$shard" "$out/$model-ckpt"
    loss=$(first_loss "$out/$dir")
    echo "$dir: so_train loss $loss"
    exports+=("{\"dir\": \"$dir\", \"loss\": $loss}")
  done
done
(IFS=,; echo "{\"tokens\": $tokens, \"exports\": [${exports[*]}]}") > "$out/manifest.json"
"$python" "$here/check_hf_export.py" "$out/manifest.json" --rtol 1e-5
