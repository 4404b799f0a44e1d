#!/usr/bin/env python3
"""long_sequence_np4.py MPIEXEC SO_TRAIN: the long-sequence target on the CPU backend.
tests/plan/long_sequence.json (16 layers, 2048-token sequences, Ulysses over 4 ranks, ZeRO-3, a
22 MiB device) does not fit without offloading the activation checkpoints and tiling the MLP: the
planner says so for each of the three smaller combinations, and a run of each is refused with
the planner's table before anything is allocated. With "auto" the planner turns both on, the run
trains, its device peak is the planned one (within 10%), and its losses are the 1-rank run's on
the same data (whole sequence, no checkpointing, no limit) within 1e-6 relative."""
import json
import os
import re
import subprocess
import sys
import tempfile

mpiexec, so_train = sys.argv[1], sys.argv[2]
config = ["--config", "tests/plan/long_sequence.json", "--steps", "3"]
tmp = tempfile.mkdtemp()


def settings(offload, tile):
    return ["--set", f"train.activation_offload={offload}", "--set", f"train.mlp_tile_tokens={tile}"]


for offload, tile in (("false", 0), ("true", 0), ("false", 256)):
    plan = subprocess.run([so_train, "--plan", "--plan-ranks", "4"] + config + settings(offload, tile),
                          capture_output=True, text=True, check=True).stdout
    assert "does NOT fit in 22 MiB" in plan, plan
    run = subprocess.run([mpiexec, "--oversubscribe", "-np", "4", so_train] + config + settings(offload, tile),
                         capture_output=True, text=True)
    assert run.returncode != 0, f"offload {offload}, tile {tile}: trained though the plan does not fit"
    assert "the run does not fit: '" in run.stderr and "out of device memory" not in run.stderr, run.stderr[-3000:]
    print(f"offload {offload}, MLP tile {tile}: {re.search(r'total +([0-9.]+ MiB)', plan).group(1)} planned, "
          "refused before allocating")

metrics = {}
run = subprocess.run([mpiexec, "--oversubscribe", "-np", "4", so_train] + config +
                     ["--metrics", f"{tmp}/sp4.jsonl"], capture_output=True, text=True)
assert run.returncode == 0, run.stderr[-3000:]
out = run.stdout + run.stderr
assert "memory (auto): activation checkpoints offloaded to the host, MLP in tiles of" in out, out
measured, planned = map(float, re.search(r"device peak ([0-9.]+) MiB measured, ([0-9.]+) MiB planned", out).groups())
assert abs(planned / measured - 1) <= 0.10, (planned, measured)
ref = subprocess.run([so_train] + config + ["--set", "sequence_parallel_size=1", "--set", "backend.device_memory_limit_mb=0",
                     "--set", "train.activation_checkpointing=false"] + settings("false", 0) +
                     ["--metrics", f"{tmp}/ref.jsonl"], capture_output=True, text=True)
assert ref.returncode == 0, ref.stderr[-3000:]
for name in ("sp4", "ref"):
    metrics[name] = [json.loads(l)["loss"] for l in open(f"{tmp}/{name}.jsonl")]
worst = max(abs(a - b) / abs(b) for a, b in zip(metrics["sp4"], metrics["ref"]))
assert len(metrics["sp4"]) == 3 and worst <= 1e-6, metrics
chosen = re.search(r"memory \(auto\): (.*)", out).group(1)
print(f"auto: {chosen}; device peak {measured:.3f} MiB measured, "
      f"{planned:.3f} planned (ratio {planned / measured:.4f}); losses {metrics['sp4']} vs 1 rank {metrics['ref']}: "
      f"largest relative difference {worst:.2e}")
