"""No tracked file holds a merge's conflict markers (a line starting with 7 '<' or '>' and a
space, or a lone 7 '='): a marker left in a header compiles nowhere, and one left in a script or a
doc is wrong quietly.

check_conflict_markers.py ROOT       every tracked file under ROOT
check_conflict_markers.py --self-test
"""
import re
import subprocess
import sys

MARKER = re.compile(r"^(<{7} |>{7} |={7}$)")


def marker_lines(text):
    return [n for n, line in enumerate(text.splitlines(), 1) if MARKER.match(line)]


def self_test():
    bad = "a\n<<<<<<< HEAD\nb\n=======\nc\n>>>>>>> branch\n"
    good = "a\n======= not alone\n<<<<<<<< eight\n  <<<<<<< indented in a string\n"
    assert marker_lines(bad) == [2, 4, 6], marker_lines(bad)
    assert marker_lines(good) == [], marker_lines(good)
    print("self-test ok")


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = sys.argv[1]
    files = subprocess.run(["git", "-C", root, "ls-files", "-z"], check=True, capture_output=True).stdout.split(b"\0")
    found = 0
    for f in filter(None, files):
        try:
            text = open(root.encode() + b"/" + f, "rb").read().decode("utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary data (fixtures), or a submodule
        for n in marker_lines(text):
            print(f"{f.decode()}:{n}: a merge conflict marker")
            found += 1
    if found:
        sys.exit(1)
    print(f"conflict markers ok: {len(files) - 1} files")


if __name__ == "__main__":
    main()
