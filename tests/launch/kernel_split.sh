#!/usr/bin/env bash
# jobs/local/kernel_split.py on a small nsys-shaped CSV and metrics file: kernels classed by name,
# per-step times, idle = wall - kernels; malformed inputs refused with one line and exit 1.
set -euo pipefail
python=${SO_PYTHON:?SO_PYTHON is not set: run under ctest, or set it to the interpreter scripts/python_env.sh makes}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/kern.csv" <<'CSV'
"Time (%)","Total Time (ns)","Instances","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Name"
60.0,4000000,8,500000,500000,400000,600000,1000,"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
20.0,1500000,4,375000,375000,300000,400000,1000,"cudnn_generated_fort_native_sdpa_sm90_flash_fprop"
10.0,500000,4,125000,125000,100000,150000,1000,"void so::cuda::rmsnorm_backward_rows_kernel<bf16, 8, 4>(...)"
CSV
for s in 1 2 3; do echo "{\"step\": $s, \"step_seconds\": 0.004}"; done > "$work/m.jsonl"
out=$("$python" jobs/local/kernel_split.py "$work/kern.csv" --metrics "$work/m.jsonl" --steps 2:3)
echo "$out"
grep -q "^| gemm | 2.00 | 66.7% | 50.0% |$" <<<"$out" || { echo "gemm row wrong"; exit 1; }
grep -q "^| attention | 0.75 | 25.0% | 18.8% |$" <<<"$out" || { echo "attention row wrong"; exit 1; }
grep -q "^| norm | 0.25 | 8.3% | 6.2% |$" <<<"$out" || { echo "norm row wrong"; exit 1; }
grep -q "^| idle (gaps, syncs, host work) | 1.00 | | 25.0% |$" <<<"$out" || { echo "idle row wrong"; exit 1; }
echo "not,a,profile" > "$work/bad.csv"
for args in "$work/bad.csv --metrics $work/m.jsonl --steps 2:3" "$work/kern.csv --metrics $work/m.jsonl --steps 2:9" \
            "$work/kern.csv --metrics $work/m.jsonl --steps 3:2"; do
  # shellcheck disable=SC2086
  if err=$("$python" jobs/local/kernel_split.py $args 2>&1); then echo "accepted: $args"; exit 1; fi
  [ "$(wc -l <<<"$err")" -eq 1 ] && grep -q "^kernel_split: " <<<"$err" || { echo "not one error line: $err"; exit 1; }
done
echo "kernel split ok"
