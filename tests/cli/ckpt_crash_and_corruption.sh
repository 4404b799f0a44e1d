#!/usr/bin/env bash
# Crash safety and corruption: (1) SIGKILL while a save is paused just before its commit: the
# previous checkpoint stays `latest`, verifies and resumes; no partial file is ever loaded.
# (2) A truncated file and a flipped byte inside a dataset are refused by so_ckpt verify and by
# --resume with a message naming the damage, and the damaged files are left untouched. (3) A save
# to a full disk fails cleanly.
# usage: ckpt_crash_and_corruption.sh SO_TRAIN SO_CKPT WORKDIR
set -uo pipefail
so_train=$1 so_ckpt=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
args=(--config configs/runs/tiny-demo.json --set data.seq_len=32 --set train_micro_batch_size_per_gpu=2)

# (1) Kill during the step-4 save (the step-2 one committed normally).
SO_CKPT_TEST_PAUSE_BEFORE_COMMIT=0 "$so_train" "${args[@]}" --steps 2 --save-dir "$work/run" --save-every 2 >/dev/null 2>&1 ||
  fail "first run"
SO_CKPT_TEST_PAUSE_BEFORE_COMMIT=60 "$so_train" "${args[@]}" --steps 4 --resume "$work/run" --save-dir "$work/run" \
  --save-every 2 >"$work/crash.log" 2>&1 &
pid=$!
for _ in $(seq 1 120); do grep -q "paused before committing" "$work/crash.log" && break; sleep 0.5; done
grep -q "paused before committing" "$work/crash.log" || fail "the save never reached its pause"
kill -9 "$pid"
wait "$pid" 2>/dev/null
[ "$(cat "$work/run/latest")" = "step-00000002.h5" ] || fail "latest moved to $(cat "$work/run/latest")"
ls "$work/run"/.step-00000004.h5.partial >/dev/null 2>&1 || fail "no partial file: the kill came too late"
"$so_ckpt" verify "$work/run" || fail "previous checkpoint does not verify"
"$so_train" "${args[@]}" --steps 3 --resume "$work/run" 2>&1 | grep "done: 3 steps" >/dev/null || fail "resume after the crash"
echo "crash: previous checkpoint intact, verified and resumed"

# (3) A save that cannot fit (a file-size limit standing in for a full disk; SIGXFSZ ignored so that
# writes fail as on a full disk): a clear error and exit 1, before HDF5 writes a byte (HDF5 1.10
# crashes at exit after a failed write); the previous checkpoint stays `latest`, no partial file.
out=$( (trap '' XFSZ; ulimit -f 4096; "$so_train" "${args[@]}" --steps 4 --resume "$work/run" --save-dir "$work/run" \
  --save-every 2) 2>&1)
rc=$?
[ $rc -eq 1 ] || fail "full disk: exit code $rc (expected 1): $(echo "$out" | tail -3)"
echo "$out" | grep -E "error: checkpoint save to '.*': the checkpoint needs about .* MB but this process may not write files larger than" >/dev/null ||
  fail "full disk: message: $(echo "$out" | grep error)"
[ "$(cat "$work/run/latest")" = "step-00000002.h5" ] || fail "full disk: latest moved to $(cat "$work/run/latest")"
ls "$work/run"/.step-*.partial >/dev/null 2>&1 && fail "full disk: a partial file was left behind"
echo "full disk: refused ($(echo "$out" | grep -o 'error: .*'))"

# (2) Damage copies of the good checkpoint.
good="$work/run/step-00000002.h5"
sum=$(md5sum < "$good")
mkdir -p "$work/trunc" "$work/flip"
head -c 200000 "$good" > "$work/trunc/step-00000002.h5" && echo step-00000002.h5 > "$work/trunc/latest"
cp "$good" "$work/flip/step-00000002.h5" && echo step-00000002.h5 > "$work/flip/latest"
size=$(stat -c %s "$good")
printf '\xff' | dd of="$work/flip/step-00000002.h5" bs=1 seek=$((size / 2)) conv=notrunc status=none
for d in trunc flip; do
  before=$(md5sum < "$work/$d/step-00000002.h5")
  out=$("$so_ckpt" verify "$work/$d" 2>&1) && fail "verify accepted the $d file"
  echo "$out" | grep "DAMAGED" >/dev/null || fail "verify did not name the damage: $out"
  out=$("$so_train" "${args[@]}" --steps 3 --resume "$work/$d" 2>&1) && fail "resume accepted the $d file"
  echo "$out" | grep -E "error: .*(truncated|checksum|damaged)" >/dev/null || fail "resume message: $out"
  [ "$(md5sum < "$work/$d/step-00000002.h5")" = "$before" ] || fail "$d file was modified"
  echo "$d: refused ($(echo "$out" | grep -o 'error: .*' | head -1))"
done
[ "$(md5sum < "$good")" = "$sum" ] || fail "the good checkpoint changed"
echo "crash and corruption ok"
