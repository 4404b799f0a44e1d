#!/usr/bin/env python3
"""Peer baseline: PyTorch FSDP2 (torch.distributed.fsdp.fully_shard) with CPUOffloadPolicy on one
GPU (one rank): fp32 parameters and AdamW state live in pinned CPU memory, each decoder layer's
bf16 copy is brought to the GPU for its forward and backward (MixedPrecisionPolicy), and the
optimizer steps on the CPU after backward — the offload baseline for so_train's ZeRO-Offload and
SuperOffload on the so_train config's shape. Prints one JSON line with tokens/s."""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from transformers import AutoModelForCausalLM

from peer_common import Run, enable_checkpointing, parse_args, report, timed_training


def main():
    args = parse_args(__doc__)
    run = Run(args)
    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517", "RANK": "0", "WORLD_SIZE": "1"}.items():
        os.environ.setdefault(k, v)
    cuda = run.device.type == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    if cuda:
        torch.cuda.set_device(run.device)
    mesh = init_device_mesh(run.device.type, (1,))
    model = AutoModelForCausalLM.from_config(run.hf_config("sdpa"))  # fp32, on the CPU until sharded
    if run.checkpointing:
        enable_checkpointing(model)
    model.train()
    policy = dict(mesh=mesh, offload_policy=CPUOffloadPolicy(pin_memory=cuda),
                  mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    for layer in model.model.layers:
        fully_shard(layer, **policy)
    fully_shard(model, **policy)
    # The parameters are CPU tensors: torch's fused CPU AdamW steps them there.
    optimizer = torch.optim.AdamW(model.parameters(), lr=run.lr, betas=run.betas, eps=run.eps,
                                  weight_decay=run.weight_decay, fused=True)
    seconds, loss = timed_training(run, model, optimizer, args.steps, args.warmup, autocast=False)
    report("fsdp2_cpu_offload", run, args, seconds, loss, sum(p.numel() for p in model.parameters()),
           {"attention": "sdpa", "precision": "fp32 params on CPU, bf16 compute (MixedPrecisionPolicy)",
            "optimizer": "AdamW fused on CPU", "cpu_threads": torch.get_num_threads()})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
