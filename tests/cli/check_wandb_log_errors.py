#!/usr/bin/env python
"""scripts/wandb_log.py on bad input: every case ends in one line on stderr naming the file (and
the line) and the problem, exit status 1, no traceback: missing and malformed metrics files (not
JSON, not UTF-8, nested too deeply, a metric that is a string, no step), a run config that is
missing, not JSON or not an object, an unknown option, and a Python without the wandb package.

  check_wandb_log_errors.py WORK_DIR
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
LOG = os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts", "wandb_log.py")
sys.path.insert(0, os.path.dirname(HERE))
from script_checks import check, finish  # noqa: E402


def main():
    work = sys.argv[1]
    os.makedirs(work, exist_ok=True)

    def path(name, data):
        p = os.path.join(work, name)
        with open(p, "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode())
        return p

    good_line = json.dumps({"step": 1, "loss": 2.5, "lr": 1e-3, "skipped": False}) + "\n"
    metrics = path("metrics.jsonl", good_line)
    config = path("run.json", json.dumps({"wandb": {"enabled": True, "project": "p"}}))
    no_wandb = os.path.join(work, "no_wandb")  # a wandb module that cannot be imported, first on the path
    os.makedirs(no_wandb, exist_ok=True)
    path("no_wandb/wandb.py", "raise ImportError(\"No module named 'wandb'\")\n")
    cases = [  # (arguments, extra environment, what the line names, the problem it states)
        (["--metrics", os.path.join(work, "nope.jsonl")], {}, "nope.jsonl", "cannot read the metrics file"),
        (["--metrics", path("not_json.jsonl", good_line + "{step: 2\n")], {}, "not_json.jsonl:2", "malformed JSON line"),
        (["--metrics", path("latin1.jsonl", good_line.encode() + b'{"step": 2, "caf\xe9": 1}\n')], {},
         "latin1.jsonl:2", "not UTF-8 (byte 0xe9"),
        (["--metrics", path("deep.jsonl", "[" * 100000 + "]" * 100000 + "\n")], {}, "deep.jsonl:1", "nested deeper"),
        (["--metrics", path("string_metric.jsonl", json.dumps({"step": 1, "loss": "abc"}) + "\n")], {},
         "string_metric.jsonl:1", "'loss' is \"abc\", not a number"),
        (["--metrics", path("no_step.jsonl", json.dumps({"loss": 1.0}) + "\n")], {}, "no_step.jsonl:1",
         "no integer 'step'"),
        (["--metrics", path("empty.jsonl", "")], {}, "empty.jsonl", "holds no metrics lines"),
        (["--metrics", metrics, "--config", os.path.join(work, "nope.json")], {}, "nope.json", "cannot read the run config"),
        (["--metrics", metrics, "--config", path("bad.json", "{\"wandb\": ")], {}, "bad.json:1", "malformed JSON"),
        (["--metrics", metrics, "--config", path("list.json", "[1]")], {}, "list.json", "not a JSON object"),
        (["--metrics", metrics, "--config", path("team.json", json.dumps({"wandb": {"team": 5}}))], {}, "team.json",
         "'wandb.team' must be a string"),
        (["--metrics", metrics, "--bogus"], {}, "unrecognized arguments: --bogus", "--help lists the options"),
        (["--metrics", metrics, "--config", config], {"PYTHONPATH": no_wandb}, "wandb cannot be imported",
         "No module named 'wandb'"),
    ]
    for args, env, names, problem in cases:
        r = subprocess.run([sys.executable, LOG] + args + ["--dir", work], capture_output=True, text=True,
                           env=dict(os.environ, WANDB_MODE="offline", **env))
        lines = r.stderr.strip().splitlines()
        ok = (r.returncode == 1 and len(lines) == 1 and lines[0].startswith("wandb_log: ") and names in lines[0]
              and problem in lines[0] and "Traceback" not in r.stderr)
        check(ok, f"{names}: {r.stderr.strip()[-300:]}")
    finish("wandb_log bad input")


if __name__ == "__main__":
    main()
