"""The compile service: graphs compile in worker processes, not in the training process.

Why processes (docs/compile-service.md has the figures): MLIR's ExecutionEngine holds the
GIL while LLVM runs, so a compile on a thread stalls the training loop's Python anyway; a
process can be killed when a compile hangs (timm MobileViT spent more than 300 s in LLVM);
and the compiler's few hundred MB of peak memory stay out of the training process.

    service = compile_service.get()          # the process's pool (None: compile here)
    job = service.submit(request, "graph 3")
    job.done()                                # never blocks
    answer = job.result()                     # blocks; raises ServiceError

A request is a dict (`pipeline.service_request` makes it: the `ca` module after the stages
that need this process, and what the rest need); the answer a dict (`pipeline.compile_apart`:
the program as the files the disk cache stores, so a finished background compile and a
warm start load through one code path, `Backend.from_files`).

Workers are started with `subprocess` (fork + exec: a fork of a process that holds OpenMP
and MKL threads is not safe to go on running Python) as `python -m camlir.compile_worker`,
one when the first compile is asked for and more while compiles wait, up to
`camlir.config.compile_workers` (default: the cores left over, at least one). Each runs one
compile at a time; messages are length-prefixed pickles over its stdin and stdout. A worker
idle for `IDLE_S` (60 s) ends; the next compile starts another.

The watchdog: a compile running longer than `camlir.config.compile_timeout_s` gets its
worker SIGKILLed and fails with `CompileTimeout`. A worker that dies during a compile
(a segfault in LLVM, SIGKILL, the OOM killer) is replaced and the compile tried once more on
the new one; a second death fails it with `WorkerDied`. Workers that exit before they are
ready, twice (they cannot start: a broken environment), mark the service `broken`: the
caller then compiles in its own process (`ServiceUnavailable`). The training process never waits
on a worker except through `Job.result()`.

This module imports only the standard library: the worker imports it for the protocol
before it imports torch or MLIR.
"""

import atexit
import collections
import itertools
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
import time
from typing import Optional

_HEADER = struct.Struct("<Q")
# A worker process idle this long exits (a compiled worker keeps ~190 MB; the next compile
# starts one in 0.4 s).
IDLE_S = 60.0


# --------------------------------------------------------------------------- the protocol

def send(stream, message) -> None:
    """Writes `message` to the binary `stream` as a length-prefixed pickle."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)))
    stream.write(data)
    stream.flush()


def receive(stream):
    """The next message on `stream`; EOFError when it closed (between or inside a message)."""
    header = _read_exactly(stream, _HEADER.size)
    return pickle.loads(_read_exactly(stream, _HEADER.unpack(header)[0]))


def _read_exactly(stream, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = stream.read(left)
        if not chunk:
            raise EOFError("the stream closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# --------------------------------------------------------------------------- errors

class ServiceError(RuntimeError):
    """A compile the service could not finish (the message names the graph and why)."""


class CompileTimeout(ServiceError):
    """The compile ran past `compile_timeout_s`; its worker was killed."""


class WorkerDied(ServiceError):
    """The compile's worker died during it, twice (on the first worker and its replacement)."""


class ServiceUnavailable(ServiceError):
    """No worker could be started here: the caller compiles in its own process instead."""


class CompileFailed(RuntimeError):
    """A stage failed in the worker (the same failure the compile would have had here):
    `kind` is the exception's type name, `stage` the stage's name where it was a StageError."""

    def __init__(self, kind: str, message: str, stage: Optional[str] = None):
        super().__init__(message)
        self.kind, self.stage = kind, stage


# --------------------------------------------------------------------------- jobs

class Job:
    """One compile asked of the service. `done()` never blocks; `result(timeout)` waits and
    returns the worker's answer, or raises `ServiceError` / `CompileFailed`."""

    _ids = itertools.count(1)

    def __init__(self, request: dict, label: str):
        self.id = next(Job._ids)
        self.request = request
        self.label = label
        self.submitted = time.monotonic()
        self.started: Optional[float] = None  # when a worker took it (the timeout counts from here)
        self.attempts = 0
        self.timed_out = False
        self.answer: Optional[dict] = None
        self.error: Optional[BaseException] = None
        self._done = threading.Event()
        self._callbacks: list = []
        self._callback_lock = threading.Lock()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: Optional[float] = None) -> dict:
        if not self._done.wait(timeout):
            raise TimeoutError(f"{self.label}: still compiling after {timeout} s")
        if self.error is not None:
            raise self.error
        return self.answer

    def add_done_callback(self, fn) -> None:
        """Calls `fn(job)` once the job has finished: at once if it has, else on the
        service's thread that finished it (so it must be quick and must not raise)."""
        with self._callback_lock:
            if not self._done.is_set():
                self._callbacks.append(fn)
                return
        fn(self)

    def _finish(self, answer=None, error=None) -> None:
        with self._callback_lock:
            self.answer, self.error = answer, error
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            try:
                fn(self)
            except Exception:  # noqa: BLE001 - a callback must not take the service's thread down
                pass


# --------------------------------------------------------------------------- the pool

def default_workers() -> int:
    """The cores this process may run on, less one (the training loop's), at least 1, at most 8."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores - 1, 8))


class _CannotStart(RuntimeError):
    """A worker process exited (or said something else) before it was ready."""


class _Worker:
    """One worker process and the thread in this process that feeds it jobs."""

    def __init__(self, service: "Service", index: int, start_now: bool = False):
        self.service = service
        self.index = index
        self.start_now = start_now  # start the process before the first job arrives (prestart)
        self.proc: Optional[subprocess.Popen] = None
        self.job: Optional[Job] = None
        self.thread = threading.Thread(target=self._serve, name=f"camlir-compile-{index}", daemon=True)
        self.thread.start()

    def _start(self) -> None:
        """Starts the process and waits for its "ready" (torch and MLIR imported, ~3 s);
        `_CannotStart` when it exits first."""
        env = dict(os.environ)
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "camlir.compile_worker"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, env=env, close_fds=True)
            hello = receive(self.proc.stdout)
        except (OSError, EOFError, pickle.UnpicklingError, ValueError) as exc:
            status = self._reap()
            raise _CannotStart(f"exit status {status}: {exc}") from exc
        if not (isinstance(hello, dict) and hello.get("ready")):
            self._reap()
            raise _CannotStart(f"it said {hello!r} instead of ready")

    def _serve(self) -> None:
        if self.start_now:
            try:
                self._start()
            except _CannotStart as exc:
                self.service._start_failed(str(exc))
        while True:
            job = self.service._next_job(self)
            if job is None:
                return
            try:
                if self.proc is None or self.proc.poll() is not None:
                    self._start()
            except _CannotStart as exc:
                self.service._start_failed(str(exc), job)
                continue
            try:
                job.started = time.monotonic()
                job.attempts += 1
                self.job = job
                send(self.proc.stdin, job.request)
                answer = receive(self.proc.stdout)
            except (OSError, EOFError, pickle.UnpicklingError, ValueError):
                answer = None  # it died: `_reap` gets its exit status
            except Exception as exc:  # noqa: BLE001 - e.g. a request that does not pickle
                # This thread must go on serving, and no job may stay unfinished (a waiting
                # backward would wait for ever): the job fails, the process (its protocol
                # state unknown) is replaced.
                self.job = None
                self._reap()
                self.service._fail(job, ServiceError(f"{job.label}: the compile service failed: "
                                                     f"{type(exc).__name__}: {exc}"))
                continue
            self.job = None
            if answer is not None:
                self.service._finished(job, answer)
                continue
            status = self._reap()
            self.service._worker_lost(job, status)

    def _reap(self) -> Optional[int]:
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        try:
            proc.kill()
        except OSError:
            pass
        try:
            return proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return None

    def end(self) -> None:
        """Ends an idle process: it exits when its stdin closes (or is killed)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()
            proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            try:
                proc.kill()
            except OSError:
                pass

    def kill(self) -> None:
        """SIGKILLs the process (the watchdog; tests): its thread sees the pipe close."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                proc.send_signal(signal.SIGKILL)
            except OSError:
                pass


class Service:
    """A pool of compile workers (see the module docstring)."""

    def __init__(self, size: int, timeout_s: float):
        self.size = max(1, size)
        self.timeout_s = timeout_s
        self.pid = os.getpid()  # a forked child gets a service of its own (these threads are not there)
        self.broken: Optional[str] = None  # why no worker can run here (then nothing is submitted)
        self._lock = threading.Condition()
        self._queue: collections.deque = collections.deque()
        self._workers: list = []
        self._idle = 0
        self._start_failures = 0
        self._jobs: set = set()  # submitted, not finished
        self._closed = False
        self._watchdog = threading.Thread(target=self._watch, name="camlir-compile-watchdog", daemon=True)
        self._watchdog.start()

    # ------------------------------------------------------------ asked by the driver

    def submit(self, request: dict, label: str) -> Job:
        job = Job(request, label)
        with self._lock:
            if self.broken is not None or self._closed:
                job._finish(error=ServiceUnavailable(self.broken or "the compile service closed"))
                return job
            self._jobs.add(job)
            self._queue.append(job)
            if self._idle == 0 and len(self._workers) < self.size:
                self._workers.append(_Worker(self, len(self._workers)))
            self._lock.notify()
        return job

    def prestart(self) -> None:
        """Starts one worker now (it takes ~3 s to import torch and MLIR), so the first
        compile does not wait for it. Returns at once: the worker's thread starts it."""
        with self._lock:
            if self._workers or self.broken is not None:
                return
            self._workers.append(_Worker(self, 0, start_now=True))

    def in_flight(self) -> int:
        with self._lock:
            return len(self._jobs)

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks until every job submitted so far has finished; False on `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._jobs:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._lock.wait(left if left is not None else 1.0)
        return True

    def workers(self) -> list:
        """The live worker processes' pids (tests kill them)."""
        return [w.proc.pid for w in self._workers if w.proc is not None and w.proc.poll() is None]

    def kill_workers(self) -> int:
        """SIGKILLs every worker process (tests); returns how many."""
        killed = 0
        for worker in list(self._workers):
            if worker.proc is not None and worker.proc.poll() is None:
                worker.kill()
                killed += 1
        return killed

    def close(self) -> None:
        """Ends the workers (at exit): they leave when their stdin closes, or are killed."""
        with self._lock:
            self._closed = True
            for job in self._queue:
                job._finish(error=ServiceUnavailable("the compile service closed"))
            self._queue.clear()
            self._lock.notify_all()
        for worker in self._workers:
            if worker.job is not None:  # mid-compile: its answer would come too late to use
                worker.kill()
            else:
                worker.end()

    # ------------------------------------------------------------ asked by the workers' threads

    def _next_job(self, worker: _Worker) -> Optional[Job]:
        """The next job for `worker`'s thread (None: the service closed). A worker process
        idle for `IDLE_S` is ended (its memory goes back); the next job starts another."""
        with self._lock:
            self._idle += 1
            try:
                idle_since = time.monotonic()
                while not self._queue or self._closed:
                    if self._closed:
                        return None
                    self._lock.wait(IDLE_S / 4)
                    if worker.proc is not None and time.monotonic() - idle_since > IDLE_S:
                        worker.end()
                return self._queue.popleft()
            finally:
                self._idle -= 1

    def _finished(self, job: Job, answer: dict) -> None:
        error = None
        if answer.get("error") is not None:
            kind, message, stage = answer["error"]
            error = CompileFailed(kind, message, stage)
        job._finish(answer=answer, error=error)
        with self._lock:
            self._jobs.discard(job)
            self._lock.notify_all()

    def _worker_lost(self, job: Job, status) -> None:
        code = (f"exit status {status}" if status is not None and status >= 0 else
                f"killed by signal {-status}" if status is not None else "no exit status")
        if job.timed_out:
            error = CompileTimeout(f"{job.label}: the compile ran past camlir.config.compile_timeout_s="
                                   f"{self.timeout_s:g} s; its worker was killed")
        elif self._closed:
            error = ServiceUnavailable("the compile service closed")
        elif job.attempts < 2:
            with self._lock:  # once more, on the replacement, ahead of the others
                self._queue.appendleft(job)
                self._lock.notify()
            return
        else:
            error = WorkerDied(f"{job.label}: its compile worker died twice ({code})")
        self._fail(job, error)

    def _start_failed(self, why: str, job: Optional[Job] = None) -> None:
        """A worker process could not start: twice in this process marks the service broken."""
        with self._lock:
            self._start_failures += 1
            broken = self._start_failures >= 2
            if job is not None and not broken:
                self._queue.appendleft(job)
                self._lock.notify()
        if broken:
            self._mark_broken(f"compile workers exit before they are ready ({why})")
            if job is not None:
                self._fail(job, ServiceUnavailable(self.broken))

    def _fail(self, job: Job, error: BaseException) -> None:
        job._finish(error=error)
        with self._lock:
            self._jobs.discard(job)
            self._lock.notify_all()

    def _mark_broken(self, why: str) -> None:
        with self._lock:
            self.broken = why
            queued = list(self._queue)
            self._queue.clear()
            for job in queued:
                self._jobs.discard(job)
            self._lock.notify_all()
        for job in queued:
            job._finish(error=ServiceUnavailable(why))

    def _watch(self) -> None:
        while not self._closed:
            time.sleep(0.2)
            now = time.monotonic()
            for worker in list(self._workers):
                job = worker.job
                if job is not None and job.started is not None and now - job.started > self.timeout_s:
                    job.timed_out = True
                    worker.kill()


# --------------------------------------------------------------------------- the process's service

_service: list = []
_service_lock = threading.Lock()


def get(size: int, timeout_s: float) -> Service:
    """The process's service with `size` workers at most and `timeout_s` per compile (made
    on first use; a later call with other values updates them for new work)."""
    with _service_lock:
        if _service and _service[0].pid != os.getpid():
            _service.clear()  # inherited through fork: its threads and workers are the parent's
        if not _service:
            _service.append(Service(size, timeout_s))
            atexit.register(_close)
        service = _service[0]
        service.size, service.timeout_s = max(1, size), timeout_s
        return service


def current() -> Optional[Service]:
    """The service if one was started in this process, else None (never starts one)."""
    return _service[0] if _service and _service[0].pid == os.getpid() else None


def _close() -> None:
    service = current()
    if service is not None:
        service.close()
