#!/usr/bin/env bash
# mxfp4_bad_input.sh SO_TRAIN: broken copies of the MXFP4 model directory (hf_models/gpt_oss_mxfp4)
# are refused, naming the tensor, before the engine allocates anything (the "rank"/"weights"
# lines never appear): blocks of the wrong size, an E8M0 scale of 255 (NaN), missing scales, F32
# blocks, and a quantization_config other than mxfp4.
set -eu
python=${SO_PYTHON:?SO_PYTHON is not set: run under ctest, or set it to the interpreter scripts/python_env.sh makes}
so_train=$1; dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
src=tests/reference/hf_models/gpt_oss_mxfp4
# case NAME PYTHON_EDIT EXPECTED_REGEX: the edit gets `t` (the tensors, by name) and `cfg` (config.json).
case_() {
  local name=$1 edit=$2 expected=$3
  mkdir -p "$dir/$name" && cp "$src"/* "$dir/$name"/
  "$python" - "$dir/$name" "$edit" <<'PY'
import json, sys
import torch
from safetensors.torch import load_file, save_file
d, edit = sys.argv[1], sys.argv[2]
t = load_file(f"{d}/model.safetensors")
cfg = json.load(open(f"{d}/config.json"))
exec(edit)
save_file(t, f"{d}/model.safetensors", metadata={"format": "pt"})
json.dump(cfg, open(f"{d}/config.json", "w"))
PY
  if "$so_train" --config tests/cli/configs/hf_dir_train.json --set model.hf_dir="$dir/$name" > "$dir/$name.out" 2>&1; then
    echo "FAIL $name: so_train accepted it"; cat "$dir/$name.out"; exit 1
  fi
  grep -Eq "$expected" "$dir/$name.out" || { echo "FAIL $name: no '$expected' in:"; cat "$dir/$name.out"; exit 1; }
  if grep -q "weights loaded\|^step " "$dir/$name.out"; then echo "FAIL $name: refused too late"; exit 1; fi
  echo "ok $name"
}
b=model.layers.1.mlp.experts.down_proj
case_ blocks_size "t['$b""_blocks'] = t['$b""_blocks'][:, :, :, :8].contiguous()" \
  "tensor '$b""_blocks' in '.*' has shape \[4, 64, 2, 8\] \(U8\); config.json needs \[4, 64, 2, 16\]"
case_ scale_nan "t['$b""_scales'][2, 5, 1] = 255" \
  "tensor '$b""_scales': MXFP4 scale 255 at row 133, block 1 is out of range"
case_ scales_missing "del t['$b""_scales']" "tensor '$b""_scales' \[4, 64, 2\] is missing"
case_ blocks_f32 "t['$b""_blocks'] = t['$b""_blocks'].float()" "tensor '$b""_blocks' in '.*' is F32; MXFP4 \(quantization_config\) stores U8"
case_ other_method "cfg['quantization_config'] = {'quant_method': 'fp8'}" \
  "quantization_config.*so_train reads \{\"quant_method\": \"mxfp4\"\}"
echo "mxfp4 bad input refused"
