#!/usr/bin/env python3
"""Generate tests/reference/fixtures/hf_config_absent_null.json: what transformers makes of a
config.json key that is absent and of the same key given as null, per model family.

Absent means the family's default (PhiConfig's pad_token_id 32000, MistralConfig's sliding_window
4096, ...); null means None, which is "no padding index", "no window", "derived from the other
keys" or an error, depending on the key and the family. Each case is a tiny config (every other
key given or left at transformers' default) and either the model transformers builds from it, in
the terms so_train reads (the embedding's padding index, head_dim, key/value heads, each layer's
sliding window, the RMSNorm epsilon, max_position_embeddings, rope_theta, tying, projection
biases), or the error transformers raised.

Layout: {"transformers_version": ..., "cases": [{"family", "key", "state": "absent"|"null",
"config": {...}, "expect": {...}} or {..., "error": "..."}]}; windows list one value per layer
(0: full attention).

Usage (from the repository root, with the project's Python, $SO_PYTHON):
    python tests/reference/make_hf_config_defaults_fixture.py [--out tests/reference/fixtures/hf_config_absent_null.json]
"""
import argparse
import dataclasses
import json
import logging
import warnings

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

# vocab 32064: Phi-3's absent pad_token_id (32000) must lie inside it to build.
BASE = {"vocab_size": 32064, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4, "num_key_value_heads": 2,
        "num_attention_heads": 4}
FAMILIES = {
    "llama": {}, "qwen3": {}, "qwen2": {}, "mistral": {}, "phi3": {}, "seed_oss": {},
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16},
    "gpt_oss": {"num_local_experts": 4, "num_experts_per_tok": 2},
}
# Families whose windows apply only with use_sliding_window: their window keys are also tried with it on.
WINDOWED = {"qwen2": {"use_sliding_window": True, "max_window_layers": 2},
            "qwen3": {"use_sliding_window": True, "max_window_layers": 2},
            "qwen3_moe": {"use_sliding_window": True}}
# Keys a family's config class does not have are left out, except those so_train reads for every
# family: transformers keeps any unknown key, so_train refuses the ones it does not know by name.
ALWAYS_READ = {"rope_theta", "head_dim", "attention_bias", "sliding_window"}
KEYS = ["pad_token_id", "head_dim", "num_key_value_heads", "sliding_window", "rms_norm_eps", "max_position_embeddings",
        "rope_theta", "rope_parameters", "use_sliding_window", "max_window_layers", "layer_types", "tie_word_embeddings",
        "attention_bias", "attention_dropout", "mlp_only_layers"]
WINDOW_KEYS = ["sliding_window", "max_window_layers", "layer_types"]


def effective(cfg):
    """The model transformers builds and trains (one step's forward and backward) from cfg, in
    so_train's terms."""
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(cfg)
    m.train()
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    m(input_ids=ids, labels=ids).loss.backward()
    attn = m.model.layers[0].self_attn
    hd = attn.head_dim
    if hasattr(attn, "qkv_proj"):  # Phi-3: q, k and v stacked
        kv = (attn.qkv_proj.out_features - cfg.num_attention_heads * hd) // (2 * hd)
        qkv_bias = attn.qkv_proj.bias is not None
    else:
        kv = attn.k_proj.out_features // hd
        qkv_bias = attn.q_proj.bias is not None
    windows = []
    for layer in m.model.layers:
        # A per-layer window where the attention keeps one (Qwen2/3, GPT-OSS), else the config's
        # for every layer (Mistral, Phi-3).
        a = layer.self_attn
        w = a.sliding_window if hasattr(a, "sliding_window") else getattr(m.config, "sliding_window", None)
        windows.append(w or 0)
    pad = m.model.embed_tokens.padding_idx
    return {"pad_token_id": -1 if pad is None else pad, "head_dim": hd, "num_key_value_heads": kv,
            "windows": windows, "rms_norm_eps": m.model.norm.variance_epsilon,
            "max_position_embeddings": m.config.max_position_embeddings,
            "rope_theta": m.config.rope_parameters["rope_theta"], "tie_word_embeddings": bool(m.config.tie_word_embeddings),
            "qkv_bias": qkv_bias, "o_bias": attn.o_proj.bias is not None}


def case(family, key, state, config):
    out = {"family": family, "key": key, "state": state, "config": config}
    try:
        out["expect"] = effective(AutoConfig.for_model(**config))
    except Exception as e:  # noqa: BLE001 - whatever transformers refuses, so_train must refuse
        out["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="tests/reference/fixtures/hf_config_absent_null.json")
    a = p.parse_args()
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    cases = []
    for family, extra in FAMILIES.items():
        bases = [dict(BASE, model_type=family, **extra)]
        if family in WINDOWED:
            bases.append(dict(bases[0], **WINDOWED[family]))
        for i, base in enumerate(bases):
            fields = {f.name for f in dataclasses.fields(type(AutoConfig.for_model(**base)))}
            for key in [k for k in (KEYS if i == 0 else WINDOW_KEYS) if k in fields or k in ALWAYS_READ]:
                for state in ("absent", "null"):
                    config = {k: v for k, v in base.items() if k != key}
                    if state == "null":
                        config[key] = None
                    cases.append(case(family, key, state, config))
    with open(a.out, "w") as f:
        json.dump({"transformers_version": transformers.__version__, "cases": cases}, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{a.out}: {len(cases)} cases, {sum('error' in c for c in cases)} refused by transformers")


if __name__ == "__main__":
    main()
