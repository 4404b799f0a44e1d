#!/usr/bin/env python3
"""A so_train checkpoint read with h5py: format attributes, the /metadata document and its CRC32C,
the manifest against the datasets, every /model tensor's segments against their CRC32C table
(computed here in plain Python), and every /model tensor equal (bitwise) to what
`so_ckpt export --hf --dtype fp32` wrote, read back here without the safetensors package (8-byte
header length, JSON header, raw little-endian fp32).

usage: ckpt_h5py_interop.py CHECKPOINT.h5 EXPORTED_HF_DIR"""
import json
import struct
import sys

import h5py
import numpy as np

from crc32c import crc32c


def read_safetensors(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", f"{name}: {t['dtype']}"
        b, e = t["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype="<f4").reshape(t["shape"])
    return out


ckpt, hf_dir = sys.argv[1], sys.argv[2]
assert crc32c(b"123456789") == 0xE3069283  # the standard check value
with h5py.File(ckpt, "r") as f:
    assert f.attrs["format"] in (b"so_train checkpoint", "so_train checkpoint"), f.attrs["format"]
    assert int(f.attrs["format_version"]) == 2
    raw = f["/metadata"][()]
    assert crc32c(raw) == int(f["/metadata"].attrs["crc32c"]), "metadata checksum"
    meta = json.loads(raw)
    manifest = meta["manifest"]
    exported = read_safetensors(f"{hf_dir}/model.safetensors")
    config = json.load(open(f"{hf_dir}/config.json"))
    segments = 0
    for t in manifest:
        for group in ("model", "optim/exp_avg", "optim/exp_avg_sq"):
            ds = f[f"/{group}/{t['name']}"]
            assert list(ds.shape) == t["shape"] and ds.dtype == np.float32, (group, t["name"], ds.shape)
        w = f[f"/model/{t['name']}"][...]
        flat = w.astype("<f4").tobytes()
        for first, count, crc in f[f"/checksums/model/{t['name']}"][...]:
            assert crc32c(flat[4 * first:4 * (first + count)]) == crc, f"{t['name']} [{first}, {first + count})"
            segments += 1
        assert np.isfinite(w).all(), t["name"]
        assert np.array_equal(w, exported[t["name"]]), f"{t['name']} differs from the export"
    if config.get("tie_word_embeddings"):
        assert "lm_head.weight" not in exported, "tied lm_head exported twice"
    print(f"h5py ok: {len(manifest)} tensors x 3 groups, {segments} /model segments' CRC32C checked, "
          f"steps_taken {meta['state']['steps_taken']}, every /model tensor equal to the fp32 export")
