"""Where a fixture generator writes: the path from --out (by default the committed fixture under
tests/reference/fixtures/), created as an HDF5 file stamped with the versions of the libraries that
computed it, so that a changed number can be traced to a changed library."""
import argparse

import h5py
import torch


def fixture_out(doc, name):
    """The --out argument of a generator whose module docstring is `doc`; by default fixtures/`name`."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", default=f"tests/reference/fixtures/{name}")
    return ap.parse_args().out


def create_fixture(path, *libraries):
    """`path` opened as a new HDF5 file with attrs torch_version and <library>_version for each of
    `libraries` (modules, e.g. transformers)."""
    f = h5py.File(path, "w")
    for lib in (torch,) + libraries:
        f.attrs[f"{lib.__name__}_version"] = str(lib.__version__)
    return f
