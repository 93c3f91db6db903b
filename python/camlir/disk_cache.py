"""Compiled backward programs kept on disk, across processes.

PyTorch cannot put a compiled-autograd graph in its own caches (pytorch #148491), so every
new process compiles its backward again. camlir keeps its cpu programs in a `DiskStore`
(`disk_store.py`: atomic writes, verified reads, an LRU size bound), under a key computed
from what the autograd engine hands over, before any of the expensive stages run:

- the captured graph: compiled autograd's FX code for it (`gm.code`);
- every input's kind, dtype, shape, strides, requires_grad and whether it is a parameter;
  the lifted sizes and scalars, by value;
- every entry of the hooks list the re-trace reads: a custom Function's backward (its
  code, constants and the simple values of the globals it reads), a hook function's
  code; what cannot be fingerprinted makes the graph unkeyable (not stored);
- the backend, the `dynamic` setting and which program of a capture it is (its first, a
  size set's, the dynamic-size one);
- the environment (`environment()`): camlir's own sources (a hash of every file), the
  versions of torch and torch-mlir (MLIR), Python, the machine and its CPU features.

An entry holds one artifact: the `ca` module (so that a symbolic capture can compile a
new program for another size set without re-tracing), what the re-trace's guards need
(the symbolic shape guards as an expression, the static shapes of parameters, the ctx
values it baked in), and for a static capture, the program (`backends/cpu/persist.py`).
A symbolic capture's programs are entries of their own, keyed on the artifact's key plus
the size set (or "dynamic").

Not stored (logged at debug level), so always compiled: programs with inlined Python hook
bodies (their guard matches code objects, which only live in one process), programs the
cpu backend could not compile (interpreted), ctx values that are not plain numbers or
strings, and the reference backend's programs.

Stores run on a background thread (linking the machine code takes ~0.2 s); the process
waits for them at exit. `config.disk_cache = False` (or `CAMLIR_DISK_CACHE=0`) turns the
whole thing off; `camlir.clear_disk_cache()` or `python -m camlir.disk_store clear`
empties it.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import importlib.util
import os
import platform
import sys
import threading
import types
from typing import Optional

import torch

from camlir import environment as environment_variables  # not `environment`: environment() below
from camlir import logs
from camlir.cache import ValueGuard
from camlir.capture.retrace import CompiledGuards, static_dims_hold
from camlir.disk_store import DiskStore

FORMAT = 2  # 2: static dims of size 0/1 are checked (entries of 1 lack that check)
_SIMPLE = (int, float, bool, str, type(None))


# --------------------------------------------------------------------------- environment

_environment: list = []


def environment() -> str:
    """What decides the generated code besides the graph: camlir's sources, torch, MLIR,
    Python, the machine and its CPU (computed once per process)."""
    if not _environment:
        h = hashlib.sha256()
        for package in ("camlir", "camlir.dialects", "camlir.passes"):
            spec = importlib.util.find_spec(package)
            for root in sorted(spec.submodule_search_locations or []):
                for dirpath, dirnames, filenames in sorted(os.walk(root)):
                    dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
                    for name in sorted(filenames):
                        if name.endswith((".py", ".mlir", ".td")):
                            h.update(os.path.relpath(os.path.join(dirpath, name), root).encode())
                            with open(os.path.join(dirpath, name), "rb") as f:
                                h.update(f.read())
        parts = [h.hexdigest(), torch.__version__, _version("torch-mlir"), sys.version, platform.machine(),
                 torch.backends.cpu.get_cpu_capability(), _cpu_features()]
        _environment.append(hashlib.sha256("\n".join(parts).encode()).hexdigest())
    return _environment[0]


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "unknown"


def _cpu_features() -> str:
    """The CPU model and feature flags (the JIT compiles for this host's CPU)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("model name", "flags", "Features", "CPU part"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor()


# --------------------------------------------------------------------------- the key

class Unkeyable(Exception):
    """Something the program depends on has no stable fingerprint across processes."""


def _code_fingerprint(code: types.CodeType, h, globals_: Optional[dict] = None, depth: int = 0) -> None:
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    h.update(repr(code.co_varnames).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            if depth < 8:
                _code_fingerprint(const, h, globals_, depth + 1)
        else:
            h.update(repr(const).encode())
    if globals_ is not None:
        for name in code.co_names:
            value = globals_.get(name, None)
            if isinstance(value, _SIMPLE):
                h.update(f"{name}={value!r};".encode())


def _function_fingerprint(fn, h) -> None:
    if isinstance(fn, (staticmethod, classmethod)):
        fn = fn.__func__
    if isinstance(fn, types.MethodType):
        fn = fn.__func__
    code = getattr(fn, "__code__", None)
    if code is None:
        h.update(f"<{type(fn).__module__}.{type(fn).__qualname__}>".encode())
        return
    h.update(f"{fn.__module__}.{fn.__qualname__}".encode())
    _code_fingerprint(code, h, getattr(fn, "__globals__", None))
    for cell in fn.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:
            value = None
        h.update(repr(value).encode() if isinstance(value, _SIMPLE) else type(value).__qualname__.encode())
    h.update(repr(fn.__defaults__ if all(isinstance(d, _SIMPLE) for d in fn.__defaults__ or ()) else
                  len(fn.__defaults__ or ())).encode())


def _hook_fingerprint(obj, h) -> None:
    forward_cls = getattr(type(obj), "_forward_cls", None)
    if forward_cls is not None:  # a custom Function's ctx: its backward is traced into the program
        h.update(f"Function {forward_cls.__module__}.{forward_cls.__qualname__}".encode())
        for attr in ("backward", "vjp"):
            fn = forward_cls.__dict__.get(attr)
            if fn is not None:
                _function_fingerprint(fn, h)
        return
    if isinstance(obj, types.FunctionType) or callable(obj):
        _function_fingerprint(obj, h)
        return
    if isinstance(obj, _SIMPLE):
        h.update(repr(obj).encode())
        return
    raise Unkeyable(f"hooks entry of type {type(obj).__qualname__}")


def _value_fingerprint(v, h) -> None:
    if isinstance(v, torch.Tensor):
        if v.layout != torch.strided:  # no strides to key on (`stride()` raises for sparse CSR)
            raise Unkeyable(f"a graph argument with layout {v.layout}")
        h.update(f"T{v.dtype}{tuple(v.shape)}{v.stride()}{v.storage_offset()}{v.device}{v.layout}"
                 f"{v.requires_grad}{isinstance(v, torch.nn.Parameter)}{type(v).__qualname__};".encode())
    elif isinstance(v, _SIMPLE):
        h.update(f"{type(v).__name__}:{v!r};".encode())
    elif isinstance(v, (list, tuple)):
        h.update(b"[")
        for x in v:
            _value_fingerprint(x, h)
        h.update(b"]")
    else:
        raise Unkeyable(f"graph argument of type {type(v).__qualname__}")


def graph_key(gm, inputs, sizes, scalars, hooks, backend: str, dynamic) -> Optional[str]:
    """The key of one capture's artifact, or None when it cannot be keyed (logged)."""
    try:
        h = hashlib.sha256()
        h.update(f"camlir disk cache {FORMAT}\n{environment()}\n{backend}\n{dynamic!r}\n".encode())
        if any(isinstance(v, torch.Tensor) for v in vars(gm).values()) or list(gm.named_buffers()):
            raise Unkeyable("the captured graph holds tensors")
        h.update(gm.code.encode())
        for v in inputs:
            _value_fingerprint(v, h)
        h.update(b"|sizes")
        _value_fingerprint([int(s) for s in sizes], h)
        h.update(b"|scalars")
        _value_fingerprint(list(scalars), h)
        h.update(b"|hooks")
        for hook in hooks:
            _hook_fingerprint(hook, h)
        return h.hexdigest()
    except Unkeyable as exc:
        logs.log.debug("not using the disk cache for this graph: %s", exc)
        return None


def program_key(artifact_key: str, variant: str) -> str:
    """The key of one program of a symbolic capture: "dynamic", or a size set's text."""
    return hashlib.sha256(f"{artifact_key}\n{variant}".encode()).hexdigest()


# --------------------------------------------------------------------------- guards

class StoredGuards:
    """The re-trace's guards, as stored: what `Artifacts.find` asks of an artifact's
    `retraced` (`symbolic`, `guards_hold`, `value_guard`), without the trace."""

    def __init__(self, symbolic: bool, guards_code: Optional[str], static_shapes: dict, value_guard: ValueGuard):
        self.symbolic = symbolic
        self.guards_code = guards_code
        self._guards = CompiledGuards(guards_code)
        self.static_shapes = static_shapes
        self.value_guard = value_guard

    def guards_hold(self, inputs, sizes) -> bool:
        if not self.symbolic:
            return True
        if not static_dims_hold(self.static_shapes, inputs):
            return False
        return self._guards(list(inputs) + list(sizes))


def guards_meta(retraced) -> dict:
    """The re-trace's guards as JSON; raises Unkeyable for a ctx value that is not plain."""
    values = []
    for (slot, attribute), (value, by_value, label) in retraced.value_guard.entries.items():
        if attribute == "_forward_cls" and not by_value:
            continue  # the custom Function itself: its name and backward's code are in the key
        if not by_value or not isinstance(value, _SIMPLE) or (isinstance(value, float) and value != value):
            raise Unkeyable(f"{label} is baked by identity or is not a plain value")
        values.append([slot, attribute, value, label])
    return {
        "symbolic": retraced.symbolic,
        "guards_code": retraced.guards_code() if retraced.symbolic else None,
        "static_shapes": [[i, list(s)] for i, s in retraced.static_shapes.items()],
        "values": values,
    }


def guards_from_meta(meta: dict) -> StoredGuards:
    """The guards `guards_meta` stored, ready to check calls against."""
    guard = ValueGuard()
    for slot, attribute, value, label in meta["values"]:
        guard.add(slot, attribute, value, True, label)
    return StoredGuards(meta["symbolic"], meta["guards_code"],
                        {i: tuple(s) for i, s in meta["static_shapes"]}, guard)


# --------------------------------------------------------------------------- the store

_stores: dict = {}
_writer: list = []
_writer_lock = threading.Lock()


def store() -> DiskStore:
    """The store for the current `CAMLIR_CACHE_DIR` (or the per-user default)."""
    from camlir.disk_store import default_directory

    directory = default_directory()
    if directory not in _stores:
        _stores[directory] = DiskStore(directory)
    return _stores[directory]


def enabled() -> bool:
    """Whether the disk cache is on: `config.disk_cache`, unless `CAMLIR_DISK_CACHE=0`."""
    from camlir.settings import config

    return config.disk_cache and environment_variables.flag("CAMLIR_DISK_CACHE")


def put_later(key: str, make_files) -> None:
    """Stores `make_files() -> (files, meta)` under `key` on the background writer thread.
    Failures are logged, never raised."""
    target = store()

    def write():
        try:
            files, meta = make_files()
            target.put(key, files, meta)
        except Exception as exc:  # noqa: BLE001 - a cache write must never break a backward
            logs.log.info("not stored in the disk cache: %s: %s", type(exc).__name__, exc)

    with _writer_lock:
        if not _writer:
            _writer.append(concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="camlir-disk"))
        _writer[0].submit(write)


def flush() -> None:
    """Waits until every store started so far is written (tests; process exit does it too)."""
    with _writer_lock:
        writer = _writer.pop() if _writer else None
    if writer is not None:
        writer.shutdown(wait=True)


def clear() -> int:
    """Empties the disk cache (`camlir.clear_disk_cache()`); returns the entries removed."""
    flush()
    return store().clear()
