"""Observability: the `CAMLIR_LOGS` environment variable and the `camlir` logger.

`CAMLIR_LOGS` (its old name `CA_LOGS` still works) is a comma-separated list (also settable
with `camlir.set_logs("graph,recompiles")`):
- `graph`: print each captured `ca` module;
- `verbose`: also the module after every pipeline stage, and tensor metadata;
- `passes`: the IR after every pass inside each stage, on stderr (as `ca-opt
  --mlir-print-ir-after-all`);
- `recompiles`: why each capture and compile happened, and its cost (`camlir.explain()`);
- `perf`: profile every backward and log where the time went at exit (`camlir.profile()`).
Everything goes through Python `logging` (logger `camlir`), so applications can route it;
when a kind is switched on and the logger has no handler, one printing to stderr is added.
Messages carry no "camlir:" of their own: where the application configured logging
(`logging.basicConfig()`: `WARNING:camlir:graph 1 runs ...`) the logger's name says it once;
where nothing is configured, warnings print as `camlir: graph 1 runs ...` (`_Unconfigured`,
in place of logging's last resort, which prints the bare message).
"""

import difflib
import logging
import sys

from camlir import environment

KINDS = ("graph", "verbose", "recompiles", "passes", "perf")
log = logging.getLogger("camlir")
_enabled: set = set()
_handler = None


class _Unconfigured(logging.Handler):
    """Warnings and errors on stderr as `camlir: <message>`, only while nothing else shows
    them: no other handler on camlir's logger and none on the root logger."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.setFormatter(logging.Formatter("camlir: %(message)s"))

    def emit(self, record):
        if logging.getLogger().handlers or any(h is not self for h in log.handlers):
            return
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001 - as logging's own handlers: never raise from a log call
            self.handleError(record)


_UNCONFIGURED = _Unconfigured()
log.addHandler(_UNCONFIGURED)


def _own_handlers() -> list:
    return [h for h in log.handlers if h is not _UNCONFIGURED]


def follow_torch_logs() -> None:
    """`TORCH_LOGS=camlir`: PyTorch put its handler (its format, its level) on camlir's
    logger, and each record also reached the root logger's handler once one was set (every
    line printed twice). As PyTorch does for its own loggers, records stop at camlir's
    logger then. Called here and when the API loads (torch, which reads TORCH_LOGS, is
    imported by then)."""
    names = [n.strip().lstrip("+-") for n in (environment.raw("TORCH_LOGS") or "").split(",")]
    if "camlir" in names and _own_handlers():
        log.propagate = False


def set_logs(spec) -> None:
    """Switches camlir's log kinds on, as `CAMLIR_LOGS` does (`CA_LOGS` too): `spec` is a
    comma-separated string or an iterable of kinds from `KINDS` ("graph": each captured
    `ca` module; "verbose": also the module after every stage; "passes": the IR after every
    pass, on stderr; "recompiles": why each capture and compile happened; "perf": where the
    time went, at exit). Empty switches all off;
    an unknown kind is a ValueError that lists the known ones.

        camlir.set_logs("graph,recompiles")
        camlir.set_logs("")             # all off
    """
    global _handler
    kinds = [k.strip() for k in (spec.split(",") if isinstance(spec, str) else spec or ()) if k.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown CAMLIR_LOGS kind(s) {unknown}; known: {', '.join(KINDS)}")
    _enabled.clear()
    _enabled.update(kinds)
    if "verbose" in _enabled:
        _enabled.update(("graph", "recompiles"))
    if _enabled:
        if log.level == logging.NOTSET or log.level > logging.INFO:
            log.setLevel(logging.INFO)
        if not _own_handlers() and _handler is None:
            _handler = logging.StreamHandler(sys.stderr)
            _handler.setFormatter(logging.Formatter("[camlir] %(message)s"))
            log.addHandler(_handler)
            log.propagate = False  # our handler prints it; don't print it twice via the root
    if "perf" in _enabled:
        from camlir import profiling

        profiling.profile_process(log)


def enabled(kind: str) -> bool:
    """Whether log kind `kind` (one of `KINDS`) is on; `verbose` turns `graph` and
    `recompiles` on too."""
    return kind in _enabled


def set_from_environment() -> None:
    """Applies `CAMLIR_LOGS` (or its old name `CA_LOGS`; run once, when this module is
    imported). An unknown kind is warned about and skipped, the others still apply (as
    `TORCH_LOGS` does: `CAMLIR_LOGS=grpah,recompiles` used to drop `recompiles` too), rather
    than making `import camlir` fail."""
    spec = environment.text("CAMLIR_LOGS") or ""
    kinds = [k.strip() for k in spec.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    set_logs([k for k in kinds if k in KINDS])
    if unknown:
        close = {k: difflib.get_close_matches(k, KINDS, n=1) for k in unknown}
        hints = ", ".join(f"{k!r}" + (f" (did you mean {c[0]!r}?)" if c else "") for k, c in close.items())
        log.warning("%s: skipping unknown kind(s) %s; known: %s", environment.source("CAMLIR_LOGS"), hints,
                    ", ".join(KINDS))

set_from_environment()
follow_torch_logs()
