#!/usr/bin/env bash
# Sets everything up, then runs every test: the lit suites through CMake's check-ca target,
# the docs check, and pytest. Fails if any suite fails or runs no tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
PY="$PWD/.venv/bin/python"

echo "== docs are up to date with the op and pass descriptions"
"$PY" -m camlir.tools.gen_docs --check docs

echo "== wheel: non-editable install in a clean venv"
bash tools/check_wheel.sh

echo "== lit suites (cmake --build build --target check-ca)"
if command -v cmake >/dev/null 2>&1; then
  generator=()
  if command -v ninja >/dev/null 2>&1 && [ ! -f build/CMakeCache.txt ]; then generator=(-G Ninja); fi
  cmake -S . -B build "${generator[@]}" -DPython3_EXECUTABLE="$PY" >/dev/null
  cmake --build build --target check-ca
else
  echo "cmake not found: running lit directly"
  .venv/bin/lit -sv test
fi

echo "== pytest"
set +e
"$PY" -m pytest -q test/python "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$status"
