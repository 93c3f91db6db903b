"""Backends by name: what `enable(backend=...)` and `camlir.config.backend` accept.

The built-in backends are listed here by the module that defines them and imported when
first asked for, so that naming a backend costs no import (the gpu backend loads llvmlite).
Adding a backend is its own folder plus one line: a row of `_BUILTIN`, or a call of
`register(MyBackend())` from anywhere (a test file registers a toy one).

This module imports nothing of camlir at load time: `settings.py` asks it for the names, so
it stands below everything (the backends themselves are loaded by name, on first use).
"""

import importlib

_BUILTIN = {
    "eager": "camlir.backends.eager:EagerBackend",
    "cpu": "camlir.backends.cpu.compiler:CpuBackend",
    "gpu": "camlir.backends.gpu.compiler:GpuBackend",
}
_made: dict = {}
_registered: dict = {}


def register(backend) -> None:
    """Makes `backend` (a `backends.base.Backend`) available under `backend.name`; a later
    registration of the same name replaces it."""
    if not getattr(backend, "name", "") or not isinstance(backend.name, str):
        raise ValueError(f"a backend needs a name, got {backend!r}")
    _registered[backend.name] = backend


def unregister(name: str) -> None:
    """Removes a backend registered with `register` (the built-in ones stay)."""
    _registered.pop(name, None)


def known(name) -> bool:
    """Whether `name` names a backend (two dict lookups: `enable()` asks on every call)."""
    return name in _registered or name in _BUILTIN


def names() -> tuple:
    """Every backend name, built-in first."""
    return tuple(_BUILTIN) + tuple(n for n in _registered if n not in _BUILTIN)


def get(name: str):
    """The backend called `name`; a ValueError listing the backends when there is none."""
    if name in _registered:
        return _registered[name]
    if name in _made:
        return _made[name]
    if name not in _BUILTIN:
        raise ValueError(f"unknown camlir backend {name!r}; available: {', '.join(names())}")
    module, cls = _BUILTIN[name].split(":")
    _made[name] = getattr(importlib.import_module(module), cls)()
    return _made[name]
