#!/usr/bin/env python3
"""Generate tests/reference/fixtures/attention_mask_torch.h5: masked attention and its gradients.

The oracle is transformers' own code in float64: the mask from masking_utils (causal_mask_function,
sliding_window_overlay, packed_sequence_mask_function, padding_mask_function combined by and_masks,
made additive by eager_mask) and the attention from the models' eager_attention_forward -- GPT-OSS's (sinks: one
extra logit column per head, dropped after the softmax) where a case has sinks, Llama's otherwise.
Gradients of sum(out * dout) by autograd with respect to q, k, v and the sinks.

Layout: one group per case; attrs window (0: none), scale; q f32 [B*S, Hq*D], k, v [B*S, Hkv*D],
dout like q, doc_start i32 [B, S] (index within its row of each token's document's first token),
key_end i32 [B] (padded cases: where each row's padding begins, attention_mask 0 from there),
sinks f32 [Hq] (cases with sinks), out, dq, dk, dv, dsinks (with sinks), lse f32 [B, Hq, S] (the
log-sum-exp of each row's scaled, masked scores and the sink).

Usage (from the repository root, with the project's Python, $SO_PYTHON):
    python tests/reference/make_attention_mask_fixture.py [--out tests/reference/fixtures/attention_mask_torch.h5]
"""
import types

import numpy as np
import torch
import transformers
from transformers import masking_utils as mu
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward as gpt_oss_attention
from transformers.models.llama.modeling_llama import eager_attention_forward as llama_attention

from fixture_file import create_fixture, fixture_out

CASES = [
    # name, B, S, Hq, Hkv, D, documents per row, window, sinks
    ("documents", 2, 70, 4, 2, 16, 3, 0, False),
    ("window", 2, 70, 4, 1, 16, 1, 9, False),
    ("sinks", 1, 45, 4, 2, 8, 1, 0, True),
    ("documents_window_sinks", 2, 90, 6, 2, 16, 4, 13, True),
    ("window_longer_than_documents", 1, 66, 2, 2, 8, 5, 40, True),
]
# Right padding: padding queries attend to the row's tokens. With sinks, a window and documents
# some rows see no key: GPT-OSS's eager attention gives the sink all the mass there (zero output).
# Without sinks every row here sees a key (eager would spread a keyless row uniformly).
PADDED_CASES = {"padding": [17, 40], "padding_documents_window_sinks": [29, 11]}
CASES += [("padding", 2, 40, 4, 2, 8, 1, 0, False), ("padding_documents_window_sinks", 2, 40, 4, 2, 8, 2, 6, True)]


def doc_starts(rng, B, S, docs):
    starts = np.zeros((B, S), dtype=np.int32)
    ids = np.zeros((B, S), dtype=np.int64)
    for b in range(B):
        cuts = sorted(rng.choice(np.arange(1, S), size=docs - 1, replace=False)) if docs > 1 else []
        first, doc = 0, 0
        for i in range(S):
            if doc < len(cuts) and i == cuts[doc]:
                first, doc = i, doc + 1
            starts[b, i], ids[b, i] = first, doc
    return starts, ids


def case(rng, B, S, Hq, Hkv, D, docs, window, with_sinks, key_end=None):
    starts, ids = doc_starts(rng, B, S, docs)
    q = rng.standard_normal((B, S, Hq, D)).astype(np.float32) * 1.5
    k = rng.standard_normal((B, S, Hkv, D)).astype(np.float32)
    v = rng.standard_normal((B, S, Hkv, D)).astype(np.float32)
    dout = rng.standard_normal((B, S, Hq, D)).astype(np.float32)
    sinks = (rng.standard_normal(Hq) * 1.5).astype(np.float32)
    scale = 1.0 / np.sqrt(D)

    fns = [mu.causal_mask_function, mu.packed_sequence_mask_function(torch.from_numpy(ids))]
    if window:
        fns.append(mu.sliding_window_overlay(window))
    if key_end is not None:
        fns.append(mu.padding_mask_function(torch.arange(S)[None, :] < torch.tensor(key_end)[:, None]))
    mask = mu.eager_mask(batch_size=B, q_length=S, kv_length=S, mask_function=mu.and_masks(*fns),
                         dtype=torch.float64)
    # [B, H, S, D] as the attention functions take them, float64 leaves for autograd.
    qt, kt, vt = (torch.from_numpy(x).double().transpose(1, 2).requires_grad_() for x in (q, k, v))
    st = torch.from_numpy(sinks).double().requires_grad_()
    module = types.SimpleNamespace(num_key_value_groups=Hq // Hkv, sinks=st, training=False)
    attention = gpt_oss_attention if with_sinks else llama_attention
    out, _ = attention(module, qt, kt, vt, mask, scaling=scale, dropout=0.0)  # [B, S, Hq, D]
    (out * torch.from_numpy(dout).double()).sum().backward()

    with torch.no_grad():
        kr = kt.repeat_interleave(Hq // Hkv, dim=1)
        logits = torch.matmul(qt, kr.transpose(2, 3)) * scale + mask
        if with_sinks:
            logits = torch.cat([logits, st.reshape(1, -1, 1, 1).expand(B, -1, S, 1)], dim=-1)
        lse = torch.logsumexp(logits, dim=-1)  # [B, Hq, S]

    def rows(t):  # [B, S, H, D] or [B, H, S, D] (transposed=True) -> [B*S, H*D] f32
        return t.detach().reshape(B * S, -1).float().numpy()

    def grad_rows(t):
        return t.grad.transpose(1, 2).reshape(B * S, -1).float().numpy()

    d = dict(q=q.reshape(B * S, -1), k=k.reshape(B * S, -1), v=v.reshape(B * S, -1), dout=dout.reshape(B * S, -1),
             doc_start=starts, out=rows(out), dq=grad_rows(qt), dk=grad_rows(kt), dv=grad_rows(vt),
             lse=lse.float().numpy())
    if key_end is not None:
        d["key_end"] = np.asarray(key_end, dtype=np.int32)
    if with_sinks:
        d["sinks"] = sinks
        d["dsinks"] = st.grad.float().numpy()
    return d, scale


def main():
    out = fixture_out(__doc__, "attention_mask_torch.h5")
    rng = np.random.default_rng(20261126)
    with create_fixture(out, transformers) as f:
        for name, B, S, Hq, Hkv, D, docs, window, with_sinks in CASES:
            d, scale = case(rng, B, S, Hq, Hkv, D, docs, window, with_sinks, PADDED_CASES.get(name))
            g = f.create_group(name)
            g.attrs["window"] = np.int64(window)
            g.attrs["scale"] = np.float64(scale)
            for key, val in d.items():
                g.create_dataset(key, data=val)
            print(f"{name}: B={B} S={S} Hq={Hq} Hkv={Hkv} D={D} documents/row={docs} window={window} "
                  f"sinks={with_sinks}; |out| {np.abs(d['out']).mean():.3f}")


if __name__ == "__main__":
    main()
