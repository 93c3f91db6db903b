#!/usr/bin/env bash
# The GPU check (docs/gpu-backend.md, "Checking on a GPU"):
#   bash bench/gpu_check.sh build [OUT]   here: export the zoo's gpu backwards, expected grads, runner (no GPU needed)
#   bash bench/gpu_check.sh run [OUT]     on the GPU machine: run, check against eager CUDA, time, print one table
# OUT defaults to build/gpu_check (git-ignored: carry it to the GPU machine).
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-build}"
out="${2:-build/gpu_check}"
case "$mode" in
  build)
    py=python3
    [ -x .venv/bin/python ] && py=.venv/bin/python
    "$py" bench/gpu_check.py build "$out"
    ;;
  run)
    # Only torch and the pack's own files: camlir is not installed there.
    exec "${PYTHON:-python3}" "$out/gpu_check.py" run "$out"
    ;;
  *)
    echo "usage: bash bench/gpu_check.sh build|run [OUT]" >&2
    exit 2
    ;;
esac
