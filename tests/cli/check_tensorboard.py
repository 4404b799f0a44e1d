#!/usr/bin/env python3
"""check_tensorboard.py DIR METRICS CONFIG: the event file so_train wrote to DIR, read with PyPI
tensorboard's EventAccumulator (what TensorBoard itself loads), against the run's --metrics JSON
lines: every number of every line is the scalar "train/<name>" at that step, equal to the JSONL
value as a 32-bit float (TensorBoard's simple_value; "skipped" as 0 or 1), no step missing or extra;
the config as text ("config/text_summary", the text plugin's tensor) is the run's config, the
values in CONFIG among them."""
import json
import sys

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

d, metrics, config = sys.argv[1], sys.argv[2], sys.argv[3]
steps = [json.loads(line) for line in open(metrics)]
assert steps, "no metrics"

ea = EventAccumulator(d, size_guidance={"scalars": 0, "tensors": 0})
ea.Reload()
tags = ea.Tags()
names = sorted(k for k in steps[0] if k != "step")
assert sorted(tags["scalars"]) == sorted("train/" + n for n in names), (tags["scalars"], names)
checked = 0
for n in names:
    events = ea.Scalars("train/" + n)
    assert [e.step for e in events] == [m["step"] for m in steps], (n, [e.step for e in events])
    for e, m in zip(events, steps):
        want = np.float32(float(m[n]))
        assert np.float32(e.value) == want, (n, m["step"], e.value, m[n])
        checked += 1

assert "config/text_summary" in tags["tensors"], tags["tensors"]
(text,) = ea.Tensors("config/text_summary")
assert ea.SummaryMetadata("config/text_summary").plugin_data.plugin_name == "text"
logged = json.loads(text.tensor_proto.string_val[0].decode())
given = json.load(open(config))
for key in ("optimizer", "scheduler", "model"):
    if key in given:
        assert logged[key] == given[key], (key, logged[key], given[key])
print(f"tensorboard ok: {checked} scalars ({len(names)} metrics x {len(steps)} steps) equal to the JSONL values; "
      f"config text of {len(logged)} sections")
