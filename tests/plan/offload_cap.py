#!/usr/bin/env python3
"""offload_cap.py SO_TRAIN: an offloaded bf16 run plans what it allocates, so it trains under a device
cap of its own plan. configs/models/bench-m100.json (94 M parameters), bf16, 256 tokens x micro-batch
2, ZeRO-Offload and SuperOffload (ratio 0.9) with the cast sites left to the start-up measurement,
and the on-device optimizer: the pool's measured peak equals the plan (one rank: exact to 0.1%),
and an offloaded run capped at its planned MiB (backend.device_memory_limit_mb) trains. An offloaded bucket's
gradients are on the device only in flight (the gradient ring), so the offloaded plans are far
below the on-device one."""
import math
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peak_run import peak_run  # noqa: E402

so_train = sys.argv[1]
base = ["--config", "configs/runs/tiny-demo.json", "--model", "configs/models/bench-m100.json", "--steps", "2",
        "--seq-len", "256", "--set", "train_micro_batch_size_per_gpu=2", "--set", "bf16.enabled=true",
        "--set", "zero_optimization.sub_group_size=4000000"]
off = "zero_optimization.offload_optimizer"
modes = {
    "on-device": [],
    "ZeRO-Offload": ["--set", f"{off}.device=cpu", "--set", f"{off}.ratio=0.9"],
    "SuperOffload": ["--set", f"{off}.device=cpu", "--set", f"{off}.ratio=0.9", "--set", f"{off}.super_offload=true"],
}
failures = 0
planned_of = {}
for name, args in modes.items():
    measured, planned, out = peak_run([so_train] + base + args)
    if measured is None:
        print(f"FAIL {name}: run failed\n{out[-3000:]}")
        failures += 1
        continue
    planned_of[name] = planned
    ok = abs(measured / planned - 1) <= 0.001
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {name:13s} planned {planned:9.2f} MiB, measured {measured:9.2f} MiB")
    if not args:
        continue
    cap = math.ceil(planned)
    capped = subprocess.run([so_train] + base + args + ["--set", f"backend.device_memory_limit_mb={cap}"],
                            capture_output=True, text=True)
    ok = capped.returncode == 0 and "done: 2 steps" in capped.stdout + capped.stderr
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {name:13s} trains under a cap of {cap} MiB"
          + ("" if ok else f"\n{(capped.stdout + capped.stderr)[-3000:]}"))
for name in ("ZeRO-Offload", "SuperOffload"):
    if name in planned_of and "on-device" in planned_of and not planned_of[name] < 0.5 * planned_of["on-device"]:
        print(f"FAIL {name}: planned {planned_of[name]:.1f} MiB, not under half the on-device plan")
        failures += 1
if failures:
    sys.exit(f"{failures} checks failed")
print("every run measured its plan and trained under it as a cap")
