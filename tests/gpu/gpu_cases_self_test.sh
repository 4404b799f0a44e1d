#!/usr/bin/env bash
# gpu_cases_self_test.sh: gpu_cases_without_gpu.sh against fake gtest binaries: cases that skip
# give 77 (skipped), cases that pass 0, and a failed case, a crash or a filter that selects
# nothing 1 (failed).
set -euo pipefail
script=$(dirname "$0")/gpu_cases_without_gpu.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fake() {  # fake NAME EXIT-STATUS LINES...: a binary that prints LINES and exits with EXIT-STATUS
  local name=$1 status=$2
  shift 2
  { echo '#!/usr/bin/env bash'; printf 'echo %q\n' "$@"; echo "exit $status"; } > "$work/$name"
  chmod +x "$work/$name"
}
fake skip 0 "[==========] 3 tests from 1 test suite ran. (1 ms total)" "[  PASSED  ] 0 tests." \
  "[  SKIPPED ] 3 tests, listed below:"
fake pass 0 "[==========] 1 test from 1 test suite ran. (1 ms total)" "[  PASSED  ] 1 test."
fake fail 1 "[==========] 3 tests from 1 test suite ran. (1 ms total)" "[  PASSED  ] 0 tests." \
  "[  SKIPPED ] 2 tests, listed below:" "[  FAILED  ] 1 test, listed below:"
fake none 0 "[==========] 0 tests from 0 test suites ran. (0 ms total)" "[  PASSED  ] 0 tests."
printf '#!/usr/bin/env bash\nkill -SEGV $$\n' > "$work/crash"
chmod +x "$work/crash"
for expect in skip:77 pass:0 fail:1 none:1 crash:1; do
  name=${expect%:*} want=${expect#*:}
  rc=0
  "$script" "$work/$name" '*' > "$work/$name.out" 2>&1 || rc=$?
  if [ "$rc" != "$want" ]; then
    echo "FAILED: a binary that does '$name' gave exit $rc, not $want:"
    cat "$work/$name.out"
    exit 1
  fi
done
echo "gpu cases self-test ok"
