#!/usr/bin/env bash
# Creates .venv (Python 3.11) and installs camlir with its pinned dependencies and test tools.
# Re-running is cheap: the install is skipped while pyproject.toml and setup.py are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && \
       "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      PY="$candidate"; break
    fi
  done
fi
if [ -z "$PY" ]; then
  echo "setup: error: camlir needs Python 3.11 (set PYTHON=/path/to/python3.11)" >&2
  exit 1
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $PY"
  "$PY" -m venv .venv
fi

stamp=".venv/.camlir-installed"
want="$(cat pyproject.toml setup.py | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing camlir and its pinned dependencies (torch==2.13.0, torch-mlir==20261001)"
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e '.[test]'
  echo "$want" > "$stamp"
fi
