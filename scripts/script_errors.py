"""What the project's command-line scripts (prepare_data.py, wandb_log.py) share about failing:
every problem ends in one line on stderr, naming what was wrong where, and exit status 1; never a
traceback, whatever failed."""
import argparse
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
