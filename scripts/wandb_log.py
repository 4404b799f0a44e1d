#!/usr/bin/env python3
"""Logs a so_train run to Weights & Biases through the official client, from the run's --metrics
JSON lines (so_train is C++ and writes no wandb run itself). DeepSpeed's `wandb` section of the
run's config gives project, group and team (wandb's entity), as DeepSpeed's WandbMonitor reads
them; every number of each metrics line is logged as "train/<name>" at that line's step, and the
config file as the run's config.

Offline (no account, no network), then uploaded later:
    WANDB_MODE=offline ${SO_PYTHON} scripts/wandb_log.py --metrics run.jsonl --config run.json --dir OUT
    wandb sync OUT/wandb/offline-run-*        # later, where the network and a wandb login are
Online: the same without WANDB_MODE (after `wandb login`). Run it after so_train has finished (or
again over a longer file: each call makes a new wandb run). Every problem (a missing or malformed
file, a value that is no number, no wandb package) ends in one line naming the file, the line and
the problem, and exit status 1.

usage: wandb_log.py --metrics FILE [--config RUN_CONFIG.json] [--dir DIR] [--name NAME]
                    [--project P] [--group G] [--team T]"""
import argparse
import json
import numbers
import sys

from script_input import InputError, OneLineParser, parse_json, read_utf8, run_as_command


def read_config(path):
    """The run's config and its `wandb` section (DeepSpeed's keys only)."""
    config = parse_json(path, read_utf8(path, "run config"))
    if not isinstance(config, dict):
        raise InputError(f"{path}: the run config is not a JSON object")
    section = config.get("wandb", {})
    if not isinstance(section, dict):
        raise InputError(f"{path}: 'wandb' is not an object")
    unknown = sorted(set(section) - {"enabled", "group", "team", "project"})
    if unknown:
        raise InputError(f"{path}: unknown key 'wandb.{unknown[0]}' (DeepSpeed's keys: enabled, group, team, project)")
    for key in ("group", "team", "project"):
        if key in section and not isinstance(section[key], str):
            raise InputError(f"{path}: 'wandb.{key}' must be a string")
    return config, section


def read_metrics(path):
    """The metrics lines, each an object with an integer step and numbers."""
    lines = []
    for n, line in enumerate(read_utf8(path, "metrics file").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        record = parse_json(where, line, one_line=True)
        if not isinstance(record, dict) or not isinstance(record.get("step"), int) or isinstance(record["step"], bool):
            raise InputError(f"{where}: no integer 'step': not a so_train metrics line")
        for key, value in record.items():
            if not isinstance(value, numbers.Real):  # bool included: logged as 0/1
                raise InputError(f"{where}: '{key}' is {json.dumps(value)[:40]}, not a number")
        lines.append(record)
    if not lines:
        raise InputError(f"{path}: holds no metrics lines")
    return lines


def main(argv):
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--metrics", required=True, help="so_train --metrics file (JSON lines)")
    p.add_argument("--config", help="the run's config file: its `wandb` section and the run's config")
    p.add_argument("--dir", default=".", help="where wandb puts its wandb/ directory (default: the cwd)")
    p.add_argument("--name", help="the wandb run's name")
    p.add_argument("--project", help="overrides wandb.project (DeepSpeed's default: deepspeed)")
    p.add_argument("--group", help="overrides wandb.group")
    p.add_argument("--team", help="overrides wandb.team (wandb's entity)")
    a = p.parse_args(argv)

    config, section = read_config(a.config) if a.config else ({}, {})
    lines = read_metrics(a.metrics)
    try:
        import wandb
    except ImportError as e:
        raise InputError(f"the Python package wandb cannot be imported in {sys.executable} ({e}); install the "
                         f"project's environment (scripts/requirements.txt pins it)")
    try:
        run = wandb.init(project=a.project or section.get("project") or "deepspeed",
                         group=a.group or section.get("group"), entity=a.team or section.get("team"),
                         name=a.name, dir=a.dir, config=config)
        for record in lines:
            run.log({f"train/{k}": float(v) for k, v in record.items() if k != "step"}, step=record["step"])
        run.finish()
    except Exception as e:  # noqa: BLE001 - the client's failures (a bad --dir, the network, a login)
        raise InputError(f"the wandb client failed logging '{a.metrics}': {type(e).__name__}: {e}")
    print(f"wandb_log: {len(lines)} steps logged to {run.dir.rsplit('/files', 1)[0]}")
    return 0


def cli(argv):
    """main as a command: whatever goes wrong ends in one line on stderr and exit status 1."""
    return run_as_command("wandb_log", main, argv)


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
