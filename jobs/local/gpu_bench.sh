#!/usr/bin/env bash
# GPU validation and benchmarks on one GPU machine, in stages that each fit a 10-minute slot (for
# everything measured in one call of at most 8 minutes: jobs/local/gpu_measure.py):
#   jobs/local/gpu_bench.sh STAGE...      (run from anywhere; stages run in the order given)
# On a lent GPU machine without our libraries: jobs/local/gpu_pack.sh here, then
# `bash .gpu/run.sh STAGE...` there (jobs/local/gpu_stage.sh), which runs these stages but build.
# Stages:
#   build       configure + build so_train, so_bench and the gpu tests into $BUILD
#   tests-ops   ctest -L gpu, the op suite (test_cuda_ops, also under both attention kernels)
#   tests-model ctest -L gpu, the rest but the sanitizer: training, Transformers fixtures, casts
#   sanitizer   ctest gpu.memcheck and gpu.racecheck (compute-sanitizer over the quick op cases)
#   peaks       so_bench gpu-peaks: bf16 GEMM TFLOP/s vs nominal, device copy GB/s
#   ops         so_bench ops: every op at Llama-1B sizes as a fraction of the measured peaks,
#               attention at S = 4096, 16384, 131072 (D 64; then D 128 at 4096, 16384) with its
#               memory, through our flash kernels, cuDNN (atomic backward) and cuDNN deterministic
#   train-1b, train-3b   so_train (configs/runs/llama-{1b,3b}-seq4096.json: ~1.04B / ~2.92B
#               parameters, tied embeddings) with the optimizer on the device, ZeRO-Offload and
#               SuperOffload (ratio 1); tokens/s, TFLOP/s, MFU per step from so_train itself
#               (TRAIN_MODES picks among: none zero-offload superoffload)
#   peers-1b, peers-3b   bench/peers: transformers LlamaForCausalLM (fused AdamW) and FSDP2 with
#               CPUOffloadPolicy on the same shapes
#   probe-none, probe-super   the largest model that trains: the 3B shape with more and more
#               layers (PROBE_START, PROBE_STEP; a few steps each) until a run fails
#   long-512k   the 1.04B config at 524,288 tokens per step (configs/runs/llama-1b-512k.json:
#               checkpoints offloaded and the MLP tiled as the planner decides): its --plan, then
#               one step (STEPS_LONG, 1) with the measured device peak next to the planned one
#   profile-1b  the 1B config under nsys (steps 3..5 between cudaProfilerStart/Stop): the step's GPU
#               time split per op class and the idle time (jobs/local/kernel_split.py)
#   trace       SuperOffload trace (so_train --trace, checked) and so_bench step's exposed
#               optimizer time, ZeRO-Offload vs SuperOffload
#   summary     summary.md from whatever the other stages left
#   all         every stage above in order (longer than one slot)
# Results go to $OUT when set (the device machine's return folder), else results/gpu-bench.
# Environment: BUILD (build-gpu), STEPS (so_train steps, default: the configs' 30), CTEST_JOBS (4),
# CORES_PERC (cpuadam_cores_perc, 0.9), PROBE_START/PROBE_STEP/PROBE_MAX (layers: 28/8/400),
# PROBE_STEPS (3), SLOT_S (seconds a looping stage may use: 540).
set -uo pipefail
python=${SO_PYTHON:?SO_PYTHON is not set: run through .gpu/run.sh (gpu_stage.sh sets it) or set it to an interpreter with PyTorch}
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
build=${BUILD:-$root/build-gpu}
results=${OUT:-$root/results/gpu-bench}
mkdir -p "$results"
so_train=$build/launcher/so_train
so_bench=$build/bench/so_bench
cores_perc=${CORES_PERC:-0.9}
slot_s=${SLOT_S:-540}
steps_args=()
[ -n "${STEPS:-}" ] && steps_args=(--steps "$STEPS")
offload=zero_optimization.offload_optimizer

log() { echo "[gpu_bench $(date +%H:%M:%S)] $*" | tee -a "$results/stages.log"; }

# Runs a command with its output in $results/NAME.log (and on the terminal); records the exit.
run_logged() {
  local name=$1; shift
  log "$name: $*"
  "$@" 2>&1 | tee "$results/$name.log"
  local rc=${PIPESTATUS[0]}
  log "$name: exit $rc"
  return "$rc"
}

offload_set() {  # offload_set MODE -> so_train --set arguments for that optimizer placement
  case $1 in
    none) echo "--set $offload.device=none" ;;
    zero-offload) echo "--set $offload={\"device\":\"cpu\",\"pin_memory\":true,\"ratio\":1.0,\"cpuadam_cores_perc\":$cores_perc}" ;;
    superoffload) echo "--set $offload={\"device\":\"cpu\",\"pin_memory\":true,\"ratio\":1.0,\"super_offload\":true,\"cpuadam_cores_perc\":$cores_perc}" ;;
  esac
}

stage_build() {
  run_logged build bash -c "cmake -S '$root' -B '$build' -DCMAKE_BUILD_TYPE=Release -DSO_CUDA=ON >/dev/null &&
    cmake --build '$build' -j\$(nproc) --target so_train so_bench test_cuda_ops test_cuda_training test_cuda_cast test_reference"
}

stage_tests() {  # stage_tests NAME CTEST_SELECTION...
  local name=$1; shift
  run_logged "$name" ctest --test-dir "$build" -L gpu "$@" -j "${CTEST_JOBS:-4}" --output-on-failure --timeout 600 \
    --output-junit "$results/$name-junit.xml"
}

stage_sanitizer() {
  run_logged sanitizer ctest --test-dir "$build" -R 'gpu\.(memcheck|racecheck)' --output-on-failure
}

stage_peaks() { run_logged peaks "$so_bench" gpu-peaks; }

stage_ops() {
  rm -f "$results/ops.jsonl"
  run_logged ops "$so_bench" ops --json "$results/ops.jsonl"
  # Attention at head dim 128 too (the issue's targets: D 64 and 128), the same hidden size.
  run_logged ops-d128 "$so_bench" ops --heads 16 --kv-heads 4 --head-dim 128 --attn-seqs 4096,16384 \
    --json "$results/ops.jsonl"
}

stage_train() {  # stage_train 1b|3b
  local size=$1 mode
  for mode in ${TRAIN_MODES:-none zero-offload superoffload}; do
    rm -f "$results/train-$size-$mode.jsonl"
    # shellcheck disable=SC2046  # offload_set's words are separate arguments
    run_logged "train-$size-$mode" timeout 600 "$so_train" --config "configs/runs/llama-$size-seq4096.json" \
      "${steps_args[@]}" $(offload_set "$mode") --metrics "$results/train-$size-$mode.jsonl"
  done
}

stage_long() {  # one step of 512K tokens: the plan, then the run's measured peak against it
  run_logged long-512k-plan "$so_train" --config configs/runs/llama-1b-512k.json --plan || return 1
  rm -f "$results/long-512k.jsonl"
  run_logged long-512k timeout 600 "$so_train" --config configs/runs/llama-1b-512k.json --steps "${STEPS_LONG:-1}" \
    --metrics "$results/long-512k.jsonl"
}

stage_profile() {  # the 1B step's kernels by op class, from nsys over steps 3..5
  command -v nsys >/dev/null || { log "profile-1b: nsys not found (the CUDA toolkit's Nsight Systems)"; return 1; }
  rm -f "$results/profile-1b.jsonl" "$results/profile-1b.nsys-rep" "$results"/profile-1b_*.csv
  run_logged profile-1b-run nsys profile --capture-range=cudaProfilerApi --trace=cuda --sample=none --cpuctxsw=none \
    --force-overwrite=true -o "$results/profile-1b" "$so_train" --config configs/runs/llama-1b-seq4096.json \
    --steps 6 --profile-steps 3:5 --metrics "$results/profile-1b.jsonl" || return 1
  run_logged profile-1b-stats nsys stats --report cuda_gpu_kern_sum --format csv --output "$results/profile-1b" \
    "$results/profile-1b.nsys-rep" || return 1
  run_logged profile-1b "$python" jobs/local/kernel_split.py "$results/profile-1b_cuda_gpu_kern_sum.csv" \
    --metrics "$results/profile-1b.jsonl" --steps 3:5
}

peak_tflops() {  # the nominal peak so_bench gpu-peaks reported, for the peers' MFU (0: none)
  "$python" jobs/local/bench_json.py nominal-peak "$results/peaks.log" 2>/dev/null || echo 0
}

stage_peers() {  # stage_peers 1b|3b
  local size=$1 peak
  peak=$(peak_tflops)
  for peer in torch_train fsdp2_offload; do
    run_logged "peer-$size-$peer" timeout 600 "$python" bench/peers/$peer.py \
      --config "configs/runs/llama-$size-seq4096.json" --peak-tflops "$peak"
  done
}

# Grows num_hidden_layers on the 3B shape until a run fails (device or host memory), each run a few
# steps; stops at the slot's budget and says where to resume.
stage_probe() {  # stage_probe none|superoffload
  local mode=$1 layers=${PROBE_START:-28} t0=$SECONDS out="$results/probe-$1.txt"
  echo "# mode $mode: layers, parameters, result (3B shape: hidden 3072, 24/8 heads, intermediate 8192)" >> "$out"
  while [ "$layers" -le "${PROBE_MAX:-400}" ]; do
    if [ $((SECONDS - t0)) -gt "$slot_s" ]; then
      log "probe-$mode: slot used up; resume with PROBE_START=$layers"
      echo "$layers  (not tried: slot used up; resume with PROBE_START=$layers)" >> "$out"
      return 0
    fi
    # shellcheck disable=SC2046
    timeout 420 "$so_train" --config configs/runs/llama-3b-seq4096.json --steps "${PROBE_STEPS:-3}" \
      --set model.inline.num_hidden_layers="$layers" $(offload_set "$mode") > "$results/probe-$mode-$layers.log" 2>&1
    local rc=$? params last
    params=$(grep -o '[0-9.]*M parameters' "$results/probe-$mode-$layers.log" | head -1)
    if [ $rc -eq 0 ]; then
      last=$(grep '^step' "$results/probe-$mode-$layers.log" | tail -1 | grep -o 'MFU [0-9.]*%\|mem .*')
      echo "$layers  $params  ok: $last" >> "$out"
      log "probe-$mode: $layers layers ($params) trained"
    else
      last=$(grep -i 'error\|out of memory\|killed' "$results/probe-$mode-$layers.log" | tail -1)
      [ -z "$last" ] && last="exit $rc$([ $rc -eq 137 ] && echo ' (killed: host memory?)')$([ $rc -eq 124 ] && echo ' (timeout)')"
      echo "$layers  $params  FAILED: $last" >> "$out"
      log "probe-$mode: $layers layers failed: $last"
      return 0
    fi
    layers=$((layers + ${PROBE_STEP:-8}))
  done
}

stage_trace() {
  # shellcheck disable=SC2046
  run_logged trace-superoffload-1b timeout 400 "$so_train" --config configs/runs/llama-1b-seq4096.json --steps 8 \
    $(offload_set superoffload) --trace "$results/trace-superoffload-1b.json" &&
    run_logged trace-check "$python" tests/cli/check_trace.py "$results/trace-superoffload-1b.json" --expect-speculation
  run_logged step-exposed timeout 500 "$so_bench" step --config configs/runs/llama-1b-seq4096.json --steps 8 \
    --modes zero-offload:1,superoffload:1 --set "$offload.cpuadam_cores_perc=$cores_perc"
}

stage_summary() {
  "$python" - "$results" > "$results/summary.md" <<'EOF'
import glob, json, os, re, sys
r = sys.argv[1]
def lines(name):
    p = os.path.join(r, name)
    return open(p, errors="replace").read().splitlines() if os.path.exists(p) else []
print("# GPU benchmark summary\n")
print("## Tests\n")
for l in lines("tests-ops.log") + lines("tests-model.log") + lines("sanitizer.log"):
    if re.search(r"tests passed|tests failed|\*\*\*Failed|\*\*\*Skipped|Not Run", l): print("    " + l)
print("\n## Peaks (so_bench gpu-peaks)\n")
for l in lines("peaks.log"): print("    " + l)
print("\n## Ops (so_bench ops)\n")
for l in lines("ops.log") + lines("ops-d128.log"): print("    " + l)
print("\n## Training (so_train; means over steps 2..N)\n")
print("| run | steps | tokens/s | TFLOP/s | MFU (causal) | MFU (non-causal) | of measured GEMM | peak mem MiB | exposed optimizer ms |")
print("|---|---|---|---|---|---|---|---|---|")
for p in sorted(glob.glob(os.path.join(r, "train-*.jsonl"))):
    rows = [json.loads(l) for l in open(p)][1:]
    if not rows: continue
    mean = lambda k: sum(x[k] for x in rows) / len(rows)
    print(f"| {os.path.basename(p)[6:-6]} | {len(rows) + 1} | {mean('tokens_per_s'):.0f} | {mean('tflops'):.1f} | "
          f"{100 * mean('mfu'):.1f}% | {100 * mean('mfu_noncausal'):.1f}% | {100 * mean('mfu_gemm'):.1f}% | "
          f"{max(x['peak_mem_mib'] for x in rows):.0f} | {1e3 * mean('exposed_optimizer_s'):.1f} |")
print("\n## The 1B step by op class (nsys, steps 3..5)\n")
for l in lines("profile-1b.log"):
    if l.startswith("|") or l.startswith("#"): print(l)
print("\n## Peers (bench/peers)\n")
for p in sorted(glob.glob(os.path.join(r, "peer-*.log"))):
    for l in open(p):
        if l.startswith("{"): print(f"    {os.path.basename(p)[:-4]}: {l.strip()}")
print("\n## Largest model (probe)\n")
for p in sorted(glob.glob(os.path.join(r, "probe-*.txt"))):
    for l in open(p): print("    " + l.rstrip())
print("\n## SuperOffload trace and exposed optimizer time\n")
for l in lines("trace-check.log") + lines("step-exposed.log")[-6:]: print("    " + l)
EOF
  log "summary: $results/summary.md"
  cat "$results/summary.md"
}

[ $# -ge 1 ] || { sed -n '2,/^set /{/^#/p}' "$0"; exit 2; }
stages=("$@")
[ "$1" = all ] && stages=(build tests-ops tests-model sanitizer peaks ops train-1b train-3b peers-1b peers-3b probe-none probe-super profile-1b trace summary)
status=0
for st in "${stages[@]}"; do
  case $st in
    build) stage_build || exit 1 ;;
    tests-ops) stage_tests tests-ops -R 'CudaOps|CudaBadIds' || status=1 ;;
    tests-model) stage_tests tests-model -E 'CudaOps|CudaBadIds|gpu\.(memcheck|racecheck)' || status=1 ;;
    sanitizer) stage_sanitizer || status=1 ;;
    peaks) stage_peaks || status=1 ;;
    ops) stage_ops || status=1 ;;
    train-1b|train-3b) stage_train "${st#train-}" || status=1 ;;
    peers-1b|peers-3b) stage_peers "${st#peers-}" || status=1 ;;
    probe-none) stage_probe none ;;
    probe-super) stage_probe superoffload ;;
    long-512k) stage_long || status=1 ;;
    profile-1b) stage_profile || status=1 ;;
    trace) stage_trace || status=1 ;;
    summary) stage_summary ;;
    *) echo "gpu_bench.sh: unknown stage '$st' (see the header of $0)" >&2; exit 2 ;;
  esac
done
exit $status
