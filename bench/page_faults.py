"""Page faults per backward step, and the backward's time, with and without camlir's malloc
tuning (python/camlir/backends/cpu/malloc_tuning.py says why).

    python -m bench.page_faults --workloads W3,Transformer --threads 1

One fresh process per row (eager; eager with camlir's tuning applied by hand; camlir with
`CAMLIR_MALLOC_TUNING=0`; camlir tuned), each
running the workload's compiled backward (`CAMLIR_GRAPH_CHOICE=0`, so the program itself runs,
not a route to the eager engine), warm-up steps first, then `--steps` timed ones: the median
backward and the minor page faults per step (forward, zero_grad and backward together).
Processes run one after another, so read the times with the machine's noise in mind; the
fault counts do not depend on it.
"""

import argparse
import json
import os
import subprocess
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (name, camlir?, malloc tuned?): "eager tuned" applies camlir's tuning to a plain eager
# process, to show what the tuning alone does for the eager engine.
ROWS = (("eager", False, False), ("eager tuned", False, True), ("camlir untuned", True, False), ("camlir", True, True))

_CHILD = r"""
import json, resource, statistics, sys, time
import torch
from bench import workloads
torch.set_num_threads(int(sys.argv[2]))
w = workloads.build(sys.argv[1])
use_camlir = sys.argv[3] == "1"
if sys.argv[6] == "1" and not use_camlir:
    from camlir.backends.cpu import malloc_tuning
    assert malloc_tuning.apply()
if use_camlir:
    import camlir
    camlir.config.enabled = True
def step():
    w.model.zero_grad(set_to_none=True)
    loss = w.forward(w.model, w.inputs)
    start = time.perf_counter()
    loss.backward()
    return time.perf_counter() - start
for _ in range(int(sys.argv[4])):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
times = [step() for _ in range(int(sys.argv[5]))]
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"ms": 1e3 * statistics.median(times), "faults": faults / len(times)}))
"""


def measure(workload: str, threads: int, camlir: bool, tuned: bool, warmup: int, steps: int) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    full_env = dict(os.environ, CAMLIR_GRAPH_CHOICE="0", PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    full_env["CAMLIR_MALLOC_TUNING"] = "1" if tuned else "0"
    out = subprocess.run([sys.executable, "-c", _CHILD, workload, str(threads), "1" if camlir else "0",
                          str(warmup), str(steps), "1" if tuned else "0"],
                         env=full_env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> list:
    """Prints the table; returns its rows as (workload, variant, backward ms, faults per step)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="W3", help="comma-separated bench workloads (bench/workloads.py)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args(argv)
    print("| workload | variant | backward ms | minor page faults per step |")
    print("|---|---|---|---|")
    rows = []
    for workload in args.workloads.split(","):
        for name, camlir, tuned in ROWS:
            row = measure(workload, args.threads, camlir, tuned, args.warmup, args.steps)
            rows.append((workload, name, row["ms"], row["faults"]))
            print(f"| {workload} | {name} | {row['ms']:.1f} | {row['faults']:.0f} |", flush=True)
    return rows


if __name__ == "__main__":
    main()
