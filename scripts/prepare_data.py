#!/usr/bin/env python
"""Turns instruction, chat or plain-text data into one HDF5 file so_train trains on.

The model's own tokenizer is read from its directory (tokenizer.json, tokenizer_config.json,
chat_template.jinja) through transformers, never from the hub. Every sample becomes a document:
its token ids and a loss mask (1 = the token is a label the loss is computed on). Documents are
packed several to a row (--pack, the default) or padded one to a row (--pad). The layout of the
output is documented in docs/finetuning.md; so_train reads it with data.type "prepared".

  $SO_PYTHON scripts/prepare_data.py --model-dir DIR --input alpaca.json --format alpaca \
      --max-length 4096 --out train.h5

$SO_PYTHON is the project's Python environment ($(scripts/python_env.sh path)/bin/python, which
scripts/install-deps.sh makes with transformers, h5py and pyarrow pinned).
"""
import argparse
import hashlib
import json
import os
import random
import sys
import tempfile

import h5py
import numpy as np

from script_input import InputError, OneLineParser, parse_json, read_utf8, run_as_command

FORMAT_VERSION = 2

# Stanford Alpaca's prompt (tatsu-lab/stanford_alpaca train.py), with its preamble: the default.
ALPACA_PROMPT = {
    "with_input": ("Below is an instruction that describes a task, paired with an input that provides further "
                   "context. Write a response that appropriately completes the request.\n\n"
                   "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"),
    "without_input": ("Below is an instruction that describes a task. Write a response that appropriately "
                      "completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n"),
}
# The public SuperOffload example's shorter template (no preamble).
EXAMPLE_PROMPT = {
    "with_input": "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n",
    "without_input": "### Instruction:\n{instruction}\n\n### Response:\n",
}


class DataError(InputError):
    """A problem with the user's input: printed as one line, exit status 1."""


# ---------------------------------------------------------------------------------------------
# Reading records


def read_json_records(path):
    """JSON (an array of objects) or JSON Lines; a malformed line is named by file and line."""
    text = read_utf8(path, "input")
    if text.lstrip().startswith("["):
        for i, r in enumerate(parse_json(path, text)):
            yield f"{path}: record {i}", r
        return
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            yield f"{path}:{lineno}", parse_json(f"{path}:{lineno}", line, one_line=True)


def read_arrow_records(path):
    """Parquet, Arrow IPC files and datasets.save_to_disk directories, through pyarrow."""
    try:
        import pyarrow.parquet as pq
        import pyarrow.ipc as ipc
        import pyarrow as pa
    except ImportError:
        raise DataError(f"{path}: reading Parquet/Arrow needs the PyPI package pyarrow, which this Python "
                        f"({sys.executable}) does not have; convert to JSON Lines or use an environment with it")
    try:
        if os.path.isdir(path):  # datasets.save_to_disk: data-*.arrow files (streaming IPC) in order
            files = sorted(f for f in os.listdir(path) if f.endswith(".arrow"))
            if not files:
                raise DataError(f"{path}: a directory, but no .arrow files in it (not a datasets.save_to_disk directory)")
            tables = []
            for f in files:
                with open(os.path.join(path, f), "rb") as fh:
                    tables.append(ipc.open_stream(fh).read_all())
            table = pa.concat_tables(tables)
        elif path.endswith(".parquet"):
            table = pq.read_table(path)
        else:
            with open(path, "rb") as fh:
                try:
                    table = ipc.open_file(fh).read_all()
                except pa.ArrowInvalid:
                    fh.seek(0)
                    table = ipc.open_stream(fh).read_all()
        rows = table.to_pylist()
    except (pa.ArrowException, OSError, ValueError) as e:
        raise DataError(f"{path}: not a readable {'Parquet' if path.endswith('.parquet') else 'Arrow'} file or "
                        f"dataset directory ({type(e).__name__}: {e})")
    for i, r in enumerate(rows):
        yield f"{path}: row {i}", r


def read_records(path):
    if not os.path.exists(path):
        raise DataError(f"{path}: no such file or directory")
    if os.path.isdir(path) or path.endswith((".parquet", ".arrow")):
        return read_arrow_records(path)
    return read_json_records(path)


def detect_format(where, record):
    if not isinstance(record, dict):
        raise DataError(f"{where}: a record must be an object, got {type(record).__name__}")
    if "messages" in record:
        return "chat"
    if "instruction" in record:
        return "alpaca"
    if "text" in record:
        return "text"
    raise DataError(f"{where}: cannot tell the format: no 'messages' (chat), 'instruction' (alpaca) or 'text' "
                    f"field (fields: {sorted(record)})")


def field(where, record, name, allow_empty=True):
    if name not in record:
        raise DataError(f"{where}: missing field '{name}' (fields: {sorted(record)})")
    v = record[name]
    if v is None:
        v = ""
    if not isinstance(v, str):
        raise DataError(f"{where}: field '{name}' must be a string, got {type(v).__name__}")
    if not allow_empty and not v.strip():
        raise EmptyResponse(f"{where}: field '{name}' is empty")
    return v


class EmptyResponse(Exception):
    """A sample with nothing to learn from: counted and skipped, never trained on."""


# ---------------------------------------------------------------------------------------------
# Tokenizing one sample: token ids and, per token, whether it is supervised. Text is rendered
# whole and tokenized once (so the ids equal what the tokenizer gives for the whole text); the
# supervised character spans decide the mask through the tokenizer's offsets.


# Tokens kept past --max-length when a long text is tokenized from a prefix: the prefix ends at
# whitespace beyond them, so the tokens kept are the whole text's.
CUT_MARGIN_TOKENS = 64


def encode(tok, text, add_special_tokens, max_length):
    """Token ids and character offsets of text as the tokenizer gives them for the whole text, but
    at most max_length + CUT_MARGIN_TOKENS of them: a text far longer than that is tokenized from a
    prefix, cut at whitespace and doubled until it yields more (a 50 MB record tokenized whole took
    10 GB for the few thousand tokens kept)."""
    limit = max_length + CUT_MARGIN_TOKENS
    chars = 8 * limit
    while chars < len(text):
        space = max(text.rfind(c, chars // 2, chars) for c in " \n\t")
        enc = tok(text[:space if space > 0 else chars], add_special_tokens=add_special_tokens,
                  return_offsets_mapping=True)
        if len(enc["input_ids"]) > limit:
            return list(enc["input_ids"])[:limit], list(enc["offset_mapping"])[:limit]
        chars *= 2
    enc = tok(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    return list(enc["input_ids"]), list(enc["offset_mapping"])


def tokenize_with_spans(tok, text, spans, add_special_tokens, max_length):
    ids, offsets = encode(tok, text, add_special_tokens, max_length)
    mask = []
    for (a, b) in offsets:
        # Special tokens added by the tokenizer have an empty span (0, 0): never supervised here.
        mask.append(1 if b > a and any(s <= a < e for s, e in spans) else 0)
    return ids, mask


def alpaca_sample(tok, where, record, args):
    instruction = field(where, record, "instruction")
    inp = field(where, record, "input") if "input" in record else ""
    output = field(where, record, "output", allow_empty=args.example_compatible)
    if args.alpaca_template == "chat":
        user = instruction if not inp.strip() else f"{instruction}\n\n{inp}"
        messages = [{"role": "user", "content": user}, {"role": "assistant", "content": output}]
        return chat_sample(tok, where, {"messages": messages}, args)
    prompts = EXAMPLE_PROMPT if args.alpaca_template == "example" else ALPACA_PROMPT
    prompt = (prompts["with_input"] if inp.strip() else prompts["without_input"]).format(instruction=instruction,
                                                                                          input=inp)
    ids, mask = tokenize_with_spans(tok, prompt + output, [(len(prompt), len(prompt) + len(output))],
                                    add_special_tokens=True, max_length=args.max_length)
    return with_eos(tok, where, ids, mask, args)


def chat_sample(tok, where, record, args):
    if not tok.chat_template:
        raise DataError(f"{where}: a chat sample, but the tokenizer has no chat template (neither in "
                        f"tokenizer_config.json nor in chat_template.jinja)")
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{where}: 'messages' must be a non-empty list of {{role, content}} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise DataError(f"{where}: message {i} must have 'role' and 'content'")
        if not isinstance(m["role"], str):
            raise DataError(f"{where}: message {i}: 'role' must be a string, got {type(m['role']).__name__}")
        if m["content"] is None:  # as a null Alpaca field: empty
            messages[i] = m = dict(m, content="")
        if not isinstance(m["content"], str):
            raise DataError(f"{where}: message {i} ({m['role']}): 'content' must be a string, got "
                            f"{type(m['content']).__name__}")
    render = lambda msgs, gen=False: tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
    text = render(messages)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] not in args.train_roles:
            continue
        if m["role"] == "assistant" and not str(m["content"]).strip():
            raise EmptyResponse(f"{where}: message {i} (assistant) is empty")
        # The template must render a conversation as the prefix of its continuation; the text
        # message i adds is what lies between the two renderings (its header excluded for the
        # assistant: the generation prompt).
        before = render(messages[:i], gen=m["role"] == "assistant") if i else ""
        upto = render(messages[:i + 1])
        if not text.startswith(upto) or not upto.startswith(before):
            raise DataError(f"{where}: the chat template does not render message {i} as a continuation of the ones "
                            f"before it; the trained span cannot be located")
        end = len(upto)
        while end > len(before) and upto[end - 1].isspace():  # the turn ends at its end token, not the newline
            end -= 1
        spans.append((len(before), end))
    # The template writes any BOS and each turn's end token itself: nothing added on top, neither
    # the tokenizer's special tokens nor --eos (as apply_chat_template and TRL's SFT do).
    return tokenize_with_spans(tok, text, spans, add_special_tokens=False, max_length=args.max_length)


def text_sample(tok, where, record, args):
    text = field(where, record, "text", allow_empty=False)
    ids, _ = encode(tok, text, True, args.max_length)
    return with_eos(tok, where, ids, [1] * len(ids), args)


def with_eos(tok, where, ids, mask, args):
    """--eos: the tokenizer's EOS after an Alpaca or text sample, supervised when the sample is.
    Chat samples end where their template ends them and never get one."""
    if args.eos:
        if tok.eos_token_id is None:
            raise DataError(f"{where}: --eos, but the tokenizer has no EOS token; pass --no-eos")
        ids.append(tok.eos_token_id)
        mask.append(1 if any(mask) else 0)
    return ids, mask


SHAPES = {"alpaca": alpaca_sample, "chat": chat_sample, "text": text_sample}


# ---------------------------------------------------------------------------------------------
# Rows


class Counts:
    """What became of the records read: counts, and the first record of each kind skipped (one
    warning line per kind, however many there are)."""
    KINDS = {"dropped_long": "dropped as too long", "empty": "skipped as empty",
             "unsupervised": "skipped with no supervised token left"}

    def __init__(self):
        self.records = self.truncated = self.dropped_long = self.empty = self.unsupervised = 0
        self.first = {}

    def skip(self, kind, what):
        setattr(self, kind, getattr(self, kind) + 1)
        self.first.setdefault(kind, what)

    def summary(self):
        return (f"{self.records} records read; dropped {self.dropped_long} too long, {self.empty} empty, "
                f"{self.unsupervised} without a supervised token; {self.truncated} truncated")

    def warnings(self):
        return [f"{getattr(self, k)} {'record' if getattr(self, k) == 1 else 'records'} {self.KINDS[k]} (the first: "
                f"{what})" for k, what in self.first.items()]


def load_documents(tok, paths, args, counts):
    """Every sample of every file as (ids, mask), after EOS, truncation and drops."""
    docs = []
    for path in paths:
        for where, record in read_records(path):
            counts.records += 1
            shape = args.format if args.format != "auto" else detect_format(where, record)
            if not isinstance(record, dict):
                raise DataError(f"{where}: a record must be an object, got {type(record).__name__}")
            try:
                ids, mask = SHAPES[shape](tok, where, record, args)
            except EmptyResponse as e:
                counts.skip("empty", str(e))
                continue
            except InputError:
                raise
            except RecursionError:
                raise DataError(f"{where}: nested too deeply to render")
            except Exception as e:  # the chat template or the tokenizer failing on this record
                raise DataError(f"{where}: cannot be rendered or tokenized ({type(e).__name__}: {e})")
            if args.example_compatible:
                mask = [1] * len(ids)
            if len(ids) > args.max_length:
                if args.overflow == "drop":
                    counts.skip("dropped_long", f"{where} has more tokens than --max-length {args.max_length}")
                    continue
                counts.truncated += 1
                ids, mask = ids[:args.max_length], mask[:args.max_length]
            if not any(mask):
                counts.skip("unsupervised", f"{where} (after truncation to {args.max_length} tokens)")
                continue
            docs.append((ids, mask))
    return docs


def make_rows(docs, max_length, pack):
    """Rows of documents, one per row with --pad. Packed: best-fit decreasing (TRL's "bfd"): the
    documents longest first, each into the fullest row it fits, a new row when none has room; so
    no two rows could be one. In a row the documents keep their order, and rows are ordered by
    their first document (the input order with --no-shuffle)."""
    if not pack:
        return [[d] for d in docs]
    rows = []                # document indices per row
    with_space = {}          # room left -> rows with exactly that much room
    nonempty = 0             # bit s set while some row has s tokens of room
    for i in sorted(range(len(docs)), key=lambda i: -len(docs[i][0])):  # stable: ties in order
        n = len(docs[i][0])
        fits = nonempty >> n
        if fits:
            room = n + (fits & -fits).bit_length() - 1  # the least room >= n: the fullest row that fits
            r = with_space[room].pop()
            if not with_space[room]:
                nonempty &= ~(1 << room)
        else:
            r, room = len(rows), max_length
            rows.append([])
        rows[r].append(i)
        with_space.setdefault(room - n, []).append(r)
        nonempty |= 1 << (room - n)
    for row in rows:
        row.sort()
    rows.sort(key=lambda row: row[0])
    return [[docs[i] for i in row] for row in rows]


def write_split(group, rows, max_length, pad_id, supervise_padding):
    n = len(rows)
    tokens = np.full((n, max_length), pad_id, dtype=np.int32)
    mask = np.zeros((n, max_length), dtype=np.uint8)
    doc_counts = np.zeros(n, dtype=np.int32)
    padding_start = np.zeros(n, dtype=np.int32)
    doc_lengths = []
    for r, docs in enumerate(rows):
        at = 0
        for ids, m in docs:
            tokens[r, at:at + len(ids)] = ids
            mask[r, at:at + len(ids)] = m
            at += len(ids)
            doc_lengths.append(len(ids))
        doc_counts[r] = len(docs)
        padding_start[r] = at  # attention hides the keys from here on (transformers' attention_mask 0)
        if supervise_padding:  # the public example: labels = input ids, padding included, one document
            mask[r, :] = 1
            doc_lengths[-1] += max_length - at
    group.create_dataset("tokens", data=tokens)
    group.create_dataset("loss_mask", data=mask)
    group.create_dataset("row_documents", data=doc_counts)
    group.create_dataset("document_lengths", data=np.asarray(doc_lengths, dtype=np.int32))
    group.create_dataset("padding_start", data=padding_start)
    group.attrs["padding_fraction"] = 1.0 - sum(len(ids) for docs in rows for ids, _ in docs) / max(1, n * max_length)
    real = sum(len(ids) for docs in rows for ids, _ in docs)
    # A label is a token predicted from the one before it in its document: a document's first
    # token is never one.
    supervised, at = 0, 0
    for r, docs in enumerate(rows):
        starts = np.cumsum([0] + doc_lengths[at:at + len(docs)])[:-1]
        at += len(docs)
        supervised += int(mask[r].sum()) - int(mask[r, starts].sum())
    return {"rows": n, "documents": len(doc_lengths), "tokens": real, "supervised_tokens": supervised,
            "padding_fraction": float(group.attrs["padding_fraction"])}


def tokenizer_identity(model_dir, tok):
    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.exists(path):
        raise DataError(f"{model_dir}: no tokenizer.json (so_train identifies a tokenizer by that file)")
    with open(path, "rb") as f:
        data = f.read()
    return {"tokenizer_sha256": hashlib.sha256(data).hexdigest(), "tokenizer_crc32c": crc32c(data),
            "vocab_size": len(tok), "eos_token_id": -1 if tok.eos_token_id is None else tok.eos_token_id,
            "pad_token_id": -1 if tok.pad_token_id is None else tok.pad_token_id,
            "bos_token_id": -1 if tok.bos_token_id is None else tok.bos_token_id}


def crc32c(data):
    """CRC32C (Castagnoli), as so_train's so::crc32c computes it."""
    table = crc32c.table
    if table is None:
        table = crc32c.table = [0] * 256
        for i in range(256):
            c = i
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
            table[i] = c
    crc = 0xFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


crc32c.table = None


# A row holds at most this many tokens (so_train's positions are 32-bit).
MAX_ROW_TOKENS = 2**31 - 1


def parse_args(argv):
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", required=True, help="the model's directory (its tokenizer files)")
    p.add_argument("--input", required=True, action="append", help="JSON/JSONL/Parquet/Arrow file or "
                   "datasets.save_to_disk directory; repeatable")
    p.add_argument("--format", choices=["auto", "alpaca", "chat", "text"], default="auto")
    p.add_argument("--out", required=True, help="the HDF5 file to write")
    p.add_argument("--max-length", type=int, default=4096, help="tokens per row")
    p.add_argument("--overflow", choices=["truncate", "drop"], default="truncate",
                   help="what happens to a sample longer than --max-length (counted either way)")
    p.add_argument("--eos", action=argparse.BooleanOptionalAction, default=True,
                   help="append the tokenizer's EOS to every Alpaca and text sample (supervised when the sample is); "
                   "chat samples end as their template ends them")
    p.add_argument("--train-roles", default="assistant", help="chat roles whose messages are trained on, "
                   "comma-separated")
    p.add_argument("--alpaca-template", choices=["alpaca", "example", "chat"], default="alpaca",
                   help="alpaca: Stanford Alpaca's prompt; example: the public SuperOffload example's; chat: "
                   "rendered as a user/assistant conversation by the tokenizer's chat template")
    packing = p.add_mutually_exclusive_group()
    packing.add_argument("--pack", dest="pack", action="store_true", default=True,
                         help="several documents per row (best-fit decreasing), attention kept within each "
                         "(default)")
    packing.add_argument("--pad", dest="pack", action="store_false", help="one document per row, padded")
    p.add_argument("--validation-fraction", type=float, default=0.0, help="share of samples held out")
    p.add_argument("--validation-file", action="append", default=[], help="validation data instead of a fraction")
    p.add_argument("--seed", type=int, default=1234, help="order of the samples and the validation split")
    p.add_argument("--shuffle", action=argparse.BooleanOptionalAction, default=True,
                   help="shuffle the samples (seeded) before the validation split and packing; --no-shuffle keeps "
                   "the input order (rows in the order of their first document)")
    p.add_argument("--example-compatible", action="store_true",
                   help="reproduce the public SuperOffload example: its Alpaca template, no EOS, every row padded "
                   "to --max-length, every token (prompt and padding) trained on")
    args = p.parse_args(argv)
    args.train_roles = [r for r in args.train_roles.split(",") if r]
    if args.example_compatible:
        args.alpaca_template, args.eos, args.pack = "example", False, False
    if not 2 <= args.max_length <= MAX_ROW_TOKENS:
        p.error(f"--max-length is {args.max_length}; a row holds 2 to {MAX_ROW_TOKENS} tokens")
    if not 0.0 <= args.validation_fraction < 1.0:
        p.error("--validation-fraction must lie in [0, 1)")
    if args.validation_fraction and args.validation_file:
        p.error("--validation-fraction and --validation-file exclude each other")
    return args


def files_read(args):
    """Every file this run reads, each with what it is to the run: the inputs (a directory's files
    too), the validation files and the model directory's files (tokenizer.json and the rest)."""
    named = [("--input", p) for p in args.input] + [("--validation-file", p) for p in args.validation_file]
    for role, d in named + [("--model-dir", args.model_dir)]:
        if os.path.isdir(d):
            named += [(f"{role} {d}: its file", os.path.join(d, f)) for f in sorted(os.listdir(d))]
    return [(role, p) for role, p in named if os.path.isfile(p)]


def check_output(args):
    """--out must be a file this run can write, and none of the files it reads (compared by the
    file itself, not its name: sub/../x, a hard link and a symbolic link are the same file)."""
    out = args.out
    if os.path.isdir(out):
        raise DataError(f"--out {out}: is a directory; name the HDF5 file to write")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise DataError(f"--out {out}: its directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DataError(f"--out {out}: its directory {parent} is not writable")
    if os.path.exists(out):
        for role, path in files_read(args):
            if os.path.samefile(out, path):
                raise DataError(f"--out {out} is the same file as {role} {path}, which this run reads: writing it would "
                                f"destroy that file; name another output")


def load_tokenizer(model_dir, args):
    import transformers
    transformers.logging.set_verbosity_error()  # its notes (long sequences, ...) are not this tool's output
    if not os.path.isdir(model_dir):
        raise DataError(f"--model-dir {model_dir}: not a directory")
    if not os.path.isfile(os.path.join(model_dir, "tokenizer.json")):
        raise DataError(f"--model-dir {model_dir}: no tokenizer.json (the model's tokenizer, which so_train identifies "
                        f"the data's token ids by)")
    try:
        tok = transformers.AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except Exception as e:  # a damaged tokenizer.json or tokenizer_config.json, an unknown tokenizer class, ...
        raise DataError(f"--model-dir {model_dir}: its tokenizer cannot be loaded ({type(e).__name__}: {e})")
    if not tok.is_fast:
        raise DataError(f"{model_dir}: the tokenizer is not a fast (tokenizers) one; token offsets are needed")
    needs_template = args.format == "chat" or (args.format in ("alpaca", "auto") and args.alpaca_template == "chat")
    if needs_template and not tok.chat_template:
        raise DataError(f"{model_dir}: the tokenizer has no chat template (neither in tokenizer_config.json nor in "
                        f"chat_template.jinja); chat data cannot be rendered")
    return tok


def check_memory(rows, max_length):
    """The rows of a split are built in memory (int32 tokens and a uint8 mask): refused when they
    would not fit in half of this machine's memory."""
    need = rows * max_length * 5
    have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if need > have // 2:
        raise DataError(f"{rows} rows of --max-length {max_length} tokens need {need / 2**30:.1f} GiB, more than half "
                        f"this machine's {have / 2**30:.1f} GiB: lower --max-length (or pack)")


def write_file(path, args, docs, val_docs, tok):
    """The prepared file at path; the statistics of its splits."""
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    pad_id = 0 if pad_id is None else pad_id
    identity = tokenizer_identity(args.model_dir, tok)
    options = {k: v for k, v in vars(args).items() if k not in ("out",)}
    with h5py.File(path, "w") as f:
        f.attrs["format"] = "so_train prepared data"
        f.attrs["format_version"] = FORMAT_VERSION
        f.attrs["options"] = json.dumps(options, sort_keys=True)
        f.attrs["model_dir"] = os.path.abspath(args.model_dir)
        for k, v in identity.items():
            f.attrs[k] = v
        stats = {}
        for split, split_docs in (("train", docs), ("validation", val_docs)):
            if split_docs:
                rows = make_rows(split_docs, args.max_length, args.pack)
                check_memory(len(rows), args.max_length)
                stats[split] = write_split(f.create_group(split), rows, args.max_length, pad_id, args.example_compatible)
    return stats


def main(argv):
    args = parse_args(argv)
    check_output(args)
    tok = load_tokenizer(args.model_dir, args)
    counts, val_counts = Counts(), Counts()
    docs = load_documents(tok, args.input, args, counts)
    if args.shuffle:
        random.Random(args.seed).shuffle(docs)
    if args.validation_file:
        val_docs = load_documents(tok, args.validation_file, args, val_counts)
    else:  # the last samples (of the shuffled order, or the input's with --no-shuffle)
        n_val = int(round(len(docs) * args.validation_fraction))
        docs, val_docs = docs[:len(docs) - n_val], docs[len(docs) - n_val:]
    if not docs:
        raise DataError(f"no training sample left: {counts.records} records read, {counts.empty} empty, "
                        f"{counts.dropped_long} too long, {counts.unsupervised} with no supervised token")
    # A fresh temporary name beside the output (never an existing file), renamed over it when complete.
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(args.out)), prefix=os.path.basename(args.out) + ".",
                               suffix=".tmp")
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # as a file the user created (mkstemp's is private)
    try:
        stats = write_file(tmp, args, docs, val_docs, tok)
        os.replace(tmp, args.out)
    except OSError as e:  # a full disk, a vanished directory
        raise DataError(f"--out {args.out}: writing it failed ({e.strerror or e})")
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    for w in counts.warnings() + [f"--validation-file: {w}" for w in val_counts.warnings()]:
        print(f"warning: {w}", file=sys.stderr)
    print(f"prepared {args.out}: {counts.summary()}")
    if args.validation_file:
        print(f"  --validation-file: {val_counts.summary()}")
    for split, s in stats.items():
        print(f"  {split}: {s['rows']} rows of {args.max_length}, {s['documents']} documents, {s['tokens']} tokens, "
              f"{s['supervised_tokens']} supervised, padding {100 * s['padding_fraction']:.1f}%")
    return 0


def cli(argv):
    """main as a command: whatever goes wrong ends in one line on stderr (the file, the record and
    the problem) and exit status 1, never a traceback."""
    return run_as_command("prepare_data", main, argv)


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
