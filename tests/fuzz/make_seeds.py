#!/usr/bin/env python3
"""Writes the committed seed inputs of the fuzz targets that are not plain config files:
  seeds/safetensors/*.safetensors   small valid files (F32, BF16, F16 tensors; metadata; empty)
  seeds/checkpoint_metadata/*.json  the /metadata document of a real checkpoint (tiny model),
                                    read with h5py from CHECKPOINT.h5 when one is given
  seeds/checkpoint_metadata/*.bin   that document, a NUL and bytes choosing the HDF5 structure
                                    (fuzz_checkpoint_metadata.cpp): /metadata of 2 elements, an
                                    empty crc32c array, no root format, a superblock bit flipped
The JSON config target's seeds are the repository's own configs (run_fuzzers.sh collects them).

usage: make_seeds.py [CHECKPOINT.h5]"""
import json
import os
import struct
import sys

here = os.path.dirname(os.path.abspath(__file__))


def safetensors(path, tensors, metadata=None):
    header, blobs, offset = {}, [], 0
    for name, dtype, shape, payload in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(payload)]}
        blobs.append(payload)
        offset += len(payload)
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


out = os.path.join(here, "seeds", "safetensors")
safetensors(os.path.join(out, "f32_bf16.safetensors"),
            [("a.weight", "F32", [2, 3], struct.pack("<6f", 1, -2, 3.5, 0, 1e-3, 7)),
             ("b.weight", "BF16", [4], struct.pack("<4H", 0x3F80, 0xC000, 0x7FC0, 0x0001))],
            {"format": "pt"})
safetensors(os.path.join(out, "f16_scalar.safetensors"), [("s", "F16", [], struct.pack("<H", 0x3C00))])
safetensors(os.path.join(out, "empty.safetensors"), [])

if len(sys.argv) > 1:
    import h5py
    with h5py.File(sys.argv[1], "r") as f:
        text = f["metadata"][()].decode()
    with open(os.path.join(here, "seeds", "checkpoint_metadata", "tiny.json"), "w") as f:
        f.write(text)
    with open(os.path.join(here, "seeds", "checkpoint_metadata", "tiny_structure.bin"), "wb") as f:
        f.write(text.encode() + b"\0" + bytes([0, 4, 0x80, 2, 7, 1, 1, 1, 0x10]))
