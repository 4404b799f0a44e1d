#!/usr/bin/env python3
"""Generate tiny Hugging Face model directories for so_train's import tests (hf_models/).

Each model is a LlamaForCausalLM, Qwen3ForCausalLM, Qwen2ForCausalLM, MistralForCausalLM, Phi3ForCausalLM,
SeedOssForCausalLM, Qwen3MoeForCausalLM or GptOssForCausalLM with seeded random weights (initialised as
make_fixtures.py does), cast to its storage dtype and written with save_pretrained, exactly as a
user's model would be. Beside them, reference.json holds one token sequence and, per model, the
loss transformers computes on it after loading the directory back in float32 (bf16 and fp16
weights widen exactly, so so_train in fp32 must match it to fp32 rounding); tokens.sotokens holds
the same sequence as an so_train token file (SOTOKENS v1, 2 bytes per token), so that so_train's
first training step sees exactly these tokens. See README.md in this directory.

gpt_oss_mxfp4 is a GPT-OSS directory as OpenAI publishes it: the expert matrices quantised to MXFP4
here (E2M1 values in blocks of 32 with an E8M0 scale, per the OCP MX spec; `*_blocks` / `*_scales`
U8 tensors and quantization_config mxfp4 in config.json). Its reference loss is transformers' on the
dequantised model: the experts are set to what transformers' own dequantiser
(convert_moe_packed_tensors) makes of the blocks and scales, then the model is saved and reloaded.

Usage (from the repository root):
    python3 tests/reference/make_hf_models.py            # writes tests/reference/hf_models/
    python3 tests/reference/make_hf_models.py --out DIR
"""
import argparse
import json
import os
import shutil
import struct

import torch
import transformers

from check_hf_export import hf_loss
from make_fixtures import CLASSES, reinit_

SEQ_TOKENS = 33  # one sequence: 32 positions of next-token loss
TOKEN_SEED = 99
COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, hidden_act="silu",
              attention_bias=False)

MODELS = [
    dict(name="llama_tied_bf16", cls="llama", seed=11, dtype=torch.bfloat16,
         config=dict(tie_word_embeddings=True, rope_theta=10000.0)),
    dict(name="llama_untied_fp32", cls="llama", seed=12, dtype=torch.float32,
         config=dict(tie_word_embeddings=False, rope_theta=500000.0)),
    dict(name="llama_untied_fp16_sharded", cls="llama", seed=13, dtype=torch.float16, max_shard_size="80KB",
         config=dict(tie_word_embeddings=False, rope_theta=10000.0, num_key_value_heads=1)),
    dict(name="qwen3_tied_bf16", cls="qwen3", seed=14, dtype=torch.bfloat16,
         config=dict(tie_word_embeddings=True, rope_theta=1000000.0, head_dim=32, use_sliding_window=False)),
    dict(name="qwen2_untied_bf16", cls="qwen2", seed=15, dtype=torch.bfloat16,
         config=dict(tie_word_embeddings=False, rope_theta=1000000.0, use_sliding_window=False)),
    dict(name="mistral_untied_fp32", cls="mistral", seed=16, dtype=torch.float32,
         config=dict(tie_word_embeddings=False, rope_theta=1000000.0, head_dim=32, sliding_window=4096)),
    dict(name="phi3_untied_bf16", cls="phi3", seed=17, dtype=torch.bfloat16,
         config=dict(tie_word_embeddings=False, rope_theta=250000.0, pad_token_id=3,
                     original_max_position_embeddings=128)),
    dict(name="seed_oss_tied_fp32", cls="seed_oss", seed=18, dtype=torch.float32,
         config=dict(tie_word_embeddings=True, rope_theta=10000000.0, head_dim=32, attention_bias=True,
                     attention_out_bias=True, attention_dropout=0.0, residual_dropout=0.0)),
    dict(name="qwen3_moe_untied_bf16", cls="qwen3_moe", seed=20, dtype=torch.bfloat16,
         config=dict(tie_word_embeddings=False, rope_theta=1000000.0, head_dim=32, num_experts=4,
                     num_experts_per_tok=2, moe_intermediate_size=48, norm_topk_prob=True, use_sliding_window=False)),
    # GPT-OSS keeps its own YaRN RoPE (rope="yarn"); a window of 8 on layer 0 so that 32 tokens feel it.
    dict(name="gpt_oss_untied_bf16", cls="gpt_oss", seed=21, dtype=torch.bfloat16, rope="yarn",
         config=dict(tie_word_embeddings=False, rope_theta=150000.0, head_dim=16, attention_bias=True,
                     intermediate_size=48, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                     output_router_logits=False)),
    # MXFP4 blocks hold 32 values along each matrix's input dimension: intermediate 64, hidden 64.
    dict(name="gpt_oss_mxfp4", cls="gpt_oss", seed=22, dtype=torch.bfloat16, rope="yarn", mxfp4=True,
         config=dict(tie_word_embeddings=False, rope_theta=150000.0, head_dim=16, attention_bias=True,
                     intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                     output_router_logits=False)),
]
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  # codes 0-7; bit 3 is the sign


def quantize_mxfp4(w):
    """[E, G*32, R] (GptOssExperts' layout) -> blocks [E, R, G, 16] and scales [E, R, G] uint8.

    Per block: the E8M0 scale 2^(floor(log2 amax) - 2) puts the largest magnitude in [4, 8) (E2M1's
    largest exponent is 2); each value / scale rounds to the nearest E2M1 magnitude (6 at most)."""
    rows = w.float().transpose(1, 2)  # [E, R, G*32]
    E, R, C = rows.shape
    blocks = rows.reshape(E, R, C // 32, 32)
    amax = blocks.abs().amax(dim=-1).clamp_min(2.0 ** -126)
    exp = (torch.floor(torch.log2(amax)) - 2).clamp(-127, 127)
    scaled = blocks / torch.pow(2.0, exp).unsqueeze(-1)
    code = (scaled.abs().unsqueeze(-1) - E2M1).abs().argmin(dim=-1)  # nearest magnitude (ties: the smaller)
    code = (code + 8 * (scaled < 0)).to(torch.uint8)
    packed = code[..., 0::2] | (code[..., 1::2] << 4)  # low nibble first
    return packed.contiguous(), (exp + 127).to(torch.uint8).contiguous()


def quantize_experts_(model):
    """Quantises every layer's expert matrices; sets the model's to their dequantised values (as
    transformers dequantises them) and returns the packed tensors by checkpoint name."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    packed = {}
    with torch.no_grad():
        for l, layer in enumerate(model.model.layers):
            for proj in ("gate_up_proj", "down_proj"):
                w = getattr(layer.mlp.experts, proj)
                blocks, scales = quantize_mxfp4(w)
                w.copy_(convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).to(w.dtype))
                name = f"model.layers.{l}.mlp.experts.{proj}"
                packed[name + "_blocks"], packed[name + "_scales"] = blocks, scales
    return packed


def write_mxfp4(path, packed):
    """Replaces the expert matrices of a saved model directory by their MXFP4 blocks and scales."""
    from safetensors.torch import load_file, save_file
    file = os.path.join(path, "model.safetensors")
    tensors = {k: v for k, v in load_file(file).items() if k.removesuffix("_blocks") + "_blocks" not in packed}
    save_file(dict(tensors, **packed), file, metadata={"format": "pt"})
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")


def build(spec):
    kw = dict(COMMON, **spec["config"])
    theta = kw.pop("rope_theta")
    if spec["cls"] in ("qwen2", "mistral", "phi3"):
        del kw["attention_bias"]  # not theirs: Qwen2 always has q/k/v biases, Mistral and Phi-3 none
    config_cls, cls = CLASSES[spec["cls"]]
    cfg = config_cls(**kw)
    cfg.rope_parameters = dict(cfg.rope_parameters, rope_type=spec.get("rope", "default"), rope_theta=theta)  # Phi-3 adds its partial_rotary_factor
    torch.manual_seed(spec["seed"])
    model = cls(cfg).float()
    reinit_(model)
    return model.to(spec["dtype"])


def write_sotokens(path, tokens):
    header = b"SOTOKENS" + struct.pack("<IIQ", 1, 2, len(tokens))
    with open(path, "wb") as f:
        f.write(header.ljust(32, b"\0"))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_models"))
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)

    gen = torch.Generator().manual_seed(TOKEN_SEED)
    tokens = torch.randint(0, COMMON["vocab_size"], (SEQ_TOKENS,), generator=gen).tolist()
    reference = dict(tokens=tokens, torch_version=torch.__version__, transformers_version=transformers.__version__,
                     models={})
    for spec in MODELS:
        path = os.path.join(args.out, spec["name"])
        shutil.rmtree(path, ignore_errors=True)
        model = build(spec)
        packed = quantize_experts_(model) if spec.get("mxfp4") else None
        model.save_pretrained(path, max_shard_size=spec.get("max_shard_size", "5GB"))
        loss = hf_loss(path, tokens)  # of the dequantised model, for an MXFP4 one
        if packed:
            write_mxfp4(path, packed)
        # so_train's CLI test compares the first loss to 4 decimals: keep clear of a rounding edge.
        assert abs((loss * 1e4) % 1 - 0.5) > 0.01, f"{spec['name']}: loss {loss} is too close to a rounding edge"
        reference["models"][spec["name"]] = dict(loss=loss, loss_4dp=f"{loss:.4f}", dtype=str(spec["dtype"]),
                                                  files=sorted(os.listdir(path)))
        size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
        print(f"{spec['name']}: loss {loss:.7f}, {size / 1024:.0f} KiB, {sorted(os.listdir(path))}")
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(reference, f, indent=1)
        f.write("\n")
    write_sotokens(os.path.join(args.out, "tokens.sotokens"), tokens)


if __name__ == "__main__":
    main()
