"""A program a compile worker is still building (the compile service's side in the driver).

`CompiledBackward.build` gets a `compile_service.Job` from `pipeline.compile` and wraps it:

    pending = PendingProgram(job, backend, context, "graph 3", on_failure)
    pending.in_flight()          # True while the worker compiles (never blocks)
    program = pending.resolve(wait=False)   # None while in flight, else the program

`resolve` loads the worker's answer through the disk cache's path (`backend.from_files` on
the files `to_files` made there): a finished background compile and a warm start are one
code path. Where the stages failed in the worker, `on_failure(error)` gives what runs
instead (the driver's one fallback policy: the reference interpreter), as it would have for
a failure here. Where the service could not finish the compile (it timed out, its worker
died twice), `resolve` raises `CompileAbandoned` (an `UnsupportedError`) naming the graph and why, and the driver
hands the graph to PyTorch. Where no worker can start at all, the stages run here
(`pipeline.compile_apart`, blocking), with the same answer.

Until it is resolved the object also stands for the program: calling it, or reading an
attribute (`kernels`, `lowered_text`, ...), waits for the compile (`compiled_programs()`
may hold one).
"""

import threading
import time
import weakref

from camlir import compile_service, logs
from camlir.disk_store import Entry
from camlir.errors import UnsupportedError

class CompileAbandoned(UnsupportedError):
    """The compile service could not finish a graph's compile (it timed out, or its worker
    died twice): the graph is handed to PyTorch, never interpreted."""


_unresolved: "weakref.WeakSet" = weakref.WeakSet()
_lock = threading.Lock()


class PendingProgram:
    """See the module docstring."""

    def __init__(self, job, backend, context, label: str, on_failure, on_ready=None, run_here=None):
        self.job = job
        self._run_here = run_here  # fn(request) -> answer where no worker can run (pipeline.compile_apart)
        self.backend = backend
        self.context = context
        self.label = label
        self.not_native = ""   # set by the driver; handed to the program when it arrives
        self.seconds_here = job.request.get("seconds_here", 0.0)
        self._on_failure = on_failure
        self._on_ready = on_ready  # fn(program, answer), once, when loaded
        self._program = None
        self._error = None
        self._lock = threading.RLock()
        with _lock:
            _unresolved.add(self)

    def in_flight(self) -> bool:
        """Whether the worker is still compiling (False once it answered, even if unresolved)."""
        return self._program is None and self._error is None and not self.job.done()

    def resolve(self, wait: bool):
        """The program (loaded now if it just arrived), or None while the compile is in
        flight and `wait` is False. Raises `CompileAbandoned` when the service could not
        finish it (every later call too)."""
        with self._lock:
            if self._program is not None:
                return self._program
            if self._error is not None:
                raise self._error
            if not wait and not self.job.done():
                return None
            try:
                try:
                    answer = self.job.result()
                except compile_service.ServiceUnavailable as exc:
                    if self._run_here is None:
                        raise
                    logs.log.warning("%s: no compile worker can run here (%s); compiling in this "
                                     "process", self.label, exc)
                    answer = self._run_here(self.job.request)
                _tell_logs(answer)
                program = self._load(answer)
                if self._on_ready is not None:
                    self._on_ready(program, answer)
            except compile_service.ServiceError as exc:
                self._error = CompileAbandoned(str(exc))
                self._error.__cause__ = exc
                self._release()
                raise self._error
            except Exception as exc:  # noqa: BLE001 - a stage failed, there or here: the one policy
                if isinstance(exc, compile_service.CompileFailed):
                    _tell_logs(self.job.answer or {})
                try:
                    program = self._on_failure(exc)
                except BaseException as failure:  # it raises (the caller decides): raised again later too
                    self._error = failure
                    self._release()
                    raise
            self._program = program
            self._release()
            return program

    def _load(self, answer: dict):
        entry = Entry("compile-service", None, answer["meta"], time.time(), answer["files"])
        program = self.backend.from_files(entry, self.context)
        program.lowered_text = answer.get("lowered_text", "")
        program.compile_seconds = self.seconds_here + answer.get("seconds", 0.0)
        program.not_native = self.not_native
        program.service_files = (answer["files"], answer["meta"])  # what the disk cache stores of it
        if hasattr(program, "label"):
            program.label = self.label
        return program

    def _release(self) -> None:
        self._on_failure = self._on_ready = self._run_here = None  # they hold the first call's tensors
        with _lock:
            _unresolved.discard(self)

    # ------------------------------------------------------------------ standing for the program

    def __call__(self, *args, **kwargs):
        return self.resolve(wait=True)(*args, **kwargs)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.resolve(wait=True), name)


def _tell_logs(answer: dict) -> None:
    """The worker's log records, logged here as this process's own (once)."""
    for level, message in answer.pop("logs", ()):
        logs.log.log(level, "%s", message)


def any_unresolved() -> bool:
    """Whether some pending program is not resolved yet (one check per backward)."""
    return bool(_unresolved)


def unresolved() -> list:
    """Every pending program not yet resolved (`camlir.wait()` resolves them)."""
    with _lock:
        return list(_unresolved)


def wait_all(timeout=None) -> bool:
    """Waits for every compile in flight and loads what arrived; False on `timeout`.
    A compile that failed is not raised here: its graph's next backward handles it."""
    service = compile_service.current()
    if service is not None and not service.wait(timeout):
        return False
    for pending in unresolved():
        try:
            pending.resolve(wait=True)
        except Exception:  # noqa: BLE001 - said and handled where its graph runs next
            pass
    return True
