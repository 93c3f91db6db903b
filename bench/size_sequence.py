"""A size that changes every step: compiles, compile seconds and step times per `dynamic` mode.

    python -m bench.size_sequence [--steps 40]

Two graphs: the issue's `(y.sin() * y).sum()` on `y` of shape `(n, 3)`, and a small
language-model-like step (Linear-GELU-Linear on `(2, n, 64)`, a new sequence length `n`
every step). Sizes: the issue's sequence 10, 100, 10, 37, 64, 100, 50, 51, 52, 53, then
`--steps` more drawn from 8..128 (fixed seed). Each mode runs in its own process (fresh
caches, disk cache off). Printed per graph and mode: compiles, fallbacks, the seconds
camlir spent compiling (`camlir.explain()`), the total backward wall time, and the median
backward time over the last half of the steps (when compiling is over), next to eager's.
Gradients are checked against eager at every step.
"""

import argparse
import json
import os
import subprocess
import sys

_CHILD = r"""
import json, random, statistics, sys, time
import torch
import camlir, camlir.api

mode = {"None": None, "True": True, "False": False}[sys.argv[2]]
graph, steps = sys.argv[1], int(sys.argv[3])
torch.set_num_threads(1)
rng = random.Random(0)
sizes = [10, 100, 10, 37, 64, 100, 50, 51, 52, 53] + [rng.randint(8, 128) for _ in range(steps)]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))

def loss_of(n):
    torch.manual_seed(n)
    if graph == "sin":
        y = torch.randn(n, 3, requires_grad=True)
        return (y.sin() * y).sum(), [y]
    x = torch.randn(2, n, 64)
    return model(x).pow(2).mean(), list(model.parameters())

times, eager_times = [], []
for n in sizes:
    loss, leaves = loss_of(n)
    start = time.perf_counter(); loss.backward(); eager_times.append(time.perf_counter() - start)
    expected = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    loss, leaves = loss_of(n)
    start = time.perf_counter()
    with camlir.enable(dynamic=mode):
        loss.backward()
    times.append(time.perf_counter() - start)
    for t, e in zip(leaves, expected):
        torch.testing.assert_close(t.grad, e, rtol=1e-4, atol=1e-5)
    for t in leaves:
        t.grad = None
half = len(sizes) // 2
print(json.dumps({
    "compiles": camlir.counters["compiles"], "fallbacks": camlir.counters["fallbacks"],
    "compile_s": sum(e.seconds for e in camlir.explain(kind="compile")),
    "total_s": sum(times), "median_ms": 1e3 * statistics.median(times[half:]),
    "eager_median_ms": 1e3 * statistics.median(eager_times[half:]), "steps": len(sizes)}))
"""


def main(argv=None) -> list:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args(argv)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, CAMLIR_DISK_CACHE="0")
    rows = []
    print("| graph | dynamic | steps | compiles | fallbacks | compile s | backward s, all steps | "
          "median backward ms (2nd half) | eager median ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for graph in ("sin", "lm"):
        for mode in ("None", "True", "False"):
            done = subprocess.run([sys.executable, "-c", _CHILD, graph, mode, str(args.steps)], cwd=root,
                                  env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(done.stderr[-3000:])
            r = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append(dict(r, graph=graph, mode=mode))
            print(f"| {graph} | {mode} | {r['steps']} | {r['compiles']} | {r['fallbacks']} | {r['compile_s']:.2f} "
                  f"| {r['total_s']:.2f} | {r['median_ms']:.3f} | {r['eager_median_ms']:.3f} |", flush=True)
    return rows


if __name__ == "__main__":
    main()
