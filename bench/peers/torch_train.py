#!/usr/bin/env python3
"""Peer baseline: transformers' model of the so_train config's family and shape (LlamaForCausalLM,
Qwen3MoeForCausalLM, ...) on one GPU (or the CPU), built on the device, fp32 weights with bf16
autocast (so_train's mixed precision: fp32 master weights, bf16 compute) or fp32 throughout, SDPA
attention (flash kernels on the GPU) or flash_attention_2 when installed, MoE experts through
torch's grouped GEMM (grouped_experts.py), fused AdamW, the same batch, sequence length and
clipping. Prints one JSON line with tokens/s."""
import torch
from transformers import AutoModelForCausalLM

import grouped_experts
from peer_common import Run, enable_checkpointing, parse_args, report, timed_training


def main():
    args = parse_args(__doc__)
    run = Run(args)
    try:
        import flash_attn  # noqa: F401
        attn = "flash_attention_2"
    except ImportError:
        attn = "sdpa"
    if run.device.type != "cuda":
        attn = "sdpa"
    experts, experts_note = grouped_experts.install(run.model, run.device)
    config = run.hf_config(attn, **({"experts_implementation": experts} if experts else {}))
    with torch.device(run.device):  # initialised where it trains: no host-side init of billions of weights
        model = AutoModelForCausalLM.from_config(config)
    if run.checkpointing:
        enable_checkpointing(model)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=run.lr, betas=run.betas, eps=run.eps,
                                  weight_decay=run.weight_decay, fused=True)
    seconds, loss = timed_training(run, model, optimizer, args.steps, args.warmup,
                                   autocast=args.precision == "bf16-autocast")
    report("torch", run, args, seconds, loss, sum(p.numel() for p in model.parameters()),
           {"attention": attn, "precision": "fp32 weights + bf16 autocast" if args.precision == "bf16-autocast" else "fp32",
            "optimizer": "AdamW fused", **({"experts": experts_note} if experts_note else {})})


if __name__ == "__main__":
    main()
