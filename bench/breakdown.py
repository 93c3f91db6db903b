"""Where one workload's backward goes, camlir's compiled program against the eager engine.

    python -m bench.breakdown W3              # 1 thread, compiled program only (no graph choice)

Times both sides interleaved (40 rounds after 30 warm-ups, medians), then prints
`camlir.profile()`'s table for camlir's program (kernels, host ops, accumulations, and the
time outside the program: the engine, PyTorch's compiled-autograd runtime, camlir's driver)
and torch.profiler's self time by op for eager's steps (forward included: compare the
backward ops). docs/speed.md, "Where the compiled rows lose", has the figures. A
measurement aid, not a test: run it on a quiet machine.
"""

import os
import statistics
import sys
import time


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    name = argv[0] if argv else "W3"
    os.environ.setdefault("CAMLIR_GRAPH_CHOICE", "0")  # the compiled program, never routed
    os.environ.setdefault("CAMLIR_DISK_CACHE", "0")
    import torch
    from torch.profiler import ProfilerActivity, profile

    import camlir
    from bench import workloads

    torch.set_num_threads(1)
    w = workloads.build(name)

    def step(use_camlir: bool) -> float:
        w.model.zero_grad(set_to_none=True)
        loss = w.forward(w.model, w.inputs)
        start = time.perf_counter()
        if use_camlir:
            with camlir.enable(backend="cpu", wait=True):
                loss.backward()
        else:
            loss.backward()
        return time.perf_counter() - start

    for _ in range(30):
        step(True)
        step(False)
    times = {True: [], False: []}
    for _ in range(40):
        for side in (True, False):
            times[side].append(step(side))
    eager, compiled = (statistics.median(times[s]) * 1e3 for s in (False, True))
    print(f"{name}: eager {eager:.3f} ms, camlir {compiled:.3f} ms, ratio {compiled / eager:.2f}",
          dict(camlir.counters))
    with camlir.profile() as prof:
        for _ in range(20):
            step(True)
    print(prof.table())
    with profile(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(10):
            step(False)
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=16))


if __name__ == "__main__":
    main()
