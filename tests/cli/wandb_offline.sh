#!/usr/bin/env bash
# DeepSpeed's wandb section, end to end offline: so_train trains with it (and --metrics) and says
# how to log the run; scripts/wandb_log.py (the official client, WANDB_MODE=offline) makes the
# offline run directory from the metrics file and the config's wandb section;
# check_wandb_offline.py finds every metric of every step in it.
# usage: wandb_offline.sh SO_TRAIN PYTHON WORK_DIR
set -euo pipefail
so_train=$1 python=$2 dir=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rm -rf "$dir" && mkdir -p "$dir"
"$python" -c 'import json, sys; c = json.load(open("configs/runs/tiny-demo.json")); c["wandb"] = {"enabled": True, "project": "so-train-ci", "group": "tiny", "team": "t"}; json.dump(c, open(sys.argv[1], "w"))' "$dir/run.json"
"$so_train" --config "$dir/run.json" --steps 4 --set data.seq_len=32 --metrics "$dir/metrics.jsonl" 2>&1 | tee "$dir/log" | grep "wandb:"
grep -q "scripts/wandb_log.py --metrics $dir/metrics.jsonl --config $dir/run.json --project 'so-train-ci' --group 'tiny' --team 't'" "$dir/log"
WANDB_MODE=offline "$python" scripts/wandb_log.py --metrics "$dir/metrics.jsonl" --config "$dir/run.json" --dir "$dir" 2>&1 | grep "wandb_log:"
"$python" "$here/check_wandb_offline.py" "$dir" "$dir/metrics.jsonl" so-train-ci tiny t
