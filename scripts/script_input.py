"""What the project's command-line scripts (prepare_data.py, wandb_log.py) share about reading
their input and failing: every problem ends in one line on stderr naming the file (and the line
or record) and what is wrong, and exit status 1; never a traceback, whatever failed."""
import argparse
import json
import os
import sys


class InputError(Exception):
    """A problem with what the user gave: its message is the line printed."""


class OneLineParser(argparse.ArgumentParser):
    """A command-line error in one line (argparse's own adds the usage above it)."""

    def error(self, message):
        raise InputError(f"{message} (--help lists the options)")


def run_as_command(tool, main, argv):
    """main(argv)'s exit status; any failure printed as one line 'tool: problem', status 1."""
    try:
        return main(argv)
    except InputError as e:
        problem = str(e)
    except MemoryError:
        problem = "out of memory (an input too large for this machine)"
    except RecursionError:
        problem = "input nested too deeply"
    except Exception as e:  # noqa: BLE001 - a failure no check foresaw, still in one line
        problem = f"unexpected {type(e).__name__}: {e}"
    print(f"{tool}: " + " ".join(problem.split()), file=sys.stderr)
    return 1


def read_utf8(path, what):
    """The text of the file at path (`what` names it to the user), which must be UTF-8, a
    byte-order mark allowed; an encoding error is named by line and byte."""
    if os.path.exists(path) and not os.path.isfile(path):
        raise InputError(f"{path}: the {what} is not a regular file")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise InputError(f"{path}: cannot read the {what}: {e.strerror or e}")
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise InputError(f"{path}: the {what} is UTF-16 text (it starts with a UTF-16 byte-order mark); convert it "
                         f"to UTF-8")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise InputError(f"{path}:{line}: the {what} is not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}: "
                         f"{e.reason})")


def parse_json(where, text, one_line=False):
    """json.loads(text); a failure named by where (a file, or file:line for one line of it) and
    the place within the text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        if one_line:
            raise InputError(f"{where}: malformed JSON line: {e.msg} (column {e.colno})")
        raise InputError(f"{where}:{e.lineno}: malformed JSON: {e.msg} (column {e.colno})")
    except RecursionError:
        raise InputError(f"{where}: JSON nested deeper than Python's reader follows ({sys.getrecursionlimit()} levels)")
