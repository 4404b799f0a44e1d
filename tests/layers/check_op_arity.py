#!/usr/bin/env python3
"""No op of the backend interface takes more than MAX_PARAMS parameters (the stream included).

Reads the `class Ops` of include/so/backend/ops.h, prints every virtual method with its parameter
count, widest first, and fails, naming each offender, when one takes more: a wider op gets a typed
argument struct (Gemm, RmsNormShape, MoeSlots, ...) instead of a run of positional arguments.

usage: check_op_arity.py OPS_H
       check_op_arity.py --self-test
"""
import re
import sys
import tempfile

MAX_PARAMS = 8
VIRTUAL_RE = re.compile(r"\bvirtual\b[^;{]*?\b(\w+)\s*\(")


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def class_body(text, name):
    """The text between the braces of `class name {...};`."""
    m = re.search(r"\bclass\s+" + name + r"\b[^;{]*\{", text)
    if not m:
        raise ValueError(f"no class {name}")
    depth, i = 1, m.end()
    while depth:
        if i >= len(text):
            raise ValueError(f"class {name} is not closed")
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[m.end():i - 1]


def count_params(params):
    """Top-level commas of a parameter list: those inside <>, (), [] or {} (a template argument
    list, a default value) do not separate parameters."""
    params = params.strip()
    if params in ("", "void"):
        return 0
    depth, count = 0, 1
    for c in params:
        if c in "<([{":
            depth += 1
        elif c in ">)]}":
            depth -= 1
        elif c == "," and depth == 0:
            count += 1
    return count


def op_arities(text):
    """[(name, parameter count)] of every virtual method of class Ops (the destructor excluded)."""
    body = class_body(strip_comments(text), "Ops")
    ops = []
    for m in VIRTUAL_RE.finditer(body):
        depth, i = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(body[i], 0)
            i += 1
        if m.group(1) != "Ops":  # ~Ops
            ops.append((m.group(1), count_params(body[m.end():i - 1])))
    return ops


def check(path):
    with open(path) as f:
        ops = op_arities(f.read())
    if not ops:
        print(f"{path}: no virtual op found in class Ops", file=sys.stderr)
        return 1
    for name, n in sorted(ops, key=lambda o: (-o[1], o[0])):
        print(f"{n:3d}  {name}")
    wide = [(name, n) for name, n in ops if n > MAX_PARAMS]
    for name, n in wide:
        print(f"{path}: Ops::{name} takes {n} parameters, more than {MAX_PARAMS}: give it a typed argument struct",
              file=sys.stderr)
    if wide:
        return 1
    print(f"op arity ok: {len(ops)} ops, the widest {max(n for _, n in ops)} parameters (at most {MAX_PARAMS})")
    return 0


SELF_TEST_HEADER = """
struct Gemm { int a, b; };
class Stream;
class Ops {
 public:
  virtual ~Ops() = default;
  // virtual void commented(int a, int b, int c, int d, int e, int f, int g, int h, int i) = 0;
  virtual void narrow(Stream& s, const Gemm& g) = 0;
  virtual void templated(Stream& s, std::map<int, int> m, std::array<int, 3> a, float x = f(1, 2)) = 0;
  virtual std::string none() = 0;
  virtual void wide(Stream& s, void* a, const void* b, int64_t M, int64_t N, int64_t K,
                    float alpha, float beta, DType dt) = 0;
};
class Other {
  virtual void elsewhere(int a, int b, int c, int d, int e, int f, int g, int h, int i) = 0;
};
"""


def self_test():
    got = dict(op_arities(SELF_TEST_HEADER))
    want = {"narrow": 2, "templated": 4, "none": 0, "wide": 9}
    assert got == want, f"parsed {got}, expected {want}"
    with tempfile.NamedTemporaryFile("w", suffix=".h") as f:
        f.write(SELF_TEST_HEADER)
        f.flush()
        assert check(f.name) == 1, "a 9-parameter op passed"
        f.seek(0)
        f.truncate()
        f.write(SELF_TEST_HEADER.replace("float alpha, float beta, DType dt", "float alpha"))
        f.flush()
        assert check(f.name) == 0, "a header within the bound failed"
    with tempfile.NamedTemporaryFile("w", suffix=".h") as f:
        f.write("class Ops {\n public:\n  virtual ~Ops() = default;\n};\n")
        f.flush()
        assert check(f.name) == 1, "a class without ops passed"
    print("self-test ok")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(check(sys.argv[1]))
