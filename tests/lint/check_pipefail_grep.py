"""A shell script with `set -o pipefail` must not pipe into `grep -q`: grep stops reading at its
first match, a writer still writing gets SIGPIPE, and pipefail turns that into a failure that
depends on timing. `grep PATTERN >/dev/null` reads everything and answers the same.

check_pipefail_grep.py ROOT       every tracked *.sh (and .ci/run) under ROOT
check_pipefail_grep.py --self-test
"""
import re
import subprocess
import sys

PIPED_QUIET_GREP = re.compile(r"\|\s*grep\s+(-[A-Za-z]*q[A-Za-z]*|--quiet|--silent)\b")


def offending_lines(text):
    if "pipefail" not in text:
        return []
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1)
            if PIPED_QUIET_GREP.search(line) and not line.lstrip().startswith("#")]


def self_test():
    bad = "set -euo pipefail\ncmd | grep -q x || exit 1\nb | grep -Eq y\n"
    good = "set -euo pipefail\ncmd | grep x >/dev/null || exit 1\n# a | grep -q z\n"
    no_pipefail = "set -eu\ncmd | grep -q x\n"
    assert [n for n, _ in offending_lines(bad)] == [2, 3], offending_lines(bad)
    assert offending_lines(good) == [] and offending_lines(no_pipefail) == []
    print("self-test ok")


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = sys.argv[1]
    files = subprocess.run(["git", "-C", root, "ls-files", "*.sh", ".ci/run"], check=True, capture_output=True,
                           text=True).stdout.split()
    found = [(f, n, line) for f in files for n, line in offending_lines(open(f"{root}/{f}").read())]
    for f, n, line in found:
        print(f"{f}:{n}: piped into grep -q under pipefail (use grep ... >/dev/null): {line}")
    if found:
        sys.exit(1)
    print(f"pipefail grep ok: {len(files)} scripts")


if __name__ == "__main__":
    main()
