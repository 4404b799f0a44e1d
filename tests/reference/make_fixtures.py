#!/usr/bin/env python3
"""Generate reference fixtures (HDF5) for so_train's model/gradient/optimizer tests.

Each fixture holds a tiny Hugging Face model (float32, CPU, eager attention) with
deterministic weights, one forward/backward pass (loss, logits, every gradient) and a
10-step AdamW + grad-clip training run. See README.md in this directory for the layout.

Usage (from the repository root):
    python3 tests/reference/make_fixtures.py            # writes tests/reference/fixtures/*.h5
    python3 tests/reference/make_fixtures.py --out DIR  # writes DIR/*.h5
"""
import argparse
import copy
import os

import h5py
import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward as gpt_oss_attention
from transformers.models.llama import modeling_llama
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Phi3Config,
                          Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                          Qwen3MoeConfig, Qwen3MoeForCausalLM, SeedOssConfig, SeedOssForCausalLM, GptOssConfig,
                          GptOssForCausalLM)

CLASSES = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM),
           "qwen2": (Qwen2Config, Qwen2ForCausalLM), "mistral": (MistralConfig, MistralForCausalLM),
           "phi3": (Phi3Config, Phi3ForCausalLM), "seed_oss": (SeedOssConfig, SeedOssForCausalLM),
           "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM), "gpt_oss": (GptOssConfig, GptOssForCausalLM)}
PAD_POSITIONS = [(0, 3), (0, 20), (1, 10)]  # where a config with pad_token_id gets that token in every batch

B = 2            # batch size
S = 37           # input sequence length (input_ids has S + 1 columns); a spec's seq_len overrides it
N_LOGITS = 4     # logits stored for the first N_LOGITS positions of each sequence
TRAIN_STEPS = 10
LR, BETA1, BETA2, EPS, WEIGHT_DECAY, GRAD_CLIP = 3e-3, 0.9, 0.95, 1e-8, 0.1, 1.0
INIT_STD = 0.08      # std of Linear / Embedding weights
NORM_JITTER = 0.1    # RMSNorm weights = 1 + NORM_JITTER * randn

# What every fixture's config shares (a 2-layer GQA model, untied, no bias), and its changes to it.
BASE_CONFIG = dict(
    vocab_size=128, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0,
    rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=256, hidden_act="silu",
)
LLAMA_NO_BIAS = dict(attention_bias=False, mlp_bias=False)


def fixture(name, model_type, seed, config, **spec):
    """A fixture spec: BASE_CONFIG with `config`'s keys changed or added; `spec` the other fields
    (seq_len, packed, sinks, router_std, final_weights)."""
    return dict(name=name, model_type=model_type, seed=seed, **spec, config=dict(BASE_CONFIG, **config))


# The two MoE models (with and without the load-balancing loss below).
QWEN3_MOE = dict(intermediate_size=96, moe_intermediate_size=48, num_hidden_layers=3, head_dim=16,
                 rope_theta=1000000.0, rms_norm_eps=1e-6, num_experts=6, num_experts_per_tok=2,
                 norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1], output_router_logits=False)
GPT_OSS = dict(intermediate_size=48, head_dim=16, rope_theta=150000.0,
               rope_scaling=dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=False,
                                 original_max_position_embeddings=4096),
               num_local_experts=4, num_experts_per_tok=2, sliding_window=8, attention_bias=True,
               output_router_logits=False)
AUX_LOSS = dict(output_router_logits=True, router_aux_loss_coef=0.5)

FIXTURES = [
    fixture("llama_gqa_untied", "llama", 1234, dict(LLAMA_NO_BIAS, rope_theta=500000.0)),
    fixture("llama_tied_mqa", "llama", 2345,
            dict(LLAMA_NO_BIAS, num_hidden_layers=3, num_key_value_heads=1, tie_word_embeddings=True)),
    fixture("qwen3_tied", "qwen3", 3456,
            dict(intermediate_size=160, head_dim=32, rope_theta=1000000.0, rms_norm_eps=1e-6,
                 tie_word_embeddings=True, use_sliding_window=False, attention_bias=False)),
    # RoPE scaling through the whole model: the original context (16) is shorter than the
    # sequence (37), so the scaled bands matter; yarn's attention factor multiplies cos and sin.
    fixture("llama_rope_llama3", "llama", 4567,
            dict(LLAMA_NO_BIAS, max_position_embeddings=128,
                 rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                   original_max_position_embeddings=16))),
    fixture("llama_rope_yarn", "llama", 5678,
            dict(LLAMA_NO_BIAS, num_key_value_heads=1, tie_word_embeddings=True, max_position_embeddings=128,
                 rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=32))),
    # Projection biases (drawn like weights, so that their gradients and values matter): Qwen2's
    # q/k/v biases with an odd vocabulary, and with q dim (4 x 32) != hidden (64), MQA and tying;
    # Llama's attention_bias (q/k/v/o).
    fixture("qwen2_gqa_untied", "qwen2", 6789,
            dict(vocab_size=131, rope_theta=1000000.0, rms_norm_eps=1e-6, use_sliding_window=False)),
    fixture("qwen2_tied_mqa_qdim", "qwen2", 7890,
            dict(vocab_size=127, intermediate_size=160, num_key_value_heads=1, head_dim=32, rope_theta=1000000.0,
                 rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False)),
    fixture("llama_attention_bias", "llama", 8901,
            dict(tie_word_embeddings=True, attention_bias=True, mlp_bias=False)),
    # Phi-3 (Phi-4's family): fused qkv_proj and gate_up_proj, stored here split into so_train's
    # names (q_proj, k_proj, v_proj, gate_proj, up_proj); pad_token_id 5 occurs in every batch.
    fixture("phi3_gqa_pad", "phi3", 1357,
            dict(rope_theta=250000.0, original_max_position_embeddings=256, pad_token_id=5, sliding_window=None,
                 resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0)),
    # padding_idx with a tied head: the lookup's gradient skips row 7, the head's still reaches it.
    fixture("llama_tied_pad", "llama", 2468, dict(LLAMA_NO_BIAS, tie_word_embeddings=True, pad_token_id=7)),
    # Seed-OSS: q/k/v biases and an o bias (attention_out_bias), q dim (4 x 32) != hidden (64), GQA,
    # odd vocabulary, pad_token_id 1 in every batch; its dropout (default 0.1) set to 0. rope_theta
    # 1e4, not Seed-OSS's 1e7: with pairs that barely turn over 37 positions, k_proj's bias adds
    # almost the same q.b to every score of a query (softmax ignores it), its gradient there is
    # rounding noise that AdamW amplifies, and 10 steps would compare noise.
    fixture("seed_oss_qdim_bias", "seed_oss", 3579,
            dict(vocab_size=129, head_dim=32, rms_norm_eps=1e-6, attention_bias=True, attention_out_bias=True,
                 attention_dropout=0.0, residual_dropout=0.0, pad_token_id=1)),
    # Mistral: Llama's maths; its sliding window (64) is longer than the sequence (37).
    fixture("mistral_window", "mistral", 9012, dict(head_dim=32, rope_theta=1000000.0, sliding_window=64)),
    # Sliding windows shorter than the sequence: Mistral's on every layer (8 keys per query),
    # Qwen2's with use_sliding_window on the layers from max_window_layers on (layer 1 of 2). These
    # and the packed ones have 36 positions, so that two Ulysses ranks split them (test_reference_sp).
    fixture("mistral_window_short", "mistral", 9123, dict(head_dim=16, sliding_window=8), seq_len=36),
    fixture("qwen2_sliding_layers", "qwen2", 9234,
            dict(vocab_size=131, rms_norm_eps=1e-6, use_sliding_window=True, sliding_window=11, max_window_layers=1),
            seq_len=36),
    # Packed rows: several documents per row (lengths below, positions restarting at each), whose
    # loss and gradients are those of the documents run separately through the model (transformers
    # would attend across documents in a packed forward; the reference never packs).
    fixture("llama_packed", "llama", 9345, LLAMA_NO_BIAS, seq_len=36, packed=[[9, 17, 1, 9], [36]]),
    # GPT-OSS's attention sinks without its family (which the MoE work adds): a Llama whose layers
    # get self_attn.sinks and GPT-OSS's eager attention (an extra logit column per head); so_train
    # switches ModelConfig::attention_sinks on for it (the fixture's attention_sinks attribute).
    fixture("llama_sinks", "llama", 9567, LLAMA_NO_BIAS, seq_len=36, sinks=True, packed=[[13, 23], [36]]),
    fixture("mistral_packed_window", "mistral", 9457,
            dict(num_key_value_heads=1, head_dim=16, tie_word_embeddings=True, sliding_window=7),
            seq_len=36, packed=[[20, 16], [5, 6, 25]]),
    # Qwen3-MoE: 3 layers, the middle one dense (mlp_only_layers), the others 6 experts with top-2
    # renormalised routing; q/k norm, GQA, untied.
    fixture("qwen3_moe_mixed", "qwen3_moe", 8642, QWEN3_MOE),
    # GPT-OSS: every layer MoE (4 experts, top-2 of the biased router's logits, clamped GLU, fused
    # interleaved expert tensors with biases), q/k/v/o biases, learned sinks, a sliding window of 8
    # on layer 0 (layer_types' default: every other layer), yarn RoPE (GptOssConfig's default).
    fixture("gpt_oss_window_sinks", "gpt_oss", 7531, GPT_OSS),
    # The load-balancing loss (output_router_logits): qwen3_moe_mixed's and gpt_oss_window_sinks'
    # models with it on, its coefficient raised so that its gradient is far above rounding.
    fixture("qwen3_moe_aux", "qwen3_moe", 8643, dict(QWEN3_MOE, **AUX_LOSS)),
    fixture("gpt_oss_aux", "gpt_oss", 7532, dict(GPT_OSS, **AUX_LOSS)),
    # Qwen3-MoE for bf16: a router with real preferences (router_std 0.2: logits of std 0.8-1.3),
    # so that no token's 2nd and 3rd experts are within bf16 rounding of a tie (smallest gap 0.01
    # here, at least 1.7x what rounding the router's input and weight to bf16 moves it; 0.002 in
    # qwen3_moe_mixed, whose bf16 run sends a token to another expert and is off by 0.34 on that
    # expert's gradients). Stronger routing moves the router's gradient further from
    # fp32 in bf16 (0.5: 3.3e-2). Tiny, and without final weights (its fp32 run is held to torch
    # by every step's loss and gradient norm), so that it adds little to what travels to the GPU machine.
    fixture("qwen3_moe_routed", "qwen3_moe", 8644,
            dict(QWEN3_MOE, vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                 num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, num_experts=4, mlp_only_layers=[]),
            router_std=0.2, final_weights=False),
]


def build_model(spec):
    kw = dict(spec["config"], attn_implementation="eager")
    kw.setdefault("rope_scaling", None)
    config_cls, cls = CLASSES[spec["model_type"]]
    cfg = config_cls(**kw)
    cfg._attn_implementation = "eager"
    model = cls(cfg).float()
    if spec.get("sinks"):
        for layer in model.model.layers:
            layer.self_attn.sinks = torch.nn.Parameter(torch.empty(cfg.num_attention_heads))
    # Sanity checks on how the installed transformers interpreted the config.
    theta = spec["config"]["rope_theta"]
    rp = getattr(cfg, "rope_parameters", None)
    got_theta = rp["rope_theta"] if rp else cfg.rope_theta
    assert got_theta == theta, (got_theta, theta)
    if rp:
        want = (spec["config"].get("rope_scaling") or {}).get("rope_type", "default")
        assert rp.get("rope_type", "default") == want, rp
    if spec["model_type"] in ("qwen3", "qwen2"):
        want = ["sliding_attention" if spec["config"].get("use_sliding_window") and
                i >= spec["config"].get("max_window_layers", 28) else "full_attention"
                for i in range(cfg.num_hidden_layers)]
        assert cfg.layer_types == want, cfg.layer_types
    if "head_dim" in spec["config"]:
        assert model.model.layers[0].self_attn.head_dim == spec["config"]["head_dim"]
    return model


def reinit_(model, router_std=INIT_STD):
    """Linear/Embedding weights and biases ~ N(0, INIT_STD); RMSNorm weights = 1 + NORM_JITTER*randn.

    Tied parameters are initialised once (the first module that owns them, in
    named_modules() order, i.e. the embedding)."""
    seen = set()
    with torch.no_grad():
        for _, mod in model.named_modules():
            w = getattr(mod, "weight", None)
            if hasattr(mod, "sinks") and id(mod.sinks) not in seen:
                mod.sinks.normal_(0.0, 1.0)  # wide, so that the sink takes a real share of every row
                seen.add(id(mod.sinks))
            if w is None or id(w) in seen:
                continue
            cls = type(mod).__name__
            if isinstance(mod, (torch.nn.Linear, torch.nn.Embedding)):
                w.normal_(0.0, INIT_STD)
                if getattr(mod, "bias", None) is not None:
                    mod.bias.normal_(0.0, INIT_STD)
                    seen.add(id(mod.bias))
            elif cls.endswith("RMSNorm"):
                w.copy_(1.0 + NORM_JITTER * torch.randn_like(w))
            elif cls.endswith("TopKRouter"):  # an MoE router: a linear layer without the class
                w.normal_(0.0, router_std)
                if getattr(mod, "bias", None) is not None:  # GPT-OSS's router has a bias
                    mod.bias.normal_(0.0, INIT_STD)
                    seen.add(id(mod.bias))
            else:
                raise RuntimeError(f"unexpected module with weight: {cls}")
            seen.add(id(w))
        for _, mod in model.named_modules():  # fused expert stacks (transformers 5's MoE experts)
            if type(mod).__name__.endswith("Experts"):
                for p in mod.parameters(recurse=False):
                    p.normal_(0.0, INIT_STD)
                    seen.add(id(p))
    # every parameter must have been touched
    for n, p in model.named_parameters():
        assert id(p) in seen, n


def lm_loss(model, ids):
    out = model(input_ids=ids[:, :-1])
    logits = out.logits
    V = logits.shape[-1]
    loss = F.cross_entropy(logits.reshape(-1, V).float(), ids[:, 1:].reshape(-1))
    if getattr(model.config, "output_router_logits", False):  # as the model adds it with labels
        loss = loss + model.config.router_aux_loss_coef * out.aux_loss
    return loss, logits


def packed_loss(model, docs):
    """Every document run on its own (positions from 0); the sum of their token losses over all
    tokens, as one packed forward's mean. Logits of each row's first document."""
    total, n, first_logits = 0.0, 0, []
    for row in docs:
        for j, ids in enumerate(row):
            logits = model(input_ids=ids[None, :-1]).logits
            total = total + F.cross_entropy(logits[0].float(), ids[1:], reduction="sum")
            n += ids.numel() - 1
            if j == 0:
                first_logits.append(logits[0, :N_LOGITS])
    return total / n, torch.stack(first_logits)


def pack_rows(docs):
    """inputs, targets, positions and doc_start [B, S] int32 of rows of documents."""
    out = {k: [] for k in ("inputs", "targets", "positions", "doc_start")}
    for row in docs:
        r = {k: [] for k in out}
        for ids in row:
            n = ids.numel() - 1
            r["doc_start"] += [len(r["inputs"])] * n
            r["inputs"] += ids[:-1].tolist()
            r["targets"] += ids[1:].tolist()
            r["positions"] += list(range(n))
        for k in out:
            out[k].append(r[k])
    return {k: np.array(v, dtype=np.int32) for k, v in out.items()}


def np32(t):
    return t.detach().cpu().to(torch.float32).numpy()


def keeps_final_weight(name):
    """The weights after 10 steps are kept for the embedding, the head and layer 0 (every kind of
    parameter a family has); the other layers are held to torch by the losses and gradient norms
    of every step. It keeps the fixtures, which travel to the GPU machine, within its carry."""
    return not name.startswith("model.layers.") or name.startswith("model.layers.0.")


def split_fused(cfg, tensors):
    """Phi-3's stacked projections under so_train's parameter names (rows [q; k; v], [gate; up]);
    transformers 5's fused MoE experts under the per-expert names its checkpoints use
    (gate_up_proj [E, 2I, H] -> experts.e.gate_proj / up_proj, down_proj [E, H, I] -> experts.e.down_proj)."""
    out = {}
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * head_dim, cfg.num_key_value_heads * head_dim
    for n, a in tensors.items():
        if n.endswith("qkv_proj.weight"):
            base = n[: -len("qkv_proj.weight")]
            out[base + "q_proj.weight"], out[base + "k_proj.weight"], out[base + "v_proj.weight"] = (
                a[:q], a[q:q + kv], a[q + kv:])
        elif cfg.model_type == "qwen3_moe" and (n.endswith("mlp.experts.gate_up_proj") or
                                                n.endswith("mlp.experts.down_proj")):
            base, which = n.rsplit(".", 1)
            for e in range(a.shape[0]):
                if which == "down_proj":
                    out[f"{base}.{e}.down_proj.weight"] = a[e]
                else:
                    half = a.shape[1] // 2
                    out[f"{base}.{e}.gate_proj.weight"], out[f"{base}.{e}.up_proj.weight"] = a[e, :half], a[e, half:]
        elif n.endswith("gate_up_proj.weight"):
            base = n[: -len("gate_up_proj.weight")]
            half = a.shape[0] // 2
            out[base + "gate_proj.weight"], out[base + "up_proj.weight"] = a[:half], a[half:]
        else:
            out[n] = a
    return {n: np.ascontiguousarray(a) for n, a in out.items()}


def make_fixture(spec, out_dir):
    if spec.get("sinks"):  # Llama's attention module calls GPT-OSS's eager attention while this runs
        plain = modeling_llama.eager_attention_forward
        modeling_llama.eager_attention_forward = gpt_oss_attention
        try:
            return make_fixture_with(spec, out_dir)
        finally:
            modeling_llama.eager_attention_forward = plain
    return make_fixture_with(spec, out_dir)


def seeded_model_and_batches(spec):
    """The spec's model with its initial weights, the single step's rows, the training batches and
    the generator the packed documents are drawn from next, all from the spec's seed."""
    torch.manual_seed(spec["seed"])
    model = build_model(spec)
    reinit_(model, spec.get("router_std", INIT_STD))
    model.train()  # dropout is 0 everywhere; train() vs eval() makes no numerical difference
    V = model.config.vocab_size
    gen = torch.Generator().manual_seed(spec["seed"] + 1)
    S = spec.get("seq_len", globals()["S"])
    ids = torch.randint(0, V, (B, S + 1), generator=gen)
    train_ids = torch.randint(0, V, (TRAIN_STEPS, B, S + 1), generator=gen)
    pad = model.config.pad_token_id
    if pad is not None:
        assert model.model.embed_tokens.padding_idx == pad
        for b, t in PAD_POSITIONS:
            ids[b, t] = pad
            train_ids[:, b, t] = pad
    return model, ids, train_ids, gen


def single_step_loss(spec, model, ids, gen):
    """The fixture's single forward: loss, logits and the packed rows (None for plain rows)."""
    if "packed" not in spec:
        return (*lm_loss(model, ids), None)
    V = model.config.vocab_size
    docs = [[torch.randint(0, V, (n + 1,), generator=gen) for n in row] for row in spec["packed"]]
    assert all(sum(row) == ids.shape[1] - 1 for row in spec["packed"]) and all(row[0] >= N_LOGITS for row in spec["packed"])
    return (*packed_loss(model, docs), pack_rows(docs))


def make_fixture_with(spec, out_dir):
    model, ids, train_ids, gen = seeded_model_and_batches(spec)
    tied = bool(model.config.tie_word_embeddings)
    if tied:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    else:
        assert model.lm_head.weight is not model.model.embed_tokens.weight

    train_model = copy.deepcopy(model)  # fresh copy of the initial weights for training
    if tied:
        assert train_model.lm_head.weight is train_model.model.embed_tokens.weight

    # ---- single forward / backward ----
    init_weights = split_fused(model.config, {n: np32(p) for n, p in model.named_parameters()})
    model.zero_grad(set_to_none=True)
    loss, logits, packed = single_step_loss(spec, model, ids, gen)
    loss.backward()
    grads = split_fused(model.config, {n: np32(p.grad) for n, p in model.named_parameters()})

    # ---- 10-step AdamW training run ----
    params = list(train_model.parameters())
    opt = torch.optim.AdamW(params, lr=LR, betas=(BETA1, BETA2), eps=EPS,
                            weight_decay=WEIGHT_DECAY)
    losses, norms = [], []
    for step in range(TRAIN_STEPS):
        opt.zero_grad(set_to_none=True)
        l, _ = lm_loss(train_model, train_ids[step])
        l.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, max_norm=GRAD_CLIP)
        opt.step()
        losses.append(l.item())
        norms.append(gn.item())
    final_weights = split_fused(train_model.config, {n: np32(p) for n, p in train_model.named_parameters()})

    path = os.path.join(out_dir, spec["name"] + ".h5")
    with h5py.File(path, "w") as f:
        f.attrs["config_json"] = str(model.config.to_json_string())
        f.attrs["model_type"] = str(spec["model_type"])
        if spec.get("sinks"):
            f.attrs["attention_sinks"] = 1
        f.attrs["torch_version"] = str(torch.__version__)
        f.attrs["transformers_version"] = str(transformers.__version__)
        # convenience copies (config_json has rope_theta under rope_parameters in transformers>=5)
        f.attrs["rope_theta"] = float(spec["config"]["rope_theta"])
        f.attrs["tie_word_embeddings"] = int(tied)
        f.attrs["seed"] = int(spec["seed"])
        f.create_dataset("input_ids", data=ids.numpy().astype(np.int32))
        if packed is not None:  # the batch of the single forward/backward (input_ids then unused there)
            p = f.create_group("packed")
            for k, a in packed.items():
                p.create_dataset(k, data=a)
        f.create_dataset("loss", data=np.array([loss.item()], dtype=np.float32))
        f.create_dataset("logits", data=np32(logits[:, :N_LOGITS, :]))
        gw, gg = f.create_group("weights"), f.create_group("grads")
        for n in init_weights:
            gw.create_dataset(n, data=init_weights[n])
            gg.create_dataset(n, data=grads[n])
        t = f.create_group("train")
        t.attrs["lr"] = float(LR)
        t.attrs["beta1"] = float(BETA1)
        t.attrs["beta2"] = float(BETA2)
        t.attrs["eps"] = float(EPS)
        t.attrs["weight_decay"] = float(WEIGHT_DECAY)
        t.attrs["grad_clip"] = float(GRAD_CLIP)
        t.attrs["steps"] = int(TRAIN_STEPS)
        t.create_dataset("input_ids", data=train_ids.numpy().astype(np.int32))
        t.create_dataset("losses", data=np.array(losses, dtype=np.float32))
        t.create_dataset("grad_norms", data=np.array(norms, dtype=np.float32))
        fw = t.create_group("final_weights")
        for n, a in final_weights.items():
            if spec.get("final_weights", True) and keeps_final_weight(n):
                fw.create_dataset(n, data=a)
    return path


def verify(path):
    with h5py.File(path, "r") as f:
        print(f"== {path} ({os.path.getsize(path) / 1024:.1f} KiB)")
        for k in ("model_type", "torch_version", "transformers_version", "rope_theta",
                  "tie_word_embeddings"):
            print(f"  attr {k} = {f.attrs[k]}")
        def show(name, obj):
            if isinstance(obj, h5py.Dataset):
                print(f"  /{name} {obj.dtype} {obj.shape}")
        f.visititems(show)
        print(f"  train attrs: {dict(f['train'].attrs)}")
        print(f"  loss = {f['loss'][0]:.7f}")
        print(f"  train/losses = {np.array2string(f['train/losses'][:], precision=5)}")
        print(f"  train/grad_norms = {np.array2string(f['train/grad_norms'][:], precision=5)}")
        assert set(f["weights"]) == set(f["grads"])
        kept = set(f["train/final_weights"])  # none where the spec says final_weights=False
        assert not kept or kept == {n for n in f["weights"] if keeps_final_weight(n)}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "fixtures"))
    ap.add_argument("--only", nargs="*", help="write only these fixtures (names)")
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # bit-for-bit reproducible CPU reductions
    os.makedirs(args.out, exist_ok=True)
    for spec in FIXTURES:
        if not args.only or spec["name"] in args.only:
            verify(make_fixture(spec, args.out))


if __name__ == "__main__":
    main()
