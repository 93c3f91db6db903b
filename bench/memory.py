"""Where camlir's memory goes: resident memory after each step of one workload's first backward.

    python -m bench.memory [--workload MobileNetV3]

One fresh process, 1 thread, the disk cache off. Printed after each step: resident memory
now and the peak so far (MB), and how many Python modules are loaded. The steps: import
torch, build the workload, an eager forward and backward, import camlir, import
torch-mlir's bindings, camlir's first backward (capture, compile, run), three more.
"""

import argparse
import os
import subprocess
import sys

_CHILD = r"""
import os, resource, sys
def report(step):
    now = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"| {step} | {now:.0f} | {peak:.0f} | {len(sys.modules)} |", flush=True)
print("| step | resident MB | peak MB | Python modules |")
print("|---|---|---|---|")
import torch
report("import torch")
from bench import workloads
torch.set_num_threads(1)
w = workloads.build(sys.argv[1])
report("build " + sys.argv[1])
w.forward(w.model, w.inputs).backward()
report("eager forward + backward")
import camlir
report("import camlir")
import torch_mlir.ir
report("import torch_mlir")
loss = w.forward(w.model, w.inputs)
with camlir.enable(backend="cpu", wait=True):
    loss.backward()
report("camlir's first backward")
for _ in range(3):
    loss = w.forward(w.model, w.inputs)
    with camlir.enable(backend="cpu", wait=True):
        loss.backward()
report("three more")
"""


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="MobileNetV3")
    args = parser.parse_args(argv)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, CAMLIR_DISK_CACHE="0", PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", _CHILD, args.workload], env=env, capture_output=True, text=True,
                          timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{args.workload} failed: {done.stderr[-2000:]}")
    table = "\n".join(line for line in done.stdout.splitlines() if line.startswith("|"))
    print(table)
    return table


if __name__ == "__main__":
    main()
