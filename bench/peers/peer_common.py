"""What the peer baselines share: the model shape, batch and optimizer settings read from an
so_train run config (so both sides train the same thing), synthetic tokens, the timed training
loop and the one-line JSON result. No downloads: models are built from their config."""
import argparse
import json
import time

import torch
from transformers import AutoConfig


def parse_args(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--config", default="configs/runs/llama-1b-seq4096.json", help="so_train run config (model.inline)")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--device", default="cuda", help="cuda or cpu (cpu: only to check the script on tiny shapes)")
    p.add_argument("--model-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a model config field, e.g. num_hidden_layers=2 (repeatable)")
    p.add_argument("--batch", type=int, help="sequences per step (default: the config's micro-batch)")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default: the config's data.seq_len)")
    p.add_argument("--checkpointing", choices=["config", "on", "off"], default="config",
                   help="activation checkpointing (default: as train.activation_checkpointing says)")
    p.add_argument("--peak-tflops", type=float, default=0.0, help="dense bf16 peak for MFU (0: no MFU)")
    p.add_argument("--precision", choices=["bf16-autocast", "fp32"], default="bf16-autocast",
                   help="fp32 weights with bf16 autocast (so_train's bf16), or fp32 throughout (its fp32)")
    return p.parse_args()


class Run:
    """The so_train config as the peers need it."""

    def __init__(self, args):
        with open(args.config) as f:
            cfg = json.load(f)
        model = dict(cfg["model"]["inline"])
        for kv in args.model_set:
            key, value = kv.split("=", 1)
            model[key] = json.loads(value)
        self.model = model
        self.batch = args.batch or cfg.get("train_micro_batch_size_per_gpu", 1)
        self.seq_len = args.seq_len or cfg["data"]["seq_len"]
        params = cfg.get("optimizer", {}).get("params", {})
        self.lr = params.get("lr", 1e-3)
        self.betas = tuple(params.get("betas", (0.9, 0.999)))
        self.eps = params.get("eps", 1e-8)
        self.weight_decay = params.get("weight_decay", 0.0)
        self.clip = cfg.get("gradient_clipping", 0.0)
        ckpt = cfg.get("train", {}).get("activation_checkpointing", False)
        self.checkpointing = {"config": ckpt, "on": True, "off": False}[args.checkpointing]
        self.device = torch.device(args.device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", 0)  # torch.cuda.set_device refuses an index-less "cuda"

    def hf_config(self, attn_implementation, **extra):
        """The transformers config of the so_train model (its model_type: llama, qwen3_moe, ...)."""
        keep = {k: v for k, v in self.model.items() if k != "model_type"}
        return AutoConfig.for_model(self.model.get("model_type", "llama"), **keep,
                                    attn_implementation=attn_implementation, use_cache=False, **extra)

    def flops_per_token(self):
        """so_train's count (src/model/param_layout.cpp train_flops_per_token), so TFLOP/s compare."""
        m = self.model
        H, L, V = m["hidden_size"], m["num_hidden_layers"], m["vocab_size"]
        D = m.get("head_dim", H // m["num_attention_heads"])
        q, kv = m["num_attention_heads"] * D, m["num_key_value_heads"] * D
        mlp = 3 * H * m["intermediate_size"]
        if m.get("model_type") == "qwen3_moe":  # every layer MoE here: the router and top-k experts
            E = m.get("num_experts", m.get("num_local_experts"))
            mlp = H * E + 3 * H * m["moe_intermediate_size"] * m["num_experts_per_tok"]
        matmul = L * (H * q + 2 * H * kv + q * H + mlp) + V * H
        attn = L * 4.0 * D * m["num_attention_heads"] * (self.seq_len + 1) / 2.0
        return 3.0 * (2.0 * matmul + attn)


def enable_checkpointing(model):
    """Activation checkpointing per decoder layer (transformers 5 renamed the method)."""
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_training(run, model, optimizer, steps, warmup, autocast):
    """Trains on synthetic tokens, the forward under bf16 autocast when asked; returns (seconds of
    the timed steps, last loss)."""
    gen = torch.Generator().manual_seed(1234)
    vocab = run.model["vocab_size"]
    loss = None
    t0 = None
    for step in range(warmup + steps):
        if step == warmup:
            synchronize(run.device)
            t0 = time.perf_counter()
        ids = torch.randint(vocab, (run.batch, run.seq_len), generator=gen).to(run.device, non_blocking=True)
        with torch.autocast(run.device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if run.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), run.clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    synchronize(run.device)
    return time.perf_counter() - t0, loss.item()


def report(peer, run, args, seconds, loss, n_params, extra):
    tokens_per_s = run.batch * run.seq_len * args.steps / seconds
    tflops = tokens_per_s * run.flops_per_token() / 1e12
    out = {"peer": peer, "config": args.config, "params": n_params, "batch": run.batch, "seq_len": run.seq_len,
           "checkpointing": run.checkpointing, "steps": args.steps, "tokens_per_s": round(tokens_per_s, 1),
           "step_s": round(seconds / args.steps, 4), "tflops": tflops,
           "mfu": tflops / args.peak_tflops if args.peak_tflops > 0 else None, "last_loss": round(loss, 4),
           "torch": torch.__version__, "device": str(run.device)}
    if run.device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(run.device)
        out["peak_mem_mib"] = round(torch.cuda.max_memory_allocated(run.device) / 2**20)
    out.update(extra)
    print(json.dumps(out), flush=True)
