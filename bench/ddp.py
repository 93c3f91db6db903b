"""DDP benchmark: eager DDP vs camlir's DDP, 2 gloo processes on the CPU, backward time.

    python -m bench.ddp                                   # MLP, 6 layers of 2048, batch 64
    python -m bench.ddp --width 1024 --layers 4 --rounds 10   # a quick look
    python -m bench.ddp --hook-cost                       # one process: what post-accumulate-grad hooks cost

Two processes (ranks), one thread each (`torch.set_num_threads(1)`), gloo over localhost.
Each rank builds, from the same seed, one model per variant:

| variant | what reduces the gradients |
|---|---|
| `eager` | DDP's C++ reducer (built before `import camlir`), PyTorch's autograd engine |
| `camlir` | camlir's bucketed reducer, compiled backward, buckets all-reduced as they fill |
| `camlir_no_overlap` | the same, but every bucket launched when the backward ends |
| `camlir_reducer_eager_engine` | camlir's bucketed reducer, on PyTorch's autograd engine (no `camlir.enable()`) |

The last one separates the reducer from the compiled backward: it is DDP's C++ reducer
against camlir's Python one, both on the eager engine.

Each rank feeds its own seeded batch, and the loss is `(model(x) ** 2).mean()`. The
first backward of each variant is not timed (camlir compiles it); after that the
gradients of both camlir variants must equal eager's (rtol 1e-4, atol 1e-5). Then
`--warmup` untimed rounds and `--rounds` timed rounds. In each round, every variant runs
one step (zero_grad, forward, timed backward), in an order that rotates each round, so
slow drift in machine load hits every variant alike. Both ranks run the same sequence,
so their collectives match. Times are `time.perf_counter` around `loss.backward()`, which
returns only once the gradients are all-reduced, for all three variants. The table shows
medians and quartiles over the rounds, per rank, and the ratio of each median to eager's
on that rank; for camlir it also shows the median time its end-of-backward wait took
(waiting for the all-reduces, copying the results into `.grad`).

Run it on an otherwise idle machine with at least 2 cores: the two ranks, their gloo
threads and the compute share them.
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

if __package__ in (None, ""):  # `python bench/ddp.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

VARIANTS = ("eager", "camlir", "camlir_no_overlap", "camlir_reducer_eager_engine")
RTOL, ATOL = 1e-4, 1e-5


def _model(args):
    import torch

    torch.manual_seed(0)
    layers = [torch.nn.Linear(args.inputs, args.width), torch.nn.GELU()]
    for _ in range(args.layers - 2):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.GELU()]
    layers.append(torch.nn.Linear(args.width, args.outputs))
    return torch.nn.Sequential(*layers)


def _rank(rank, args, port, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), CAMLIR_DISK_CACHE="0")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        DDP = torch.nn.parallel.DistributedDataParallel
        kw = {} if args.bucket_cap_mb is None else {"bucket_cap_mb": args.bucket_cap_mb}
        models = {"eager": DDP(_model(args), **kw)}  # C++ reducer: built before camlir
        import camlir

        models["camlir"] = DDP(_model(args), **kw)
        models["camlir_no_overlap"] = DDP(_model(args), **kw)
        models["camlir_no_overlap"]._camlir_reducer.overlap = False
        models["camlir_reducer_eager_engine"] = DDP(_model(args), **kw)
        torch.manual_seed(1000 + rank)
        x = torch.randn(args.batch, args.inputs)

        def step(name):
            model = models[name]
            model.zero_grad(set_to_none=True)
            loss = model(x).pow(2).mean()
            start = time.perf_counter()
            if name in ("eager", "camlir_reducer_eager_engine"):
                loss.backward()
            else:
                with camlir.enable():
                    loss.backward()
            return time.perf_counter() - start

        first = {name: step(name) for name in VARIANTS}
        worst = {}
        for name in VARIANTS[1:]:
            worst[name] = 0.0
            for p, r in zip(models[name].parameters(), models["eager"].parameters()):
                torch.testing.assert_close(p.grad, r.grad, rtol=RTOL, atol=ATOL)
                worst[name] = max(worst[name], float((p.grad - r.grad).abs().max()))
        for _ in range(args.warmup):
            for name in VARIANTS:
                step(name)
        times = {name: [] for name in VARIANTS}
        waits = {name: [] for name in VARIANTS[1:]}
        for i in range(args.rounds):
            order = VARIANTS[i % len(VARIANTS):] + VARIANTS[:i % len(VARIANTS)]
            for name in order:
                times[name].append(step(name))
                if name != "eager":
                    waits[name].append(models[name]._camlir_reducer.last["end_wait_s"])
        buckets = [len(b.params) for b in models["camlir"]._camlir_reducer.buckets]
        results.put((rank, dict(times=times, waits=waits, first=first, worst=worst, buckets=buckets,
                                counters=dict(camlir.counters),
                                choices=[str(e) for e in camlir.explain(kind="choice")])))
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        import traceback

        results.put((rank, dict(error=f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")))
    finally:
        dist.destroy_process_group()


def hook_cost(args) -> str:
    """One process, one thread, no DDP: the same MLP's backward on the eager engine, compiled
    by camlir, and compiled by camlir with a no-op post-accumulate-grad hook on every
    parameter (what DDP's reducer adds to the graph). Interleaved, medians."""
    os.environ["CAMLIR_GRAPH_CHOICE"] = "0"  # always camlir's program, never routed to eager
    os.environ.setdefault("CAMLIR_DISK_CACHE", "0")
    import torch

    import camlir

    torch.set_num_threads(1)
    models = {name: _model(args) for name in ("eager", "camlir", "camlir_with_hooks")}
    for p in models["camlir_with_hooks"].parameters():
        p.register_post_accumulate_grad_hook(lambda p: None)
    x = torch.randn(args.batch, args.inputs)
    times = {name: [] for name in models}
    for i in range(args.warmup + args.rounds):
        for name, model in models.items():
            model.zero_grad(set_to_none=True)
            loss = model(x).pow(2).mean()
            start = time.perf_counter()
            with camlir.enable() if name != "eager" else _nothing():
                loss.backward()
            if i >= args.warmup:
                times[name].append(time.perf_counter() - start)
    eager = statistics.median(times["eager"])
    return "\n".join(f"{name}: {1e3 * statistics.median(t):.1f} ms ({statistics.median(t) / eager:.2f}x)"
                     for name, t in times.items())


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _quartiles(xs):
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return q[0], statistics.median(xs), q[2]


def report(args, out) -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))).stdout.strip()
    params = args.inputs * args.width + args.width + (args.layers - 2) * (args.width * args.width + args.width) \
        + args.width * args.outputs + args.outputs
    lines = [f"MLP {args.inputs}-{'x'.join([str(args.width)] * (args.layers - 1))}-{args.outputs} "
             f"({args.layers} Linear layers, {params / 1e6:.1f} M parameters, {4 * params / 2**20:.0f} MiB of "
             f"gradients), batch {args.batch}, 2 gloo ranks x 1 thread, {args.rounds} rounds "
             f"(+{args.warmup} warm-up), commit {commit or '?'}; buckets (parameters each): "
             f"{out[0]['buckets']}", "",
             "| rank | variant | backward ms, median | p25 | p75 | vs eager | end wait ms, median | max diff vs eager |",
             "|---|---|---|---|---|---|---|---|"]
    for rank in (0, 1):
        r = out[rank]
        eager = statistics.median(r["times"]["eager"])
        for name in VARIANTS:
            lo, med, hi = _quartiles(r["times"][name])
            wait = f"{1e3 * statistics.median(r['waits'][name]):.1f}" if name in r["waits"] else ""
            diff = f"{r['worst'][name]:.1e}" if name in r["worst"] else ""
            lines.append(f"| {rank} | {name} | {1e3 * med:.1f} | {1e3 * lo:.1f} | {1e3 * hi:.1f} | "
                         f"{med / eager:.2f}x | {wait} | {diff} |")
    lines += ["", f"counters (rank 0): {out[0]['counters']}"]
    lines += [f"rank {rank}: {choice}" for rank in (0, 1) for choice in out[rank]["choices"]]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=6, help="Linear layers (the MLP's depth)")
    parser.add_argument("--inputs", type=int, default=512)
    parser.add_argument("--outputs", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--bucket-cap-mb", type=float, default=None, help="DDP's bucket_cap_mb (default: DDP's 25)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--hook-cost", action="store_true", help="one process, no DDP: see hook_cost()")
    args = parser.parse_args(argv)
    if args.hook_cost:
        print(hook_cost(args))
        return

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, args, port, results)) for r in range(2)]
    for p in procs:
        p.start()
    out = dict(results.get(timeout=3600) for _ in procs)
    for p in procs:
        p.join(60)
    for rank in (0, 1):
        if "error" in out[rank]:
            sys.exit(f"rank {rank}: {out[rank]['error']}")
    print(report(args, out))


if __name__ == "__main__":
    main()
