#!/usr/bin/env python3
"""No include runs up a layer (docs/architecture.md, "Layers").

The libraries and executables of src/, parallel/, launcher/ and bench/ stand in one order, lowest
first (LAYERS). The check reads the link graph CMake generated (targets, their sources and the
libraries each links) and fails, naming every offence, when
  - a target links a project library that is not below it in the order (or a target has no place
    in the order), or
  - a file of one target includes a project header of a target above it in the order (a header
    belongs to the target whose sources share its folder: include/so/X/ goes with src/X/).

usage: check_include_layers.py GRAPH.tsv SOURCE_DIR
       check_include_layers.py --self-test
GRAPH.tsv (tests/CMakeLists.txt writes it): one target a line, tab-separated: name, its source
directory, its sources ('|'-separated) and the libraries it links ('|'-separated).
"""
import os
import re
import sys
import tempfile

# Lowest first. A target may link, and its files include, only what stands before it.
LAYERS = [
    "so_core",        # errors, dtypes, JSON, RNG, units
    "so_optim",       # GraceAdam and the reference AdamW
    "so_io",          # HDF5, safetensors, direct I/O, CRC32C
    "so_data",        # token sources, samplers, prepared data, TokenBatch
    "so_backend",     # the backend interface, CPU and CUDA backends
    "so_parallel",    # communicators, process groups
    "so_model",       # HF configs, parameter layout, the decoder
    "so_engine",      # buffers, buckets, ZeRO, the offload pipeline
    "so_checkpoint",  # the checkpoint format, reader/writer, run saves
    "so_train_lib",   # run config, memory plan, the training loop, monitors
    "so_launch",      # topology, placement, binding
    "so_train",       # the executables
    "so_ckpt",
    "so_bench",
]
HEADER_EXTS = (".h", ".hpp", ".cuh")
SOURCE_EXTS = (".cpp", ".cc", ".cu") + HEADER_EXTS
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def read_graph(path, root):
    """{target: (sources as paths relative to root, [linked targets])}."""
    graph = {}
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            name, source_dir, sources, links = (line.rstrip("\n").split("\t") + ["", "", ""])[:4]
            files = []
            for s in filter(None, sources.split("|")):
                p = os.path.normpath(os.path.join(source_dir, s))
                rel = os.path.relpath(p, root)
                if not rel.startswith("..") and rel.endswith(SOURCE_EXTS):  # generated files lie elsewhere
                    files.append(rel)
            graph[name] = (files, [l for l in links.split("|") if l])
    return graph


class Owners:
    """Which target a file belongs to: its own sources, or for a header the target of the source with
    its name in its folder, else the target with most sources in that folder."""

    def __init__(self, graph):
        self.of_file, self.by_dir = {}, {}
        for target, (files, _) in graph.items():
            for f in files:
                self.of_file.setdefault(f, target)
                counts = self.by_dir.setdefault(os.path.dirname(f), {})
                counts[target] = counts.get(target, 0) + 1

    def __call__(self, path):
        if path in self.of_file:
            return self.of_file[path]
        folder, name = os.path.split(path)
        parts = folder.split(os.sep)
        if len(parts) >= 3 and parts[0] == "include" and parts[1] == "so":  # include/so/X -> src/X
            folder = os.path.join("src", *parts[2:])
        stem = os.path.splitext(name)[0]
        for ext in (".cpp", ".cu", ".cc"):
            if os.path.join(folder, stem + ext) in self.of_file:
                return self.of_file[os.path.join(folder, stem + ext)]
        # The target with most sources in the folder and its subfolders, or else in the nearest
        # folder above it that has sources, up to the second level (src/backend/cuda's headers
        # when this build leaves its sources out go with src/backend; nothing goes with all of src/).
        candidates = [folder]
        while folder.count(os.sep) >= 2:
            folder = os.path.dirname(folder)
            candidates.append(folder)
        for folder in candidates:
            counts = {}
            for d, c in self.by_dir.items():
                if d == folder or d.startswith(folder + os.sep):
                    for t, n in c.items():
                        counts[t] = counts.get(t, 0) + n
            if counts:
                return max(sorted(counts), key=lambda t: counts[t])
        return None


def resolve(root, including, name):
    for base in (os.path.dirname(including), "include", ""):
        rel = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(os.path.join(root, rel)):
            return rel
    return None  # a system or generated header


def check(graph, root, folders):
    problems = []
    order = {t: i for i, t in enumerate(LAYERS)}
    for target, (_, links) in sorted(graph.items()):
        if target not in order:
            problems.append(f"target {target} has no place in the layer order (LAYERS in {__file__})")
            continue
        for dep in links:
            if dep in graph and dep in order and order[dep] >= order[target]:
                problems.append(f"link up a layer: {target} links {dep}, which stands above it")
    owners = Owners(graph)
    files = {f for fs, _ in graph.values() for f in fs}
    for folder in folders:
        for d, _, names in os.walk(os.path.join(root, folder)):
            files.update(os.path.relpath(os.path.join(d, n), root) for n in names if n.endswith(HEADER_EXTS))
    for f in sorted(files):
        me = owners(f)
        if me is None:
            problems.append(f"{f}: no target owns it (no source of any target in its folder)")
            continue
        with open(os.path.join(root, f), errors="replace") as src:
            text = src.read()
        for m in INCLUDE_RE.finditer(text):
            header = resolve(root, f, m.group(1))
            if header is None:
                continue
            them = owners(header)
            if them is None or them not in order or me not in order or order[them] <= order[me]:
                continue
            line = text.count("\n", 0, m.start()) + 1
            problems.append(f"{f}:{line}: includes {m.group(1)} ({them}), which stands above {me}")
    return problems


def self_test():
    """The check finds an include up a layer and a link up a layer, and passes a clean tree."""
    with tempfile.TemporaryDirectory() as root:
        def write(rel, text=""):
            os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        write("include/so/core/error.h")
        write("src/core/error.cpp", '#include "so/core/error.h"\n')
        write("include/so/model/model.h", '#include "so/core/error.h"\n')
        write("src/model/model.cpp", '#include "so/model/model.h"\n')
        write("include/so/data/batch.h", '#include <vector>\n#include "so/core/error.h"\n')
        write("src/data/batch.cpp", '#include "so/data/batch.h"\n#include "private.h"\n')
        write("src/data/private.h")
        graph = {
            "so_core": (["src/core/error.cpp"], []),
            "so_data": (["src/data/batch.cpp"], ["so_core"]),
            "so_model": (["src/model/model.cpp"], ["so_core", "so_data"]),
        }
        folders = ["include", "src"]
        clean = check(graph, root, folders)
        assert clean == [], clean
        write("include/so/data/batch.h", '#include "so/model/model.h"\n')  # data -> model
        up = check(graph, root, folders)
        assert up == ["include/so/data/batch.h:1: includes so/model/model.h (so_model), which stands above so_data"], up
        write("include/so/data/batch.h", '#include <vector>\n#include "so/core/error.h"\n')
        graph["so_data"] = (["src/data/batch.cpp"], ["so_core", "so_model"])  # a link up, no include
        up = check(graph, root, folders)
        assert up == ["link up a layer: so_data links so_model, which stands above it"], up
        graph["so_data"] = (["src/data/batch.cpp"], ["so_core"])
        graph["so_extra"] = ([], [])
        assert any("so_extra has no place" in p for p in check(graph, root, folders))
        del graph["so_extra"]
        write("include/so/orphan/thing.h")
        assert "include/so/orphan/thing.h: no target owns it (no source of any target in its folder)" in \
            check(graph, root, folders)
    print("include layers self-test ok: an include up, a link up, an unplaced target and an unowned header "
          "are reported")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    root = os.path.abspath(argv[2])
    graph = read_graph(argv[1], root)
    problems = check(graph, root, ["include", "src", "parallel", "launcher", "bench"])
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} include(s) or link(s) run up a layer (order: {' < '.join(LAYERS)})")
        return 1
    files = sum(len(fs) for fs, _ in graph.values())
    print(f"include layers ok: {len(graph)} targets, {files} sources, order {' < '.join(LAYERS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
