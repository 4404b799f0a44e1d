"""The checks of a test script: each prints `ok:` or `FAIL:` and what it checked; finish() ends the
script with the count of failures (exit 1) or `NAME: all checks passed`, the line ctest matches."""
import sys

failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        failures.append(what)
    return cond


def finish(name):
    if failures:
        print(f"{len(failures)} checks failed")
        sys.exit(1)
    print(f"{name}: all checks passed")
