#!/usr/bin/env python3
"""Crafted checkpoints: copies of a good one, each altered the way an attacker (or a broken tool)
would, the metadata's CRC32C recomputed where the attack needs it to get past the checksum. Each
must be refused by `so_ckpt verify` and by `so_train --resume` with exit code 1 (no crash) and an
error naming what is wrong, and left unmodified.

usage: ckpt_crafted.py SO_TRAIN SO_CKPT WORKDIR"""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

from crc32c import crc32c

so_train, so_ckpt, work = sys.argv[1:4]
ARGS = ["--config", "configs/runs/tiny-demo.json", "--set", "data.seq_len=32", "--set", "train_micro_batch_size_per_gpu=2"]


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


def set_metadata(f, text, crc=None):
    """Replaces /metadata by `text` (a fixed-length string) with its CRC32C (or the one given)."""
    raw = text.encode()
    del f["metadata"]
    ds = f.create_dataset("metadata", data=np.array(raw, dtype=f"S{max(1, len(raw))}"))
    ds.attrs.create("crc32c", crc32c(raw) if crc is None else crc, dtype="<u4")


def metadata(f):
    return json.loads(f["metadata"][()].decode())


def edit_metadata(change):
    def attack(f):
        m = metadata(f)
        change(m)
        set_metadata(f, json.dumps(m))
    return attack


def flip_metadata_byte(f):
    raw = bytearray(f["metadata"][()])
    crc = crc32c(bytes(raw))
    raw[len(raw) // 2] ^= 0x01
    set_metadata(f, raw.decode(errors="replace"), crc)


def first_tensor(f):
    return metadata(f)["manifest"][0]["name"]


def retype_dataset(f):
    name = "/model/" + first_tensor(f)
    data = f[name][()].astype("<f8")
    del f[name]
    f.create_dataset(name, data=data)


def unwritten_checksums(f):
    name = "/checksums/model/" + first_tensor(f)
    f[name][...] = 0


def huge_shape(f):
    name = "/model/" + first_tensor(f)
    del f[name]
    f.create_dataset(name, shape=(1 << 20, 1 << 14), dtype="<f4")  # 64 GiB claimed, nothing stored


def misaligned_dataset(f):
    # The same values and checksums, stored from an odd byte (3 bytes of raw data allocated before
    # them): loads read tensors by pieces in place and need whole values.
    name = "/model/" + first_tensor(f)
    data = f[name][()]
    f.create_dataset("/pad", data=np.zeros(3, "u1"))
    f.create_dataset("/model/moved", data=data)
    assert f["/model/moved"].id.get_offset() % 4 != 0
    del f[name]
    f.move("/model/moved", name)
    del f["/pad"]


def nested_metadata(f):
    set_metadata(f, "[" * 100000 + "]" * 100000)


def metadata_array(f):
    # The same document 1000 times over: a reader that trusts one element overflows its buffer.
    raw = f["metadata"][()]
    del f["metadata"]
    ds = f.create_dataset("metadata", data=np.array([raw] * 1000, dtype=f"S{len(raw)}"))
    ds.attrs.create("crc32c", crc32c(raw), dtype="<u4")


def crc_attr(value, dtype):
    def attack(f):
        crc = crc32c(f["metadata"][()])
        f["metadata"].attrs.create("crc32c", np.full(value, crc) if isinstance(value, int) else value, dtype=dtype)
    return attack


def drop(key, inner=None):
    return edit_metadata(lambda m: (m[inner] if inner else m).pop(key))


def root_attr(name, value):
    def attack(f):
        if value is None:
            del f.attrs[name]
        else:
            f.attrs[name] = value
    return attack


def flip_base_address(path):
    # Superblock version 0: the base address is the 8 bytes at 24. Flipping bit 12 moves HDF5's
    # end of allocation 4 KiB back, before the end of the last dataset, which h5py then cannot read.
    with open(path, "r+b") as f:
        head = bytearray(f.read(32))
        assert head[:8] == b"\x89HDF\r\n\x1a\n" and head[8] == 0, "not a version-0 superblock"
        head[24 + 1] ^= 0x10
        f.seek(0)
        f.write(head)
    with h5py.File(path, "r") as f:
        names = [g + t["name"] for t in metadata(f)["manifest"] for g in ("/model/", "/optim/exp_avg/", "/optim/exp_avg_sq/")]
        try:
            f[max(names, key=lambda n: f[n].id.get_offset())][()]
        except (OSError, KeyError):  # h5py's HDF5 refuses to open it, or to read it
            return
    raise AssertionError("h5py still reads the last dataset")


ATTACKS = [
    ("metadata byte flipped", flip_metadata_byte, "fails its checksum"),
    ("steps_taken -1", edit_metadata(lambda m: m["state"].update(steps_taken=-1)), "'state.steps_taken' must be in"),
    ("iteration 2^63-1", edit_metadata(lambda m: m["state"].update(iteration=2**63 - 1)), "'state.iteration' must be in"),
    ("steps_taken > iteration", edit_metadata(lambda m: m["state"].update(steps_taken=m["state"]["iteration"] + 1)),
     "'state.steps_taken' must be in"),
    ("data_position -5", edit_metadata(lambda m: m["state"].update(data_position=-5)), "'state.data_position' must be in"),
    ("empty manifest", edit_metadata(lambda m: m.update(manifest=[])), "the manifest does not list the tensors"),
    ("vocab 2^31", edit_metadata(lambda m: m["model_config"].update(vocab_size=2**31)), "vocab_size"),
    ("unknown key", edit_metadata(lambda m: m.update(extra=1)), "unknown key 'extra'"),
    ("metadata not JSON", lambda f: set_metadata(f, '{"format": "so_train-checkpoint", '), "metadata"),
    ("metadata nested 100k deep", nested_metadata, "nested"),
    ("dataset stored as float64", retype_dataset, "is not float32 little-endian"),
    ("checksum table never written", unwritten_checksums, "is not a valid segment"),
    ("dataset shape claims 64 GiB", huge_shape, "has the wrong shape"),
    ("dataset from an odd byte", misaligned_dataset, "not on a whole value"),
    # Shapes and types of the HDF5 objects themselves, each refused before it is read.
    ("metadata of 1000 elements", metadata_array, "dataset '/metadata' has shape [1000], expected scalar"),
    ("crc32c of 4096 elements", crc_attr(4096, "<u4"), "attribute 'crc32c' of '/metadata' has shape [4096], expected scalar"),
    ("crc32c a float", crc_attr(np.float64(1.5), "<f8"), "attribute 'crc32c' of '/metadata' is not an integer"),
    ("root format an array", root_attr("format", np.array([b"so_train checkpoint"] * 64)),
     "attribute 'format' of '/' has shape [64], expected scalar"),
    # Every metadata field is required.
    ("no format_version", drop("format_version"), "'format_version' is missing"),
    ("no chunk_elements", drop("chunk_elements", "checksum"), "'checksum.chunk_elements' is missing"),
    ("no iteration", drop("iteration", "state"), "'state.iteration' is missing"),
    # The root copies h5py users read first must agree with /metadata.
    ("root format gone", root_attr("format", None), "no attribute 'format' on '/'"),
    ("root format_version gone", root_attr("format_version", None), "no attribute 'format_version' on '/'"),
    ("root format_version 1", root_attr("format_version", np.int64(1)), "the root attributes say 'so_train checkpoint' version 1"),
]
# Damage outside the datasets: raw bytes of the file, after h5py closed it.
RAW_ATTACKS = [
    ("superblock base address bit", flip_base_address, "lies outside the file's"),
]


def refused(name, path, expect):
    """The number of tools (verify, resume) that did not refuse `path` with exit 1 and `expect`."""
    bad = 0
    for tool, cmd in (("verify", [so_ckpt, "verify", path]), ("resume", [so_train, *ARGS, "--steps", "3", "--resume", path])):
        rc, out = run(cmd)
        errors = [line for line in out.splitlines() if "error" in line.lower() or "DAMAGED" in line]
        ok = rc == 1 and any(expect in line for line in errors)
        print(f"{'ok ' if ok else 'BAD'} {name:32s} {tool:6s} exit {rc}: {(errors or [out.strip()[-200:]])[0][:200]}")
        bad += not ok
    return bad


def main():
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    rc, out = run([so_train, *ARGS, "--steps", "2", "--save-dir", f"{work}/good", "--save-every", "2"])
    assert rc == 0, out
    good = f"{work}/good/step-00000002.h5"
    failures = 0
    for name, attack, expect in ATTACKS + RAW_ATTACKS:
        d = f"{work}/{name.replace(' ', '_')}"
        os.makedirs(d)
        path = f"{d}/step-00000002.h5"
        shutil.copy(good, path)
        if (name, attack, expect) in RAW_ATTACKS:
            attack(path)
        else:
            with h5py.File(path, "r+") as f:
                attack(f)
        with open(f"{d}/latest", "w") as f:
            f.write("step-00000002.h5\n")
        before = hashlib.md5(open(path, "rb").read()).hexdigest()
        failures += refused(name, d, expect)
        if hashlib.md5(open(path, "rb").read()).hexdigest() != before:
            print(f"BAD {name}: the file was modified")
            failures += 1
    # A symbolic link to itself is a loop, not a missing file.
    loop = f"{work}/loop.h5"
    os.symlink(loop, loop)
    failures += refused("symlink to itself", loop, "a loop of symbolic links")
    print("crafted checkpoints ok" if failures == 0 else f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
