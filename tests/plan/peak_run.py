"""One so_train run and the device peak it reports at the end: (measured MiB, planned MiB, output),
or None for both when the run failed or printed no peak line."""
import re
import subprocess


def peak_run(cmd):
    run = subprocess.run(cmd, capture_output=True, text=True)
    out = run.stdout + run.stderr
    found = re.search(r"device peak ([0-9.]+) MiB measured, ([0-9.]+) MiB planned", out)
    if run.returncode != 0 or not found:
        return None, None, out
    return float(found.group(1)), float(found.group(2)), out
