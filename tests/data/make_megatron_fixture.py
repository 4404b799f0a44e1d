#!/usr/bin/env python
"""Writes small Megatron-LM indexed datasets (PREFIX.bin + PREFIX.idx) for test_data_path, in the
format of Megatron-LM's megatron/core/datasets/indexed_dataset.py (_IndexWriter: "MMIDIDX\\0\\0",
<Q version 1, <B dtype code, <Q sequence count, <Q document-index count, int32 lengths, int64 byte
pointers, int64 document indices), written here from that description with numpy and struct, and
the documents as JSON (documents.json) for the reader to be compared with.

  $SO_PYTHON tests/data/make_megatron_fixture.py tests/data/fixtures
"""
import json
import os
import struct
import sys

import numpy as np

CODES = {np.uint16: 8, np.int32: 4}


def write(prefix, documents, dtype, sentences_per_doc=1):
    """Each document is one sequence, or split into `sentences_per_doc` sequences (Megatron's
    --split-sentences), as preprocess_data.py writes them."""
    lengths, doc_index = [], [0]
    with open(prefix + ".bin", "wb") as b:
        for doc in documents:
            parts = np.array_split(np.asarray(doc), min(sentences_per_doc, len(doc)))
            for part in parts:
                b.write(np.asarray(part, dtype=dtype).tobytes(order="C"))
                lengths.append(len(part))
            doc_index.append(len(lengths))
    item = np.dtype(dtype).itemsize
    pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]) * item
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", CODES[dtype]))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(doc_index)))
        f.write(np.array(lengths, dtype=np.int32).tobytes(order="C"))
        f.write(np.array(pointers, dtype=np.int64).tobytes(order="C"))
        f.write(np.array(doc_index, dtype=np.int64).tobytes(order="C"))


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(29)
    docs_a = [rng.integers(1, 60000, size=int(n)).tolist() for n in rng.integers(1, 90, size=40)]
    docs_b = [rng.integers(1, 250, size=int(n)).tolist() for n in rng.integers(5, 200, size=12)]
    write(os.path.join(out, "megatron_u16"), docs_a, np.uint16)
    write(os.path.join(out, "megatron_i32_sentences"), docs_b, np.int32, sentences_per_doc=3)
    with open(os.path.join(out, "megatron_documents.json"), "w") as f:
        json.dump({"megatron_u16": docs_a, "megatron_i32_sentences": docs_b}, f)


if __name__ == "__main__":
    main()
