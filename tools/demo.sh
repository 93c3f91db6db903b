#!/usr/bin/env bash
# Sets everything up, then runs the main job: a small model trained with camlir's
# compiled backward (python -m camlir.demo).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec .venv/bin/python -m camlir.demo "$@"
