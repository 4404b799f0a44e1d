"""The project's Python environment has every package of scripts/requirements.txt at its pinned
version, and the modules the tests import load. Fails naming each package that is missing or at
another version (so a test that needs one never skips, nor fails later with a vaguer error).

usage: check_python_env.py REQUIREMENTS.txt"""
import importlib
import importlib.metadata
import sys

# What the tests and tools import, by module name (the first block of requirements.txt).
MODULES = ("h5py", "matplotlib", "numpy", "safetensors", "tensorboard", "tokenizers", "torch", "transformers", "wandb")

pins = {}
for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    if line:
        name, version = line.split("==")
        pins[name] = version
problems = []
for name, want in sorted(pins.items()):
    try:
        have = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        problems.append(f"{name}=={want} is not installed")
        continue
    if have.split("+")[0] != want:
        problems.append(f"{name} is {have}, requirements.txt pins {want}")
for module in MODULES:
    try:
        importlib.import_module(module)
    except Exception as e:  # an import that fails for any reason is the problem to report
        problems.append(f"import {module} failed: {type(e).__name__}: {e}")
print(f"python: {sys.executable} ({sys.version.split()[0]}), {len(pins)} pinned packages")
if problems:
    print("the project's Python environment is not the pinned one (scripts/install-deps.sh makes it):")
    print("\n".join("  " + p for p in problems))
    sys.exit(1)
print("python env ok")
