"""Why camlir captured or compiled: one record per event, for people and for code.

    camlir.explain()            # [Event(graph=2, kind='capture', what='sizes', ...), ...]
    print(camlir.explain_text())

Every capture (the autograd engine handed camlir a new graph) and every compile (a program
built for a graph: its first, a new size set, a changed hook or ctx value, a backend it had
not been compiled for) is an `Event`, in order. Loads from the disk cache and fallbacks are
events too, so the list says where every second of compiling went. `CA_LOGS=recompiles`
prints each event as it happens; `camlir.reset()` clears the list.

This module imports nothing of camlir but `logs`: the driver (`compiled.py`) records, and
capture code could too, without a cycle.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from typing import Any, Optional

from camlir import logs

KINDS = ("capture", "compile", "ready", "disk_hit", "backward", "fallback", "recompile_limit", "choice", "host_call")
# A long training run with a recompiling graph must not grow memory without bound; the
# oldest records go first (the recompile limit stops a storm long before this).
MAX_EVENTS = 10_000


@dataclass(frozen=True)
class Event:
    """One capture or compile.

    `graph`: the capture id (as in logs and `CA_DUMP_DIR`); `kind`: one of `KINDS` (a
    `choice` is the measured pick between a compiled program and PyTorch's captured graph,
    `old`/`new` its ms per backward: program, PyTorch; a `host_call` names a node whose
    backward runs in Python inside the compiled program, `new` the count in that graph);
    `reason`: a sentence; `what`: which node, size, hook or guard it is about
    ("node ReluBackward0", "sizes", "hook 2", "ctx value", "backend", "first call");
    `old`/`new`: the value before and after where there is one (size lists, hook labels,
    ctx values); `seconds`: what the event cost (compile time; 0 for a capture, which
    PyTorch's engine does before camlir sees it).
    """

    graph: int
    kind: str
    reason: str
    what: str = ""
    old: Any = None
    new: Any = None
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        old, new = _shown(self.old), _shown(self.new)
        if self.old is not None and self.new is not None:
            change = f" ({old} -> {new})"
        elif self.old is not None or self.new is not None:  # one side only: no "None ->"
            change = f" ({new})" if self.old is None else f" (was {old})"
        else:
            change = ""
        cost = f", {self.seconds:.3f} s" if self.seconds else ""
        return f"graph {self.graph}: {self.kind}: {self.reason}{change}{cost}"


def _shown(value) -> str:
    """A value of an event as printed: floats (ms per backward of a `choice`) to 3 digits."""
    if isinstance(value, float):
        return f"{value:.3g}"
    return repr(value)


_events: list = []
_lock = threading.Lock()


def record(event: Event) -> Event:
    """Appends `event` and prints it when `CA_LOGS=recompiles` is on."""
    with _lock:
        _events.append(event)
        if len(_events) > MAX_EVENTS:
            del _events[: len(_events) - MAX_EVENTS]
    if logs.enabled("recompiles"):
        logs.log.info("%s", event)
    return event


def explain(graph: Optional[int] = None, kind: Optional[str] = None) -> list:
    """The events since the last `camlir.reset()`, oldest first, as `Event`s (`graph`: the
    capture id; `kind`: one of `KINDS`; `reason`; `what`, `old`, `new`: what changed;
    `seconds`). `graph` (a capture id) and `kind` (e.g. "compile", "fallback",
    "recompile") keep only the matching ones; None keeps all.

        for event in camlir.explain(kind="fallback"):
            print(event)                # graph 3: fallback: ...
    """
    with _lock:
        events = list(_events)
    return [e for e in events if (graph is None or e.graph == graph) and (kind is None or e.kind == kind)]


_COMPILING = ("compile", "ready", "disk_hit")  # the kinds whose seconds are camlir's compile work


def explain_text(graph: Optional[int] = None) -> str:
    """`explain()` as lines, with per graph its compiles and the seconds they took (here and
    in compile workers: `compile`, `ready` and `disk_hit` events); a graph's first backward,
    phase by phase, is its `backward` event. `graph` (a capture id) keeps one graph's lines.

        print(camlir.explain_text())
    """
    events = explain(graph)
    lines = [str(e) for e in events]
    totals: dict = {}
    for e in events:
        if e.graph:
            totals[e.graph] = totals.get(e.graph, 0.0) + (e.seconds if e.kind in _COMPILING else 0.0)
    lines += [f"graph {g}: {sum(1 for e in events if e.graph == g and e.kind == 'compile')} compiles, "
              f"{s:.3f} s compiling" for g, s in sorted(totals.items())]
    return "\n".join(lines)


def forget() -> None:
    """Clears the records (part of `camlir.reset()`) and tells the "forget" listeners."""
    with _lock:
        _events.clear()
    tell("forget")


# Debugging aids (repro.py) listen here instead of sitting on the driver's path: the driver
# tells what happened, with the live objects, and each listener decides what to keep. Kinds:
# "first_call" (a graph's first program is about to run: capture_id, module, args,
# n_inputs, sizes, symbolic, hooks), "interpreted" (a compiling backend could not build a program and the reference
# interpreter runs it: capture_id, reason, module, args, hooks, sizes), "fallback" (the
# graph runs on PyTorch from now on: capture_id, reason, gm, inputs, sizes, scalars, hooks,
# packed_data, unpacked), "forget" (`camlir.reset()`).
LISTENER_KINDS = ("first_call", "interpreted", "fallback", "forget")
_listeners: dict = {kind: [] for kind in LISTENER_KINDS}


def listen(kind: str, callback) -> None:
    """Calls `callback(**details)` whenever the driver tells `kind` (one of
    `LISTENER_KINDS`); registering the same callback twice calls it once."""
    if kind not in _listeners:
        raise ValueError(f"unknown listener kind {kind!r}; known: {', '.join(LISTENER_KINDS)}")
    if callback not in _listeners[kind]:
        _listeners[kind].append(callback)


def listening(kind: str) -> bool:
    """Whether anything listens to `kind` (the driver asks before it builds the details)."""
    return bool(_listeners[kind])


def tell(kind: str, **details) -> None:
    """Calls every listener of `kind` with `details` (the driver's news; see `listen`)."""
    for callback in list(_listeners[kind]):
        callback(**details)


