#!/usr/bin/env bash
# The project's Python environment: one virtual environment, made from scripts/requirements.txt.
#   python_env.sh path     prints its directory: $SO_PYTHON_ENV, else ~/.cache/so_train/python
#                          (CMake reads the default from here; nothing else guesses it)
#   python_env.sh ensure   makes it, or brings it to the pinned requirements; fast when it is
#                          already there (a stamp holds the hash of what it was made from)
# The environment's interpreter is the one every test, tool and sweep script runs with; a user
# with an environment of their own points the build at it with cmake -DSO_PYTHON=/path/bin/python.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
env_dir=${SO_PYTHON_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/so_train/python}
# Debian's interpreter (python3-venv), never whichever python3 comes first on PATH.
base=${SO_PYTHON_BASE:-/usr/bin/python3}
requirements=$here/requirements.txt

case "${1:-}" in
  path) echo "$env_dir" ;;
  ensure)
    [ -x "$base" ] || { echo "python_env: base interpreter '$base' not found (Debian: python3, python3-venv)" >&2; exit 1; }
    stamp="$env_dir/.so_train-requirements"
    want="$(sha256sum "$requirements" | cut -d' ' -f1) $("$base" -c 'import sys; print(sys.version.split()[0])')"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$env_dir/bin/python" -c '' 2>/dev/null; then
      echo "python_env: $env_dir is up to date"
      exit 0
    fi
    start=$(date +%s)
    if ! "$env_dir/bin/python" -c '' 2>/dev/null; then
      echo "python_env: creating $env_dir from $base"
      rm -rf "$env_dir"
      mkdir -p "$(dirname "$env_dir")"
      "$base" -m venv "$env_dir"
    fi
    echo "python_env: installing $requirements into $env_dir"
    "$env_dir/bin/python" -m pip install --disable-pip-version-check --no-input -q -r "$requirements"
    echo "$want" > "$stamp"
    echo "python_env: ready in $(( $(date +%s) - start )) s"
    ;;
  *) echo "usage: $0 path|ensure" >&2; exit 2 ;;
esac
