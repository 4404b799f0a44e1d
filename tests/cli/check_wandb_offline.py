#!/usr/bin/env python3
"""check_wandb_offline.py DIR METRICS PROJECT GROUP TEAM: the offline run scripts/wandb_log.py made under
DIR/wandb/ (WANDB_MODE=offline) holds, in its run-*.wandb file (the records `wandb sync` uploads),
a history record per --metrics line with every number of it as "train/<name>" at that step, equal
to the JSONL value, and the run's project, group and entity (DeepSpeed's team) from the config's wandb section.
The file is read as wandb writes it: a 7-byte header (":W&B", magic 0xBEE1, version), then
LevelDB-log records (32 KiB blocks; CRC32C, length, type FULL/FIRST/MIDDLE/LAST) each holding a
serialized wandb.internal Record."""
import glob
import json
import struct
import sys

from wandb.proto import wandb_internal_pb2

d, metrics, project, group, team = sys.argv[1:6]
(path,) = glob.glob(f"{d}/wandb/offline-run-*/run-*.wandb")
steps = [json.loads(line) for line in open(metrics)]

data = open(path, "rb").read()
assert data[:4] == b":W&B" and struct.unpack("<H", data[4:6])[0] == 0xBEE1, data[:7]
BLOCK, pos, records, pending = 32768, 7, [], b""
while pos + 7 <= len(data):
    left = BLOCK - pos % BLOCK
    if left < 7:  # block trailer
        pos += left
        continue
    _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
    chunk = data[pos + 7:pos + 7 + length]
    pos += 7 + length
    if kind == 0 and length == 0:
        continue
    pending += chunk
    if kind in (1, 4):  # FULL or LAST
        records.append(pending)
        pending = b""

history, run = [], None
for raw in records:
    r = wandb_internal_pb2.Record()
    r.ParseFromString(raw)
    kind = r.WhichOneof("record_type")
    if kind == "history":
        history.append((r.history.step.num, {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                              for i in r.history.item}))
    elif kind == "run":
        run = r.run
assert run is not None and (run.project, run.run_group, run.entity) == (project, group, team), run
assert [s for s, _ in history] == [m["step"] for m in steps], [s for s, _ in history]
checked = 0
for (s, items), m in zip(history, steps):
    for k, v in m.items():
        if k == "step":
            continue
        assert items[f"train/{k}"] == float(v), (s, k, items.get(f"train/{k}"), v)
        checked += 1
print(f"wandb offline ok: {checked} values in {len(history)} history records equal to the JSONL; project {project}, group {group}, team {team}")
