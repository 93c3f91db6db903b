#!/usr/bin/env bash
# Builds camlir's wheel, installs it (not editable) into a clean virtual environment outside
# the source tree, and checks from there that ca-opt and compile_backward work. The editable
# install the other tests use reads the checkout, so it hides subpackages or data files that
# the wheel leaves out; this does not.
#
# The wheel is built from a copy of the checkout's files (tracked, and untracked but not
# ignored): setuptools stages builds in build/lib and never clears it, so building in the
# checkout can ship files left there by an earlier build and pass when the wheel is broken.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC="$PWD"
PY="$SRC/.venv/bin/python"
BASE_PY="${PYTHON:-python3.11}"
if [ ! -x "$PY" ]; then
  echo "check_wheel: error: $PY not found (run bash tools/setup.sh first)" >&2
  exit 1
fi

tmp="$(mktemp -d "${TMPDIR:-/tmp}/camlir-wheel.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
tmp="$(cd "$tmp" && pwd -P)"
case "$tmp/" in
  "$(pwd -P)"/*) echo "check_wheel: error: temp dir $tmp is inside the source tree" >&2; exit 1 ;;
esac
mkdir "$tmp/src" "$tmp/dist" "$tmp/run"

echo "== wheel: build (pip wheel from a copy of the checkout)"
start=$SECONDS
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
    if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\0' "$f"; fi  # skip deleted, not yet staged
  done | tar --null -T - -cf - | tar -xf - -C "$tmp/src"
else
  tar --exclude=./.git --exclude=./.venv --exclude=./build --exclude='*.egg-info' \
      --exclude=__pycache__ -cf - . | tar -xf - -C "$tmp/src"
fi
(cd "$tmp/src" && "$PY" -m pip wheel --quiet --no-deps -w "$tmp/dist" .)
wheel=("$tmp"/dist/camlir-*.whl)
[ -f "${wheel[0]}" ] || { echo "check_wheel: error: no wheel built" >&2; exit 1; }
echo "built $(basename "${wheel[0]}") in $((SECONDS - start)) s"

echo "== wheel: it holds every file of python/camlir, dialects and passes"
"$PY" - "$tmp/src" "${wheel[0]}" <<'EOF'
import os, sys, zipfile
src, wheel = sys.argv[1:]
roots = {"python/camlir": "camlir", "dialects": "camlir/dialects", "passes": "camlir/passes"}
want = set()
for root, dest in roots.items():
    for dirpath, dirnames, filenames in os.walk(os.path.join(src, root)):
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.startswith(".")]
        rel = os.path.relpath(dirpath, os.path.join(src, root))
        for name in filenames:
            if not name.startswith(".") and not name.endswith((".pyc", ".pyo")):
                want.add(os.path.normpath(os.path.join(dest, rel, name)).replace(os.sep, "/"))
have = {n for n in zipfile.ZipFile(wheel).namelist() if not n.split("/")[0].endswith(".dist-info")}
missing, extra = sorted(want - have), sorted(have - want)
for name in missing:
    print(f"missing from the wheel: {name}", file=sys.stderr)
for name in extra:
    print(f"in the wheel but not in the source: {name}", file=sys.stderr)
if missing or extra:
    sys.exit(1)
print(f"{len(have)} files, as in the source")
EOF

echo "== wheel: install into a clean venv ($BASE_PY -m venv, pip install <wheel>)"
start=$SECONDS
"$BASE_PY" -m venv "$tmp/venv"
env -u PYTHONPATH "$tmp/venv/bin/python" -m pip install --quiet --disable-pip-version-check "${wheel[0]}"
echo "installed in $((SECONDS - start)) s"

cd "$tmp/run"  # outside the source tree: the checkout cannot shadow the install

echo "== wheel: ca-opt --list-passes"
passes="$(env -u PYTHONPATH "$tmp/venv/bin/ca-opt" --list-passes)"
if ! grep -q -w -e 'ca-outline-kernels' <<<"$passes"; then
  echo "$passes" >&2
  echo "check_wheel: error: ca-opt --list-passes does not list ca-outline-kernels" >&2
  exit 1
fi
echo "ok: lists ca-outline-kernels"

echo "== wheel: compile_backward (cpu backend) matches eager PyTorch; a second process loads it from disk"
cat > "$tmp/step.py" <<'EOF'
import os, sys
import torch
import camlir

venv = os.path.realpath(sys.argv[1])
where = os.path.realpath(camlir.__file__)
assert where.startswith(venv + os.sep), f"camlir imported from {where}, not from the clean venv {venv}"
assert camlir.config.backend == "cpu", camlir.config.backend

torch.manual_seed(0)
model = torch.nn.Linear(4, 3)
x = torch.randn(5, 4)
reference = torch.nn.Linear(4, 3)
reference.load_state_dict(model.state_dict())

reference(x).tanh().sum().backward()
camlir.compile_backward(model(x).tanh().sum(), fullgraph=True)

for name, p in model.named_parameters():
    torch.testing.assert_close(p.grad, dict(reference.named_parameters())[name].grad)
counters = dict(camlir.counters)
if sys.argv[2] == "cold":
    assert counters["compiles"] >= 1 and counters["disk_cache_hits"] == 0, counters
else:  # the same step in a new process: everything from the disk cache
    assert counters["compiles"] == 0 and counters["disk_cache_hits"] >= 1, counters
assert camlir.counters.get("fallbacks", 0) == 0, counters
assert camlir.counters.get("interpreted", 0) == 0, counters
print(f"ok ({sys.argv[2]}): camlir from {where}; grads match eager; counters {counters}")
EOF
for run in cold from-disk; do
  env -u PYTHONPATH CAMLIR_DISK_CACHE=1 CAMLIR_CACHE_DIR="$tmp/cache" "$tmp/venv/bin/python" -I "$tmp/step.py" "$tmp/venv" "$run"
done
