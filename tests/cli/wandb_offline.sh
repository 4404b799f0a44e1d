#!/usr/bin/env bash
# DeepSpeed's wandb section, end to end offline: so_train trains with it (and --metrics) and says
# how to log the run; that command, run by the shell as printed (a group with quotes and shell
# syntax in it), has scripts/wandb_log.py (the official client, WANDB_MODE=offline) make the
# offline run directory from the metrics file and the config's wandb section;
# check_wandb_offline.py finds every metric of every step in it.
# usage: wandb_offline.sh SO_TRAIN PYTHON WORK_DIR
set -euo pipefail
so_train=$1 python=$2 dir=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rm -rf "$dir" && mkdir -p "$dir"
# A group with a space, a quote and shell syntax: the printed command must pass it through a
# shell unchanged (and run nothing).
group="tiny 'a' \$(touch $dir/injected) \"b\""
"$python" -c 'import json, sys; c = json.load(open("configs/runs/tiny-demo.json")); c["wandb"] = {"enabled": True, "project": "so-train-ci", "group": sys.argv[2], "team": "t"}; json.dump(c, open(sys.argv[1], "w"))' "$dir/run.json" "$group"
"$so_train" --config "$dir/run.json" --steps 4 --set data.seq_len=32 --metrics "$dir/metrics.jsonl" 2>&1 | tee "$dir/log" | grep "wandb:"
# The command as printed, run by the shell.
command=$(sed -n 's/.*after the run: \(WANDB_MODE=offline .*\), then `wandb sync.*/\1/p' "$dir/log")
[ -n "$command" ]
SO_PYTHON=$python sh -c "$command --dir '$dir'" 2>&1 | grep "wandb_log:"
[ ! -e "$dir/injected" ]
"$python" "$here/check_wandb_offline.py" "$dir" "$dir/metrics.jsonl" so-train-ci "$group" t
