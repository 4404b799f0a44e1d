#!/usr/bin/env python3
"""Generate tests/reference/fixtures/rope_scaling.h5: transformers' RoPE frequency tables.

For each case, a config.json as published models write it (transformers 4 `rope_scaling` or
transformers 5 `rope_parameters`) and what transformers computes from it
(modeling_rope_utils.ROPE_INIT_FUNCTIONS):
  inv_freq32       the table transformers uses (float32)
  inv_freq64       the same functions run in double (torch.float and torch.float32 bound to
                   torch.float64 during the call), so that cos/sin at positions up to 2^21 can be checked: transformers'
                   own fp32 angles are off by up to 2^21 * 2^-24 = 0.125 rad there
  attention_factor the factor cos and sin are multiplied by (yarn)
  positions, cos64, sin64  [P, head_dim/2]: cos(pos * inv_freq64) * attention_factor, as
                   LlamaRotaryEmbedding.forward forms them (in double)
The script checks that the double tables equal the float32 ones (2e-6 relative: yarn's float32
blend rounds several times) and that the
rotary module's own cos/sin agree with cos64/sin64 at small positions.

Usage (repository root): $SO_PYTHON tests/reference/make_rope_fixture.py [--out DIR]
"""
import argparse
import contextlib
import json
import os

import h5py
import numpy as np
import torch
import transformers
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

POSITIONS = [0, 1, 2, 100, 4095, 8191, 8192, 32767, 65536, 131071, 1_000_000, (1 << 21) - 1, 1 << 21]

BASE = dict(model_type="llama", vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-5, hidden_act="silu")

CASES = {
    # Llama 3.1 / 3.3 (transformers 4 style, as published)
    "llama3_v4": dict(head_dim=128, max_position_embeddings=131072, rope_theta=500000.0,
                      rope_scaling=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                        original_max_position_embeddings=8192, rope_type="llama3")),
    # the same in transformers 5 style
    "llama3_v5": dict(head_dim=128, max_position_embeddings=131072,
                      rope_parameters=dict(rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                                           high_freq_factor=4.0, original_max_position_embeddings=8192,
                                           rope_type="llama3")),
    # Qwen2.5's documented long-context setting (legacy "type")
    "yarn_qwen": dict(head_dim=128, max_position_embeddings=131072, rope_theta=1000000.0,
                      rope_scaling=dict(type="yarn", factor=4.0, original_max_position_embeddings=32768)),
    # DeepSeek-style mscale ratio, betas given, no truncation, head_dim 80
    "yarn_mscale": dict(head_dim=80, max_position_embeddings=163840, rope_theta=10000.0,
                        rope_scaling=dict(rope_type="yarn", factor=40.0, original_max_position_embeddings=4096,
                                          beta_fast=24, beta_slow=2, mscale=0.707, mscale_all_dim=1.0,
                                          truncate=False)),
    # explicit attention factor, transformers 5 style
    "yarn_attention_factor": dict(head_dim=64, max_position_embeddings=32768,
                                  rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=8.0,
                                                       original_max_position_embeddings=4096,
                                                       attention_factor=1.25)),
    "linear": dict(head_dim=64, max_position_embeddings=8192,
                   rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0)),
    # dynamic NTK within max_position_embeddings: the default table
    "dynamic": dict(head_dim=64, max_position_embeddings=4096, rope_theta=10000.0,
                    rope_scaling=dict(type="dynamic", factor=2.0)),
    "default": dict(head_dim=128, max_position_embeddings=4096, rope_theta=500000.0, rope_scaling=None),
}


@contextlib.contextmanager
def float_is_double():
    # The functions name torch.float (and yarn's ramp torch.float32) at call time.
    saved = torch.float, torch.float32
    torch.float = torch.float32 = torch.float64
    try:
        yield
    finally:
        torch.float, torch.float32 = saved


def tables(raw):
    config = LlamaConfig(**{k: v for k, v in raw.items() if k != "model_type"})
    rope_type = config.rope_parameters.get("rope_type", "default")
    init = (LlamaRotaryEmbedding.compute_default_rope_parameters if rope_type == "default"
            else ROPE_INIT_FUNCTIONS[rope_type])
    inv32, af32 = init(config, device="cpu")
    with float_is_double():
        inv64, af64 = init(config, device="cpu")
    assert inv32.dtype == torch.float32 and inv64.dtype == torch.float64, (inv32.dtype, inv64.dtype)
    assert af32 == af64, (af32, af64)
    np.testing.assert_allclose(inv64.numpy(), inv32.numpy().astype(np.float64), rtol=2e-6, atol=0)
    return config, inv32.numpy(), inv64.numpy(), float(af64)


def make(out_dir):
    path = os.path.join(out_dir, "rope_scaling.h5")
    pos = np.array(POSITIONS, dtype=np.int64)
    with h5py.File(path, "w") as f:
        f.attrs["torch_version"] = str(torch.__version__)
        f.attrs["transformers_version"] = str(transformers.__version__)
        for name, kw in CASES.items():
            config_json = json.dumps(dict(BASE, **kw), sort_keys=True)  # before transformers edits the dicts
            config, inv32, inv64, af = tables(json.loads(config_json))
            angle = pos[:, None].astype(np.float64) * inv64[None, :]
            cos64, sin64 = np.cos(angle) * af, np.sin(angle) * af
            # transformers' own rotary module (fp32 angles): equal where fp32 angles are exact enough
            rotary = LlamaRotaryEmbedding(config)
            small = torch.arange(0, 64)[None, :]
            cos_hf, sin_hf = rotary(torch.zeros(1, dtype=torch.float32), small)
            half = inv64.shape[0]
            np.testing.assert_allclose(cos_hf[0, :, :half].double().numpy(),
                                       np.cos(np.arange(64)[:, None] * inv64[None, :]) * af, atol=2e-5, rtol=0)
            np.testing.assert_allclose(sin_hf[0, :, :half].double().numpy(),
                                       np.sin(np.arange(64)[:, None] * inv64[None, :]) * af, atol=2e-5, rtol=0)
            g = f.create_group(name)
            g.attrs["config_json"] = config_json
            g.attrs["rope_type"] = str(config.rope_parameters.get("rope_type", "default"))
            g.attrs["attention_factor"] = af
            g.create_dataset("inv_freq32", data=inv32)
            g.create_dataset("inv_freq64", data=inv64)
            g.create_dataset("positions", data=pos.astype(np.int32))
            g.create_dataset("cos64", data=cos64)
            g.create_dataset("sin64", data=sin64)
            print(f"{name}: {g.attrs['rope_type']}, head_dim {2 * half}, attention_factor {af:.9g}, "
                  f"inv_freq[-1] {inv64[-1]:.9g}")
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    print(make(args.out))


if __name__ == "__main__":
    main()
