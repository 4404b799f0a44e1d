#!/usr/bin/env python3
"""Generate tests/reference/fixtures/moe_torch.h5: transformers' own MoE blocks, forward and backward.

The oracle is transformers' Qwen3MoeSparseMoeBlock (softmax over all experts, top-k, optional
renormalisation, SwiGLU experts) and GptOssMLP (top-k of the biased router logits, softmax over
the k, experts with biases and the clamped GLU), in float64, with autograd for every gradient.

Weights are written as so_train keeps them, per family: qwen3_moe's per-expert nn.Linear weights
stacked (gate and up [E, I, H], down [E, H, I]; transformers 5 fuses gate and up in one
[E, 2I, H]); gpt_oss's own tensors (gate_up [E, H, 2I] with gate and up interleaved in the
columns, gate_up_bias [E, 2I], down [E, I, H], down_bias [E, H]); router [E, H] (+ bias [E]).

Layout: one group per case; attrs kind ("qwen3_moe" | "gpt_oss"), top_k, normalize (0/1),
clamped_fraction (gpt_oss: the share of GLU inputs beyond the clamp);
f32 datasets x [T, H], dout [T, H], the weights, out [T, H], dx [T, H], d<weight> for each weight,
i32 experts [T, k] (transformers' choice, best first).

Usage (from the repository root, with the project's Python, $SO_PYTHON):
    python tests/reference/make_moe_fixture.py [--out tests/reference/fixtures/moe_torch.h5]
"""
import h5py
import numpy as np
import torch
from transformers.models.gpt_oss.configuration_gpt_oss import GptOssConfig
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP
from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from fixture_file import fixture_out

CASES = [
    # name, kind, T, H, I, E, k, normalize, hot_expert (every token's first choice, or -1), weight std
    ("qwen_norm", "qwen3_moe", 19, 16, 12, 8, 2, True, -1, 0.3),
    ("qwen_no_norm_k3", "qwen3_moe", 23, 12, 8, 6, 3, False, -1, 0.3),
    ("qwen_k_is_experts", "qwen3_moe", 9, 8, 6, 4, 4, True, -1, 0.3),
    ("qwen_k1", "qwen3_moe", 17, 8, 10, 5, 1, True, -1, 0.3),
    ("qwen_all_to_one_k1", "qwen3_moe", 13, 8, 6, 6, 1, False, 4, 0.3),
    ("qwen_all_to_one_k2", "qwen3_moe", 11, 8, 6, 6, 2, True, 1, 0.3),
    ("gpt_oss", "gpt_oss", 21, 16, 12, 8, 2, True, -1, 0.3),
    ("gpt_oss_k1", "gpt_oss", 15, 8, 6, 4, 1, True, -1, 0.3),
    # Large weights: many gate/up pre-activations beyond the GLU's clamp (limit 7).
    ("gpt_oss_clamped", "gpt_oss", 17, 16, 12, 8, 3, True, -1, 1.5),
]


def make_case(kind, T, H, I, E, k, normalize, hot, std, gen):
    def randn(*shape, s=std):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * s

    x = randn(T, H, s=1.0)
    if hot >= 0:
        x = x.abs() + 0.5  # positive inputs, so a positive router row wins for every token
    router = randn(E, H)
    if hot >= 0:
        router[hot] = 2.0
    if kind == "qwen3_moe":
        gate, up, down = randn(E, I, H), randn(E, I, H), randn(E, H, I)
        params = {"router": router, "gate": gate, "up": up, "down": down}
        cfg = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=k,
                             norm_topk_prob=normalize)
        block = Qwen3MoeSparseMoeBlock(cfg).double()
        with torch.no_grad():
            block.gate.weight.copy_(router)
            block.experts.gate_up_proj.copy_(torch.cat([gate, up], dim=1))
            block.experts.down_proj.copy_(down)
        tensors = {"router": block.gate.weight, "gate_up": block.experts.gate_up_proj,
                   "down": block.experts.down_proj}
        run = lambda h: block(h.unsqueeze(0))[0]
        router_module = block.gate
    else:
        params = {"router": router, "router_bias": randn(E), "gate_up": randn(E, H, 2 * I),
                  "gate_up_bias": randn(E, 2 * I), "down": randn(E, I, H), "down_bias": randn(E, H)}
        cfg = GptOssConfig(hidden_size=H, intermediate_size=I, num_local_experts=E, num_experts_per_tok=k)
        block = GptOssMLP(cfg).double()
        with torch.no_grad():
            block.router.weight.copy_(router)
            block.router.bias.copy_(params["router_bias"])
            block.experts.gate_up_proj.copy_(params["gate_up"])
            block.experts.gate_up_proj_bias.copy_(params["gate_up_bias"])
            block.experts.down_proj.copy_(params["down"])
            block.experts.down_proj_bias.copy_(params["down_bias"])
        run = lambda h: block(h.unsqueeze(0))[0][0]
        router_module = block.router

    xg = x.clone().requires_grad_(True)
    out = run(xg)
    dout = torch.randn(T, H, generator=gen, dtype=torch.float64)
    out.backward(dout)
    with torch.no_grad():
        _, _, experts = router_module(x)

    grads = {"dx": xg.grad}
    if kind == "qwen3_moe":
        gu = block.experts.gate_up_proj.grad
        grads.update(drouter=block.gate.weight.grad, dgate=gu[:, :I], dup=gu[:, I:], ddown=block.experts.down_proj.grad)
    else:
        ex = block.experts
        grads.update(drouter=block.router.weight.grad, drouter_bias=block.router.bias.grad,
                     dgate_up=ex.gate_up_proj.grad, dgate_up_bias=ex.gate_up_proj_bias.grad,
                     ddown=ex.down_proj.grad, ddown_bias=ex.down_proj_bias.grad)
    return x, dout, params, out.detach(), grads, experts


def main():
    out = fixture_out(__doc__, "moe_torch.h5")
    gen = torch.Generator().manual_seed(2028)
    with h5py.File(out, "w") as f:
        for name, kind, T, H, I, E, k, normalize, hot, std in CASES:
            x, dout, params, out, grads, experts = make_case(kind, T, H, I, E, k, normalize, hot, std, gen)
            g = f.create_group(name)
            g.attrs["kind"], g.attrs["top_k"], g.attrs["normalize"] = kind, k, int(normalize)
            if kind == "gpt_oss":  # how often the GLU's clamp (limit 7) engages, over every expert
                gu = torch.einsum("th,ehn->ten", x, params["gate_up"]) + params["gate_up_bias"][None]
                g.attrs["clamped_fraction"] = float(((gu[..., ::2] > 7) | (gu[..., 1::2].abs() > 7)).double().mean())
            f32 = lambda t: np.ascontiguousarray(t.detach().numpy().astype(np.float32))
            g["x"], g["dout"], g["out"] = f32(x), f32(dout), f32(out)
            for key, value in list(params.items()) + list(grads.items()):
                g[key] = f32(value)
            g["experts"] = experts.numpy().astype(np.int32)
            print(f"{name}: T={T} H={H} I={I} E={E} k={k} tokens per expert "
                  f"{np.bincount(experts.numpy().ravel(), minlength=E).tolist()}")


if __name__ == "__main__":
    main()
