"""The public API: `compile_backward`, `enable`, `reset`, and `config` (re-exported from
`settings`, so that `camlir.config` loads this module and with it the capture engine).

Importing this module hands `compiled.CompiledBackward` to the capture engine, which
compiles every captured graph with it; the engine itself never imports the compiler."""

import torch

from . import compiled, ddp, logs, pending_program, settings
from . import backend_registry as registry
from . import repro  # noqa: F401 - listens to the driver (events.listen): repros, kept inputs
from .capture import engine
from .settings import Settings, config, scoped  # noqa: F401 - config is re-exported as camlir.config
from .stats import counters

engine.set_compiler(compiled.CompiledBackward)
logs.follow_torch_logs()  # torch has read TORCH_LOGS by now


_prestarted = [False]


def _prestart_service():
    # Once: a loop that opens enable() around each backward switches camlir on every step.
    if not _prestarted[0] and settings.in_use():  # camlir was switched on: a worker starts now
        _prestarted[0] = True
        compiled.prestart_service()


settings.on_change(_prestart_service)
_prestart_service()

ddp.install()  # DistributedDataParallel modules built from now on use the Python reducer


def compile_backward(loss, gradient=None, *, retain_graph=False, backend=None, fullgraph=None):
    """Runs `loss.backward(gradient, retain_graph=...)` through camlir; grads land in `.grad`.

    `loss`: the tensor to differentiate (a scalar, or any shape with `gradient`, a tensor of
    its shape, as in `Tensor.backward`); `retain_graph`: keep the graph for another
    backward. `backend=None` means `camlir.config.backend`; `fullgraph=True` raises
    `camlir.UnsupportedError` instead of falling back to PyTorch (the values of both as in
    `enable`). It waits for a new graph's program (`enable(wait=True)`): this backward runs
    compiled code.

        camlir.compile_backward(model(x).sum())
    """
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"compile_backward expects a tensor, got {type(loss).__name__}")
    with enable(backend=backend, fullgraph=fullgraph, wait=True):
        torch.autograd.backward(loss, gradient, retain_graph=retain_graph)


def enable(backend=None, fullgraph=None, dynamic=None, wait=None) -> scoped:
    """Every `Tensor.backward()` / `torch.autograd.backward()` inside runs through camlir:
    `with camlir.enable(): ...`, or `@camlir.enable()` on a function.

    - `backend`: a registered backend name: "cpu" (native code, the default), "eager" (the
      reference interpreter: every op through torch, for debugging), "gpu" (PTX on a CUDA
      device), or one `camlir.backend_registry.register`ed; None means `config.backend`.
    - `fullgraph`: True raises `camlir.UnsupportedError` naming what would not be compiled
      code, instead of falling back; None means `config.fullgraph` (False).
    - `dynamic`: None (sizes start static, then one program with dynamic sizes after a
      change), True (dynamic sizes from the first backward), False (every new size set is
      compiled with its sizes as constants); None means `config.dynamic`.
    - `wait`: False (the default, `config.wait`) compiles a new graph in a worker process
      while its backwards run on PyTorch's eager engine (same gradients), and its program
      takes over at the first backward after it is ready; True makes the backward wait for
      the program. `camlir.wait()` waits for every compile in flight.

    Bad arguments raise a ValueError here.

        with camlir.enable(backend="cpu", dynamic=True):
            loss.backward()
    """
    try:
        scope = _scopes.get((backend, fullgraph, dynamic, wait))
    except TypeError:  # an unhashable argument: never valid, said below
        scope = None
    if scope is not None and (backend is None or registry.known(backend)):  # it may be unregistered since
        return scope
    if dynamic not in (None, True, False):
        raise ValueError(f"dynamic must be None, True or False, got {dynamic!r}")
    if fullgraph not in (None, True, False):
        raise ValueError(f"fullgraph must be None, True or False, got {fullgraph!r}")
    if wait not in (None, True, False):
        raise ValueError(f"wait must be None, True or False, got {wait!r}")
    scope = scoped(Settings(backend, fullgraph, dynamic, wait))  # checks the backend
    if len(_scopes) < 64:
        _scopes[(backend, fullgraph, dynamic, wait)] = scope
    return scope


# One scope per distinct argument set, handed out again: a scope keeps no state of its own
# (entering pushes its settings on the calling thread's stack), so one object may be open
# on several threads or nested, and its resolved settings stay cached. `with enable():`
# around every backward then costs a dict lookup, not a new scope.
_scopes: dict = {}


def wait(timeout=None) -> bool:
    """Blocks until every compile in flight (in the compile workers) has finished and its
    program is loaded, so the next backward of each graph runs compiled code; returns False
    if `timeout` seconds passed first. For tests, benchmarks, and users who prefer to wait
    once after the first step:

        loss.backward()   # the first backward of a new graph: runs eagerly while it compiles
        camlir.wait()     # its program is ready; later backwards run it
    """
    return pending_program.wait_all(timeout)


def clear_disk_cache() -> int:
    """Empties the disk cache (`CAMLIR_CACHE_DIR`, or the per-user default); returns how many
    entries it removed. No arguments. The same from a shell: `python -m camlir.disk_store
    clear`. `camlir.config.disk_cache = False` (or `CAMLIR_DISK_CACHE=0`) stops using it.

        removed = camlir.clear_disk_cache()   # e.g. 3
    """
    from . import disk_cache

    return disk_cache.clear()


def reset() -> None:
    """Clears the counters, the events of `explain()` and every in-memory cache (captured
    graphs, compiled artifacts, routes), so the next backward of each graph is captured
    again. No arguments. The disk cache stays: `clear_disk_cache()` empties it.

        camlir.reset()
        assert camlir.counters["compiles"] == 0
    """
    engine.reset()
    compiled.forget_graphs()
    counters.clear()
