"""FSDP2 benchmark: eager FSDP2 vs camlir's compiled backward, 2 gloo processes on the CPU.

    python -m bench.fsdp                                  # GPT-like, 4 blocks, d_model 128, batch 8 x 64
    python -m bench.fsdp --quick                          # a smoke check: 5 rounds, 1 warm-up round
    python -m bench.fsdp --d-model 256 --seq 128 --no-reshard-after-forward
    python -m bench.fsdp --profile                        # also camlir.profile()'s table (rank 0)

Two processes (ranks), one thread each (`torch.set_num_threads(1)`), gloo over localhost.
Each rank builds, from the same seed, one model per variant: a GPT-like language model
(token and position embeddings; `--blocks` blocks of LayerNorm -> causal self-attention
(Linear q, k, v and out, `scaled_dot_product_attention(is_causal=True)`) -> residual,
LayerNorm -> MLP (Linear to 4x, GELU, Linear) -> residual; a final LayerNorm and an LM
head), every block and then the root wrapped with `fully_shard(reshard_after_forward=...)`,
and an SGD optimizer. `reshard_after_forward` is passed explicitly (True by default, as in
test/python/test_fsdp.py), so the root reshards too and is all-gathered again in the
backward (5 all-gathers there with 4 blocks); `fully_shard`'s own default (None) would keep
the root's parameters unsharded after the forward.

| variant | what runs the backward |
|---|---|
| `eager` | eager FSDP2, PyTorch's autograd engine |
| `camlir` | the same under `camlir.enable(backend="cpu", wait=True)`: camlir's compiled backward, FSDP2's hooks and collectives inside it |

`import camlir` comes first on both; only `camlir.enable()` around `loss.backward()` tells
the variants apart (camlir changes nothing in FSDP2 itself). camlir runs with
`CAMLIR_GRAPH_CHOICE=0` and `CAMLIR_COMPILE_WORKERS=0`: in a torch.distributed group
camlir never routes a backward to the eager engine by timing anyway (ranks deciding apart
would issue different collectives), and `wait=True` with in-process compiles makes the first
backward build the program, so no timed backward runs PyTorch's graph while a worker
compiles. The counters and host calls printed under the table say what did run.

Each rank trains on its own seeded batch of random tokens (the same batch every step),
loss cross entropy against random target tokens. A step is `zero_grad(set_to_none=True)`,
the forward, `loss.backward()`, `opt.step()`. First `--check-steps` steps of each variant
(eager, then camlir, per step; camlir's first backward captures and runs PyTorch's graph
once to see what the host calls return, its second compiles); after them the parameters
of the two models, gathered from their shards (`full_tensor()`), must be equal (rtol 1e-5,
atol 1e-6) on both ranks. Then `--warmup` untimed rounds and `--rounds` timed rounds. In
each round every variant runs one step, in an order that rotates each round, so slow drift
in machine load hits both alike; both ranks run the same sequence, so their collectives
match. Times are `time.perf_counter`: the whole step, and `loss.backward()` alone (the
blocks' reduce-scatters run inside it, and it returns after FSDP2's end-of-backward
callback, which reduce-scatters the root's group).

Communication wait. On the CPU FSDP2 (torch 2.13, `_fsdp_collectives.py`) issues its
collectives synchronously: `foreach_all_gather` calls `dist.all_gather_single(...,
async_op=False)` (an `FSDPParamGroup`'s `unshard_async_op` is False: the pre-forward and
pre-backward unshards and the backward prefetch all pass it), and `foreach_reduce` calls
`dist.reduce_scatter_single` without `async_op` (and `dist.all_reduce` only for HSDP,
not used here). A synchronous call returns after `work.wait()`, so the time inside it is
the time the step spends blocked on communication: gloo's transfer, plus waiting for the
other rank to reach the same collective. So this bench replaces `torch.distributed.all_gather_single`,
`reduce_scatter_single` and `all_reduce` (the module attributes `_fsdp_collectives` looks
up at each call) in the bench's rank processes with wrappers that add up the seconds
spent inside them, per phase of the step (forward, backward, zero_grad + optimizer). The
copy-in/copy-out around the collectives (`all_gather_copy_in`, `chunk_cat`, the
split copies) is compute, not counted. A call with `async_op=True` would time only the
launch: such calls are counted and flagged under the table (none expected on the CPU).
`full_tensor()` (the equality check) uses functional collectives and is outside any phase.

The table shows medians and quartiles over the rounds, per rank, the ratio of each median
to eager's on that rank, and the median communication wait inside the backward (all-gathers
plus reduce-scatters) and inside the forward.

`--profile` adds `camlir.profile()`'s table for a few more camlir steps on rank 0 (kernels,
host ops, hooks; FSDP2's `RegisterPostBackwardFunction` host calls, which issue the
reduce-scatters, are the `custom_backward` hooks). With `reshard_after_forward=True` the
table is nearly empty at bf3c935: the program then runs through
`host_runtime._Program.run_deferring` (its arguments include resharded parameters' deferred
views), which times no steps; `--no-reshard-after-forward` gives the full table.

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

if __package__ in (None, ""):  # `python bench/fsdp.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

VARIANTS = ("eager", "camlir")
RTOL, ATOL = 1e-5, 1e-6
PHASES = ("forward", "backward", "step")  # "step": zero_grad and the optimizer
COLLECTIVES = ("all_gather_single", "reduce_scatter_single", "all_reduce")


def _model(args):
    """The GPT-like model, from seed 0 (every rank and variant builds the same)."""
    import torch
    from torch import nn

    F = torch.nn.functional

    class Attention(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.heads = heads
            self.q, self.k, self.v, self.out = (nn.Linear(d, d) for _ in range(4))

        def forward(self, x):
            b, t, d = x.shape

            def split(y):
                return y.view(b, t, self.heads, d // self.heads).transpose(1, 2)

            y = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)), is_causal=True)
            return self.out(y.transpose(1, 2).reshape(b, t, d))

    class Block(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.ln1, self.attn = nn.LayerNorm(d), Attention(d, heads)
            self.ln2 = nn.LayerNorm(d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(args.vocab, args.d_model)
            self.pos = nn.Embedding(args.seq, args.d_model)
            self.blocks = nn.ModuleList(Block(args.d_model, args.heads) for _ in range(args.blocks))
            self.ln_f = nn.LayerNorm(args.d_model)
            self.head = nn.Linear(args.d_model, args.vocab, bias=False)

        def forward(self, idx):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln_f(x))

    torch.manual_seed(0)
    return GPT()


class CommClock:
    """Seconds spent inside FSDP2's synchronous collectives, per phase of the step and per
    collective, while `phase` is set (see the module docstring for why these calls)."""

    def __init__(self):
        self.phase = None
        self.async_calls = 0
        self.take()

    def install(self, dist) -> None:
        for name in COLLECTIVES:
            setattr(dist, name, self._timed(name, getattr(dist, name)))

    def _timed(self, name, collective):
        def timed(*args, **kwargs):
            phase = self.phase
            start = time.perf_counter()
            try:
                return collective(*args, **kwargs)
            finally:
                if phase is not None:
                    self.seconds[phase, name] += time.perf_counter() - start
                    self.calls[phase, name] += 1
                    self.async_calls += bool(kwargs.get("async_op", False))

        timed.__wrapped__ = collective
        return timed

    def take(self) -> dict:
        """{(phase, collective): (seconds, calls)} since the last take; starts again at zero."""
        out = {key: (self.seconds[key], self.calls[key]) for key in self.seconds} if hasattr(self, "seconds") else {}
        self.seconds = {(phase, name): 0.0 for phase in PHASES for name in COLLECTIVES}
        self.calls = dict.fromkeys(self.seconds, 0)
        return out


def _rank(rank, args, port, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), CAMLIR_DISK_CACHE="0",
                      CAMLIR_GRAPH_CHOICE="0", CAMLIR_COMPILE_WORKERS="0")
    import contextlib

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        import camlir

        clock = CommClock()
        clock.install(dist)
        models, opts = {}, {}
        for name in VARIANTS:
            model = _model(args)
            params = sum(p.numel() for p in model.parameters())
            for block in model.blocks:
                fully_shard(block, reshard_after_forward=args.reshard_after_forward)
            fully_shard(model, reshard_after_forward=args.reshard_after_forward)
            models[name] = model
            opts[name] = torch.optim.SGD(model.parameters(), lr=args.lr)
        contexts = {"eager": contextlib.nullcontext, "camlir": lambda: camlir.enable(backend="cpu", wait=True)}
        torch.manual_seed(1000 + rank)
        tokens = torch.randint(args.vocab, (args.batch, args.seq))
        targets = torch.randint(args.vocab, (args.batch, args.seq))

        def step(name):
            model, opt = models[name], opts[name]
            clock.take()
            start = time.perf_counter()
            clock.phase = "step"
            opt.zero_grad(set_to_none=True)
            clock.phase = "forward"
            loss = torch.nn.functional.cross_entropy(model(tokens).view(-1, args.vocab), targets.view(-1))
            clock.phase = "backward"
            backward_start = time.perf_counter()
            with contexts[name]():
                loss.backward()
            backward_end = time.perf_counter()
            clock.phase = "step"
            opt.step()
            end = time.perf_counter()
            clock.phase = None
            return dict(step=end - start, backward=backward_end - backward_start, comm=clock.take(),
                        loss=loss.detach().item())

        first = {name: [] for name in VARIANTS}
        for _ in range(args.check_steps):
            for name in VARIANTS:
                first[name].append(step(name))
        eager_params = [p.detach().full_tensor() for p in models["eager"].parameters()]
        camlir_params = [p.detach().full_tensor() for p in models["camlir"].parameters()]
        worst = max(float((a - b).abs().max()) for a, b in zip(camlir_params, eager_params))
        for (pname, _), a, b in zip(models["eager"].named_parameters(), camlir_params, eager_params):
            torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=lambda m, pname=pname:
                                       f"parameter {pname} after {args.check_steps} steps differs from eager's: {m}")
        counters_checked = dict(camlir.counters)
        for _ in range(args.warmup):
            for name in VARIANTS:
                step(name)
        before = dict(camlir.counters)
        samples = {name: [] for name in VARIANTS}
        for i in range(args.rounds):
            order = VARIANTS[i % len(VARIANTS):] + VARIANTS[:i % len(VARIANTS)]
            for name in order:
                samples[name].append(step(name))
        after = dict(camlir.counters)
        profile = None
        if args.profile:
            with camlir.profile() as prof:
                profiled = [step("camlir") for _ in range(max(3, args.rounds // 2))]
            profile = (f"{len(profiled)} camlir steps in a row (not interleaved), backward ms median "
                       f"{1e3 * statistics.median(s['backward'] for s in profiled):.1f}, comm wait in it "
                       f"{1e3 * statistics.median(_comm(s, 'backward', COLLECTIVES) for s in profiled):.1f}\n"
                       + prof.table())
        results.put((rank, dict(
            samples=samples, first=first, worst=worst, params=params, async_calls=clock.async_calls,
            counters=after, counters_checked=counters_checked,
            timed_counters={k: after[k] - before.get(k, 0) for k in after},
            host_calls=[e.what for e in camlir.explain(kind="host_call")],
            fallbacks=[str(e) for e in camlir.explain(kind="fallback")],
            profile=profile)))
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        import traceback

        results.put((rank, dict(error=f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _quartiles(xs):
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return q[0], statistics.median(xs), q[2]


def _comm(sample, phase, names) -> float:
    return sum(sample["comm"][phase, name][0] for name in names)


def _calls(sample, phase) -> str:
    short = {"all_gather_single": "AG", "reduce_scatter_single": "RS", "all_reduce": "AR"}
    return " ".join(f"{sample['comm'][phase, name][1]} {short[name]}" for name in COLLECTIVES
                    if sample["comm"][phase, name][1]) or "none"


def report(args, out) -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))).stdout.strip()
    r0 = out[0]
    first_steps = ", ".join(f"{s['step']:.2f}" for s in r0["first"]["camlir"])
    lines = [f"GPT-like: {args.blocks} blocks, d_model {args.d_model}, {args.heads} heads, seq {args.seq}, "
             f"batch {args.batch}, vocab {args.vocab} ({r0['params'] / 1e6:.2f} M parameters); fully_shard on "
             f"every block and the root, reshard_after_forward={args.reshard_after_forward}; SGD; 2 gloo ranks x "
             f"1 thread, {args.rounds} rounds (+{args.warmup} warm-up, after {args.check_steps} checked steps), "
             f"commit {commit or '?'}. camlir's checked steps (it captures, then compiles), rank 0: {first_steps} s.", "",
             "| rank | variant | step ms, median | p25 | p75 | vs eager | backward ms, median | p25 | p75 | vs eager "
             "| comm wait in backward ms (all-gather + reduce-scatter) | comm wait in forward ms "
             "| collectives per step: forward, backward |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for rank in (0, 1):
        r = out[rank]
        eager_step = statistics.median(s["step"] for s in r["samples"]["eager"])
        eager_bwd = statistics.median(s["backward"] for s in r["samples"]["eager"])
        for name in VARIANTS:
            samples = r["samples"][name]
            slo, smed, shi = _quartiles([s["step"] for s in samples])
            blo, bmed, bhi = _quartiles([s["backward"] for s in samples])
            gather, scatter, total_bwd, total_fwd = (
                1e3 * statistics.median(_comm(s, phase, names) for s in samples)
                for phase, names in (("backward", ("all_gather_single",)), ("backward", ("reduce_scatter_single",)),
                                     ("backward", COLLECTIVES), ("forward", COLLECTIVES)))
            calls = f"{_calls(samples[-1], 'forward')}; {_calls(samples[-1], 'backward')}"
            lines.append(f"| {rank} | {name} | {1e3 * smed:.1f} | {1e3 * slo:.1f} | {1e3 * shi:.1f} | "
                         f"{smed / eager_step:.2f}x | {1e3 * bmed:.1f} | {1e3 * blo:.1f} | {1e3 * bhi:.1f} | "
                         f"{bmed / eager_bwd:.2f}x | {total_bwd:.1f} ({gather:.1f} + {scatter:.1f}) | "
                         f"{total_fwd:.1f} | {calls} |")
    lines += ["", f"Parameters after {args.check_steps} steps: camlir's equal eager's (max difference "
              f"{max(out[0]['worst'], out[1]['worst']):.1e} over both ranks; rtol {RTOL}, atol {ATOL})."]
    for rank in (0, 1):
        r = out[rank]
        lines.append(f"rank {rank}: counters after the checked steps {r['counters_checked']}; "
                     f"over the timed rounds {r['timed_counters']}; "
                     f"host calls: {len(r['host_calls'])} ({', '.join(sorted(set(r['host_calls'])))})")
        lines += [f"rank {rank}: {f}" for f in r["fallbacks"]]
        if r["async_calls"]:
            lines.append(f"rank {rank}: {r['async_calls']} collectives ran with async_op=True: "
                         "their wait is not in the comm columns")
    if r0.get("profile"):
        lines += ["", "camlir.profile() on rank 0, after the timed rounds:", "", "```",
                  r0["profile"], "```"]
    return "\n".join(lines)


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--reshard-after-forward", action=argparse.BooleanOptionalAction, default=True,
                        help="fully_shard's reshard_after_forward (default: True)")
    parser.add_argument("--check-steps", type=int, default=3, help="steps before the parameters are compared")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="5 rounds, 1 warm-up round: a smoke check")
    parser.add_argument("--profile", action="store_true",
                        help="after the timed rounds, camlir.profile()'s table of camlir's step on rank 0")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.warmup = 5, 1
    if args.d_model % args.heads:
        parser.error("--d-model must be a multiple of --heads")

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
    text = report(args, out)
    print(text)
    return text


if __name__ == "__main__":
    main()
