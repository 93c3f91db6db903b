"""camlir: a compiled-autograd compiler for PyTorch built on MLIR.

    import camlir
    camlir.compile_backward(loss)            # one backward
    with camlir.enable(backend="cpu"):       # every backward in the scope ("eager": reference)
        loss.backward()
    camlir.config.enabled = True             # every backward in the process
    camlir.explain()                         # why each capture and compile happened

The public API (`help(camlir.<name>)` for each one's arguments, values and an example):
- `enable(backend, fullgraph, dynamic, wait)`: backwards in a scope (or decorated function)
  run through camlir; `config`: the same settings process-wide (`config.enabled = True`);
- `compile_backward(loss, ...)`: one backward through camlir, waiting for its program;
- `wait(timeout)`: block until every compile in flight is loaded;
- `explain(graph, kind)`, `explain_text(graph)`: why each capture, compile, fallback and
  recompile happened, with timings; `counters`: the running totals;
- `profile()`: where each backward's time goes (`.table()`);
- `captured_graphs()`, `compiled_programs()`, `summarize(text)`, `draw(path)`: the captured
  `ca` modules, the compiled programs, what a module holds, an SVG of a graph;
- `save_repro(directory)`: a standalone repro of a captured backward;
- `set_logs(spec)`: log kinds, as `CAMLIR_LOGS`; `make_context()`: an MLIR context that reads
  camlir's IR; `reset()`, `clear_disk_cache()`: forget what is in memory, on disk;
- `UnsupportedError`: what `fullgraph=True` raises instead of falling back.
Environment variables: docs/environment.md; every doc: docs/README.md.

The PyTorch-facing API is loaded on first use, so the MLIR tools (`ca-opt`) start without
importing torch.
"""

import importlib
import sys

__version__ = "0.1.0"

_LAZY = {
    "compile_backward": "api", "enable": "api", "reset": "api", "clear_disk_cache": "api", "wait": "api",
    "captured_graphs": "compiled", "compiled_programs": "compiled", "summarize": "summary",
    # "config" loads api (which re-exports it) so that the capture engine is registered and
    # has its compiler: `camlir.config.enabled = True` alone must patch backward.
    "config": "api", "counters": "stats", "UnsupportedError": "errors",
    "set_logs": "logs", "make_context": "context", "explain": "events", "explain_text": "events",
    "profile": "profiling", "save_repro": "repro", "draw": "drawing",
}
__all__ = sorted(_LAZY)


if "torch" in sys.modules:  # DDP modules built after `import camlir` can then compile (ddp.py)
    from . import ddp as _ddp

    _ddp.install()


_SUBMODULES = ("repro", "backend_registry")  # `camlir.repro.keep_inputs = True` works without importing it first


def __dir__():
    """The public API (loaded on first use, so `dir()` alone lists it), then the rest."""
    return sorted(set(__all__) | set(_SUBMODULES) | set(globals()))


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'camlir' has no attribute {name!r}")
