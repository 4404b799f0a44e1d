# Sourced by the scripts that compare two tiny runs bit for bit, whose arguments are
# SO_TRAIN WORKDIR [--set key=value ...]: sets so_train, python and work (emptied), leaves the extra
# arguments in "$@", and gives tiny_run (what both runs share) and same_tensors.
python=${SO_PYTHON:?SO_PYTHON is not set: run under ctest, or set it to the interpreter scripts/python_env.sh makes}
so_train=$1 work=$2
shift 2
rm -rf "$work" && mkdir -p "$work"
# Two runs compared bit for bit: on a CUDA backend attention must be deterministic (not the default).
tiny_run=(--config configs/runs/tiny-demo.json --set data.seq_len=32 --set train_micro_batch_size_per_gpu=4
          --set backend.deterministic_attention=true --set steps_per_print=1)

same_tensors() {  # A.h5 B.h5 WHAT: the model and both Adam moments of two checkpoints identical
  local group
  for group in /model /optim/exp_avg /optim/exp_avg_sq; do
    h5diff -r "$1" "$2" "$group" "$group" >/dev/null || { echo "$3: tensors under $group differ"; exit 1; }
  done
}
