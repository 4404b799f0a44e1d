"""Every tracked C++/CUDA file is as clang-format 14 writes it under the repository's .clang-format
(the version is pinned: another release formats differently, and Debian 12 ships 14).

check_clang_format.py ROOT       every tracked *.cpp, *.h, *.cu, *.cuh under ROOT
check_clang_format.py --self-test
To fix: clang-format-14 -i $(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

BINARY = "clang-format-14"
PATTERNS = ["*.cpp", "*.h", "*.cu", "*.cuh"]


def misformatted(root, files):
    """The files clang-format would change, with its first complaint about each."""
    clang_format = shutil.which(BINARY)
    if clang_format is None:
        sys.exit(f"{BINARY} is not installed (scripts/install-deps.sh installs it)")
    run = subprocess.run([clang_format, "--style=file", "--dry-run", "--Werror", *files], cwd=root,
                         capture_output=True, text=True)
    first = {}
    for line in run.stderr.splitlines():
        m = re.match(r"^(.*?):(\d+):\d+: error: code should be clang-formatted", line)
        if m:
            first.setdefault(m.group(1), int(m.group(2)))
    if run.returncode != 0 and not first:
        sys.exit(f"{BINARY} failed: {run.stderr.strip()[:2000]}")
    return first


def self_test():
    with tempfile.TemporaryDirectory() as d:
        shutil.copy(os.path.join(os.path.dirname(__file__), "..", "..", ".clang-format"), d)
        with open(os.path.join(d, "good.cpp"), "w") as f:
            f.write("int add(int a, int b) { return a + b; }\n")
        with open(os.path.join(d, "bad.cpp"), "w") as f:
            f.write("int  add(int a,int b){\nreturn a+b;}\n")
        found = misformatted(d, ["good.cpp", "bad.cpp"])
        assert list(found) == ["bad.cpp"], found
    print("self-test ok")


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = sys.argv[1]
    files = subprocess.run(["git", "-C", root, "ls-files", "--", *PATTERNS], check=True, capture_output=True,
                           text=True).stdout.split()
    found = misformatted(root, files)
    for f, line in sorted(found.items()):
        print(f"{f}:{line}: not as {BINARY} writes it")
    if found:
        print(f"{len(found)} of {len(files)} files differ; to fix: {BINARY} -i $(git ls-files {' '.join(repr(p) for p in PATTERNS)})")
        sys.exit(1)
    print(f"clang-format ok: {len(files)} files")


if __name__ == "__main__":
    main()
