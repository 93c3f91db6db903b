# RUN: %python %s %t | FileCheck %s
# Every stage of a cpu compile written to CAMLIR_DUMP_DIR is a starting point for ca-opt:
# each MLIR file parses and verifies on its own, and each stage that is a pass pipeline is
# replayed from the previous file with the command its first line names, giving the same
# IR. (retrace is Python, not MLIR: its file is the one ca-opt cannot start from.)

import os
import pathlib
import re
import shutil
import subprocess
import sys

import torch

dump_dir = pathlib.Path(sys.argv[1])
shutil.rmtree(dump_dir, ignore_errors=True)
os.environ["CAMLIR_DUMP_DIR"] = str(dump_dir)
os.environ["CAMLIR_DISK_CACHE"] = "0"
import camlir  # noqa: E402

ca_opt = os.path.join(os.path.dirname(sys.executable), "ca-opt")
ca_opt = ca_opt if os.path.exists(ca_opt) else shutil.which("ca-opt")
made_by = re.compile(r"made by: ca-opt (\S+) --pass-pipeline='(.*)'$")

torch.manual_seed(0)
w = torch.randn(6, 3, requires_grad=True)
x = torch.randn(5, 3, requires_grad=True)  # saves w.t(), a strided input: the layouts stage runs
camlir.compile_backward((torch.nn.functional.gelu(x @ w.t()) * 0.5).sum(), fullgraph=True)

for path in sorted((dump_dir / "graph1").glob("*.mlir")):
    first, _, body = path.read_text().partition("\n")
    stage = path.stem.split("-", 1)[1]
    if first.startswith("#"):
        print(f"{stage}: python, not MLIR")
        continue
    parsed = subprocess.run([ca_opt, str(path)], capture_output=True, text=True)
    status = "starts" if parsed.returncode == 0 else f"does not parse: {parsed.stderr.strip()[:200]}"
    how = made_by.search(first)
    if how is not None:
        source, passes = how.groups()
        replay = subprocess.run([ca_opt, str(path.parent / source), f"--pass-pipeline={passes}"],
                                capture_output=True, text=True)
        same = replay.returncode == 0 and replay.stdout.strip() == body.strip()
        status += ", replays" if same else f", replay differs ({replay.stderr.strip()[:200]})"
    print(f"{stage}: {status}")

# CHECK: retrace: python, not MLIR
# CHECK-NEXT: import: starts
# CHECK-NEXT: trace-hooks: starts
# CHECK-NEXT: layouts: starts, replays
# CHECK-NEXT: kernels: starts, replays
# CHECK-NEXT: linalg: starts, replays
# CHECK-NEXT: split: starts
# CHECK-NEXT: same-code: starts
# CHECK-NEXT: math: starts, replays
# CHECK-NEXT: bufferize: starts, replays
# CHECK-NEXT: blas: starts, replays
# CHECK: loops: starts, replays
# CHECK-NEXT: llvm: starts, replays
# CHECK-NOT: differs
# CHECK-NOT: does not parse
