"""What a compiled artifact assumes, and how it is looked up.

An artifact compiled for one captured backward is only right while what the compiler
assumed still holds; this module owns those assumptions and the checks run on every call
to find an artifact that still fits:

- `Artifact`: one compiled program with what it assumes (backend, the re-trace's shape
  guards, the hook guard); `Artifacts.find` is the lookup each backward call makes.
- `SizeVariants`: a symbolic capture's programs on a backend that compiles static sizes:
  one program with runtime sizes, or (where that cannot be compiled, or with
  `dynamic=False`) one per observed size set; each carries the hook guard of its own trace
  (hooks are traced after specialization).
- `HookGuard`: what inlined hook bodies assume about the hooks list.
- `ValueGuard`: the Python values a re-trace baked in, read again from the objects the
  engine passes in the hooks list (a custom Function's `ctx`); see capture/baked_values.py.

Everything here lives in memory, per process; `camlir.reset()` forgets it.

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

from camlir.pending_program import CompileAbandoned, PendingProgram
from camlir.variant import Variant

__all__ = ["Artifact", "Artifacts", "HookGuard", "RecompileLimitReached", "SizeVariants", "ValueGuard",
           "describe_hook"]


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


# --------------------------------------------------------------------------- baked values

class ValueGuard:
    """Attributes of objects in the hooks list whose values a re-trace baked in.

    Each entry is (slot, attribute, value, by_value): `getattr(hooks[slot], attribute)`
    must still be `value` (equal with the same type when `by_value`, the same object
    otherwise). Empty guards hold trivially and cost nothing per call.
    """

    def __init__(self):
        self.entries: dict = {}  # (slot, attribute) -> (value, by_value, label)

    def add(self, slot: int, attribute: str, value, by_value: bool, label: str) -> None:
        self.entries.setdefault((slot, attribute), (value, by_value, label))

    def _changed(self, hooks):
        for (slot, attribute), (value, by_value, label) in self.entries.items():
            try:
                now = getattr(hooks[slot], attribute)
            except Exception:  # noqa: BLE001 - a missing slot or attribute is a change
                return label, value, "<missing>"
            same = (type(now) is type(value) and (now == value or (now != now and value != value))
                    if by_value else now is value)
            if not same:
                return label, value, now
        return None

    def holds(self, hooks) -> bool:
        return not self.entries or self._changed(hooks) is None

    def reason(self, hooks) -> str:
        """Why `holds(hooks)` is False ("" when it holds), for the recompile log."""
        changed = self._changed(hooks)
        if changed is None:
            return ""
        label, old, new = changed
        return f"{label} changed from {old!r} to {new!r}"


# --------------------------------------------------------------------------- artifacts

@dataclass
class Artifact:
    """One compiled program for a captured backward, and what it assumes.

    `retraced` holds the re-trace's shape guards (symbolic captures), `hook_guard` what the
    inlined hook bodies assume (None: nothing inlined, or the program checks per variant),
    `scalars` the values of the graph's lifted scalars it was traced with: the re-trace
    bakes them in as constants (PyTorch lifts a number an autograd node saved, e.g. an int
    in a C++ Function's `saved_data`, and captures once for every value).
    """

    retraced: Any
    module: Any
    program: Any
    backend: str
    hook_guard: Any = None
    scalars: tuple = ()


class Artifacts:
    """The artifacts of one captured graph, tried in the order they were compiled."""

    def __init__(self):
        self.items: list = []

    def add(self, artifact: Artifact) -> None:
        self.items.append(artifact)

    def find(self, backend: str, inputs, sizes, hooks, on_miss=None, scalars=()):
        """The first artifact for `backend` whose guards hold for this call, or None.
        `on_miss(reason)` hears why an artifact whose shapes fit was passed over."""
        for artifact in self.items:
            if artifact.backend != backend or not artifact.retraced.guards_hold(inputs, sizes):
                continue
            changed = scalar_change(artifact.scalars, scalars)
            if changed:
                if on_miss is not None:
                    on_miss(changed)
                continue
            values = artifact.retraced.value_guard
            if not values.holds(hooks):
                if on_miss is not None:
                    on_miss(values.reason(hooks))
                continue
            guard = artifact.hook_guard
            if guard is None or guard.holds(hooks):
                return artifact
            if on_miss is not None:
                on_miss(guard.reason(hooks))
        return None


def scalar_change(traced: tuple, now) -> str:
    """Why a program traced with the lifted scalars `traced` does not fit this call's
    `now` ("" when it does): a value or its type changed (NaN matches NaN)."""
    now = tuple(now)
    if len(now) != len(traced):
        return f"scalars changed: {len(traced)} traced, {len(now)} now"
    for i, (old, new) in enumerate(zip(traced, now)):
        if type(old) is not type(new) or not (old == new or (old != old and new != new)):
            return f"scalar {i} changed from {old!r} to {new!r}"
    return ""


@dataclass
class _Variant:
    program: Any
    guard: Any  # HookGuard of this variant's hook trace, or None


class RecompileLimitReached(RuntimeError):
    """Raised by the driver's compile gate when a graph has compiled `recompile_limit`
    programs and needs another; the driver then runs that graph uncompiled."""


class SizeVariants:
    """A symbolic capture's programs on a backend that compiles static sizes: one program
    with runtime sizes, or one per size set.

    Where the backend has runtime sizes and `runtime_sizes` is asked for (the default once
    sizes have changed), the first call compiles one program whose kernels take their sizes
    at run time, and every later size set the trace's guards accept runs it: N sizes cost
    one compile. Where that compile fails (an op the dynamic lowering refuses), or without
    it, each size set gets a program with its sizes as constants (static shapes let the
    loops vectorize fully).

    `build(variant, args, hooks, interpret_on_failure) -> (program, hook_guard)` is the
    driver's (`CompiledBackward.build`): it runs the backend's stages for a
    `variant.Variant` and applies the one fallback policy (with `interpret_on_failure`
    False it raises instead, and this class specializes). Every compile goes through
    `compiling(what, reason, old, new, make) -> make()`, the driver's gate, which counts,
    times, records and limits it (it raises `RecompileLimitReached`, which passes through).
    The specialized key is the lifted sizes plus the shapes of the arguments with symbolic
    dims; a program whose hook guard fails is compiled again for the new hooks. With
    `stored` (the disk cache), a program is looked up there before it is compiled, and
    stored once it is.
    """

    def __init__(self, n_inputs: int, shaped_args: list, build, compiling, runtime_sizes: bool = True,
                 stored=None):
        self.stored = stored  # .load(name) -> (program, guard) | None, .save(name, program, guard): disk
        self.n_inputs = n_inputs
        self.shaped_args = shaped_args  # argument numbers whose types have `?` dims
        self.build = build
        self.compiling = compiling
        self.variants: dict = {}
        self.runtime_sized = None  # _Variant of the program with runtime sizes, once compiled
        # why there is none ("": not tried, or fine)
        self.runtime_sizes_error = "" if runtime_sizes else "the backend compiles static sizes only"
        self.last_sizes = None
        self.kernels: dict = {}
        self.compile_seconds = 0.0
        self.lowered_text = ""

    def _key(self, args) -> tuple:
        sizes = tuple(int(s) for s in args[self.n_inputs:])
        shapes = tuple(tuple(args[i].shape) for i in self.shaped_args)
        return sizes, shapes

    def variant(self, args, hooks, runtime_sizes: bool = False):
        """The program for this call's sizes and hooks, compiled first when there is none."""
        args = list(args)
        key = self._key(args)
        if runtime_sizes and not self.runtime_sizes_error:
            program = self._runtime_sized(key, args, hooks)
            if program is not None:
                return program
        variant = self.variants.get(key)
        if variant is None and self.stored is not None:
            loaded = self.stored.load(f"sizes {key}")
            if loaded is not None:
                self._note(loaded[0])
                variant = self.variants[key] = _Variant(*loaded)
        if variant is None:
            variant = self._compile(key, args, hooks, "sizes", "new sizes", self.last_sizes, list(key[0]))
        elif variant.guard is not None and not variant.guard.holds(hooks):
            variant = self._compile(key, args, hooks, "hooks", variant.guard.reason(hooks), None, None)
        return variant.program

    def __call__(self, args, hooks, callbacks=(), packed=()):
        return self.variant(args, hooks)(args, hooks, callbacks, packed)

    def _runtime_sized(self, key, args, hooks):
        done = self.runtime_sized
        if done is not None and isinstance(done.program, PendingProgram):
            try:  # compiling in a worker: it serves once it is there; its failure specializes
                ready = done.program.resolve(wait=False)
            except CompileAbandoned:
                raise
            except Exception as exc:  # noqa: BLE001 - as a failure of the compile here
                self._no_runtime_sizes(exc)
                return None
            if ready is None:
                return done.program  # the driver runs PyTorch's graph for this call
            done.program = ready
            self._note(ready)
        if done is not None and (done.guard is None or done.guard.holds(hooks)):
            return done.program
        if done is None:
            what, reason = "sizes", "sizes change: one program with dynamic sizes"
            loaded = self.stored.load("dynamic") if self.stored is not None else None
            if loaded is not None:
                self._note(loaded[0])
                self.runtime_sized = _Variant(*loaded)
                return self._runtime_sized(key, args, hooks)
        else:
            what, reason = "hooks", done.guard.reason(hooks)
        try:
            program, guard = self.compiling(what, reason, None, list(key[0]),
                                            lambda: self.build(Variant(runtime_sizes=True), args, hooks, False))
        except RecompileLimitReached:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure: specialise per size set instead
            self._no_runtime_sizes(exc)
            return None
        self._note(program)
        self.runtime_sized = _Variant(program, guard)
        if self.stored is not None:
            self.stored.save("dynamic", program, guard)
        return program

    def _no_runtime_sizes(self, exc: BaseException) -> None:
        from camlir import logs

        self.runtime_sizes_error = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
        self.runtime_sized = None
        logs.log.warning("no dynamic-size code for this graph (%s); each size set is "
                         "compiled with its sizes as constants", self.runtime_sizes_error)

    def refuse_runtime_sizes(self, reason: str) -> None:
        """The program with runtime sizes refused a call (`errors.ProgramRefused`): from now
        on every size set is compiled with its sizes as constants."""
        from camlir import logs

        self.runtime_sizes_error = f"it refused a call: {reason}"
        self.runtime_sized = None
        logs.log.warning("the dynamic-size program of this graph refused a call (%s); each size set is "
                         "compiled with its sizes as constants from now on", reason)

    def _note(self, program) -> None:
        if isinstance(program, PendingProgram):
            return  # noted when it arrives (reading it now would wait for it)
        self.compile_seconds += getattr(program, "compile_seconds", 0.0)
        self.kernels.update(getattr(program, "kernels", {}))
        self.lowered_text = getattr(program, "lowered_text", self.lowered_text)

    def _compile(self, key, args, hooks, what: str, reason: str, old, new) -> _Variant:
        sizes, shapes = key
        variant = Variant.specialized(sizes, dict(zip(self.shaped_args, shapes)))
        program, guard = self.compiling(what, reason, old, new, lambda: self.build(variant, args, hooks, True))
        self._note(program)
        self.last_sizes = list(sizes)
        done = _Variant(program, guard)
        self.variants[key] = done
        if self.stored is not None:
            self.stored.save(f"sizes {key}", program, guard)
        return done
