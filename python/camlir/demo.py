"""The main job: train a small model with camlir's compiled backward, and show what it did.

    python -m camlir.demo [--steps N] [--backend cpu|eager] [--svg PATH]

It also draws the captured backward (`camlir.draw`) to an SVG, by default
`camlir-demo-backward.svg` in the temp directory; the path is printed.
"""

import argparse
import copy
import os
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import camlir


def make_data(n=256, features=20, classes=4, seed=0):
    """A seeded toy classification set: `n` points in `features` dims drawn around one
    random center per class. Returns `(x, labels)`, shapes `(n, features)` and `(n,)`."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, features, generator=g) * 2
    labels = torch.randint(0, classes, (n,), generator=g)
    x = centers[labels] + torch.randn(n, features, generator=g)
    return x, labels


def make_model():
    """The demo's 20 -> 64 -> 64 -> 4 MLP with GELUs, seeded so every run starts the same."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 4))


def main(argv=None) -> int:
    """Trains with camlir's backward, checks every step's gradients against PyTorch's
    engine (raising on a mismatch), prints the captured graph, kernels, timings and
    counters. Returns 0."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--backend", default=None, help="camlir backend (default: camlir.config.backend)")
    parser.add_argument("--svg", default=os.path.join(tempfile.gettempdir(), "camlir-demo-backward.svg"),
                        help="where to draw the captured backward (default: %(default)s)")
    args = parser.parse_args(argv)

    x, y = make_data()
    model = make_model()
    reference = copy.deepcopy(model)
    losses = []
    # A gradient hook, so the captured backward has one to show.
    model[0].weight.register_hook(lambda g: g.clamp(-1.0, 1.0))
    reference[0].weight.register_hook(lambda g: g.clamp(-1.0, 1.0))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)

    print(f"camlir {camlir.__version__}: training a 3-layer GELU MLP for {args.steps} steps "
          f"(batch 64) with the backward compiled by camlir\n")
    camlir.reset()
    worst = 0.0
    for step in range(args.steps):
        idx = torch.arange(step * 64, step * 64 + 64) % x.shape[0]
        opt.zero_grad(set_to_none=True)
        ref_opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        before = camlir.counters["while_compiling"]
        with camlir.enable(backend=args.backend):
            loss.backward()
        # The first backwards of a new graph run on PyTorch's engine while a worker compiles it
        # (docs/compile-service.md); the program takes over at the first backward after.
        ran = "eager, compiling in a worker" if camlir.counters["while_compiling"] > before else "compiled"
        F.cross_entropy(reference(x[idx]), y[idx]).backward()  # PyTorch's own engine
        for p, q in zip(model.parameters(), reference.parameters()):
            worst = max(worst, (p.grad - q.grad).abs().max().item())
            torch.testing.assert_close(p.grad, q.grad)
        opt.step()
        ref_opt.step()
        if step % 3 == 0 or step == args.steps - 1:
            print(f"  step {step:3d}  loss {loss.item():.4f}  ({ran})")
        if step == 2 and camlir.counters["while_compiling"]:
            start = time.perf_counter()
            camlir.wait()  # a demo wants to see the program run; training loops need not wait
            print(f"  (camlir.wait(): the program arrived {time.perf_counter() - start:.2f} s later; "
                  f"the next steps run it)")
        losses.append(loss.item())

    camlir.wait()  # a compile still in flight (few steps): its program, for what follows
    print(f"\nloss went from {losses[0]:.4f} to {losses[-1]:.4f}")
    print(f"gradients equal to PyTorch's eager engine at every step (max abs difference {worst:.2e})")
    graphs = camlir.captured_graphs()
    if graphs:
        capture_id, text = graphs[-1]
        s = camlir.summarize(text)
        print(f"\ncaptured backward graph #{capture_id}: {s['nodes']} autograd nodes, "
              f"{s['aten_ops']} aten ops, hooks {s['hooks']}, {s['accumulate_grad']} accumulations into .grad")
        print("  nodes: " + ", ".join(f"{k} x{v}" if v > 1 else k for k, v in s["node_names"].items()))
    for capture_id, backend, program in camlir.compiled_programs():
        if backend != "cpu" or not hasattr(program, "kernels"):
            continue
        lowered = program.lowered_text
        print(f"\nnative code for graph #{capture_id}: {len(program.kernels)} kernel(s) compiled in "
              f"{program.compile_seconds:.2f} s; {lowered.count('linalg.matmul')} matmuls go to BLAS, "
              f"{lowered.count('linalg.generic')} fused loops, "
              f"{'the hook was inlined' if 'ca.hook' not in lowered else 'hooks stay Python calls'}")
    if graphs:
        print(f"\npicture of the backward (nodes, kernels, hook, accumulations): {camlir.draw(args.svg)}")
    print("\nbackward time, median of 30 (ms):")
    for name, ms in _timings(model, x[:64], y[:64], args.backend).items():
        print(f"  {name:8s} {ms:.3f}")
    for event in camlir.explain(kind="choice"):  # measured on these calls: see docs/speed.md
        print(f"  camlir's choice for graph #{event.graph}: {event.reason}")
    print("\ncounters: " + ", ".join(f"{k}={v}" for k, v in camlir.counters.items()))
    print("(set CA_LOGS=graph to print the captured ca module, CA_LOGS=recompiles for capture reasons)")
    return 0


def _timings(model, x, y, backend) -> dict:
    """Eager engine vs camlir on the trained model, interleaved (a glimpse, not the benchmark:
    see bench/)."""
    import statistics
    import time

    def one(use_camlir):
        model.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        start = time.perf_counter()
        if use_camlir:
            with camlir.enable(backend=backend):
                loss.backward()
        else:
            loss.backward()
        return (time.perf_counter() - start) * 1e3

    for _ in range(60):  # camlir decides compiled-or-eager on its first 56 calls (docs/speed.md)
        one(True)
    times = {"eager": [], "camlir": []}
    for _ in range(30):
        times["eager"].append(one(False))
        times["camlir"].append(one(True))
    return {k: statistics.median(v) for k, v in times.items()}


if __name__ == "__main__":
    raise SystemExit(main())
