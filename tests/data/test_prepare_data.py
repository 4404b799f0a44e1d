#!/usr/bin/env python
"""scripts/prepare_data.py against transformers: the prepared tokens equal what the tokenizer and
its chat template give, token for token; the loss masks cover exactly the trained text; packing,
padding, the validation split and the example-compatible mode lay rows out as documented; bad
input gives a clear error or a counted warning.

  $SO_PYTHON tests/data/test_prepare_data.py WORK_DIR
"""
import json
import os
import subprocess
import sys

import h5py
import numpy as np
from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PREPARE = os.path.join(ROOT, "scripts", "prepare_data.py")
sys.path.insert(0, os.path.dirname(HERE))
from script_checks import check, finish  # noqa: E402

ALPACA = [
    {"instruction": "Name the sisters.", "input": "", "output": "Elinor and Marianne Dashwood."},
    {"instruction": "Who is Mr. Darcy?", "input": "Pride and Prejudice", "output": "A proud gentleman."},
    {"instruction": "Say nothing.", "input": "", "output": "Silence, my dear."},
]
CHAT = [
    {"messages": [{"role": "system", "content": "You are Jane."},
                  {"role": "user", "content": "How are you?"},
                  {"role": "assistant", "content": "Very well, I thank you."},
                  {"role": "user", "content": "And your sister?"},
                  {"role": "assistant", "content": "She is at Netherfield."}]},
    {"messages": [{"role": "user", "content": "Where is Longbourn?"},
                  {"role": "assistant", "content": "In Hertfordshire, sir."}]},
]


class Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def run(args, expect_ok=True):
    """prepare_data's main in this process (one transformers import for all cases), its exit
    status and output as the command line would give them."""
    import contextlib
    import io
    import prepare_data
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = prepare_data.cli(args)
    r = Result(rc, out.getvalue(), err.getvalue())
    if expect_ok and r.returncode != 0:
        raise SystemExit(f"prepare_data {args} failed: {r.stderr}")
    return r


def write_jsonl(path, records):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return path


def documents(h5, split="train"):
    """Every document of a split as (ids, mask), in row order."""
    g = h5[split]
    tokens, mask, counts, lengths = g["tokens"][...], g["loss_mask"][...], g["row_documents"][...], g["document_lengths"][...]
    out, d = [], 0
    for r in range(tokens.shape[0]):
        at = 0
        for _ in range(counts[r]):
            n = lengths[d]
            out.append((tokens[r, at:at + n].tolist(), mask[r, at:at + n].tolist()))
            at, d = at + n, d + 1
    return out


def chat_ids(tok, messages):
    ref = tok.apply_chat_template(messages, tokenize=True)
    return list(ref["input_ids"] if hasattr(ref, "keys") else ref)


def check_chat_documents(tok, path, conversations, what):
    """The file's documents are apply_chat_template's ids of the conversations, and each one's
    supervised runs, decoded, are exactly its assistant turns, each ending at <|im_end|>."""
    with h5py.File(path) as f:
        by_ids = {tuple(ids): m for ids, m in documents(f)}
    check(len(by_ids) == len(conversations), f"{what}: one document per conversation")
    for messages in conversations:
        ref = chat_ids(tok, messages)
        check(tuple(ref) in by_ids, f"{what}: tokens equal apply_chat_template token for token")
        m = by_ids.get(tuple(ref), [0] * len(ref))
        runs, cur = [], []
        for i, k in zip(ref, m):
            if k:
                cur.append(i)
            elif cur:
                runs.append(cur)
                cur = []
        if cur:
            runs.append(cur)
        want_runs = [a["content"] + "<|im_end|>" for a in messages if a["role"] == "assistant"]
        check([tok.decode(x) for x in runs] == want_runs, f"{what}: mask = assistant turns: {[tok.decode(x) for x in runs]}")


def peak_address_space(args):
    """prepare_data run as a command under no limit: its exit status and peak address space (bytes)."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import prepare_data; rc = prepare_data.main(sys.argv[2:]); "
            "print([l for l in open('/proc/self/status') if l.startswith('VmPeak')][0].split()[1])")
    r = subprocess.run([sys.executable, "-c", code, os.path.join(ROOT, "scripts")] + args, capture_output=True, text=True)
    return r.returncode, int(r.stdout.strip().splitlines()[-1]) * 1024 if r.returncode == 0 else 0


def check_huge_records(work, model, tok):
    import resource
    corpus = open(os.path.join(ROOT, "data", "corpus", "austen.txt")).read()
    n = 30_000_000
    text = (corpus * (n // len(corpus) + 1))[:n]
    messages = lambda t: [{"role": "user", "content": "Go on."}, {"role": "assistant", "content": t}]
    records = [{"text": text}, {"instruction": "Continue.", "input": "", "output": text}, {"messages": messages(text)}]
    small = write_jsonl(os.path.join(work, "small_records.jsonl"), [{"text": corpus[:2000]}])
    rc, peak = peak_address_space(["--model-dir", model, "--input", small, "--out", os.path.join(work, "small.h5"),
                                   "--max-length", "256"])
    check(rc == 0 and peak > 0, "a small run's peak address space measured")
    big = write_jsonl(os.path.join(work, "huge_records.jsonl"), records)
    out = os.path.join(work, "huge.h5")
    cap = peak + (3 << 29)
    r = subprocess.run([sys.executable, PREPARE, "--model-dir", model, "--input", big, "--out", out, "--max-length", "256"],
                       capture_output=True, text=True, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (cap, cap)))
    check(r.returncode == 0 and "3 truncated" in r.stdout,
          f"3 records of 30 MB under a cap of {cap >> 20} MiB: {r.stdout.strip()} {r.stderr.strip()[-300:]}")
    if r.returncode != 0:
        return
    with h5py.File(out) as f:
        got = {tuple(ids) for ids, _ in documents(f)}
    prefix = text[:400_000]  # 150x what the cut needed, far past the 256 tokens kept
    prompt = prepare_data_module().ALPACA_PROMPT["without_input"].format(instruction="Continue.")
    want = [tok(prefix)["input_ids"][:256], tok(prompt + prefix)["input_ids"][:256], chat_ids(tok, messages(prefix))[:256]]
    check(all(tuple(w) in got for w in want) and len(got) == 3, "the huge records' tokens are the tokenizer's")


def check_bad_inputs(work, model, alpaca):
    """Every kind of bad input ends in one line on stderr naming the file (and the record) and the
    problem, exit status 1, no traceback; empty records are counted, one warning line in all."""
    def path(name, data):
        p = os.path.join(work, name)
        with open(p, "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode())
        return p
    good = json.dumps(ALPACA[0]) + "\n"
    chat = lambda *m: json.dumps({"messages": [{"role": r, "content": c} for r, c in m]}) + "\n"
    no_tokenizer = os.path.join(work, "model_no_tokenizer")
    os.makedirs(no_tokenizer, exist_ok=True)
    with open(os.path.join(no_tokenizer, "config.json"), "w") as f:
        f.write("{}")
    broken_tokenizer = os.path.join(work, "model_broken_tokenizer")
    os.makedirs(broken_tokenizer, exist_ok=True)
    for name in os.listdir(model):
        with open(os.path.join(model, name), "rb") as src, open(os.path.join(broken_tokenizer, name), "wb") as dst:
            dst.write(b"this is not JSON" if name == "tokenizer.json" else src.read())
    out = os.path.join(work, "bad_out.h5")
    cases = [  # (arguments, the file (or option) the line names, the problem it states)
        (["--input", path("bad_utf8.jsonl", good.encode() + b'{"text": "caf\xe9"}\n')], "bad_utf8.jsonl:2",
         "not UTF-8 (byte 0xe9"),
        (["--input", path("utf16.jsonl", good.encode("utf-16"))], "utf16.jsonl", "UTF-16 text"),
        (["--input", path("deep.jsonl", good + "[" * 100000 + "]" * 100000 + "\n")], "deep.jsonl:2",
         "JSON nested deeper than"),
        (["--input", path("deep_array.json", "[" * 100000)], "deep_array.json", "JSON nested deeper than"),
        (["--input", path("not_object.json", "[1, 2]")], "not_object.json: record 0", "a record must be an object"),
        (["--input", path("chat_number.jsonl", chat(("user", 5), ("assistant", "x")))], "chat_number.jsonl:1",
         "message 0 (user): 'content' must be a string, got int"),
        (["--input", path("chat_role.jsonl", chat((7, "hi"), ("assistant", "x")))], "chat_role.jsonl:1",
         "message 0: 'role' must be a string, got int"),
        (["--input", path("garbage.parquet", "not parquet at all")], "garbage.parquet", "not a readable Parquet file"),
        (["--input", path("garbage.arrow", "not arrow at all")], "garbage.arrow", "not a readable Arrow file"),
        (["--input", path("fifo_dir", "")[:-len("fifo_dir")] + "nowhere.jsonl"], "nowhere.jsonl", "no such file"),
        (["--input", alpaca, "--model-dir", no_tokenizer], no_tokenizer, "no tokenizer.json"),
        (["--input", alpaca, "--model-dir", broken_tokenizer], broken_tokenizer, "its tokenizer cannot be loaded"),
        (["--input", alpaca, "--max-length", str(2**40)], "--max-length is 1099511627776",
         "a row holds 2 to 2147483647 tokens"),
        (["--input", alpaca, "--max-length", str(2**31 - 1), "--pad"], "rows of --max-length 2147483647", "GiB"),
        (["--input", alpaca, "--bogus"], "unrecognized arguments: --bogus", "--help lists the options"),
    ]
    for args, names, problem in cases:
        args = args + ([] if "--model-dir" in args else ["--model-dir", model]) + ["--out", out]
        r = run(args, expect_ok=False)
        lines = r.stderr.strip().splitlines()
        check(r.returncode == 1 and len(lines) == 1 and names in lines[0] and problem in lines[0]
              and "Traceback" not in r.stderr, f"{names}: one line naming it and '{problem}': {r.stderr.strip()[-300:]}")
    # As a command too (the line is all the command prints: no traceback, exit status 1).
    r = subprocess.run([sys.executable, PREPARE, "--model-dir", model, "--input", os.path.join(work, "garbage.parquet"),
                        "--out", out], capture_output=True, text=True)
    check(r.returncode == 1 and r.stderr.count("\n") == 1 and "not a readable Parquet file" in r.stderr,
          f"the command's one line: {r.stderr.strip()[-300:]}")
    # A null chat content is an empty one; 52 empty records: counted, one warning line.
    empties = path("empties.jsonl", good + chat(("user", "hi"), ("assistant", None)) +
                   "".join(json.dumps(dict(ALPACA[1], output="")) + "\n" for _ in range(51)))
    r = run(["--model-dir", model, "--input", empties, "--out", out, "--max-length", "256"])
    check(r.stderr.strip().splitlines() == [f"warning: 52 records skipped as empty (the first: {empties}:2: message 1 "
                                            f"(assistant) is empty)"] and "53 records read;" in r.stdout
          and "52 empty" in r.stdout, f"empty records counted: {r.stdout.strip()} / {r.stderr.strip()}")


def prepare_data_module():
    import prepare_data
    return prepare_data


def main():
    work = sys.argv[1]
    os.makedirs(work, exist_ok=True)
    model = os.path.join(work, "model")
    subprocess.run([sys.executable, os.path.join(HERE, "make_chat_model.py"), model, "--tokenizer-only"], check=True)
    tok = AutoTokenizer.from_pretrained(model, local_files_only=True)
    eos = tok.eos_token_id
    alpaca = write_jsonl(os.path.join(work, "alpaca.jsonl"), ALPACA)
    chat = write_jsonl(os.path.join(work, "chat.jsonl"), CHAT)

    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import prepare_data
    prompts = [prepare_data.ALPACA_PROMPT["with_input" if s["input"] else "without_input"].format(**s) for s in ALPACA]
    full = [len(tok(p + s["output"])["input_ids"]) + 1 for p, s in zip(prompts, ALPACA)]
    prompt_lens = [len(tok(p)["input_ids"]) for p in prompts]

    # Alpaca, padded, one document per row (order shuffled by seed: match by content).
    out = os.path.join(work, "alpaca.h5")
    r = run(["--model-dir", model, "--input", alpaca, "--out", out, "--max-length", "256", "--pad"])
    print(r.stdout)
    with h5py.File(out) as f:
        docs = documents(f)
        check(f["train/tokens"].shape == (3, 256), "alpaca: one padded row per sample")
        check(f.attrs["vocab_size"] == len(tok), "vocab size recorded")
        check(f.attrs["eos_token_id"] == eos, "eos id recorded")
        check(len(f.attrs["tokenizer_sha256"]) == 64, "tokenizer hash recorded")
        pad = f["train/tokens"][0, -1]
        check(pad == tok.pad_token_id, "padding uses the pad token")
        check(f["train/loss_mask"][0, -1] == 0, "padding is not supervised")
    want = {}
    for s in ALPACA:
        t = prepare_data.ALPACA_PROMPT["with_input" if s["input"] else "without_input"].format(**s)
        ids = tok(t + s["output"])["input_ids"] + [eos]
        want[tuple(ids)] = s["output"]
    want_by_ids = want
    for ids, m in docs:
        check(tuple(ids) in want, f"alpaca tokens equal tokenizer(prompt + output) + [eos]: {tok.decode(ids)!r}")
        sup = [i for i, k in zip(ids, m) if k]
        check(sup[-1] == eos and tok.decode(sup[:-1]).strip() == want.get(tuple(ids), "").strip(),
              f"alpaca mask covers the output and EOS, got {tok.decode(sup)!r}")

    # Chat, packed, with the default options (--eos on): tokens equal apply_chat_template token for
    # token (the template ends each turn; no EOS is added after it), masks end at <|im_end|>;
    # --no-eos changes nothing for chat. Alpaca rendered by the chat template likewise.
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    out = os.path.join(work, "chat.h5")
    run(["--model-dir", model, "--input", chat, "--out", out, "--max-length", "512"])
    with h5py.File(out) as f:
        check(f["train/tokens"].shape[0] == 1, "two short chats pack into one row")
    check_chat_documents(tok, out, [s["messages"] for s in CHAT], "chat (default options)")
    run(["--model-dir", model, "--input", chat, "--out", os.path.join(work, "chat_no_eos.h5"), "--max-length", "512",
         "--no-eos"])
    with h5py.File(out) as f, h5py.File(os.path.join(work, "chat_no_eos.h5")) as g:
        check((f["train/tokens"][...] == g["train/tokens"][...]).all() and
              (f["train/loss_mask"][...] == g["train/loss_mask"][...]).all(), "chat: --no-eos gives the same rows")
    out = os.path.join(work, "alpaca_chat.h5")
    run(["--model-dir", model, "--input", alpaca, "--out", out, "--max-length", "512", "--alpaca-template", "chat"])
    conversations = [[{"role": "user", "content": s["instruction"] if not s["input"] else f"{s['instruction']}\n\n{s['input']}"},
                      {"role": "assistant", "content": s["output"]}] for s in ALPACA]
    check_chat_documents(tok, out, conversations, "alpaca rendered by the chat template")
    # The smallest conversation: exactly transformers' 4 labels ("Yes." and <|im_end|>), no fifth.
    tiny = write_jsonl(os.path.join(work, "tiny_chat.jsonl"),
                       [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yes."}]}])
    out = os.path.join(work, "tiny_chat.h5")
    run(["--model-dir", model, "--input", tiny, "--out", out, "--max-length", "64"])
    with h5py.File(out) as f:
        (ids, m), = documents(f)
    ref = chat_ids(tok, [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yes."}])
    want_labels = len(tok("Yes.", add_special_tokens=False)["input_ids"]) + 1
    check(ids == ref and sum(m) == want_labels and ids.count(im_end) == 2,
          f"one short chat: {len(ids)} tokens / {sum(m)} supervised; transformers {len(ref)} / {want_labels}")

    # Roles: user turns trained too.
    out = os.path.join(work, "chat_roles.h5")
    run(["--model-dir", model, "--input", chat, "--out", out, "--max-length", "512", "--train-roles", "user,assistant"])
    with h5py.File(out) as f:
        sup = sum(int(np.sum(m)) for _, m in documents(f))
    with h5py.File(os.path.join(work, "chat.h5")) as f:
        sup_assistant = sum(int(np.sum(m)) for _, m in documents(f))
    check(sup > sup_assistant, "--train-roles user,assistant supervises more tokens")

    # Example-compatible: the example's template, no EOS, padded, everything supervised.
    out = os.path.join(work, "example.h5")
    run(["--model-dir", model, "--input", alpaca, "--out", out, "--max-length", "256", "--example-compatible"])
    with h5py.File(out) as f:
        check(f["train/loss_mask"][...].all(), "example-compatible: every token supervised")
        check((f["train/row_documents"][...] == 1).all() and (f["train/document_lengths"][...] == 256).all(),
              "example-compatible: a row is one document of max length")
        first = f["train/tokens"][...].tolist()
    s = ALPACA[0]
    ids = tok(prepare_data.EXAMPLE_PROMPT["without_input"].format(**s) + s["output"])["input_ids"]
    check(any(row[:len(ids)] == ids and row[len(ids)] == tok.pad_token_id for row in first),
          "example-compatible: the example's template, no EOS, then padding")

    # Packing: best-fit decreasing. Lengths 6 5 5 4 4 3 3 2 2 1 in rows of 10 take 4 rows (next-fit
    # in that order: 5); on 300 seeded random lengths no two rows would fit in one (any-fit's
    # guarantee, which next-fit lacks) and every document is placed once, its order kept.
    import random
    fake = lambda lengths: [([k] * n, [1] * n) for k, n in enumerate(lengths)]
    rows = prepare_data.make_rows(fake([6, 5, 5, 4, 4, 3, 3, 2, 2, 1]), 10, True)
    check(len(rows) == 4 and sorted(sum(len(ids) for ids, _ in row) for row in rows) == [5, 10, 10, 10],
          f"6 5 5 4 4 3 3 2 2 1 in rows of 10: {[[len(ids) for ids, _ in row] for row in rows]}")
    rng = random.Random(7)
    lengths = [rng.randrange(1, 200) for _ in range(300)]
    rows = prepare_data.make_rows(fake(lengths), 256, True)
    fill = [sum(len(ids) for ids, _ in row) for row in rows]
    firsts = [[ids[0] for ids, _ in row] for row in rows]
    check(max(fill) <= 256 and all(a + b > 256 for i, a in enumerate(fill) for b in fill[i + 1:]) and
          sorted(sum(firsts, [])) == list(range(300)) and all(r == sorted(r) for r in firsts) and
          [r[0] for r in firsts] == sorted(r[0] for r in firsts),
          f"300 random documents: {len(rows)} rows, no two of which fit together; each document once, in order")
    next_fit, used = 1, 0
    for n in lengths:
        next_fit, used = (next_fit + 1, n) if used + n > 256 else (next_fit, used + n)
    check(len(rows) < next_fit, f"best-fit decreasing takes fewer rows than next-fit: {len(rows)} vs {next_fit}")
    # The padding fraction is reported per split, and recorded in the file.
    r = run(["--model-dir", model, "--input", alpaca, "--out", os.path.join(work, "packed.h5"), "--max-length", "256"])
    with h5py.File(os.path.join(work, "packed.h5")) as f:
        g = f["train"]
        want = 1 - int(g["document_lengths"][...].sum()) / g["tokens"].size
        check(abs(g.attrs["padding_fraction"] - want) < 1e-12 and f"padding {100 * want:.1f}%" in r.stdout,
              f"padding fraction reported: {r.stdout.strip()}")
    # --no-shuffle: the input's order (one row per sample with --pad), the validation split its last samples.
    out = os.path.join(work, "ordered.h5")
    run(["--model-dir", model, "--input", alpaca, "--out", out, "--max-length", "256", "--pad", "--no-shuffle",
         "--validation-fraction", "0.34"])
    with h5py.File(out) as f:
        order = [want_by_ids.get(tuple(ids)) for ids, _ in documents(f)] + \
                [want_by_ids.get(tuple(ids)) for ids, _ in documents(f, "validation")]
    check(order == [s["output"] for s in ALPACA], f"--no-shuffle keeps the input order: {order}")

    # Validation split by fraction and by file; seed decides the order.
    out = os.path.join(work, "split.h5")
    run(["--model-dir", model, "--input", alpaca, "--out", out, "--max-length", "256", "--pad",
         "--validation-fraction", "0.34"])
    with h5py.File(out) as f:
        check(f["train/tokens"].shape[0] == 2 and f["validation/tokens"].shape[0] == 1, "validation fraction")
    out = os.path.join(work, "split_file.h5")
    run(["--model-dir", model, "--input", alpaca, "--out", out, "--max-length", "256", "--validation-file", alpaca])
    with h5py.File(out) as f:
        check("validation" in f, "validation file")

    # Over-long samples: truncated or dropped, counted.
    cut = str(sorted(full)[1])  # the longest sample is over it
    r = run(["--model-dir", model, "--input", alpaca, "--out", os.path.join(work, "drop.h5"), "--max-length", cut,
             "--overflow", "drop"])
    check("dropped 1 too long" in r.stdout and "more tokens than --max-length" in r.stderr, f"drops counted: {r.stdout}")
    r = run(["--model-dir", model, "--input", alpaca, "--out", os.path.join(work, "trunc.h5"), "--max-length", cut])
    check("1 truncated" in r.stdout, f"truncations counted: {r.stdout}")
    r = run(["--model-dir", model, "--input", alpaca, "--out", os.path.join(work, "trunc.h5"), "--max-length",
             str(min(prompt_lens))], expect_ok=False)
    check(r.returncode != 0 and "no training sample left" in r.stderr and "with no supervised token" in r.stderr,
          f"truncation that leaves no supervised token: {r.stderr}")

    # A record far longer than --max-length is tokenized from a prefix: 30 MB records (text, an
    # Alpaca output, an assistant turn) prepare under an address-space cap of what a small run
    # takes plus 1.5 GiB (tokenized whole, each took several GB), and their tokens are the ones the
    # tokenizer gives for a far longer prefix of each record.
    check_huge_records(work, model, tok)

    check_bad_inputs(work, model, alpaca)

    # Bad input.
    bad = os.path.join(work, "bad.jsonl")
    with open(bad, "w") as f:
        f.write(json.dumps(ALPACA[0]) + "\n" + '{"instruction": "x", "output": \n')
    r = run(["--model-dir", model, "--input", bad, "--out", os.path.join(work, "x.h5")], expect_ok=False)
    check(r.returncode == 1 and f"{bad}:2: malformed JSON line" in r.stderr, f"malformed line named: {r.stderr}")
    write_jsonl(bad, [{"instruction": "x"}])
    r = run(["--model-dir", model, "--input", bad, "--out", os.path.join(work, "x.h5"), "--format", "alpaca"],
            expect_ok=False)
    check(r.returncode == 1 and "missing field 'output'" in r.stderr and f"{bad}:1" in r.stderr,
          f"missing field: {r.stderr}")
    write_jsonl(bad, [ALPACA[0], {"instruction": "x", "input": "", "output": "  "}])
    r = run(["--model-dir", model, "--input", bad, "--out", os.path.join(work, "x.h5")])
    check("1 empty" in r.stdout and "field 'output' is empty" in r.stderr, f"empty response counted: {r.stdout}")
    write_jsonl(bad, [{"instruction": "x", "input": "", "output": ""}])
    r = run(["--model-dir", model, "--input", bad, "--out", os.path.join(work, "x.h5")], expect_ok=False)
    check(r.returncode == 1 and "no training sample left" in r.stderr, f"a file with nothing supervised: {r.stderr}")
    plain = os.path.join(work, "plain")
    subprocess.run([sys.executable, os.path.join(HERE, "make_chat_model.py"), plain, "--tokenizer-only",
                    "--no-chat-template"], check=True)
    r = run(["--model-dir", plain, "--input", chat, "--out", os.path.join(work, "x.h5"), "--format", "chat"],
            expect_ok=False)
    check(r.returncode == 1 and "no chat template" in r.stderr, f"tokenizer without chat template: {r.stderr}")
    r = run(["--model-dir", plain, "--input", chat, "--out", os.path.join(work, "x.h5")], expect_ok=False)
    check(r.returncode == 1 and "no chat template" in r.stderr, f"auto-detected chat, no template: {r.stderr}")

    # --out naming a file the run reads (by any name: the same path, sub/../x, a hard link, a
    # symbolic link) is refused before anything is written; the file is left as it was.
    import hashlib
    digest = lambda path: hashlib.sha256(open(path, "rb").read()).hexdigest()
    sub = os.path.join(work, "sub")
    os.makedirs(sub, exist_ok=True)
    hard, soft = os.path.join(work, "alpaca_hard.jsonl"), os.path.join(work, "alpaca_soft.jsonl")
    for p in (hard, soft):
        os.path.lexists(p) and os.remove(p)
    os.link(alpaca, hard)
    os.symlink(alpaca, soft)
    val = write_jsonl(os.path.join(work, "val.jsonl"), ALPACA[:1])
    tokenizer_json = os.path.join(model, "tokenizer.json")
    cases = [(alpaca, "--input"), (os.path.join(sub, "..", "alpaca.jsonl"), "--input"), (hard, "--input"),
             (soft, "--input"), (val, "--validation-file"), (tokenizer_json, "--model-dir"),
             (os.path.join(model, "tokenizer_config.json"), "--model-dir")]
    for out, role in cases:
        before = {p: digest(p) for p in (alpaca, val, tokenizer_json)}
        r = run(["--model-dir", model, "--input", alpaca, "--validation-file", val, "--out", out, "--max-length", "256"],
                expect_ok=False)
        check(r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and f"--out {out} is the same file as {role}"
              in r.stderr and before == {p: digest(p) for p in before},
              f"--out {out} refused as {role}, nothing overwritten: {r.stderr.strip()}")
    for out, why in ((work, "is a directory"), (os.path.join(work, "nowhere", "x.h5"), "does not exist")):
        r = run(["--model-dir", model, "--input", alpaca, "--out", out], expect_ok=False)
        check(r.returncode == 1 and why in r.stderr, f"--out {out}: {r.stderr.strip()}")
    # The output's temporary file is a fresh name: a file called OUT.tmp is not touched.
    decoy = write_jsonl(os.path.join(work, "decoy.h5.tmp"), ALPACA[:1])
    before = digest(decoy)
    run(["--model-dir", model, "--input", alpaca, "--out", os.path.join(work, "decoy.h5"), "--max-length", "256"])
    check(digest(decoy) == before and not [f for f in os.listdir(work) if f.startswith("decoy.h5.") and f != "decoy.h5.tmp"],
          "the temporary output neither overwrites OUT.tmp nor stays behind")

    # The same records as Parquet, an Arrow IPC file and a directory of Arrow IPC stream files
    # (the layout datasets.save_to_disk writes: data-NNNNN-of-NNNNN.arrow) give the JSONL's file.
    import pyarrow as pa
    import pyarrow.parquet as pq
    table = pa.Table.from_pylist(ALPACA)
    parquet = os.path.join(work, "alpaca.parquet")
    pq.write_table(table, parquet)
    arrow = os.path.join(work, "alpaca.arrow")
    with pa.OSFile(arrow, "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    saved = os.path.join(work, "alpaca_saved")
    os.makedirs(saved, exist_ok=True)
    for i, part in enumerate([table.slice(0, 2), table.slice(2)]):  # two shards, read in order
        with pa.OSFile(os.path.join(saved, f"data-{i:05d}-of-00002.arrow"), "wb") as sink, \
                pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(part)
    with h5py.File(os.path.join(work, "alpaca.h5")) as f:
        from_jsonl = {k: f[f"train/{k}"][:] for k in ("tokens", "loss_mask")}
    for source in (parquet, arrow, saved):
        out = os.path.join(work, "alpaca_from_" + os.path.basename(source) + ".h5")
        run(["--model-dir", model, "--input", source, "--out", out, "--max-length", "256", "--pad"])
        with h5py.File(out) as f:
            same = all((f[f"train/{k}"][:] == v).all() and f[f"train/{k}"].shape == v.shape
                       for k, v in from_jsonl.items())
        check(same, f"{os.path.basename(source)}: tokens and loss masks equal the JSONL's")

    # Plain text: tokens equal tokenizer(text) + EOS, all supervised.
    text = write_jsonl(os.path.join(work, "text.jsonl"), [{"text": "It is a truth universally acknowledged."}])
    run(["--model-dir", model, "--input", text, "--out", os.path.join(work, "text.h5"), "--max-length", "64"])
    with h5py.File(os.path.join(work, "text.h5")) as f:
        (ids, m), = documents(f)
    check(ids == tok("It is a truth universally acknowledged.")["input_ids"] + [eos] and all(m), "plain text")

    finish("prepare_data")


if __name__ == "__main__":
    main()
