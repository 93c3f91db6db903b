"""One benchmark variant on one workload, in its own process, driven by `bench.run`.

Why a process per variant: PyTorch keeps a single compiled-autograd cache per process, keyed by
graph structure and not by compiler. Once `ca_inductor` has compiled a backward graph, a camlir
backward of the same graph in the same process runs Inductor's code (and the other way round).
Each variant therefore runs in its own process; the driver interleaves them one backward at a
time, so they still share the machine's conditions.

Protocol: length-prefixed pickles. Requests on stdin, replies on the original stdout (anything
the libraries print goes to stderr). Requests, in order:
- {"cmd": "prepare", ...}: start-up, build, first backward (its time and gradients), warm-up;
- {"cmd": "check", "reference": ...}: compares the first-step gradients with eager's;
- {"cmd": "step"} (repeated): one forward, one timed backward; replies the backward's ns;
- {"cmd": "finish"}: peak RSS, camlir counters, notes; then the process exits.
Every reply is a dict; a failure replies {"error": "..."}.
"""

import contextlib
import logging
import os
import pickle
import struct
import sys
import time
import traceback

HEADER = struct.Struct("<Q")


def write_frame(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(HEADER.pack(len(data)) + data)
    stream.flush()


def read_frame(stream):
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        raise EOFError("driver closed the pipe")
    (size,) = HEADER.unpack(header)
    return pickle.loads(stream.read(size))


class _Notes(logging.Handler):
    """Collects camlir's log messages (fallbacks, "runs on the reference interpreter")."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.messages = []

    def emit(self, record):
        message = record.getMessage()
        if message not in self.messages and len(self.messages) < 20:
            self.messages.append(message)


class Variant:
    """How one variant runs `loss.backward()`: `context()` is entered around every backward."""

    def __init__(self, name):
        import torch

        self.name = name
        self.camlir = None
        self.notes = _Notes()
        if name == "eager":
            self.context = contextlib.nullcontext
        elif name == "eager_tuned":
            # The eager engine with the malloc thresholds camlir sets for its own programs
            # (camlir/backends/cpu/malloc_tuning.py): what that tuning alone is worth.
            from camlir.backends.cpu import malloc_tuning

            if not malloc_tuning.apply():
                raise RuntimeError("eager_tuned: malloc tuning is not available here (glibc only)")
            self.context = contextlib.nullcontext
        elif name == "eager_after_camlir":
            # A diagnostic: the eager engine in a process where camlir compiled this workload's
            # backward (start-up and first backward under camlir: its imports, caches and
            # malloc tuning), every later backward plain. Beside eager_tuned and camlir_cpu it
            # splits a routed row's cost into what the process costs the eager engine and
            # what the routing itself costs.
            import camlir

            under_camlir = [2]

            def context():
                if under_camlir[0]:
                    under_camlir[0] -= 1
                    return camlir.enable(backend="cpu")
                return contextlib.nullcontext()

            self.context = context
        elif name == "eager_after_ca":
            # A diagnostic beside eager_after_camlir: PyTorch's compiled autograd with a compiler
            # that returns the captured graph as it is, for the start-up and first backward,
            # every later backward plain. What a capture alone leaves the process with.
            from torch._dynamo import compiled_autograd

            under_ca = [2]

            def context():
                if under_ca[0]:
                    under_ca[0] -= 1
                    return compiled_autograd._enable(lambda gm: gm)
                return contextlib.nullcontext()

            self.context = context
        elif name == "ca_eager":
            # PyTorch's compiled autograd replaying its captured graph op by op through torch
            # (the compiler returns the GraphModule): the floor its runtime sets, with no
            # compiler at all. One compiler object: a new one per backward costs 2-3x eager.
            from torch._dynamo import compiled_autograd

            def replay(gm):
                return gm

            self.context = lambda: compiled_autograd._enable(replay)
        elif name == "ca_inductor":
            from torch._dynamo import compiled_autograd

            compiler = torch.compile(backend="inductor")  # a compiler_fn: GraphModule -> callable
            self.context = lambda: compiled_autograd._enable(compiler)
        elif name.startswith("camlir_"):
            import camlir

            backend = name[len("camlir_"):]
            self.camlir = camlir
            self.context = lambda: camlir.enable(backend=backend)
            logger = logging.getLogger("camlir")
            logger.addHandler(self.notes)
        else:
            raise ValueError(f"unknown variant {name!r}")

    def served(self) -> int:
        """How many backward calls camlir has run or routed itself (compiled now, from its cache,
        or sent to the eager engine because that measured faster: `graph_choice`)."""
        if self.camlir is None:
            return 0
        counters = self.camlir.counters
        return counters["compiles"] + counters["cache_hits"] + counters.get("eager_runs", 0)

    def start_up(self) -> None:
        """One-time start-up (imports, compiler initialisation) on a graph of no workload."""
        import torch

        model = torch.nn.Linear(3, 3)
        loss = model(torch.randn(2, 3)).tanh().sum()
        with self.context():
            loss.backward()
        if self.name == "ca_inductor":
            from torch._dynamo import compiled_autograd

            compiled_autograd.reset()
        elif self.camlir is not None:
            self.camlir.reset()


class Worker:
    def __init__(self, request):
        import torch

        from bench import workloads

        self.torch = torch
        torch.set_num_threads(request["threads"])
        self.variant = Variant(request["variant"].partition("@")[0])  # camlir_cpu@REV: the camlir on PYTHONPATH
        start = time.perf_counter()
        self._with_camlir_info(self.variant.start_up)
        self.startup_s = time.perf_counter() - start
        self.workload = workloads.build(request["workload"])
        self.not_served = 0
        self.steps = 0
        self.routed = 0  # timed camlir backwards that ran on the eager engine (the choice stepped aside)

    def _with_camlir_info(self, fn):
        """Runs fn with camlir's logger at INFO, so its notes are collected, then restores it."""
        logger = logging.getLogger("camlir")
        level = logger.level
        if self.variant.camlir is not None and (level == logging.NOTSET or level > logging.INFO):
            logger.setLevel(logging.INFO)
        try:
            return fn()
        finally:
            logger.setLevel(level)

    def _loss(self):
        w = self.workload
        w.model.zero_grad(set_to_none=True)
        return w.forward(w.model, w.inputs)

    def _backward(self, loss) -> int:
        served = self.variant.served()
        start = time.perf_counter_ns()
        with self.variant.context():
            loss.backward()
        elapsed = time.perf_counter_ns() - start
        if self.variant.camlir is not None and self.variant.served() == served:
            self.not_served += 1
        return elapsed

    def prepare(self, warmup: int) -> dict:
        loss = self._loss()
        first_ns = self._with_camlir_info(lambda: self._backward(loss))
        if self.variant.camlir is not None and hasattr(self.variant.camlir, "wait"):
            # The first backward's program compiles in a worker (docs/compile-service.md): the
            # bench times programs, so it waits for it (`first_s` is the first backward alone).
            self.variant.camlir.wait()
        self.grads = {name: (None if p.grad is None else p.grad.detach().clone())
                      for name, p in self.workload.model.named_parameters()}
        if self.variant.camlir is not None and warmup > 1:
            # camlir decides by measurement on the user's own calls (kernel twins, then the
            # compiled backward against the eager engine after 16 + 40 calls: docs/speed.md).
            # A long training loop runs decided; so does the timed part of the bench.
            warmup = max(warmup, camlir_warmup())
        for _ in range(warmup):
            self._backward(self._loss())
        return {"startup_s": self.startup_s, "first_s": first_ns / 1e9,
                "grads": pickle.dumps(self.grads)}

    def check(self, reference: bytes, rtol: float, atol: float, atol_of_max: float = 0.0) -> dict:
        """'ok', or 'WRONG' and why: this variant's first-step gradients against `reference`;
        each gradient's `atol` is at least `atol_of_max` times its largest reference entry."""
        torch = self.torch
        problems = []
        for name, ref in pickle.loads(reference).items():
            got = self.grads.get(name)
            if (ref is None) != (got is None):
                problems.append(f"{name}: grad is {'None' if got is None else 'set'}, eager's is "
                                f"{'None' if ref is None else 'set'}")
                continue
            if ref is None:
                continue
            try:
                scale = ref.abs().max().item() if ref.numel() else 0.0
                torch.testing.assert_close(got, ref, rtol=rtol, atol=max(atol, atol_of_max * scale))
            except AssertionError:
                if got.shape == ref.shape:
                    diff = f"max abs diff {(got.double() - ref.double()).abs().max().item():.3g}"
                else:
                    diff = f"shape {tuple(got.shape)} vs {tuple(ref.shape)}"
                problems.append(f"{name}: {diff}")
        if problems:
            return {"correct": "WRONG: " + "; ".join(problems[:3]) + (" ..." if len(problems) > 3 else "")}
        return {"correct": "ok"}

    def step(self) -> dict:
        loss = self._loss()
        counters = self.variant.camlir.counters if self.variant.camlir is not None else None
        before = counters.get("eager_runs", 0) if counters is not None else 0
        ns = self._backward(loss)
        if counters is not None and counters.get("eager_runs", 0) > before:
            self.routed += 1
        self.steps += 1
        return {"ns": ns}

    def finish(self) -> dict:
        counters = dict(self.variant.camlir.counters) if self.variant.camlir is not None else {}
        notes = list(self.variant.notes.messages)
        explain = getattr(self.variant.camlir, "explain", None)  # absent in older revisions
        if explain is not None:
            try:  # graph_choice: a structure measured faster on the eager engine runs there
                for event in explain(kind="choice"):
                    if "PyTorch's captured graph" in event.reason or "eager engine" in event.reason:
                        if not any(event.reason in note for note in notes):
                            notes.append(f"graph {event.graph} {event.reason}")
            except Exception:  # noqa: BLE001 - a note is not worth failing the row
                pass
        if self.not_served:
            notes.insert(0, f"{self.not_served} backward calls were not run by camlir")
        ran = "-"
        if self.variant.camlir is not None and self.steps:
            ran = ("compiled" if not self.routed else "eager engine" if self.routed == self.steps
                   else f"mixed: {self.steps - self.routed}/{self.steps} compiled")
        return {"maxrss_mb": _maxrss_mb(), "counters": counters, "notes": notes, "ran": ran}


def camlir_warmup() -> int:
    """Calls until camlir's choices have decided: the kernel choices within graph_choice's
    START calls, then at most MAX_SAMPLES timings a side in blocks (fewer in an older
    camlir, `--baseline`: 12 timings a side, 80 calls)."""
    from camlir import graph_choice as g

    samples = getattr(g, "MAX_SAMPLES", g.SAMPLES)
    blocks_per_side = -(-samples // (g.BLOCK - g.WARM))
    return g.START + 2 * blocks_per_side * g.BLOCK + 16


def _maxrss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _preload(variant: str) -> None:
    """Imports what the variant needs while the driver waits for all workers (not timed)."""
    import torch

    torch.testing.assert_close(torch.zeros(1), torch.zeros(1))  # its first call imports a lot

    if variant == "ca_inductor":
        import torch._inductor.compile_fx  # noqa: F401
    elif variant.startswith("camlir_"):
        import camlir

        camlir.enable, camlir.counters  # noqa: B018 - loads camlir's PyTorch-facing modules


def main() -> None:
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints from the libraries go to stderr, not into the protocol
    requests = sys.stdin.buffer
    _preload(sys.argv[1] if len(sys.argv) > 1 else "")
    write_frame(replies, {"ready": True})
    worker = None  # set by "prepare"; a failed prepare leaves it None
    while True:
        try:
            request = read_frame(requests)
        except EOFError:
            return
        cmd = request["cmd"]
        try:
            if cmd == "prepare":
                worker = Worker(request)
                reply = worker.prepare(request["warmup"])
            elif cmd == "check":
                reply = worker.check(request["reference"], request["rtol"], request["atol"],
                                     request.get("atol_of_max", 0.0))
            elif cmd == "step":
                reply = worker.step()
            elif cmd == "finish":
                write_frame(replies, worker.finish() if worker else {"maxrss_mb": _maxrss_mb()})
                replies.close()
                sys.stderr.flush()
                os._exit(0)  # nothing to clean up; interpreter teardown only costs seconds
            else:
                reply = {"error": f"unknown command {cmd!r}"}
        except Exception as exc:  # noqa: BLE001 - reported to the driver, which carries on
            traceback.print_exc()
            reply = {"error": f"{type(exc).__name__}: {exc}".strip()}
        write_frame(replies, reply)


if __name__ == "__main__":
    main()
