"""`camlir.config`: the process-wide settings, and the per-thread `enable()` scopes over them.

    camlir.config.enabled = True   # every backward in the process goes through camlir
    camlir.config.backend = "cpu"  # the default; "eager" is the reference interpreter
    camlir.config.fullgraph = False
    camlir.config.dynamic = None   # None: sizes start static; after a change, compiled dynamic
    camlir.config.recompile_limit = 8  # compiles per graph before it runs uncompiled
    camlir.config.disk_cache = True    # keep compiled programs on disk across processes
    camlir.config.wait = False         # True: a backward waits for its program to compile
    camlir.config.compile_workers = None  # worker processes that compile (0: in this process)
    camlir.config.compile_timeout_s = 120.0  # a compile running longer is killed

Bad values are rejected when set, with a message that says what is accepted.

`scoped(Settings(...))` (what `camlir.enable()` opens) overrides them on one thread;
`active_settings()` is what a backward on this thread runs with. This module imports
nothing of camlir but the backend registry (which itself imports nothing at load time):
whoever must follow whether camlir is in use (the capture engine, which
patches `torch.autograd.backward`) registers with `on_change` and is called whenever
`config.enabled` changes or a scope opens or closes; `in_use()` then says whether anything
wants camlir.
"""

import contextlib
import difflib
import threading
from dataclasses import dataclass
from typing import Callable, Optional

from camlir import backend_registry as registry


class Config:
    """The type of `camlir.config`: the process-wide settings.

    `enabled` (bool; setting it notifies the `on_change` listeners), `backend` (a name
    `backend_registry` knows: "cpu", "eager", "gpu", or one registered), `fullgraph`
    (bool), `dynamic` (None, True or False) and
    `recompile_limit` (an int >= 1: how many programs one captured graph may compile before
    camlir warns and runs that graph uncompiled). `backend`, `dynamic` and
    `recompile_limit` are checked when set: `config.backend = "tpu"` raises a ValueError
    that lists the backends; `enabled`, `fullgraph` and `disk_cache` take a bool
    (`config.fullgraph = "no"` is a ValueError, not True), and a name that is not a setting
    (`config.recompile_limt = 3`) is an AttributeError that names the closest setting.

    `wait` (bool, default False): False compiles a new graph in a worker process while its
    backwards run on PyTorch's eager engine, and the program takes over at the first backward
    after it is ready; True makes that backward wait for the program (as `compile_backward`
    and `enable(wait=True)` do). `compile_workers` (None: `CAMLIR_COMPILE_WORKERS`, else the
    cores left over, at least 1; 0 compiles in this process, blocking) and
    `compile_timeout_s` (a number > 0, default `CAMLIR_COMPILE_TIMEOUT_S` or 120: a compile
    running longer has its worker killed and the graph stays on the eager engine); see
    docs/compile-service.md.

    `dynamic`: None (the default) compiles the first sizes a graph sees as constants, and
    once they change, one program with dynamic sizes for all later ones; True compiles with
    dynamic sizes from the first backward; False compiles every new size set as constants.

        camlir.config.enabled = True        # every backward in the process, from now on
        camlir.config.recompile_limit = 4
        camlir.config.wait = True           # the first backward waits for its program
    """

    SETTINGS = ("enabled", "backend", "fullgraph", "dynamic", "recompile_limit", "disk_cache", "wait",
                "compile_workers", "compile_timeout_s")
    _BOOLS = ("fullgraph", "disk_cache", "wait")

    def __setattr__(self, name, value):
        if not name.startswith("_"):
            if name not in Config.SETTINGS:
                close = difflib.get_close_matches(name, Config.SETTINGS, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f"; the settings: {', '.join(Config.SETTINGS)}"
                raise AttributeError(f"camlir.config has no setting {name!r}{hint}")
            if name in Config._BOOLS:
                value = _bool(name, value)
        # Every change bumps `_version`, which `Settings.resolved` caches against (resolving
        # anew cost ~1.5 us of every backward).
        super().__setattr__(name, value)
        object.__setattr__(self, "_version", getattr(self, "_version", 0) + 1)

    def __init__(self):
        self._enabled = False
        self._backend = "cpu"
        self.fullgraph = False
        self._dynamic = None
        self._recompile_limit = 8
        self.disk_cache = True  # see camlir/disk_cache.py; CAMLIR_DISK_CACHE=0 also turns it off
        self.wait = False
        self._compile_workers = None
        self._compile_timeout_s = None

    @property
    def enabled(self) -> bool:
        return self._enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        self._enabled = _bool("enabled", value)
        _notify()

    @property
    def backend(self) -> str:
        return self._backend

    @backend.setter
    def backend(self, value: str) -> None:
        self._backend = check_backend(value)

    @property
    def dynamic(self):
        return self._dynamic

    @dynamic.setter
    def dynamic(self, value) -> None:
        if value not in (None, True, False):
            raise ValueError(f"camlir.config.dynamic must be None, True or False, got {value!r}")
        self._dynamic = value


    @property
    def recompile_limit(self) -> int:
        return self._recompile_limit

    @recompile_limit.setter
    def recompile_limit(self, value) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"camlir.config.recompile_limit must be an int >= 1, got {value!r}")
        self._recompile_limit = value


    @property
    def compile_workers(self):
        return self._compile_workers

    @compile_workers.setter
    def compile_workers(self, value) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"camlir.config.compile_workers must be None or an int >= 0, got {value!r}")
        self._compile_workers = value

    @property
    def compile_timeout_s(self):
        return self._compile_timeout_s

    @compile_timeout_s.setter
    def compile_timeout_s(self, value) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
            raise ValueError(f"camlir.config.compile_timeout_s must be None or a number > 0, got {value!r}")
        self._compile_timeout_s = value


def _bool(name: str, value) -> bool:
    """`value` as a setting's bool: True/False (or 1/0); anything else is a ValueError, so
    that `config.fullgraph = "no"` does not silently mean True."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ValueError(f"camlir.config.{name} must be True or False, got {value!r}")


def check_backend(value) -> str:
    """Returns `value` if it names a registered backend, else raises a ValueError listing
    them."""
    if not isinstance(value, str) or not registry.known(value):
        raise ValueError(f"unknown camlir backend {value!r}; available: {', '.join(registry.names())}")
    return value


config = Config()


# --------------------------------------------------------------------------- scopes

@dataclass(frozen=True)
class Settings:
    """What one `enable()` scope sets; None fields fall back to `config` (`resolved()`)."""

    backend: Optional[str] = None
    fullgraph: Optional[bool] = None
    dynamic: Optional[bool] = None
    wait: Optional[bool] = None

    def resolved(self) -> "Settings":
        cached = self.__dict__.get("_resolved")
        if cached is not None and cached[0] == config._version:
            return cached[1]
        resolved = Settings(
            backend=self.backend if self.backend is not None else config.backend,
            fullgraph=self.fullgraph if self.fullgraph is not None else config.fullgraph,
            dynamic=self.dynamic if self.dynamic is not None else config.dynamic,
            wait=self.wait if self.wait is not None else config.wait,
        )
        object.__setattr__(self, "_resolved", (config._version, resolved))
        return resolved


_local = threading.local()
_lock = threading.Lock()
_scoped = {"count": 0}  # enable() scopes open on any thread
_listeners: list = []


def _stack() -> list:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def active_settings() -> Optional[Settings]:
    """The settings in force for a backward on this thread, or None when camlir is off."""
    stack = getattr(_local, "stack", None)
    if stack:
        return stack[-1].resolved()
    if config._enabled:
        return _GLOBAL.resolved()
    return None


_GLOBAL = Settings()  # what a backward outside any scope runs with (resolved against config)


def open_scopes() -> int:
    """How many `scoped()` blocks are open, on all threads together."""
    with _lock:
        return _scoped["count"]


def in_use() -> bool:
    """Whether anything wants camlir: `config.enabled`, or a scope open on any thread."""
    return config._enabled or _scoped["count"] > 0  # an int read needs no lock


def on_change(callback: Callable[[], None]) -> Callable[[], None]:
    """Calls `callback()` whenever `config.enabled` is set, the first scope opens or the last
    one closes (after the change, on the thread that made it). Registering twice calls it
    once."""
    if callback not in _listeners:
        _listeners.append(callback)
    return callback


def _notify() -> None:
    for callback in list(_listeners):
        callback()


class scoped(contextlib.ContextDecorator):
    """Runs the block with `settings` over `config` on this thread (what `enable()` opens);
    also a decorator. A class, not a generator: a bench that opens `camlir.enable()` around
    each backward paid ~14 us per W1 step for the generator version (two generators, their
    frames, re-checks)."""

    __slots__ = ("settings",)

    def __init__(self, settings: Settings):
        if settings.backend is not None:
            check_backend(settings.backend)
        self.settings = settings

    def __enter__(self):
        stack = getattr(_local, "stack", None)
        if stack is None:
            stack = _local.stack = []
        stack.append(self.settings)
        with _lock:
            _scoped["count"] += 1
            first = _scoped["count"] == 1
        if first:  # only a change of `in_use()` is news to the listeners
            _notify()
        return None

    def __exit__(self, *exc_info):
        _local.stack.pop()
        with _lock:
            _scoped["count"] -= 1
            last = _scoped["count"] == 0
        if last:
            _notify()
        return False
