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

import contextlib
import logging
import threading
from dataclasses import dataclass
from typing import Optional

import torch
from torch._dynamo import compiled_autograd as ca_mod

from camlir.settings import check_backend, config

_original_backward = torch.autograd.backward
_local = threading.local()


@dataclass(frozen=True)
class Settings:
    backend: Optional[str] = None
    fullgraph: Optional[bool] = None
    dynamic: Optional[bool] = None

    def resolved(self) -> "Settings":
        return Settings(
            backend=self.backend if self.backend is not None else config.backend,
            fullgraph=self.fullgraph if self.fullgraph is not None else config.fullgraph,
            dynamic=self.dynamic if self.dynamic is not None else config.dynamic,
        )


def _stack() -> list:
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


def active_settings() -> Optional[Settings]:
    """The settings in force for a backward on this thread, or None when camlir is off."""
    stack = _stack()
    if stack:
        return stack[-1].resolved()
    if config.enabled:
        return Settings().resolved()
    return None


@contextlib.contextmanager
def scoped(settings: Settings):
    if settings.backend is not None:
        check_backend(settings.backend)
    _stack().append(settings)
    with _lock:
        _scoped["count"] += 1
    refresh_patch()
    try:
        yield
    finally:
        _stack().pop()
        with _lock:
            _scoped["count"] -= 1
        refresh_patch()


_lock = threading.Lock()
_scoped = {"count": 0}  # enable() scopes open on any thread


def refresh_patch() -> None:
    """Installs the backward wrapper while anything uses camlir, removes it otherwise."""
    with _lock:
        wanted = config.enabled or _scoped["count"] > 0
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
    reasons, _reasons.reasons = _reasons.reasons, []
    return reasons


def _compiler_fn(gm):
    from camlir.compiled import CompiledBackward

    return CompiledBackward(gm, take_reasons())


def _camlir_backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False,
                     grad_variables=None, inputs=None):
    settings = active_settings()
    if settings is None or create_graph or getattr(_local, "inside", False):
        return _original_backward(tensors, grad_tensors, retain_graph, create_graph,
                                  grad_variables, inputs=inputs)
    _local.inside = True
    try:
        with ca_mod._enable(_compiler_fn, dynamic=bool(settings.dynamic)):
            torch._C._dynamo.compiled_autograd.set_verbose_logger(_reason_logger)
            try:
                return _original_backward(tensors, grad_tensors, retain_graph, create_graph,
                                          grad_variables, inputs=inputs)
            finally:
                torch._C._dynamo.compiled_autograd.set_verbose_logger(None)
    finally:
        _local.inside = False


def reset() -> None:
    """Forgets every captured graph (PyTorch's compiled-autograd cache included)."""
    ca_mod.reset()
    take_reasons()
