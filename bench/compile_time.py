"""First-backward time per bench workload, with LLVM's codegen in worker processes or not.

    python -m bench.compile_time [--workloads T5,MobileNetV3] [--rounds 3] [--workers 0,default]

Each measurement is a fresh process (the disk cache off, 1 thread) that builds the workload,
runs its forward, and times its first `backward()` under camlir: capture, re-trace, every
stage and LLVM, then the backward itself. `--workers` lists the `CAMLIR_JIT_WORKERS` values
to compare ("default": unset, one worker per further core). Rounds interleave the variants
(this machine is shared and noisy); printed: each time, and per workload and variant the
median, with the ratio to the first variant. The gradients are checked against eager.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

_CHILD = r"""
import json, sys, time
import torch
import camlir
from bench import workloads

torch.set_num_threads(1)
w = workloads.build(sys.argv[1])
loss = w.forward(w.model, w.inputs)
loss.backward()
expected = [p.grad.clone() for p in w.model.parameters() if p.grad is not None]
w.model.zero_grad(set_to_none=True)
loss = w.forward(w.model, w.inputs)
start = time.perf_counter()
with camlir.enable(backend="cpu"):
    loss.backward()
seconds = time.perf_counter() - start
got = [p.grad for p in w.model.parameters() if p.grad is not None]
assert len(got) == len(expected)
for g, e in zip(got, expected):
    torch.testing.assert_close(g, e, rtol=1e-3, atol=1e-4)
print(json.dumps({"seconds": seconds, "compiles": camlir.counters["compiles"]}))
"""


def _one(workload: str, workers: str) -> dict:
    env = dict(os.environ, CAMLIR_DISK_CACHE="0")
    env.pop("CAMLIR_JIT_WORKERS", None)
    if workers != "default":
        env["CAMLIR_JIT_WORKERS"] = workers
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-c", _CHILD, workload], env=env, capture_output=True, text=True,
                          timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{workload} (workers {workers}) failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="T5,MobileNetV3")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", default="0,default", help="CAMLIR_JIT_WORKERS values to compare")
    args = parser.parse_args(argv)
    variants = args.workers.split(",")
    times: dict = {}
    for r in range(args.rounds):
        for workload in args.workloads.split(","):
            for workers in variants:
                result = _one(workload, workers)
                times.setdefault((workload, workers), []).append(result["seconds"])
                print(f"round {r + 1}: {workload} workers={workers}: first backward {result['seconds']:.2f} s",
                      flush=True)
    print("\n| workload | CAMLIR_JIT_WORKERS | first backward s (median) | ratio | each |")
    print("|---|---|---|---|---|")
    for workload in args.workloads.split(","):
        base = statistics.median(times[(workload, variants[0])])
        for workers in variants:
            t = times[(workload, workers)]
            print(f"| {workload} | {workers} | {statistics.median(t):.2f} | {statistics.median(t) / base:.2f}x | "
                  f"{', '.join(f'{s:.2f}' for s in t)} |")
    return times


if __name__ == "__main__":
    main()
