#!/usr/bin/env python3
"""Generate tests/reference/fixtures/mxfp4_torch.h5: GPT-OSS MXFP4 expert weights and their values.

The oracle is transformers' own dequantiser (integrations/mxfp4.py, convert_moe_packed_tensors),
which turns `*_blocks` [E, R, G, 16] uint8 (E2M1 pairs, low nibble first) and `*_scales` [E, R, G]
uint8 (E8M0) into the [E, G*32, R] tensors GptOssExperts uses. so_train keeps the rows as rows, so
the fixture stores the result transposed back: values [E, R, G*32] float32.

Every E2M1 code and a spread of scales (2^-20 .. 2^20, and 127 = 1) appear.

Usage (from the repository root, with the project's Python, $SO_PYTHON):
    python tests/reference/make_mxfp4_fixture.py [--out tests/reference/fixtures/mxfp4_torch.h5]
"""
import h5py
import numpy as np
import torch
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from fixture_file import fixture_out


def main():
    out = fixture_out(__doc__, "mxfp4_torch.h5")
    rng = np.random.default_rng(2029)
    E, R, G = 3, 5, 4
    blocks = rng.integers(0, 256, size=(E, R, G, 16), dtype=np.uint8)
    blocks[0, 0, 0] = np.arange(16, dtype=np.uint8) * 17  # every code in both nibbles
    scales = rng.integers(127 - 20, 127 + 21, size=(E, R, G), dtype=np.uint8)
    scales[0, 0, 0] = 127
    values = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32)
    with h5py.File(out, "w") as f:
        f["blocks"], f["scales"] = blocks, scales
        f["values"] = values.transpose(1, 2).contiguous().numpy()
    print(f"blocks {blocks.shape}, scales {scales.shape}, values {tuple(values.transpose(1, 2).shape)}")


if __name__ == "__main__":
    main()
