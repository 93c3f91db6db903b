"""What a compiled artifact assumes, and how it is looked up.

An artifact compiled for one captured backward is only right while what the compiler
assumed still holds; this module owns those assumptions and the checks run on every call
to find an artifact that still fits. (Today it holds the hook guard; the lookup of
artifacts by these checks is still in `compiled.py`.)

Hook guard (`HookGuard`). When `camlir.capture.hook_trace.trace_hooks` inlines traced hook
bodies, what the trace assumed is returned as a `HookGuard`: per inlined hook, which
callable was traced (for a Python function: its code object and globals, so that the same
`lambda` created again on the next forward still matches; for anything else: the object)
and every value read from outside that was baked into the body (numbers and strings of
globals, closure cells and default arguments; the identity of the torch/math functions and
modules read from globals; see `camlir.capture.hook_purity.Read`). `HookGuard.holds(hooks)`
checks them on each call.

The hook guard imports nothing of camlir: capture builds it (`trace_hooks` returns one), so
anything it imported from capture would run upward and close a circle.
"""

from __future__ import annotations

import os
import types
from dataclasses import dataclass, field
from typing import Any

__all__ = ["HookGuard", "describe_hook"]


def describe_hook(hook) -> str:
    """`<lambda at file.py:12>` for logs and guard messages."""
    code = getattr(hook, "__code__", None)
    name = getattr(hook, "__qualname__", None) or getattr(hook, "__name__", None) or type(hook).__name__
    name = name.replace("<lambda>", "lambda").replace("<locals>", "locals")
    if code is not None:
        return f"<{name} at {os.path.basename(code.co_filename)}:{code.co_firstlineno}>"
    return f"<{name}>"


# --------------------------------------------------------------------------- the hook guard

@dataclass
class _Inlined:
    """A traced hook: what must be found in its slot for the traced body to be right.

    A plain function matches when it runs the same code object with the same globals and
    every baked value reads the same through it: the traced function itself, or the same
    `lambda` created anew (activation hooks are registered again on every forward). Anything
    else (a builtin torch function) must be the very object that was traced.
    """

    hook_id: int
    label: str
    hook: Any = None  # held only when it has no code (builtins); functions match by code
    code: Any = None
    globals: Any = None
    reads: list = field(default_factory=list)

    def matches(self, h) -> bool:
        if self.code is None:
            return h is self.hook
        return type(h) is types.FunctionType and h.__code__ is self.code and h.__globals__ is self.globals

    def first_change(self, h):
        """The first of `reads` (`hook_purity.Read`s) that no longer holds for `h`, or None."""
        for r in self.reads:
            if not r.holds(h):
                return r
        return None


def _entry(hook_id: int, hook, reads: list) -> _Inlined:
    if isinstance(hook, types.FunctionType):
        return _Inlined(hook_id, describe_hook(hook), code=hook.__code__, globals=hook.__globals__, reads=reads)
    return _Inlined(hook_id, describe_hook(hook), hook=hook, reads=reads)


class HookGuard:
    """What a module with traced hook bodies assumes about the hooks list.

    `inlined` maps each traced hook id to its body symbol, `refused` each hook id that was
    left as a call to the reason (both for logs and tests). `holds(hooks)` is the cheap check
    to run on every backward call: each traced slot holds the traced hook (a function with
    the same code object and globals, see `_Inlined`), and every value the trace baked in
    reads the same. `reason(hooks)` says what changed.
    """

    def __init__(self):
        self.inlined: dict = {}
        self.refused: dict = {}
        self._entries: list = []

    def add_inlined(self, hook_id: int, hook, reads: list, symbol: str) -> None:
        """Records that `hook` (in slot `hook_id`) was traced into `@symbol`, assuming
        `reads` (the `Read`s `hook_purity.check_hook` returned for it)."""
        entry = _entry(hook_id, hook, reads)
        self._entries.append(entry)
        self.inlined[entry.hook_id] = symbol

    def holds(self, hooks) -> bool:
        n = len(hooks)
        for e in self._entries:
            if e.hook_id >= n:
                return False
            h = hooks[e.hook_id]
            if not e.matches(h):
                return False
            for r in e.reads:
                if not r.holds(h):
                    return False
        return True

    def reason(self, hooks) -> str:
        """Why `holds(hooks)` is False ("" when it holds), for the recompile log."""
        for e in self._entries:
            if e.hook_id >= len(hooks):
                return f"hook {e.hook_id} changed: the backward passes only {len(hooks)} hooks"
            h = hooks[e.hook_id]
            if not e.matches(h):
                return f"hook {e.hook_id} changed: {describe_hook(h)} is not the traced hook {e.label}"
            changed = e.first_change(h)
            if changed is not None:
                return f"hook {e.hook_id} {e.label}: {changed.change(h)}"
        return ""

    def __repr__(self) -> str:
        return f"HookGuard(inlined={self.inlined}, refused={self.refused})"
