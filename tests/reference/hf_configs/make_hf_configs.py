#!/usr/bin/env python3
"""Write tiny Hugging Face config.json files exactly as transformers' `config.save_pretrained` does.

They are ground truth for so_train's HF config parser (src/model/model_config.cpp): the keys and
values a user's config.json really carries, from both major transformers versions. Only
`transformers` is needed (no torch): a config is saved without any model.

The output folder is chosen from `transformers.__version__`: 4.x writes into v4/, 5.x into v5/,
next to this script (or under --out DIR). Each file is the config.json that
`config.save_pretrained(tmpdir)` wrote, copied byte for byte:

    llama_tied.json, llama_untied.json     LlamaConfig(...)
    qwen3_tied.json, qwen3_untied.json     Qwen3Config(..., head_dim=16)
    qwen2.json, mistral.json               Qwen2Config(...), MistralConfig(...)
    phi3.json                              Phi3Config(..., pad_token_id=5)
    seed_oss.json                          SeedOssConfig(..., head_dim=32, dropouts 0)
    llama_rope_llama3.json                 LlamaConfig, Llama 3.1's llama3 RoPE scaling
    qwen3_rope_yarn.json                   Qwen3Config, yarn (factor 4, original context 32)
    phi3_longrope_partial.json             Phi-4-mini's shape of RoPE: partial_rotary_factor 0.75 and
                                           longrope (so_train refuses it by name)

RoPE settings go in as each version takes them: rope_theta and rope_scaling in 4.x,
rope_parameters in 5.x (which 5.x would also build from the 4.x arguments).

All share: hidden_size 64, intermediate_size 128, num_hidden_layers 2, num_attention_heads 4,
num_key_value_heads 2, vocab_size 256, max_position_embeddings 128. Everything else is left at
transformers' defaults, so the files show what each version writes by default.

Run it once per major version, each in its own virtual environment:

    python3 -m venv /tmp/hfv4 && /tmp/hfv4/bin/pip install "transformers<5"
    /tmp/hfv4/bin/python tests/reference/hf_configs/make_hf_configs.py     # -> v4/

    python3 -m venv /tmp/hfv5 && /tmp/hfv5/bin/pip install "transformers>=5"
    /tmp/hfv5/bin/python tests/reference/hf_configs/make_hf_configs.py     # -> v5/

The versions used for the committed files are recorded in README.md beside this script.
"""
import argparse
import os
import shutil
import tempfile

import transformers
from transformers import LlamaConfig, MistralConfig, Phi3Config, Qwen2Config, Qwen3Config, SeedOssConfig

COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=256, max_position_embeddings=128)

MAJOR = int(transformers.__version__.split(".")[0])


def rope(theta, partial_rotary_factor=None, **scaling):
    """RoPE arguments the way this transformers version takes them."""
    if MAJOR >= 5:
        params = {"rope_theta": theta, "rope_type": "default", **scaling}
        if partial_rotary_factor is not None:
            params["partial_rotary_factor"] = partial_rotary_factor
        return dict(rope_parameters=params)
    out = dict(rope_theta=theta, rope_scaling=scaling or None)
    if partial_rotary_factor is not None:
        out["partial_rotary_factor"] = partial_rotary_factor
    return out


LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=16)
YARN = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=32)
# Phi-4-mini's: 48 factors = head_dim 128 x 0.75 / 2; here head_dim 16 x 0.75 / 2 = 6. Phi-3's 4.x
# class reads the type under "type" only (as Phi-4-mini's config.json has it).
LONGROPE = {"rope_type" if MAJOR >= 5 else "type": "longrope", "short_factor": [1.0] * 6, "long_factor": [1.5] * 6}

CONFIGS = {
    "llama_tied": lambda: LlamaConfig(**COMMON, tie_word_embeddings=True),
    "llama_untied": lambda: LlamaConfig(**COMMON, tie_word_embeddings=False),
    "qwen3_tied": lambda: Qwen3Config(**COMMON, head_dim=16, tie_word_embeddings=True),
    "qwen3_untied": lambda: Qwen3Config(**COMMON, head_dim=16, tie_word_embeddings=False),
    "qwen2": lambda: Qwen2Config(**COMMON, **rope(1000000.0)),
    "mistral": lambda: MistralConfig(**COMMON, **rope(1000000.0)),
    "phi3": lambda: Phi3Config(**COMMON, pad_token_id=5, **rope(250000.0)),
    "seed_oss": lambda: SeedOssConfig(**COMMON, head_dim=32, attention_dropout=0.0, residual_dropout=0.0,
                                      **rope(10000.0)),
    "llama_rope_llama3": lambda: LlamaConfig(**COMMON, **rope(500000.0, **LLAMA3)),
    "qwen3_rope_yarn": lambda: Qwen3Config(**COMMON, head_dim=16, **rope(1000000.0, **YARN)),
    "phi3_longrope_partial": lambda: Phi3Config(**COMMON, pad_token_id=5, original_max_position_embeddings=64,
                                                **rope(10000.0, partial_rotary_factor=0.75, **LONGROPE)),
}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=here, help="folder that gets v4/ or v5/ (default: beside this script)")
    args = ap.parse_args()

    major = MAJOR
    if major not in (4, 5):
        raise SystemExit(f"transformers {transformers.__version__}: expected a 4.x or 5.x release")
    out_dir = os.path.join(args.out, f"v{major}")
    os.makedirs(out_dir, exist_ok=True)

    for name, make in CONFIGS.items():
        cfg = make()
        with tempfile.TemporaryDirectory() as tmp:
            cfg.save_pretrained(tmp)
            shutil.copyfile(os.path.join(tmp, "config.json"), os.path.join(out_dir, f"{name}.json"))
        print(f"wrote {os.path.join(out_dir, name + '.json')} (transformers {transformers.__version__})")


if __name__ == "__main__":
    main()
