#!/usr/bin/env bash
# so_train's Hugging Face export loads in PyPI transformers and gives so_train's loss on the same
# tokens (within 1e-5 relative). Skipped (exit 77) where python3 cannot import torch and
# transformers: CI does not install them.
#   hf_interop.sh EXPORTER OUT_DIR      (EXPORTER: the export_hf_for_test binary)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if ! python3 -c "import torch, transformers" 2>/dev/null; then
  echo "SKIPPED: python3 cannot import torch and transformers (PyPI); the interop check needs them"
  exit 77
fi
rm -rf "$2"
mkdir -p "$2"
"$1" "$here/hf_models" "$2"
python3 "$here/check_hf_export.py" "$2/manifest.json" --rtol 1e-5
