"""A new graph's cost to the training process: first backward, time until the compiled
program serves, peak memory, and a warm second process's first backward.

    python -m bench.compile_time [--workloads Transformer,GPT2] [--rounds 3]
                                 [--modes eager,inprocess,service] [--warm]

Each measurement is a fresh process (1 thread, its own empty disk cache) that switches
camlir on (`camlir.enable()` entered before the model is built, as a training script
would), builds the workload, runs one eager backward (the reference gradients, and torch's
own warm-up), then trains: forward and backward, step after step, until a backward ran
camlir's compiled program (at most `--max-seconds`). Modes:

- `eager`: no camlir; the steps' peak RSS is the baseline;
- `ca_eager`: no camlir, PyTorch's compiled autograd replaying its captured graph op by op:
  its first backward is the capture's cost, its peak RSS what compiled autograd itself adds
  (the floors under camlir's figures);
- `inprocess`: `CAMLIR_COMPILE_WORKERS=0`, the compile in the training process (blocking,
  as before the compile service);
- `service`: the default, compiles in worker processes while the backwards run eagerly.

Printed per run: the first camlir backward (`first`, s), the time from its start until the
end of the first backward that ran the compiled program (`serves`, s), the training
process's peak RSS (MB) and the workers' (`children`, MB). `--warm` adds a second process
on the cache the previous one filled (`warm`, its first backward). Rounds interleave the
modes (the machine is shared and noisy); the table gives medians. Every backward's
gradients are checked against eager's.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

_CHILD = r"""
import json, resource, sys, time
import torch
mode = sys.argv[2]
ca_eager = mode == "ca_eager"
if ca_eager:  # PyTorch's compiled autograd, its graph replayed op by op: the capture's floor
    from torch._dynamo import compiled_autograd
    def replay(gm):
        return gm
    class scope:
        @staticmethod
        def __enter__():
            scope.ctx = compiled_autograd._enable(replay)
            scope.ctx.__enter__()
        @staticmethod
        def __exit__(*exc):
            scope.ctx.__exit__(*exc)
    mode = "eager_with_scope"
if mode not in ("eager", "eager_with_scope"):
    import camlir
    scope = camlir.enable(backend="cpu")
    scope.__enter__()  # camlir on from the start: a compile worker starts importing now
from bench import workloads

torch.set_num_threads(1)
w = workloads.build(sys.argv[1])
rtol, atol, atol_of_max = workloads.TOLERANCE.get(sys.argv[1], (1e-3, 1e-4, 0.0))
max_seconds = float(sys.argv[3])

camlir_on = mode not in ("eager", "eager_with_scope")

def step():
    w.model.zero_grad(set_to_none=True)
    loss = w.forward(w.model, w.inputs)
    before = camlir.counters["while_compiling"] if camlir_on else 0
    loss.backward()
    compiled = camlir_on and camlir.counters["while_compiling"] == before
    return [p.grad for p in w.model.parameters() if p.grad is not None], compiled

if camlir_on:
    scope.__exit__(None, None, None)  # the reference backward: the eager engine
start = time.perf_counter()
expected = [g.clone() for g in step()[0]]
eager_first = time.perf_counter() - start
if mode != "eager":
    scope.__enter__()
start = time.perf_counter()
got, compiled = step()
first = time.perf_counter() - start
serves, steps = None, 1
while True:
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=rtol, atol=max(atol, atol_of_max * float(e.abs().max())))
    if compiled:
        serves = time.perf_counter() - start
        break
    if not camlir_on or time.perf_counter() - start > max_seconds:
        break
    got, compiled = step()
    steps += 1
self_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
children_mb = 0.0  # the live workers' peaks (VmHWM): RUSAGE_CHILDREN counts only exited ones
if camlir_on:
    from camlir import compile_service
    service = compile_service.current()
    for pid in (service.workers() if service is not None else []):
        with open(f"/proc/{pid}/status") as f:
            children_mb += next(int(l.split()[1]) for l in f if l.startswith("VmHWM")) / 1024
counters = dict(camlir.counters) if camlir_on else {}
if camlir_on:
    from camlir import disk_cache
    disk_cache.flush()
print(json.dumps({"eager_first": eager_first, "first": first, "serves": serves, "steps": steps,
                  "rss_mb": self_mb, "children_mb": children_mb, "counters": counters}))
"""


def _one(workload: str, mode: str, cache_dir: str, max_seconds: float) -> dict:
    env = dict(os.environ, CAMLIR_DISK_CACHE="1", CAMLIR_CACHE_DIR=cache_dir, CAMLIR_GRAPH_CHOICE="0")
    env.pop("CAMLIR_COMPILE_WORKERS", None)
    if mode == "inprocess":
        env["CAMLIR_COMPILE_WORKERS"] = "0"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-c", _CHILD, workload, mode, str(max_seconds)], env=env,
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{workload} ({mode}) failed: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="Transformer,GPT2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="eager,ca_eager,inprocess,service")
    parser.add_argument("--warm", action="store_true", help="also a second process on the filled cache")
    parser.add_argument("--max-seconds", type=float, default=120.0)
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    rows: dict = {}
    for r in range(args.rounds):
        for workload in args.workloads.split(","):
            for mode in modes:
                with tempfile.TemporaryDirectory(prefix="camlir-bench-cache-") as cache:
                    result = _one(workload, mode, cache, args.max_seconds)
                    if args.warm and mode not in ("eager", "ca_eager"):
                        result["warm"] = _one(workload, mode, cache, args.max_seconds)["first"]
                rows.setdefault((workload, mode), []).append(result)
                serves = "-" if result["serves"] is None else f"{result['serves']:.2f}"
                print(f"round {r + 1}: {workload} {mode}: eager first {result['eager_first']:.2f} s, first "
                      f"{result['first']:.2f} s, serves {serves} s after {result['steps']} steps, RSS "
                      f"{result['rss_mb']:.0f} MB (children {result['children_mb']:.0f} MB)"
                      + (f", warm first {result['warm']:.2f} s" if "warm" in result else ""), flush=True)

    def med(results, key):
        values = [r[key] for r in results if r.get(key) is not None]
        return statistics.median(values) if values else None

    def cell(value, fmt="{:.2f}"):
        return "-" if value is None else fmt.format(value)

    print("\n| workload | mode | first backward s | serves s | peak RSS MB | workers' peak MB | warm first s |")
    print("|---|---|---|---|---|---|---|")
    for workload in args.workloads.split(","):
        for mode in modes:
            results = rows[(workload, mode)]
            print(f"| {workload} | {mode} | {cell(med(results, 'first'))} | {cell(med(results, 'serves'))} | "
                  f"{cell(med(results, 'rss_mb'), '{:.0f}')} | {cell(med(results, 'children_mb'), '{:.0f}')} | "
                  f"{cell(med(results, 'warm'))} |")
    return rows


if __name__ == "__main__":
    main()
