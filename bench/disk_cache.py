"""What the disk cache saves: a process's first backward, cold and from the disk cache.

    python -m bench.disk_cache [--workloads W2,Transformer] [--rounds 3]

Per workload and round, a fresh cache directory and two processes in turn, each running
the workload's first backward through camlir (imports and one eager backward done first,
so neither is charged to it): the first compiles and stores, the second should load.
Printed per workload (medians over rounds):
- first backward, wall time (PyTorch's compiled-autograd capture included: that part is
  PyTorch's and the same in both processes);
- camlir's own part: the compile seconds, or the disk-load seconds (`camlir.explain()`);
- the ratio of the second process's camlir part to the first's (the issue's target: 10%),
  and its compiles / disk_cache_hits counters.
Gradients are compared with eager in both processes.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

_CHILD = r"""
import json, sys, time
import torch
import camlir, camlir.api
from bench.workloads import build

w = build(sys.argv[1])
loss = w.forward(w.model, w.inputs)
loss.backward()  # eager: loads autograd, and gives the reference
expected = [p.grad.clone() for p in w.model.parameters()]
w.model.zero_grad(set_to_none=True)
loss = w.forward(w.model, w.inputs)
start = time.perf_counter()
with camlir.enable():
    loss.backward()
wall = time.perf_counter() - start
for p, e in zip(w.model.parameters(), expected):
    torch.testing.assert_close(p.grad, e, rtol=1e-4, atol=1e-5)
ours = sum(e.seconds for e in camlir.explain())
print(json.dumps({"wall": wall, "camlir": ours, "compiles": camlir.counters["compiles"],
                  "disk_cache_hits": camlir.counters["disk_cache_hits"]}))
"""


def _child(workload: str, directory: str) -> dict:
    env = dict(os.environ, CAMLIR_CACHE_DIR=directory, CAMLIR_DISK_CACHE="1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", _CHILD, workload], cwd=root, env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{workload} child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> list:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="W2,Transformer")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    rows = []
    for workload in args.workloads.split(","):
        cold, warm = [], []
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory(prefix="camlir-bench-cache-") as directory:
                cold.append(_child(workload, directory))
                warm.append(_child(workload, directory))
        med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
        row = {"workload": workload,
               "cold_wall_s": med(cold, "wall"), "warm_wall_s": med(warm, "wall"),
               "cold_camlir_s": med(cold, "camlir"), "warm_camlir_s": med(warm, "camlir"),
               "warm_compiles": max(r["compiles"] for r in warm),
               "warm_disk_hits": min(r["disk_cache_hits"] for r in warm)}
        row["camlir_ratio"] = row["warm_camlir_s"] / row["cold_camlir_s"]
        row["wall_ratio"] = row["warm_wall_s"] / row["cold_wall_s"]
        rows.append(row)
    print("| workload | first backward, cold | first backward, from disk | camlir's part, cold | "
          "camlir's part, from disk | ratio (camlir) | ratio (wall) | compiles / disk hits (2nd) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['workload']} | {r['cold_wall_s']:.3f} s | {r['warm_wall_s']:.3f} s | {r['cold_camlir_s']:.3f} s "
              f"| {r['warm_camlir_s']:.3f} s | {r['camlir_ratio']:.1%} | {r['wall_ratio']:.1%} "
              f"| {r['warm_compiles']} / {r['warm_disk_hits']} |")
    return rows


if __name__ == "__main__":
    main()
