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
again over a longer file: each call makes a new wandb run).

usage: wandb_log.py --metrics FILE [--config RUN_CONFIG.json] [--dir DIR] [--name NAME]
                    [--project P] [--group G] [--team T]"""
import argparse
import json
import sys

import wandb


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--metrics", required=True, help="so_train --metrics file (JSON lines)")
    p.add_argument("--config", help="the run's config file: its `wandb` section and the run's config")
    p.add_argument("--dir", default=".", help="where wandb puts its wandb/ directory (default: the cwd)")
    p.add_argument("--name", help="the wandb run's name")
    p.add_argument("--project", help="overrides wandb.project (DeepSpeed's default: deepspeed)")
    p.add_argument("--group", help="overrides wandb.group")
    p.add_argument("--team", help="overrides wandb.team (wandb's entity)")
    a = p.parse_args()

    config, section = {}, {}
    if a.config:
        with open(a.config) as f:
            config = json.load(f)
        section = config.get("wandb", {})
        if not isinstance(section, dict):
            sys.exit(f"wandb_log: '{a.config}': 'wandb' is not an object")
        unknown = sorted(set(section) - {"enabled", "group", "team", "project"})
        if unknown:
            sys.exit(f"wandb_log: '{a.config}': unknown key 'wandb.{unknown[0]}' (DeepSpeed's keys: enabled, group, team, project)")
    lines = []
    with open(a.metrics) as f:
        for n, line in enumerate(f, 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"wandb_log: '{a.metrics}' line {n} is not JSON: {e}")
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                sys.exit(f"wandb_log: '{a.metrics}' line {n} has no integer 'step': not a so_train metrics line")
            lines.append(record)
    if not lines:
        sys.exit(f"wandb_log: '{a.metrics}' holds no metrics lines")

    run = wandb.init(project=a.project or section.get("project") or "deepspeed",
                     group=a.group or section.get("group"), entity=a.team or section.get("team"),
                     name=a.name, dir=a.dir, config=config)
    for record in lines:
        run.log({f"train/{k}": float(v) for k, v in record.items() if k != "step"}, step=record["step"])
    run.finish()
    print(f"wandb_log: {len(lines)} steps logged to {run.dir.rsplit('/files', 1)[0]}")


if __name__ == "__main__":
    main()
