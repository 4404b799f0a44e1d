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
from transformers import LlamaConfig, Qwen3Config

COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=256, max_position_embeddings=128)

CONFIGS = {
    "llama_tied": lambda: LlamaConfig(**COMMON, tie_word_embeddings=True),
    "llama_untied": lambda: LlamaConfig(**COMMON, tie_word_embeddings=False),
    "qwen3_tied": lambda: Qwen3Config(**COMMON, head_dim=16, tie_word_embeddings=True),
    "qwen3_untied": lambda: Qwen3Config(**COMMON, head_dim=16, tie_word_embeddings=False),
}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=here, help="folder that gets v4/ or v5/ (default: beside this script)")
    args = ap.parse_args()

    major = int(transformers.__version__.split(".")[0])
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
