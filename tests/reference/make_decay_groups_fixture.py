#!/usr/bin/env python3
"""Generate tests/reference/fixtures/decay_groups_torch.h5: 10 AdamW steps with HF Trainer's groups.

The oracle for so_train's weight-decay groups (train.weight_decay_exclude, train.decay_embeddings):
a tiny Qwen3 model (it has every kind of norm: input/post-attention, q_norm/k_norm and the final
norm), its parameters split as transformers' own Trainer.get_decay_parameter_names splits them,
and torch.optim.AdamW over the two groups ({decay: weight_decay}, {the rest: 0}) for 10 steps with
gradients given per step and clip_grad_norm_ clipping some of them.

Layout:
    attrs config_json (the HF config), lr, beta1, beta2, eps, weight_decay, max_norm (float64),
          steps, torch_version, transformers_version
    p0/<name> f32 [numel]; grads/<name> f32 [STEPS, numel] (HF parameter names, untied)
    <case>/ with attr decayed (the names in the decay group, comma-separated) and
        p/<name>, m/<name>, v/<name> f32 [numel] after the last step, for the cases
        hf_trainer          Trainer.get_decay_parameter_names (embeddings decayed, as HF does)
        no_embedding_decay  the same without model.embed_tokens.weight (train.decay_embeddings false)

Usage (from the repository root, with the project's Python, $SO_PYTHON):
    python tests/reference/make_decay_groups_fixture.py [--out tests/reference/fixtures/decay_groups_torch.h5]
"""
import numpy as np
import torch
import transformers
from transformers import Qwen3Config, Qwen3ForCausalLM, Trainer

from fixture_file import create_fixture, fixture_out

STEPS = 10
LR, BETA1, BETA2, EPS, WEIGHT_DECAY = 1e-2, 0.9, 0.95, 1e-8, 0.1
CONFIG = dict(vocab_size=48, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, head_dim=16, rope_theta=1000000.0, rms_norm_eps=1e-6,
              tie_word_embeddings=False, max_position_embeddings=64, use_sliding_window=False,
              attention_bias=False, hidden_act="silu")


def run(model, p0, grads, decayed, max_norm):
    params = dict(model.named_parameters())
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(torch.from_numpy(p0[n]).view(p.shape))
    groups = [{"params": [params[n] for n in params if n in decayed], "weight_decay": WEIGHT_DECAY},
              {"params": [params[n] for n in params if n not in decayed], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=LR, betas=(BETA1, BETA2), eps=EPS, foreach=False)
    for t in range(STEPS):
        for n, p in params.items():
            p.grad = torch.from_numpy(grads[n][t].copy()).view(p.shape)
        torch.nn.utils.clip_grad_norm_(list(params.values()), max_norm=max_norm)
        opt.step()
    return {n: (p.detach().numpy().copy(), opt.state[p]["exp_avg"].numpy().copy(),
                opt.state[p]["exp_avg_sq"].numpy().copy()) for n, p in params.items()}


def main():
    out = fixture_out(__doc__, "decay_groups_torch.h5")
    torch.manual_seed(0)
    cfg = Qwen3Config(**CONFIG)
    model = Qwen3ForCausalLM(cfg).float()
    rng = np.random.default_rng(20261125)
    p0, grads = {}, {}
    for n, p in model.named_parameters():
        norm = "norm" in n
        p0[n] = ((1.0 + 0.1 * rng.standard_normal(p.shape)) if norm else 0.05 * rng.standard_normal(p.shape)).astype(
            np.float32).reshape(-1)
        # Step-to-step magnitudes that vary (x0.25 .. x4), so clipping applies to some steps only.
        scale = np.exp2(np.arange(STEPS) % 5 - 2)[:, None] * 1e-2
        grads[n] = (rng.standard_normal((STEPS, p.numel())) * scale).astype(np.float32)
    norms = [float(np.sqrt(sum(float(np.sum(grads[n][t].astype(np.float64) ** 2)) for n in grads)))
             for t in range(STEPS)]
    max_norm = float(np.median(norms))
    hf = set(Trainer.get_decay_parameter_names(None, model))
    cases = {"hf_trainer": hf, "no_embedding_decay": hf - {"model.embed_tokens.weight"}}
    with create_fixture(out, transformers) as f:
        f.attrs["config_json"] = cfg.to_json_string()
        for k, v in dict(lr=LR, beta1=BETA1, beta2=BETA2, eps=EPS, weight_decay=WEIGHT_DECAY, max_norm=max_norm).items():
            f.attrs[k] = float(v)
        f.attrs["steps"] = STEPS
        for n in p0:
            f[f"p0/{n}"], f[f"grads/{n}"] = p0[n], grads[n]
        for case, decayed in cases.items():
            g = f.create_group(case)
            g.attrs["decayed"] = ",".join(sorted(decayed))
            for n, (p, m, v) in run(model, p0, grads, decayed, max_norm).items():
                g[f"p/{n}"], g[f"m/{n}"], g[f"v/{n}"] = p.reshape(-1), m.reshape(-1), v.reshape(-1)
    clipped = sum(x > max_norm for x in norms)
    print(f"wrote {out} (torch {torch.__version__}, transformers {transformers.__version__}); "
          f"{len(hf)} of {len(p0)} tensors decayed by HF Trainer; {clipped} of {STEPS} steps clipped")


if __name__ == "__main__":
    main()
