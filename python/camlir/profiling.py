"""Where a compiled backward's time goes: `camlir.profile()` and `CA_LOGS=perf`.

    with camlir.profile() as prof:
        for _ in range(20):
            loss_fn().backward()          # inside camlir.enable(), as usual
    print(prof.table())

While a profile is active, every backward that camlir runs is timed three ways: the whole
`backward()` call (the autograd engine, PyTorch's compiled-autograd runtime, camlir's
driver and program), camlir's program alone, and each step of the program's host function:
a native kernel (`kernel @backward_kernel_3`), an op kept on the host and run through
torch (`host aten.convolution_backward`), a Python hook (`hook 2 (tensor_pre_hook)`), an
accumulation into `.grad`. The table attributes the backward's time to them, so a miss
against eager can be explained with numbers, and counts the minor page faults the backward
calls took (they were most of W3's time outside its GEMMs, docs/speed.md). Timing a step
costs ~0.3 us; without an active profile nothing is timed.

`CA_LOGS=perf` profiles the whole process and logs the table at exit.

This module imports nothing of camlir: the runtime (backends) and the driver call into it.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time

try:
    import resource  # POSIX only
except ImportError:  # pragma: no cover - Windows: no fault counts
    resource = None
from typing import Optional

_lock = threading.Lock()
_stack: list = []


class Profile:
    """Timings collected while a profile is active (see the module docstring).

    `steps` maps a step label to [calls, seconds]; `backwards`, `backward_seconds` and
    `program_seconds` are totals over the backward calls camlir ran.
    """

    def __init__(self):
        self.steps: dict = {}
        self.backwards = 0
        self.backward_seconds = 0.0
        self.program_seconds = 0.0
        self.page_faults = 0  # minor page faults of this process during the backward calls
        self.blas: dict = {}  # kernel step label -> [BLAS seconds, flops, BLAS calls]

    def add_blas(self, label: str, nanoseconds: int, flops: int, calls: int) -> None:
        """Adds what a kernel step's BLAS calls did during one call of the step (the
        kernel's code counts them: ca-define-blas-wrappers)."""
        entry = self.blas.get(label)
        if entry is None:
            entry = self.blas[label] = [0.0, 0, 0]
        entry[0] += nanoseconds * 1e-9
        entry[1] += flops
        entry[2] += calls

    def add_step(self, label: str, seconds: float) -> None:
        entry = self.steps.get(label)
        if entry is None:
            self.steps[label] = [1, seconds]
        else:
            entry[0] += 1
            entry[1] += seconds

    def add_backward(self, since: tuple) -> None:
        """Adds one backward call that started at `since` (a `clock()` reading)."""
        seconds, faults = time.perf_counter() - since[0], _minor_faults() - since[1]
        with _lock:
            self.backwards += 1
            self.backward_seconds += seconds
            self.page_faults += faults

    def add_program(self, seconds: float) -> None:
        with _lock:
            self.program_seconds += seconds

    def as_dict(self) -> dict:
        """The totals and the steps, for code (`{"steps": {label: {"calls", "seconds"}}, ...}`)."""
        return {"backwards": self.backwards, "backward_seconds": self.backward_seconds,
                "program_seconds": self.program_seconds, "page_faults": self.page_faults,
                "steps": {k: {"calls": c, "seconds": s, **self._blas_of(k)} for k, (c, s) in self.steps.items()}}

    def _blas_of(self, label: str) -> dict:
        entry = self.blas.get(label)
        if entry is None:
            return {}
        return {"blas_seconds": entry[0], "blas_flops": entry[1], "blas_calls": entry[2]}

    def table(self, top: int = 25) -> str:
        """The steps by total time, with their share of the backward time."""
        n = max(self.backwards, 1)
        total = self.backward_seconds or sum(s for _, s in self.steps.values()) or 1e-12
        outside = max(self.backward_seconds - self.program_seconds, 0.0)
        lines = [f"camlir profile: {self.backwards} backward calls, {1e3 * self.backward_seconds:.2f} ms in all "
                 f"({1e3 * self.backward_seconds / n:.3f} ms each)",
                 f"  camlir's program: {1e3 * self.program_seconds:.2f} ms ({self.program_seconds / total:.0%}); "
                 f"outside it (autograd engine, PyTorch's compiled-autograd runtime, camlir's driver): "
                 f"{1e3 * outside:.2f} ms ({outside / total:.0%})",
                 f"  minor page faults during the backward calls: {self.page_faults / n:.0f} each (a page "
                 f"the kernel zeroes and maps, ~1-2 us; see docs/speed.md, \"Page faults\")",
                 f"  {'step':<56} {'calls':>7} {'total ms':>10} {'us/call':>10} {'share':>7}"]
        if self.blas:
            blas_s = sum(e[0] for e in self.blas.values())
            flops = sum(e[1] for e in self.blas.values())
            kernels_s = sum(self.steps[label][1] for label in self.blas)
            lines.insert(2, f"  in its kernels: BLAS (MKL's gemm) {1e3 * blas_s:.2f} ms ({blas_s / total:.0%}, "
                            f"{_gflops(flops, blas_s)}); the rest of those kernels (camlir's loops, operand "
                            f"packing) {1e3 * (kernels_s - blas_s):.2f} ms ({(kernels_s - blas_s) / total:.0%})")
        ranked = sorted(self.steps.items(), key=lambda kv: -kv[1][1])
        for label, (calls, seconds) in ranked[:top]:
            lines.append(f"  {label[:56]:<56} {calls:>7} {1e3 * seconds:>10.3f} {1e6 * seconds / calls:>10.1f} "
                         f"{seconds / total:>7.1%}")
            entry = self.blas.get(label)
            if entry is not None and entry[2]:
                blas_s, flops, blas_calls = entry
                lines.append(f"  {'  BLAS: ' + str(blas_calls) + ' gemm calls, ' + _gflops(flops, blas_s):<56} "
                             f"{'':>7} {1e3 * blas_s:>10.3f} {1e6 * blas_s / calls:>10.1f} {blas_s / total:>7.1%}")
                rest = seconds - blas_s
                lines.append(f"  {'  the rest (loops, packing)':<56} {'':>7} {1e3 * rest:>10.3f} "
                             f"{1e6 * rest / calls:>10.1f} {rest / total:>7.1%}")
        if len(ranked) > top:
            rest = sum(s for _, (_, s) in ranked[top:])
            lines.append(f"  {'(' + str(len(ranked) - top) + ' more steps)':<56} {'':>7} {1e3 * rest:>10.3f}")
        return "\n".join(lines)


def _gflops(flops: int, seconds: float) -> str:
    return f"{flops / seconds / 1e9:.1f} GFLOP/s" if seconds > 0 else "0 GFLOP/s"


def clock() -> tuple:
    """A reading for `Profile.add_backward`: the time and this process's minor page faults."""
    return time.perf_counter(), _minor_faults()


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt if resource is not None else 0


def current() -> Optional[Profile]:
    """The innermost active profile, or None (then nothing is timed)."""
    return _stack[-1] if _stack else None


@contextlib.contextmanager
def profile():
    """Profiles every backward camlir runs inside the block; yields the `Profile`, whose
    `table()` is the text report (the whole backward, camlir's program, and each host step:
    kernels, host ops, hooks, accumulations) and whose `steps` are the raw timings.

        with camlir.profile() as prof:
            for _ in range(20):
                loss_fn().backward()      # inside camlir.enable(), as usual
        print(prof.table())
    """
    p = Profile()
    with _lock:
        _stack.append(p)
    try:
        yield p
    finally:
        with _lock:
            _stack.remove(p)


_process_profile: list = []


def profile_process(log) -> None:
    """`CAMLIR_LOGS=perf`: profiles everything from now on and logs the table at exit."""
    if _process_profile:
        return
    p = Profile()
    _process_profile.append(p)
    with _lock:
        _stack.insert(0, p)
    atexit.register(lambda: p.backwards and log.info("%s", p.table()))
