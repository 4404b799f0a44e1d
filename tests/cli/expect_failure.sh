#!/usr/bin/env bash
# expect_failure.sh REGEX -- COMMAND...: passes when COMMAND exits non-zero and prints exactly one
# "error:" line on stderr that matches REGEX.
set -u
regex=$1; shift; [ "$1" = "--" ] && shift
err=$("$@" 2>&1 >/dev/null); rc=$?
if [ $rc -eq 0 ]; then echo "FAIL: exited 0; expected an error matching: $regex"; exit 1; fi
lines=$(printf '%s\n' "$err" | grep -c "error:")
if [ "$lines" -ne 1 ]; then echo "FAIL: expected one error line, got $lines:"; echo "$err"; exit 1; fi
if ! printf '%s\n' "$err" | grep -qE -- "$regex"; then echo "FAIL: error does not match '$regex':"; echo "$err"; exit 1; fi
echo "ok (exit $rc): $(printf '%s\n' "$err" | grep "error:")"
