"""Hooking camlir into `backward()`: which calls are captured, with which settings.

`torch.autograd.backward` (which `Tensor.backward` calls) is wrapped while camlir is on
(globally through `camlir.config.enabled`, or inside `camlir.enable()`). A wrapped call runs
the autograd engine under PyTorch's compiled autograd with camlir's compiler function, so
the engine hands camlir one graph of the whole backward. Calls with `create_graph=True`
(double backward) are left to PyTorch.

PyTorch keeps its compiled-autograd cache per graph structure, across calls; on a miss it
explains why ("Cache miss due to ..."). Those reasons are collected through the verbose
logger hook of compiled autograd's C++ side and attached to the capture.
"""

import logging
import threading
import time
from typing import Callable, Optional

import torch
from torch._dynamo import compiled_autograd as ca_mod

from camlir import profiling
from camlir.settings import active_settings, in_use, on_change

_original_backward = torch.autograd.backward
_local = threading.local()  # `inside`: this thread is already in a wrapped backward
_lock = threading.Lock()
# What compiles a captured graph: fn(gm, reasons) -> the callable handed back to the
# autograd engine. Set by camlir.api (`set_compiler`), so that this module never imports
# the compiler above it.
_compiler: list = [None]


def set_compiler(fn: Optional[Callable]) -> None:
    """Sets what compiles each captured graph: `fn(gm, reasons)` returns the callable the
    autograd engine runs for that graph (camlir.api hands it `compiled.CompiledBackward`)."""
    _compiler[0] = fn


def refresh_patch() -> None:
    """Installs the backward wrapper while anything uses camlir, removes it otherwise."""
    with _lock:
        wanted = in_use()
        torch.autograd.backward = _camlir_backward if wanted else _original_backward


class _ReasonCollector(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.reasons = []

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("Cache miss"):
            self.reasons.append(message)


_reasons = _ReasonCollector()
_reason_logger = logging.getLogger("camlir.internal.compiled_autograd")
_reason_logger.setLevel(logging.DEBUG)
_reason_logger.propagate = False
_reason_logger.addHandler(_reasons)


def take_reasons() -> list:
    """The cache-miss reasons compiled autograd logged since the last call, emptying the list.

    E.g. `["Cache miss due to new autograd node: ..."]`; `[]` for a graph's first capture.
    """
    reasons, _reasons.reasons = _reasons.reasons, []
    return reasons


def _the_compiler() -> Callable:
    compile_graph = _compiler[0]
    if compile_graph is None:
        raise RuntimeError("camlir's capture engine has no compiler set: import camlir.api (or use "
                           "camlir.enable / camlir.compile_backward / camlir.config), which sets it "
                           "through camlir.capture.engine.set_compiler")
    return compile_graph


def _compiler_fn(gm):
    return _the_compiler()(gm, take_reasons())


# PyTorch's compiled autograd is one per process: a second compiled backward starting on
# another thread while one runs fails ("Trying to run compiled autograd within another
# compiled autograd call", and a later "Nested Compiled Autograd Contexts" assertion). So
# camlir's backward calls take turns; each is still compiled and exact. (Measured: four
# threads, each training its own model, failed three of four before; all exact now.)
_one_at_a_time = threading.Lock()


def _camlir_backward_impl(tensors, grad_tensors=None, retain_graph=None, create_graph=False,
                     grad_variables=None, inputs=None):
    settings = active_settings()
    if getattr(_local, "inside", False):  # a backward inside a hook of a compiled backward
        return _original_backward(tensors, grad_tensors, retain_graph, create_graph,
                                  grad_variables, inputs=inputs)
    if settings is None or create_graph:
        # Left to PyTorch; it still takes its turn, since a compiled backward running on
        # another thread would capture it too.
        with _one_at_a_time:
            return _original_backward(tensors, grad_tensors, retain_graph, create_graph,
                                      grad_variables, inputs=inputs)
    # Checked before the autograd engine starts: an exception raised from inside compiled
    # autograd's compile step leaves PyTorch's compiled-autograd state broken for later calls.
    _the_compiler()
    _local.inside = True
    profile = profiling.current()
    start = time.perf_counter()
    try:
        with _one_at_a_time, ca_mod._enable(_compiler_fn, dynamic=bool(settings.dynamic)):
            torch._C._dynamo.compiled_autograd.set_verbose_logger(_reason_logger)
            try:
                return _original_backward(tensors, grad_tensors, retain_graph, create_graph,
                                          grad_variables, inputs=inputs)
            finally:
                torch._C._dynamo.compiled_autograd.set_verbose_logger(None)
    finally:
        _local.inside = False
        if profile is not None:
            profile.add_backward(time.perf_counter() - start)


# camlir's capture and compile machinery must never be traced by Dynamo: inside a
# `torch.compile`d function that calls `loss.backward()`, Dynamo would otherwise trace into
# this wrapper and, from there, into the compiler itself (torch-mlir's importer, MLIR
# bindings), breaking it. Disabled, the call is a graph break that runs as plain Python,
# and the backward compiles natively as anywhere else.
_camlir_backward = torch._dynamo.disable(_camlir_backward_impl, recursive=True)


def reset() -> None:
    """Forgets every captured graph (PyTorch's compiled-autograd cache included)."""
    ca_mod.reset()
    take_reasons()


# Follow config.enabled and the enable() scopes from now on, and catch up with any change
# made before this module was imported.
on_change(refresh_patch)
refresh_patch()
