"""Every environment variable camlir reads, read in this one module.

    from camlir import environment
    environment.flag("CAMLIR_DISK_CACHE")          # -> bool
    environment.text("CAMLIR_LOGS")                # -> str | None (old name CA_LOGS works too)
    environment.integer("CAMLIR_JIT_WORKERS")      # -> int | None
    environment.raw("CUDA_HOME")                   # a variable camlir inspects but does not own

`VARIABLES` is the table: each `Variable` has its name, its old names (still read, the
name wins when both are set), its default, its kind and what it does; `markdown_table()`
renders it for docs/environment.md (`python -m camlir.tools.gen_docs`). Everything reads
`os.environ` when called, never at import, so tests may change the environment freely.
A name that is not in the table is a KeyError: a typo cannot silently read nothing.

This module imports only the standard library (camlir.disk_store, which must not pull in
torch or MLIR, uses it).
"""

import dataclasses
import os
from typing import Optional

KINDS = ("flag", "text", "int", "external")
_OFF = ("0", "false", "off")  # what switches off most flags that are on by default


@dataclasses.dataclass(frozen=True)
class Variable:
    """One environment variable.

    `kind`: "flag" (a switch: `flag()`), "text" (`text()`), "int" (`integer()`), or
    "external" (not camlir's: only inspected, with `raw()`). `default`: what an unset
    variable means (a bool for a flag). `off`: for a flag, the values that switch it off
    (any other value switches it on). `shown`: the default as the docs table writes it,
    where it is computed rather than a constant (empty: `default` itself)."""

    name: str
    old_names: tuple
    default: object
    kind: str
    doc: str
    off: tuple = _OFF
    shown: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"{self.name}: unknown kind {self.kind!r}; known: {', '.join(KINDS)}")


def _flag(name, default, doc, off=_OFF, old_names=()):
    return Variable(name, tuple(old_names), default, "flag", doc, off=off)


VARIABLES = (
    # ---------------------------------------------------------------- debugging
    Variable("CAMLIR_LOGS", ("CA_LOGS",), "", "text",
             "What to log, comma-separated: `graph` (each captured `ca` module), `verbose` (also the IR "
             "after every compile stage, and tensor metadata), `passes` (the IR after every pass inside "
             "each stage, on stderr), `recompiles` (why each capture and compile happened, and its cost), "
             "`perf` (profile every backward, log where the time went at exit). Same as "
             "`camlir.set_logs(...)`; read when camlir is imported; a bad value is logged and ignored. "
             "See [debugging.md](debugging.md).", shown="off"),
    Variable("CAMLIR_DUMP_DIR", ("CA_DUMP_DIR",), None, "text",
             "`dir`: writes each compile stage's IR to numbered files, "
             "`dir/graph<id>[-<variant>]/<NN>-<stage>.mlir`, each with the `ca-opt` command that replays "
             "it (makes it from the previous file). See [cpu-backend.md](cpu-backend.md).", shown="off"),
    _flag("CAMLIR_REPRO", False,
          "`1`: keeps each graph's first-call inputs (read when camlir is imported), so that "
          "`camlir.save_repro(dir)` can write a standalone repro of it; any value but `0` or empty "
          "switches it on. See [debugging.md](debugging.md).", off=("", "0")),
    Variable("CAMLIR_REPRO_DIR", (), None, "text",
             "`dir`: writes a standalone repro to `dir/graph<N>/` for every graph whose compile fails or "
             "that falls back to PyTorch (one per graph), and keeps inputs as `CAMLIR_REPRO=1` does. "
             "See [debugging.md](debugging.md).", shown="off"),
    _flag("CAMLIR_OPT_TRACEBACK", False,
          "Any non-empty value: `ca-opt` prints the Python traceback of an internal error (it "
          "otherwise prints one line). See [ca-opt.md](ca-opt.md).",
          off=("",), old_names=("CA_OPT_TRACEBACK",)),
    # ---------------------------------------------------------------- the disk cache
    _flag("CAMLIR_DISK_CACHE", True,
          "`0`, `false`, `off` or empty: the disk cache of compiled programs is off (it is also off "
          "when `camlir.config.disk_cache` is False). See [disk-cache.md](disk-cache.md).",
          off=_OFF + ("",)),
    Variable("CAMLIR_CACHE_DIR", (), None, "text",
             "Where the disk cache lives (ignored when empty). See [disk-cache.md](disk-cache.md).",
             shown="`$XDG_CACHE_HOME/camlir`, else `~/.cache/camlir`"),
    Variable("CAMLIR_CACHE_MAX_BYTES", (), None, "text",
             "Size bound of the disk cache, e.g. `1073741824`, `512M`, `2G` (oldest entries evicted "
             "first); a bad value is logged and ignored. See [disk-cache.md](disk-cache.md).",
             shown="1 GiB"),
    # ---------------------------------------------------------------- speed
    _flag("CAMLIR_GRAPH_CHOICE", True,
          "`0`, `false` or `off`: never time a structure's compiled backward against the eager engine "
          "(routing after a fallback stays). See [speed.md](speed.md)."),
    _flag("CAMLIR_KERNEL_CHOICE", True,
          "`0`, `false` or `off`: native kernels always, never their torch twins (otherwise each "
          "kernel is chosen by measurement). See [speed.md](speed.md)."),
    _flag("CAMLIR_MALLOC_TUNING", True,
          "`0`, `false` or `off`: leave glibc's malloc thresholds alone; otherwise camlir fixes them "
          "before its first native program runs (only on glibc, and not when the environment sets them "
          "itself), so a backward's big buffers stop being faulted in every step. "
          "See [speed.md](speed.md)."),
    _flag("CAMLIR_THREADS", True,
          "`0`, `false` or `off`: camlir's own loops stay on one thread; otherwise, where libgomp is in "
          "the process, loop nests of `CAMLIR_THREADS_MIN_ELEMENTS`+ iterations are split over torch's "
          "OpenMP threads (`torch.set_num_threads`), with the same results at any thread count. "
          "See [cpu-backend.md](cpu-backend.md)."),
    Variable("CAMLIR_THREADS_MIN_ELEMENTS", (), 32768, "int",
             "The smallest loop nest (iterations) that is split over the threads (at least 1); the fuzzer "
             "and the model sweep set it low to test the split. Not a whole number: an error. "
             "See [cpu-backend.md](cpu-backend.md)."),
    Variable("CAMLIR_VECTOR_WIDTH", (), None, "int",
             "`8` or `16`: f32 lanes per vector in the generated loops. Unset: 16 where the CPU has "
             "AVX-512, else 8. Anything else: an error. See [speed.md](speed.md).", shown="16 with AVX-512, else 8"),
    _flag("CAMLIR_KEEP_KERNEL_LIBS", False,
          "`1`: keep the temporary shared library of each loaded kernel module on disk (its path logged "
          "on `camlir.cpu`), so that `perf report` names the kernels' loop nests. A measurement aid. "
          "See [speed.md](speed.md)."),
    Variable("CAMLIR_JIT_WORKERS", (), None, "int",
             "Worker processes for LLVM's code generation of a big kernel module; `0` compiles in the "
             "process alone. Not a whole number: an error. See [speed.md](speed.md).",
             shown="cores - 1 (at most 7)"),
    Variable("CAMLIR_COMPILE_WORKERS", (), None, "int",
             "Compile worker processes (the compile service: graphs compile off the training loop); `0` "
             "compiles in the training process, as before the service. Sets the default of "
             "`camlir.config.compile_workers`. Not a whole number: an error. See "
             "[compile-service.md](compile-service.md).", shown="cores - 1 (at least 1, at most 8)"),
    Variable("CAMLIR_COMPILE_TIMEOUT_S", (), None, "text",
             "Seconds a compile may run in its worker before the worker is killed and the graph stays on "
             "the eager engine. Sets the default of `camlir.config.compile_timeout_s`. See "
             "[compile-service.md](compile-service.md).", shown="120"),
    Variable("CAMLIR_COMPILE_DELAY_S", (), None, "text",
             "Test knob: a compile worker sleeps this many seconds before each compile (tests of the "
             "watchdog and of killed workers)."),
    # ---------------------------------------------------------------- gpu
    Variable("CAMLIR_LIBDEVICE", (), None, "text",
             "Path of `libdevice.10.bc` for the gpu backend. See [gpu-backend.md](gpu-backend.md).",
             shown="under `$CUDA_HOME`/`$CUDA_PATH`, next to `ptxas`, or triton's copy"),
    # ---------------------------------------------------------------- not camlir's
    Variable("CUDA_HOME", (), None, "external",
             "Where the gpu backend looks for libdevice (`nvvm/libdevice/`) and `ptxas` (`bin/`)."),
    Variable("CUDA_PATH", (), None, "external", "Same as `CUDA_HOME`, when that is not set."),
    Variable("XDG_CACHE_HOME", (), None, "external",
             "The disk cache lives in `$XDG_CACHE_HOME/camlir` when it is an absolute path (and "
             "`CAMLIR_CACHE_DIR` is not set)."),
    Variable("GLIBC_TUNABLES", (), None, "external",
             "When it mentions `malloc`, camlir leaves malloc's thresholds alone (`CAMLIR_MALLOC_TUNING`)."),
    Variable("MALLOC_TRIM_THRESHOLD_", (), None, "external",
             "When set, camlir leaves malloc's thresholds alone (`CAMLIR_MALLOC_TUNING`)."),
    Variable("MALLOC_MMAP_THRESHOLD_", (), None, "external", "Same as `MALLOC_TRIM_THRESHOLD_`."),
    Variable("MALLOC_TOP_PAD_", (), None, "external", "Same as `MALLOC_TRIM_THRESHOLD_`."),
    Variable("MALLOC_MMAP_MAX_", (), None, "external", "Same as `MALLOC_TRIM_THRESHOLD_`."),
    Variable("TORCH_LOGS", (), None, "external",
             "PyTorch's logging switch. `TORCH_LOGS=camlir` (or `+camlir` for debug) puts PyTorch's "
             "handler and format on camlir's logger; camlir then keeps its records from reaching the "
             "root logger too, so each line prints once."),
)

BY_NAME = {v.name: v for v in VARIABLES}
if len(BY_NAME) != len(VARIABLES):
    raise AssertionError("environment.VARIABLES names a variable twice")


def variable(name: str) -> Variable:
    """The table's entry for `name` (its canonical name); KeyError if camlir does not read it."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name} is not in camlir.environment.VARIABLES") from None


def _own(name: str, kinds=("flag", "text", "int")) -> Variable:
    var = variable(name)
    if var.kind not in kinds:
        raise TypeError(f"{name} is a {var.kind} variable, not {' or '.join(kinds)}")
    return var


def source(name: str) -> Optional[str]:
    """Which variable is set for `name`: `name` itself, else its first old name that is set,
    else None (for messages that name what the user wrote)."""
    var = variable(name)
    for candidate in (var.name,) + var.old_names:
        if candidate in os.environ:
            return candidate
    return None


def text(name: str) -> Optional[str]:
    """The value of `name`, else of its first old name that is set (a set variable wins even
    when empty), else its default when that is a string, else None."""
    var = _own(name)
    found = source(name)
    if found is not None:
        return os.environ[found]
    return var.default if isinstance(var.default, str) else None


def flag(name: str) -> bool:
    """Whether flag `name` is on: its default when unset, else on unless its value is one of
    the variable's `off` values."""
    var = _own(name, ("flag",))
    value = text(name)
    if value is None:
        return bool(var.default)
    return value not in var.off


def integer(name: str) -> Optional[int]:
    """Int variable `name`: its default (an int or None) when unset, else its value as an
    int; ValueError ("`name` must be a whole number") when it is not one, empty included."""
    var = _own(name, ("int",))
    value = text(name)
    if value is None:
        return var.default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name} must be a whole number, got {value!r}") from None


def raw(name: str) -> Optional[str]:
    """`os.environ.get(name)` for a variable in the table, typically an external one that
    camlir inspects but does not own (`CUDA_HOME`, `GLIBC_TUNABLES`, ...)."""
    return os.environ.get(variable(name).name)


def _names() -> set:
    return {v.name for v in VARIABLES if v.kind != "external"} | {n for v in VARIABLES for n in v.old_names}


def snapshot() -> dict:
    """camlir's own variables (and their old names) that are set now, name -> value: what a
    compile worker applies to each request (`apply`), so that a variable set after the
    worker started still counts there."""
    return {name: os.environ[name] for name in _names() if name in os.environ}


def apply(values: dict) -> None:
    """Makes camlir's variables in this process what `values` (a `snapshot()`) says: set
    where it has them, unset where it does not."""
    for name in _names():
        if name in values:
            os.environ[name] = values[name]
        else:
            os.environ.pop(name, None)


def _default_cell(var: Variable) -> str:
    if var.shown:
        return var.shown
    if var.kind == "external":
        return "(not camlir's)"
    if var.kind == "flag":
        return "on" if var.default else "off"
    if var.default is None or var.default == "":
        return "unset"
    return f"`{var.default}`"


def markdown_table() -> str:
    """The docs table (docs/environment.md): one row per variable, in `VARIABLES` order."""
    rows = ["| variable | old names | default | what it does |", "|---|---|---|---|"]
    for var in VARIABLES:
        old = ", ".join(f"`{n}`" for n in var.old_names)
        doc = var.doc.replace("|", "\\|")
        rows.append(f"| `{var.name}` | {old} | {_default_cell(var)} | {doc} |")
    return "\n".join(rows) + "\n"
