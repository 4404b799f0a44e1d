#!/usr/bin/env python
"""so_train on prepared data, beyond the numbers: a run resumed mid-epoch gives the uninterrupted
run's losses bit for bit; a step with no supervised token trains to a loss of 0, never NaN; and
what a user can get wrong is refused with an error naming it, before the first step: a tokenizer
larger than the model's vocabulary, a validation split whose rows differ from train's, token ids
outside the vocabulary in any split, data made with another tokenizer than the model directory's, a data.seq_len other
than the rows', a file whose masks supervise nothing, HDF5 token datasets declared but never
written (prepared rows and the 1-D token reader alike) and a filter the HDF5 library lacks (lzf);
compressed prepared files (gzip, shuffle + gzip, szip) train as plain ones.

  check_prepared_runs.py WORK SO_TRAIN SO_CKPT [MPIEXEC]   (with MPIEXEC: validation under ZeRO-3, dp2)
"""
import json
import os
import re
import shutil
import subprocess
import sys

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
from check_masked_training import make_data  # noqa: E402
from script_checks import check, finish  # noqa: E402


def config(work, name, model, data, **train):
    c = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
         "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0}},
         "zero_optimization": {"stage": 0}, "model": {"hf_dir": model}, "data": {"type": "prepared", "path": data},
         "train": train, "seed": 1}
    path = os.path.join(work, name + ".json")
    with open(path, "w") as f:
        json.dump(c, f)
    return path


def so_train(so, args):
    return subprocess.run([so] + args + ["--quiet"], capture_output=True, text=True)


def losses(path):
    return [json.loads(line)["loss"] for line in open(path)]


def refused(so, args, pattern, what):
    r = so_train(so, args)
    errors = [line for line in r.stderr.splitlines() if "error:" in line]
    check(r.returncode != 0 and len(errors) == 1 and re.search(pattern, errors[0]) is not None,
          f"{what} refused: {errors[0] if errors else r.stderr[-300:]}")


def check_evaluation(work, so, model, launcher, zero_stage):
    """Validation every train.eval_every steps and at the end; the last one equals the loss
    transformers computes with the exported final weights over the validation rows."""
    tag = f"eval_np{len(launcher) and launcher[-1] or 1}_z{zero_stage}"
    split = os.path.join(work, "split.h5")
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "prepare_data.py"), "--model-dir", model, "--input",
                    os.path.join(work, "alpaca.jsonl"), "--out", split, "--max-length", "160",
                    "--validation-fraction", "0.25"], check=True, capture_output=True)
    cfg = config(work, tag, model, split, steps=3, eval_every=2)
    metrics, ck = os.path.join(work, tag + ".jsonl"), os.path.join(work, tag + "_ck")
    os.path.exists(metrics) and os.remove(metrics)
    shutil.rmtree(ck, ignore_errors=True)
    r = subprocess.run(launcher + [so, "--config", cfg, "--metrics", metrics, "--save-dir", ck, "--save-every", "2",
                                   "--save-at-end", "--async-save", "off",
                                   "--set", f"zero_optimization.stage={zero_stage}", "--quiet"],
                       capture_output=True, text=True)
    rec = [json.loads(line) for line in open(metrics)] if r.returncode == 0 else []
    check([x["step"] for x in rec if "eval_loss" in x] == [2, 3], f"{tag}: evaluated at steps 2 and 3 ({r.stderr[-300:]})")
    # Evaluating changes nothing the training computes: the same run evaluating only at the end
    # has the same losses bit for bit.
    plain = os.path.join(work, tag + "_end_only.jsonl")
    os.path.exists(plain) and os.remove(plain)
    subprocess.run(launcher + [so, "--config", cfg, "--metrics", plain, "--set", "train.eval_every=0", "--set",
                               f"zero_optimization.stage={zero_stage}", "--quiet"], capture_output=True)
    end_only = [json.loads(line) for line in open(plain)] if os.path.exists(plain) else []
    check([x["loss"] for x in end_only] == [x["loss"] for x in rec] and len(rec) == 3,
          f"{tag}: training losses with and without evaluation at step 2 are identical")
    import torch
    from transformers import LlamaForCausalLM
    from check_masked_training import labels_of
    with h5py.File(split) as f:
        g = f["validation"]
        x = torch.tensor(g["tokens"][...], dtype=torch.long)
        y = torch.tensor(labels_of(g["tokens"][...], g["loss_mask"][...], g["row_documents"][...],
                                   g["document_lengths"][...]))
    n = int((y[:, 1:] != -100).sum())
    # Both evaluations (step 2, mid-run, and the end) against the weights saved at those steps.
    for step, got in zip((2, 3), [x for x in rec if "eval_loss" in x] or [None, None]):
        hf = os.path.join(work, f"{tag}_hf{step}")
        shutil.rmtree(hf, ignore_errors=True)
        subprocess.run([sys.argv[3], "export", "--hf", hf, "--dtype", "fp32", os.path.join(ck, f"step-{step:08d}.h5")],
                       check=True, capture_output=True)
        m = LlamaForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
        with torch.no_grad():
            ref = float(m(input_ids=x, labels=y, num_items_in_batch=n).loss)
        got = got or {"eval_loss": float("nan"), "eval_tokens": -1, "eval_perplexity": float("nan")}
        check(abs(got["eval_loss"] - ref) <= 1e-5 and got["eval_tokens"] == n,
              f"{tag}: validation loss at step {step} {got['eval_loss']} over {got['eval_tokens']} tokens = "
              f"transformers' {ref} over {n}")
        check(abs(got["eval_perplexity"] - np.exp(ref)) <= 1e-3 * np.exp(ref), f"{tag}: perplexity at step {step}")


def sparse_dataset(group, name, shape, dtype):
    """A dataset whose storage is allocated at creation and never written: in a sparse file, all
    of it declared and none of it on disk."""
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    h5py.h5d.create(group.id, name.encode(), h5py.h5t.py_create(np.dtype(dtype)), h5py.h5s.create_simple(shape), dcpl=dcpl)


def check_every_split(work, so, model):
    """Every split is read in full before the first step: a validation split whose rows differ from
    train's, or with token ids outside the vocabulary (any split, -1 included), is refused at start,
    naming the ids; and an evaluation that fails after the checks costs none of the steps trained:
    the state is saved first and the run resumes from it."""
    split = os.path.join(work, "split.h5")  # rows of 160, made by check_evaluation
    short = os.path.join(work, "split_128.h5")
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "prepare_data.py"), "--model-dir", model, "--input",
                    os.path.join(work, "alpaca.jsonl"), "--out", short, "--max-length", "128",
                    "--validation-fraction", "0.25"], check=True, capture_output=True)
    mixed = os.path.join(work, "mixed_rows.h5")
    shutil.copy(split, mixed)
    with h5py.File(mixed, "a") as f, h5py.File(short) as g:
        del f["validation"]
        g.copy("validation", f)
    for name, args in (("mixed", []), ("mixed_eval", ["--set", "train.eval_every=1"])):
        metrics = os.path.join(work, name + ".jsonl")
        os.path.exists(metrics) and os.remove(metrics)
        refused(so, ["--config", config(work, name, model, mixed, steps=2), "--metrics", metrics] + args,
                r"split 'validation' holds rows of 128 tokens and split 'train' rows of 160", "validation rows of another length")
        check(not os.path.exists(metrics) or not open(metrics).read(), f"{name}: refused before the first step")
    for split_name, value in (("validation", 100000), ("train", -1)):
        bad = os.path.join(work, f"oov_{split_name}.h5")
        shutil.copy(split, bad)
        with h5py.File(bad, "a") as f:
            t = f[f"{split_name}/tokens"][...]
            if value < 0:
                t[...] = value  # every token -1
            else:
                t[0, 3] = value
            f[f"{split_name}/tokens"][...] = t
        where = r"-1 \(row 0, position 0\)" if value < 0 else rf"{value} \(row 0, position 3\)"
        refused(so, ["--config", config(work, f"oov_{split_name}", model, bad, steps=2)],
                rf"split '{split_name}' .*token ids lie outside the tokenizer's vocabulary \[0, 384\): {where}",
                f"token id {value} in the {split_name} split")
    ck = os.path.join(work, "eval_fails_ck")
    shutil.rmtree(ck, ignore_errors=True)
    cfg = config(work, "eval_fails", model, split, steps=3, eval_every=2)
    r = subprocess.run([so, "--config", cfg, "--save-dir", ck, "--async-save", "off", "--quiet"], capture_output=True,
                       text=True, env=dict(os.environ, SO_TEST_EVALUATION_FAILS="1"))
    errors = [line for line in r.stderr.splitlines() if "error:" in line]
    check(r.returncode != 0 and len(errors) == 1 and "step 2 was trained, then: evaluation" in errors[0] and
          "saved to" in errors[0] and os.path.exists(os.path.join(ck, "step-00000002.h5")),
          f"a failed evaluation saves the steps trained first: {errors or r.stderr[-300:]}")
    metrics = os.path.join(work, "eval_fails_resumed.jsonl")
    os.path.exists(metrics) and os.remove(metrics)
    r = so_train(so, ["--config", cfg, "--resume", ck, "--metrics", metrics])
    steps = [json.loads(line)["step"] for line in open(metrics)] if r.returncode == 0 else []
    check(steps == [3], f"and the run resumes from them (steps {steps}): {r.stderr[-300:]}")


def main():
    work, so = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    model, data = make_data(work)
    if len(sys.argv) > 4:  # MPIEXEC: validation under ZeRO-3 over two data-parallel ranks
        check_evaluation(work, so, model, [sys.argv[4], "--oversubscribe", "-np", "2"], 3)
        finish("prepared runs")
        return
    with h5py.File(data) as f:
        rows = f["train/tokens"].shape[0]

    # Resume mid-epoch: 8 steps of 4 samples over `rows` rows; saved at step 2 (sample 8).
    check(8 < rows, f"step 2 ends inside the first epoch ({rows} rows)")
    cfg = config(work, "resume", model, data, steps=8)
    for d in ("ck", "full.jsonl", "resumed.jsonl"):
        p = os.path.join(work, d)
        shutil.rmtree(p) if os.path.isdir(p) else os.path.exists(p) and os.remove(p)
    r = so_train(so, ["--config", cfg, "--metrics", os.path.join(work, "full.jsonl"), "--save-dir",
                      os.path.join(work, "ck"), "--save-every", "2", "--keep", "8"])
    check(r.returncode == 0, f"full run: {r.stderr[-300:]}")
    r = so_train(so, ["--config", cfg, "--metrics", os.path.join(work, "resumed.jsonl"), "--resume",
                      os.path.join(work, "ck", "step-00000002.h5")])
    check(r.returncode == 0, f"resumed run: {r.stderr[-300:]}")
    full, resumed = losses(os.path.join(work, "full.jsonl")), losses(os.path.join(work, "resumed.jsonl"))
    check(len(full) == 8 and resumed == full[2:], f"resumed mid-epoch losses equal the uninterrupted run's bit for bit: "
          f"{resumed} vs {full[2:]}")

    # Epochs: num_train_epochs decides the steps (ceil(2 * rows / 4)).
    cfg = config(work, "epochs", model, data, num_train_epochs=2)
    r = so_train(so, ["--config", cfg, "--metrics", os.path.join(work, "epochs.jsonl")])
    n = len(losses(os.path.join(work, "epochs.jsonl"))) if r.returncode == 0 else -1
    os.remove(os.path.join(work, "epochs.jsonl"))
    check(n == -(-2 * rows // 4), f"2 epochs of {rows} rows at 4 a step: {n} steps")

    # A step with no supervised token: rows 0..k of a copy have their masks cleared; one sample a
    # step, so those steps have nothing to learn.
    empty = os.path.join(work, "some_empty.h5")
    shutil.copy(data, empty)
    with h5py.File(empty, "a") as f:
        m = f["train/loss_mask"][...]
        m[: rows // 2] = 0
        f["train/loss_mask"][...] = m
    cfg = config(work, "empty_steps", model, empty, steps=rows)
    metrics = os.path.join(work, "empty.jsonl")
    os.path.exists(metrics) and os.remove(metrics)
    r = so_train(so, ["--config", cfg, "--metrics", metrics, "--set", "train_micro_batch_size_per_gpu=1",
                      "--set", "gradient_accumulation_steps=1"])
    rec = [json.loads(line) for line in open(metrics)] if r.returncode == 0 else []
    zero = [x for x in rec if x["supervised_tokens"] == 0]
    check(len(zero) == rows // 2 and all(x["loss"] == 0.0 and np.isfinite(x["grad_norm"]) for x in zero)
          and all(np.isfinite(x["loss"]) for x in rec), f"steps without a supervised token: loss 0, no NaN ({r.stderr[-200:]})")

    check_evaluation(work, so, model, [], 0)
    check_every_split(work, so, model)

    # Refusals.
    # A model of 300 tokens (its own config, freshly initialised: a checkpoint of that size) fed
    # data of the model directory's 384-token tokenizer.
    with open(os.path.join(model, "config.json")) as f:
        small = json.load(f)
    small["vocab_size"] = 300
    small_config = os.path.join(work, "model_vocab300.json")
    with open(small_config, "w") as f:
        json.dump(small, f)
    vocab_cfg = config(work, "vocab", model, data, steps=1)
    with open(vocab_cfg) as f:
        c = json.load(f)
    c["model"] = {"config": small_config}
    with open(vocab_cfg, "w") as f:
        json.dump(c, f)
    refused(so, ["--config", vocab_cfg],
            r"made with a tokenizer of 384 tokens .*more than the model's vocab_size 300", "tokenizer larger than the model")
    other = os.path.join(work, "other_model")
    shutil.rmtree(other, ignore_errors=True)
    shutil.copytree(model, other)
    with open(os.path.join(other, "tokenizer.json"), "a") as f:
        f.write("\n")
    refused(so, ["--config", config(work, "other", other, data, steps=1)],
            r"was made with the tokenizer of .*model .*not the one in .*other_model", "another tokenizer")
    refused(so, ["--config", config(work, "seq", model, data, steps=1), "--set", "data.seq_len=64"],
            r"data.seq_len.*is 64 but the rows of .* have 160 tokens", "seq_len other than the rows'")
    nothing = os.path.join(work, "nothing.h5")
    shutil.copy(data, nothing)
    with h5py.File(nothing, "a") as f:
        f["train/loss_mask"][...] = 0
    refused(so, ["--config", config(work, "nothing", model, nothing, steps=1)], r"no row has a supervised token",
            "a file with no supervised token")
    unwritten = os.path.join(work, "unwritten.h5")
    shutil.copy(data, unwritten)
    with h5py.File(unwritten, "a") as f:
        shape = f["train/tokens"].shape
        del f["train/tokens"]
        f.create_dataset("train/tokens", shape=shape, dtype="i4")
    refused(so, ["--config", config(work, "unwritten", model, unwritten, steps=1)],
            r"dataset 'train/tokens' .* declared but never written", "prepared tokens never written")
    old = os.path.join(work, "version1.h5")
    shutil.copy(data, old)
    with h5py.File(old, "a") as f:  # a file of the format before padding_start
        f.attrs["format_version"] = 1
        del f["train/padding_start"]
    refused(so, ["--config", config(work, "version1", model, old, steps=1)],
            r"format version 1; this build reads 2: prepare it again", "a version-1 prepared file")
    for value in (0, 10**6):  # the padding must begin inside or after the row's last document
        bad = os.path.join(work, f"padding_{value}.h5")
        shutil.copy(data, bad)
        with h5py.File(bad, "a") as f:
            f["train/padding_start"][0] = value
        refused(so, ["--config", config(work, f"padding_{value}", model, bad, steps=1)],
                rf"row 0 of 'train' has padding_start {value}; its documents end at", f"padding_start {value}")
    # Compressed prepared files (h5py's gzip, shuffle + gzip, szip) train exactly as the plain one;
    # lzf, which the system's libhdf5 lacks, is refused by name.
    plain_metrics = os.path.join(work, "plain_2.jsonl")
    os.path.exists(plain_metrics) and os.remove(plain_metrics)
    so_train(so, ["--config", config(work, "plain_2", model, data, steps=2), "--metrics", plain_metrics])
    plain = losses(plain_metrics) if os.path.exists(plain_metrics) else None
    for name, kw in (("gzip", {"compression": "gzip"}), ("shuffle_gzip", {"compression": "gzip", "shuffle": True}),
                     ("szip", {"compression": "szip"}), ("lzf", {"compression": "lzf"})):
        packed = os.path.join(work, f"compressed_{name}.h5")
        with h5py.File(data) as src, h5py.File(packed, "w") as dst:
            dst.attrs.update(src.attrs)
            for split in src:
                for k, v in src[split].items():
                    dst.create_dataset(f"{split}/{k}", data=v[...], chunks=True, **kw)
        cfg = config(work, f"compressed_{name}", model, packed, steps=2)
        if name == "lzf":
            refused(so, ["--config", cfg], r"dataset 'train/tokens' is compressed with the HDF5 filter 'lzf' \(id 32000\), "
                    r"which this build's HDF5 library cannot decode", "an lzf-compressed prepared file")
            continue
        metrics = os.path.join(work, f"compressed_{name}.jsonl")
        os.path.exists(metrics) and os.remove(metrics)
        r = so_train(so, ["--config", cfg, "--metrics", metrics])
        got = losses(metrics) if r.returncode == 0 else r.stderr[-300:]
        check(plain is not None and got == plain, f"{name}-compressed prepared file trains as the plain one: {got} vs {plain}")
    # Declared-size bombs: datasets allocated early in a sparse file (terabytes declared, kilobytes
    # on disk, every check of "written" passed) are refused from their extents before anything is
    # sized by them: against each other and against what reading them would need.
    def bomb(name, sizes):
        path = os.path.join(work, f"bomb_{name}.h5")
        with h5py.File(data) as src, h5py.File(path, "w") as dst:
            dst.attrs.update(src.attrs)
            for k, v in src["train"].items():
                if k in sizes:
                    sparse_dataset(dst.require_group("train"), k, sizes[k], v.dtype)
                else:
                    dst.create_dataset(f"train/{k}", data=v[...])
        return path
    huge = 2**39  # rows of 2 tokens: 2^40 token ids
    refused(so, ["--config", config(work, "bomb_rows", model, bomb("rows", {
                "tokens": (huge, 2), "loss_mask": (huge, 2), "row_documents": (huge,), "padding_start": (huge,),
                "document_lengths": (huge,)}), steps=1)],
            rf"split 'train' declares {huge} rows of 2 tokens and {huge} documents; reading it needs .* GiB of tables, "
            r"more than half this machine's", "2^40 declared token ids")
    refused(so, ["--config", config(work, "bomb_documents", model, bomb("documents", {"document_lengths": (2**40,)}), steps=1)],
            rf"'train/document_lengths' declares {2**40} documents; {rows} rows of 160 tokens hold between {rows} and {rows * 160}",
            "2^40 declared documents")
    refused(so, ["--config", config(work, "bomb_row_documents", model, bomb("row_documents", {"row_documents": (2**32,)}), steps=1)],
            rf"dataset 'train/row_documents' must be \[{rows}\], one per row of 'train/tokens'", "2^32 declared per-row counts")
    refused(so, ["--config", config(work, "bomb_row_length", model, bomb("row_length", {"tokens": (1, 2**33)}))],
            r"dataset 'train/tokens' must be \[rows, row length in 2..2147483647\]", "a row of 2^33 tokens")
    flat = os.path.join(work, "flat_unwritten.h5")
    with h5py.File(flat, "w") as f:
        f.create_dataset("tokens", shape=(4096,), dtype="i4")
    refused(so, ["--config", config(work, "flat", model, data, steps=1), "--data", flat, "--seq-len", "32"],
            r"dataset 'tokens' .* declared but never written", "1-D token dataset never written")
    partial = os.path.join(work, "flat_partial.h5")
    with h5py.File(partial, "w") as f:
        d = f.create_dataset("tokens", shape=(4096,), dtype="i4", chunks=(1024,))
        d[:1024] = 1
    refused(so, ["--config", config(work, "partial", model, data, steps=1), "--data", partial, "--seq-len", "32"],
            r"dataset 'tokens' .* only partly written", "1-D token dataset partly written")

    finish("prepared runs")


if __name__ == "__main__":
    main()
