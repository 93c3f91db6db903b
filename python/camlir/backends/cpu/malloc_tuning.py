"""Keeps glibc's malloc from handing a backward's big buffers back to the kernel every step.

Native kernels allocate their temporaries with `malloc` (a 4 MB GEMM output inside a
kernel, a 3 MB scatter target) and free them before they return; the runtime allocates
the kernels' results through torch, which also calls `malloc`. glibc serves allocations
above its mmap threshold with fresh `mmap`s, raises that threshold as such chunks are
freed (only up to the largest size seen), and trims the top of its heap whenever more
than twice the threshold is free there. A compiled backward allocates and frees its
buffers in a pattern that keeps tripping the trim, so every step faulted the same pages
in again. Measured on W3 (a TransformerEncoderLayer backward, 1 thread):

| | minor page faults per step | backward ms |
|---|---|---|
| eager engine | 256 | 41 |
| camlir, as before | 8,512 | 68 |
| camlir, tuned as below | 0 | 47 |

(`python -m bench.page_faults --workloads W3`: one process each, medians of 10 steps.)
~2 us per fault (zeroing a 4 KiB page) is ~20 ms a step.

So, before the first native program runs, camlir fixes both thresholds with `mallopt`:
allocations under `MMAP_THRESHOLD` come from the heap, and up to `TRIM_THRESHOLD` of free
memory stays at its top instead of going back to the kernel. Peak memory is unchanged (the
buffers exist at the peak anyway); what stays resident after a backward is at most
`TRIM_THRESHOLD` more, which a training loop reaches again on its next step. This is
process-wide, as `LD_PRELOAD`ing jemalloc or tcmalloc (what PyTorch's performance guides
suggest for the same reason) would be; with one of those preloaded, glibc's malloc is not
used and this changes nothing. Only on glibc; `CAMLIR_MALLOC_TUNING=0` leaves malloc alone,
and so does a process whose environment sets malloc's thresholds (`GLIBC_TUNABLES` with
`malloc`, `MALLOC_*_`).
"""

import ctypes
import ctypes.util
import platform

from camlir import environment, logs

MMAP_THRESHOLD = 64 << 20  # bytes: larger allocations keep their own mmap
TRIM_THRESHOLD = 256 << 20  # bytes of free heap top kept
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers
_USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
_state = {"done": False, "applied": False}


def enabled() -> bool:
    """Whether camlir may tune malloc (`CAMLIR_MALLOC_TUNING`, default on)."""
    return environment.flag("CAMLIR_MALLOC_TUNING")


def apply() -> bool:
    """Sets the thresholds once per process (see the module docstring); returns whether
    they are set by camlir. Cheap after the first call."""
    if _state["done"]:
        return _state["applied"]
    _state["done"] = True
    if not enabled():
        return False
    user = [name for name in _USER_SETTINGS if environment.raw(name)]
    if "malloc" in (environment.raw("GLIBC_TUNABLES") or ""):
        user.append("GLIBC_TUNABLES")
    if user:
        logs.log.debug("malloc left as configured (%s set)", ", ".join(user))
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    _state["applied"] = ok
    if ok and (logs.enabled("perf") or logs.enabled("verbose")):  # a note about speed: not for every kind
        logs.log.info("malloc keeps buffers under %d MB on its heap and up to %d MB free at its "
                      "top (CAMLIR_MALLOC_TUNING=0 turns this off; docs/speed.md)",
                      MMAP_THRESHOLD >> 20, TRIM_THRESHOLD >> 20)
    return ok
