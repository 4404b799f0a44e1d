#!/usr/bin/env python3
"""Peer baseline for `so_bench attention`: PyTorch's causal GQA attention, forward and backward
TFLOP/s per SDPA backend (flash, cuDNN, ...), on the same shapes with the same FLOP count
(forward 4*B*Hq*D*sum(L^2)/2 over each row's documents, backward 2.5x). Unpacked rows run
scaled_dot_product_attention(is_causal=True, enable_gqa=True). Rows packed with equal documents run
varlen attention (torch.nn.attention.varlen.varlen_attn, else flash_attn's flash_attn_varlen_func),
else scaled_dot_product_attention with a block-diagonal causal mask; each row names the path it
took. Times: median of CUDA-event-timed runs (the host clock on the CPU). One JSON line per row;
a backend that refuses a shape gives a row with "error"."""
import argparse
import inspect
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


def int_list(s):
    return [int(x) for x in s.split(",") if x]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda or cpu (cpu: only to check the script on tiny shapes)")
    p.add_argument("--batch", type=int, default=4, help="rows (B)")
    p.add_argument("--seq", type=int, default=4096, help="tokens per row (S)")
    p.add_argument("--hidden", type=int, default=2048, help="query heads x head dim (Hq = hidden / D)")
    p.add_argument("--gqa", type=int, default=4, help="query heads per key/value head")
    p.add_argument("--head-dims", type=int_list, default=[64, 128])
    p.add_argument("--docs", type=int_list, default=[1, 4], help="documents per row (1: unpacked)")
    p.add_argument("--backends", default="flash,cudnn", help=f"SDPA backends among {','.join(BACKENDS)}")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    return p.parse_args()


def doc_lengths(seq, docs):
    """Equal documents, the last taking the remainder (so_bench attention's packing)."""
    n = seq // docs
    return [n] * (docs - 1) + [seq - (docs - 1) * n]


def forward_flop(b, hq, d, lengths):
    return 4.0 * b * hq * d * sum(n * n for n in lengths) / 2


class Timer:
    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def median_ms(self, fn, warmup, iters):
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(iters):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                times.append((start, end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append(1e3 * (time.perf_counter() - t0))
        if self.cuda:
            torch.cuda.synchronize()
            times = [s.elapsed_time(e) for s, e in times]
        return statistics.median(times)


def varlen_call():
    """(name, fn(q, k, v, cu, max_len, gqa_native) -> out) for packed rows, or (None, why)."""
    why = ""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as e:
        varlen_attn, why = None, f"torch.nn.attention.varlen: {e}"
    if varlen_attn is not None:
        params = inspect.signature(varlen_attn).parameters
        causal = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
        gqa = "enable_gqa" in params

        def run(q, k, v, cu, max_len):
            return varlen_attn(q, k, v, cu, cu, max_len, max_len, **causal, **({"enable_gqa": True} if gqa else {}))
        return "torch varlen_attn", run, gqa
    try:
        from flash_attn import flash_attn_varlen_func

        def run(q, k, v, cu, max_len):
            return flash_attn_varlen_func(q, k, v, cu, cu, max_len, max_len, causal=True)
        return "flash_attn_varlen_func", run, True
    except ImportError as e:
        why += f"; flash_attn: {e}"
    return None, why, False


def repeat_kv(x, groups, dim):
    return x.repeat_interleave(groups, dim=dim) if groups > 1 else x


def measure(args, device, dtype, timer, backend, d, docs):
    b, s = args.batch, args.seq
    hq = args.hidden // d
    hkv = hq // args.gqa
    lengths = doc_lengths(s, docs)
    flop = forward_flop(b, hq, d, lengths)
    row = {"peer": "torch-sdpa", "backend": backend, "B": b, "S": s, "Hq": hq, "Hkv": hkv, "D": d, "docs": docs,
           "dtype": args.dtype, "torch": torch.__version__, "device": str(device)}
    if device.type == "cuda":
        row["gpu"] = torch.cuda.get_device_name(device)
    gen = torch.Generator(device="cpu").manual_seed(41)
    notes = []

    def rand(*shape):
        return torch.empty(*shape).uniform_(-1, 1, generator=gen).to(device, dtype)

    if docs == 1:
        q, k, v = rand(b, hq, s, d), rand(b, hkv, s, d), rand(b, hkv, s, d)
        path = "sdpa"

        def call(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hkv != hq)
        try:
            with sdpa_kernel([BACKENDS[backend]]):
                call(q, k, v)
        except (RuntimeError, TypeError) as e:  # a backend (or a torch) without GQA: the key/value heads repeated
            notes.append(f"key/value heads repeated ({str(e).splitlines()[0][:120]})")
            k, v = repeat_kv(k, args.gqa, 1), repeat_kv(v, args.gqa, 1)

            def call(q, k, v):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        # Every document of every row, one after another: B * docs sequences.
        cu = torch.tensor([r * s + sum(lengths[:i]) for r in range(b) for i in range(docs)] + [b * s],
                          dtype=torch.int32, device=device)
        name, varlen, gqa_native = varlen_call() if device.type == "cuda" else (None, "varlen attention needs CUDA", False)
        q3, k3, v3 = rand(b * s, hq, d), rand(b * s, hkv, d), rand(b * s, hkv, d)
        used = None
        if name is not None:
            if not gqa_native:
                k3, v3 = repeat_kv(k3, args.gqa, 1), repeat_kv(v3, args.gqa, 1)
                notes.append("key/value heads repeated (varlen without enable_gqa)")
            try:
                with sdpa_kernel([BACKENDS[backend]]):
                    varlen(q3, k3, v3, cu, max(lengths))
                used = name
            except (RuntimeError, ValueError, TypeError) as e:
                notes.append(f"{name} refused: {str(e).splitlines()[0][:160]}")
        else:
            notes.append(f"no varlen attention ({varlen})")
        if used is not None:
            path, q, k, v = used, q3, k3, v3

            def call(q, k, v):
                return varlen(q, k, v, cu, max(lengths))
        else:
            # Dense attention with a block-diagonal causal mask: all S x S pairs computed and masked.
            path = "sdpa + block-diagonal causal mask"
            doc = torch.repeat_interleave(torch.arange(docs, device=device),
                                          torch.tensor(lengths, device=device))
            pos = torch.arange(s, device=device)
            mask = (doc[:, None] == doc[None, :]) & (pos[:, None] >= pos[None, :])
            q, k, v = rand(b, hq, s, d), rand(b, hkv, s, d), rand(b, hkv, s, d)
            k, v = repeat_kv(k, args.gqa, 1), repeat_kv(v, args.gqa, 1)

            def call(q, k, v):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    row["path"] = path
    q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
    with sdpa_kernel([BACKENDS[backend]]):
        fwd_ms = timer.median_ms(lambda: call(q, k, v), args.warmup, args.iters)
        out = call(q, k, v)
        dout = torch.empty_like(out).uniform_(-1, 1)
        bwd_ms = timer.median_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True),
                                 args.warmup, args.iters)
    row.update({"fwd_ms": fwd_ms, "bwd_ms": bwd_ms,
                "fwd_tflops": flop / (fwd_ms * 1e-3) / 1e12, "bwd_tflops": 2.5 * flop / (bwd_ms * 1e-3) / 1e12})
    if notes:
        row["note"] = "; ".join(notes)
    return row


def main():
    args = parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    timer = Timer(device)
    backends = [x for x in args.backends.split(",") if x]
    for name in backends:
        if name not in BACKENDS:
            raise SystemExit(f"sdpa_attention.py: --backends: '{name}' is not one of {','.join(BACKENDS)}")
    failed = 0
    for d in args.head_dims:
        if args.hidden % d or (args.hidden // d) % args.gqa:
            raise SystemExit(f"sdpa_attention.py: --hidden {args.hidden} is not a multiple of head dim {d} x --gqa {args.gqa}")
        for docs in args.docs:
            for backend in backends:
                try:
                    row = measure(args, device, dtype, timer, backend, d, docs)
                except Exception as e:  # noqa: BLE001 — the row says what failed; the other rows still run
                    row = {"peer": "torch-sdpa", "backend": backend, "D": d, "docs": docs,
                           "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
                    # A backend that refuses the shape is a result; anything else fails the run.
                    refused = isinstance(e, RuntimeError) and any(
                        m in str(e) for m in ("No available kernel", "No viable backend"))
                    failed += not refused
                print(json.dumps(row), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
