"""Dynamic-size native code vs a size-specialized variant: compile time and time per call.

    python -m bench.dynamic_kernels [--rounds 200] [--threads 1]

For W1-like (Linear(10, 10)) and W2-like (4 x (Linear(1024, 1024) + GELU), out.sum())
backwards, the capture is made symbolic (two batch sizes through camlir's reference
backend), the arguments of one call at the measured batch are recorded, and the symbolic
`ca` module is compiled twice by `pipeline.compile` with the cpu backend:
`Variant(runtime_sizes=True)` (one program for all sizes) and `Variant.specialized(sizes,
shapes)` (the variant `SizeVariants` would
compile for this size set). Compile times: the best of `--compiles` compiles each. Run
times: the two programs are called alternately (start order rotating) on the same recorded
arguments, under `torch.no_grad()` as the driver calls them; medians over `--rounds`.
"""

import argparse
import statistics
import time

import torch
import torch.nn as nn

import camlir
from camlir import compiled, pipeline
from camlir import backend_registry as registry
from camlir.stages import Dump
from camlir.variant import Variant


def _workloads():
    def w1():
        torch.manual_seed(0)
        return nn.Linear(10, 10), (lambda n: torch.randn(n, 10)), (8, 16, 24), 4

    def w2():
        torch.manual_seed(0)
        layers = []
        for _ in range(4):
            layers += [nn.Linear(1024, 1024), nn.GELU()]
        return nn.Sequential(*layers), (lambda n: torch.randn(n, 1024)), (32, 48, 56), 64

    return {"W1-like (Linear 10x10, batch 4)": w1, "W2-like (4x Linear 1024 + GELU, batch 64)": w2}


class _Recorder:
    def __init__(self, program):
        self.program = program
        self.args = None
        self.hooks = None

    def __call__(self, args, hooks, callbacks=()):
        self.args, self.hooks = list(args), hooks
        return self.program(args, hooks, callbacks)


def _record(model, make_input, capture_sizes, batch):
    camlir.reset()
    for n in capture_sizes:
        with camlir.enable(backend="eager"):
            model(make_input(n)).sum().backward()
        if compiled._compiled[-1][1].retraced.symbolic:
            break
    artifact = [a for _, a in compiled._compiled if a.retraced.symbolic][-1]  # capture sizes until symbolic
    recorder = _Recorder(artifact.program)
    artifact.program = recorder
    artifact.retraced.guards_hold = lambda inputs, sizes: True  # batch 4 of W1 would be another capture
    with camlir.enable(backend="eager"):
        model(make_input(batch)).sum().backward()
    return artifact.module, recorder.args, recorder.hooks


def _n_sizes(module) -> int:
    from camlir.dialects.ca.ir_helpers import function_type, require_func
    return sum(1 for t in function_type(require_func(module, "backward")).inputs if str(t) == "!torch.int")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--compiles", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    opts = parser.parse_args()
    torch.set_num_threads(opts.threads)
    rows = []
    cpu = registry.get("cpu")
    for name, build in _workloads().items():
        model, make_input, capture_sizes, batch = build()
        module, args, hooks = _record(model, make_input, capture_sizes, batch)
        n_inputs = len(args) - _n_sizes(module)
        sizes = [int(s) for s in args[n_inputs:]]
        shapes = pipeline.dynamic_shapes(module, args, n_inputs)
        compile_s = {"dynamic": [], "specialized": []}
        programs = {}
        for _ in range(opts.compiles):
            for kind in ("dynamic", "specialized"):
                start = time.perf_counter()
                if kind == "dynamic":
                    program, _ = pipeline.compile(cpu, module, args, hooks, Dump(name), Variant(runtime_sizes=True))
                else:
                    program, _ = pipeline.compile(cpu, module, args, hooks, Dump(name),
                                                  Variant.specialized(sizes, shapes))
                compile_s[kind].append(time.perf_counter() - start)
                programs[kind] = program
        times = {"dynamic": [], "specialized": []}
        order = list(times)
        with torch.no_grad():
            for kind in order:  # warm-up
                for _ in range(5):
                    programs[kind](args, hooks)
            for r in range(opts.rounds):
                for kind in order[r % 2:] + order[:r % 2]:
                    start = time.perf_counter_ns()
                    programs[kind](args, hooks)
                    times[kind].append((time.perf_counter_ns() - start) / 1e3)
        rows.append((name, len(programs["dynamic"].kernels), min(compile_s["dynamic"]),
                     min(compile_s["specialized"]), statistics.median(times["dynamic"]),
                     statistics.median(times["specialized"])))
    print(f"threads {opts.threads}, {opts.rounds} interleaved rounds, best of {opts.compiles} compiles\n")
    print("| workload | kernels | compile dynamic s | compile specialized s | run dynamic us | "
          "run specialized us | run ratio |")
    print("|---|---|---|---|---|---|---|")
    for name, k, cd, cs, rd, rs in rows:
        print(f"| {name} | {k} | {cd:.3f} | {cs:.3f} | {rd:.1f} | {rs:.1f} | {rd / rs:.2f} |")


if __name__ == "__main__":
    main()
