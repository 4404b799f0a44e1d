#!/usr/bin/env bash
# One fine-tuning command, the public SuperOffload example's flow for any supported model directory:
# prepare the data with the model's tokenizer -> train with a DeepSpeed config -> export to Hugging
# Face format (weights, config, tokenizer files). docs/finetuning.md.
#
#   jobs/local/finetune.sh [--ranks N] [--epochs E] [--dry-run] MODEL_DIR DATA DS_CONFIG OUT_DIR \
#       [prepare_data.py options...] [-- so_train options...]
#
# OUT_DIR receives data.h5, checkpoints/, metrics.jsonl and hf/. --epochs (default 1) sets
# train.num_train_epochs unless the config gives train.steps. SO_PYTHON: the Python that runs
# scripts/prepare_data.py (default: the project's environment, scripts/python_env.sh path, which
# scripts/install-deps.sh makes); SO_TRAIN, SO_CKPT: the binaries (default build/launcher/);
# SO_EXPORT_DTYPE: bf16 (default) or fp32.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
ranks=1 epochs=1 dry=0
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks) ranks=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    *) break ;;
  esac
done
[ $# -ge 4 ] || { echo "usage: $0 [--ranks N] [--epochs E] [--dry-run] MODEL_DIR DATA DS_CONFIG OUT_DIR [prepare options] [-- so_train options]" >&2; exit 2; }
model=$1 data=$2 config=$3 out=$4; shift 4
prepare=() train=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do prepare+=("$1"); shift; done
[ $# -gt 0 ] && shift
train=("$@")
python=${SO_PYTHON:-$("$root/scripts/python_env.sh" path)/bin/python}
if [ $dry -eq 0 ] && [ ! -x "$python" ]; then
  echo "$0: no Python at $python: run scripts/install-deps.sh (it makes the project's environment) or set SO_PYTHON" >&2
  exit 2
fi
so_train=${SO_TRAIN:-$root/build/launcher/so_train}
so_ckpt=${SO_CKPT:-$root/build/launcher/so_ckpt}

run() { if [ $dry -eq 1 ]; then printf '%q ' "$@"; echo; else "$@"; fi; }
launch=()
if [ "$ranks" -gt 1 ]; then
  launch=(mpirun --bind-to none -np "$ranks")
  [ "$(id -u)" -eq 0 ] && launch+=(--allow-run-as-root)
  [ "$ranks" -gt "$(nproc)" ] && launch+=(--oversubscribe)
fi
[ $dry -eq 1 ] || mkdir -p "$out"
run "$python" "$root/scripts/prepare_data.py" \
  --model-dir "$model" --input "$data" --out "$out/data.h5" "${prepare[@]}"
run "${launch[@]}" "$so_train" --config "$config" --model "$model" --data "$out/data.h5" \
  --set "train.num_train_epochs=$epochs" --save-dir "$out/checkpoints" --save-at-end \
  --metrics "$out/metrics.jsonl" "${train[@]}"
run "$so_ckpt" export --hf "$out/hf" --dtype "${SO_EXPORT_DTYPE:-bf16}" "$out/checkpoints"
# The exported directory is a model transformers loads with its tokenizer.
for f in tokenizer.json tokenizer_config.json chat_template.jinja special_tokens_map.json generation_config.json; do
  [ -f "$model/$f" ] && run cp "$model/$f" "$out/hf/"
done
echo "fine-tuned model: $out/hf"
