"""One line for a long compile: what compiles, how far it got, and what the training loop does
meanwhile.

A first backward of several seconds (T5: 7 s in the training process before the compile
service; a worker's LLVM stage 1-3 s per model in `bench/`) printed nothing, so a user could
not tell a compile from a hang. Every compile of a graph (`CompiledBackward.compiling`) runs
under a `Watch`; one still running after `NOTICE_S` seconds says so once, at WARNING:

    camlir: graph 3 has been compiling for 5 s (first backward of this graph; stage llvm),
    in this process: this backward waits for it ...

A compile in a worker says that the graph's backwards run on PyTorch's eager engine until
its program is ready. A compile that ends first says nothing. Only the standard library
(a compile worker imports `pipeline`, which reports stages here).
"""

import threading
import time

from camlir import logs

NOTICE_S = 5.0  # a first backward under this is not long: Transformer's is ~1 s with the service

_here = threading.local()  # the Watch of the compile running on this thread, if any


class Watch:
    """A timer for one compile: `with Watch("graph 3", reason): build()`; `background(pending)`
    when the program went on compiling in a worker (the timer then asks it)."""

    def __init__(self, label: str, what: str, notice_s=None):
        self.label, self.what = label, what
        self.stage = None
        self.where = "in this process: this backward waits for it"
        self._pending = None
        self._running = True
        self._start = time.perf_counter()
        self._timer = threading.Timer(NOTICE_S if notice_s is None else notice_s, self._tell)
        self._timer.daemon = True

    def __enter__(self):
        self._outer, _here.watch = getattr(_here, "watch", None), self
        self._timer.start()
        return self

    def __exit__(self, *exc):
        _here.watch = self._outer
        self._running = False
        if self._pending is None:
            self._timer.cancel()
        return False

    def background(self, pending) -> None:
        """The compile goes on in a worker (`pending`: its PendingProgram) after `build` returned."""
        self._pending = pending
        self.stage = None  # the stages this process ran are over; the worker runs the rest
        self.where = ("in a compile worker: this graph's backwards run on PyTorch's eager engine until its "
                      "program is ready (camlir.wait() waits for it)")

    def _still_running(self) -> bool:
        if self._pending is not None:
            return self._pending.in_flight()
        return self._running

    def _tell(self) -> None:
        if not self._still_running():
            return
        stage = f"; stage {self.stage}" if self.stage else ""
        logs.log.warning("%s has been compiling for %.0f s (%s%s), %s", self.label,
                         time.perf_counter() - self._start, self.what, stage, self.where)


def current():
    """The Watch of the compile running on this thread, or None."""
    return getattr(_here, "watch", None)


def at_stage(name: str) -> None:
    """The pipeline entered stage `name` (shown in the long-compile line)."""
    watch = current()
    if watch is not None:
        watch.stage = name


def waits_in_worker() -> None:
    """The compile runs in a worker while this backward waits for it."""
    watch = current()
    if watch is not None:
        watch.where = "in a compile worker: this backward waits for it"
