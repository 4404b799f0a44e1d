#!/usr/bin/env python3
"""check_csv_monitor.py DIR METRICS BATCH: the CSV files so_train's csv_monitor wrote to DIR, read as
DeepSpeed's csvMonitor files are (the csv module), against the run's --metrics JSON lines:
Train_Samples_train_loss.csv = header step,train_loss then (samples before step k, loss of step k);
Train_Samples_lr.csv = header step,lr then (samples after step k, lr of step k+1) for every step."""
import csv
import json
import math
import os
import sys

d, metrics, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
steps = [json.loads(line) for line in open(metrics)]
assert steps, "no metrics"


def rows(name):
    with open(os.path.join(d, name), newline="") as f:
        return list(csv.reader(f))


loss = rows("Train_Samples_train_loss.csv")
lr = rows("Train_Samples_lr.csv")
assert loss[0] == ["step", "train_loss"], loss[0]
assert lr[0] == ["step", "lr"], lr[0]
assert len(loss) == len(steps) + 1 and len(lr) == len(steps) + 1, (len(loss), len(lr), len(steps))
for k, m in enumerate(steps):
    x, v = int(loss[k + 1][0]), float(loss[k + 1][1])
    assert x == k * batch, (k, x)
    assert math.isclose(v, m["loss"], rel_tol=1e-6), (k, v, m["loss"])  # metrics hold the loss as a float
    x, v = int(lr[k + 1][0]), float(lr[k + 1][1])
    assert x == (k + 1) * batch, (k, x)
    if k + 1 < len(steps):
        assert v == steps[k + 1]["lr"], (k, v, steps[k + 1]["lr"])
print(f"csv_monitor: {len(steps)} steps, train_loss and lr files as DeepSpeed writes them")
