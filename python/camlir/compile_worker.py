"""A compile worker: `python -m camlir.compile_worker`, started by `compile_service`.

It reads requests on stdin and writes answers on stdout, both length-prefixed pickles
(`compile_service.send` / `receive`), one compile at a time: `pipeline.compile_apart` runs
the stages from the backend's `service_from` on and returns the program as the files the
disk cache keeps. Before the first request it says `{"ready": True}` (after importing MLIR
and camlir's passes, ~0.4 s), so the service can tell a worker that cannot start from one
that died compiling.

It never imports torch: the stages it runs are MLIR passes and LLVM, the kernels' BLAS
calls stay relocations until the training process loads the library, and what the code
depends on in the training process (whether libgomp is there) comes with the request
(`Backend.worker_facts`). With torch a worker took 3.3 s to start and ~450 MB; without it
0.4 s.

Per request it applies the requester's camlir environment variables (set after this
process started, they still count) and log kinds, and hands back the log records the
compile made (the requester logs them as its own: `CAMLIR_LOGS=verbose` shows the stages
that ran here). Anything printed goes to stderr: stdout is the protocol's.

`CAMLIR_COMPILE_DELAY_S` (a test knob) sleeps that long before each compile, so tests can
make a compile outrun its timeout or kill a worker in the middle of one.
"""

import logging
import os
import signal
import sys
import time
import traceback


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append((record.levelno, record.getMessage()))


def handle(request: dict) -> dict:
    """One request's answer (never raises: a failure is the answer's `error`)."""
    from camlir import environment, logs, pipeline
    from camlir.stages import StageError

    environment.apply(request.get("environment", {}))
    logs.set_logs(request.get("log_kinds", ()))
    records = _Records()
    logs.log.addHandler(records)
    level, logs.log.level = logs.log.level, logging.DEBUG
    try:
        delay = float(environment.text("CAMLIR_COMPILE_DELAY_S") or 0)
        if delay > 0:
            time.sleep(delay)
        answer = pipeline.compile_apart(request)
    except BaseException as exc:  # noqa: BLE001 - told to the requester, who decides what runs
        if logs.enabled("verbose"):
            logs.log.info("compile worker traceback:\n%s", traceback.format_exc())
        answer = {"error": (type(exc).__name__, str(exc), exc.stage if isinstance(exc, StageError) else None)}
    finally:
        logs.log.removeHandler(records)
        logs.log.setLevel(level)
    answer["logs"] = records.records
    answer["pid"] = os.getpid()
    answer["torch_imported"] = "torch" in sys.modules  # it should not be: see the module docstring
    return answer


def main() -> int:
    """Serves requests until stdin closes; the exit status."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training process's; it ends us
    protocol_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # print() and native writes to fd 1 land on stderr, never in the protocol
    sys.stdout = sys.stderr
    protocol_in = sys.stdin.buffer
    import importlib

    from camlir import compile_service
    for name in ("camlir.pipeline", "camlir.backends.cpu.compiler"):  # imported before saying ready
        importlib.import_module(name)

    camlir_log = logging.getLogger("camlir")
    camlir_log.addHandler(logging.NullHandler())  # set_logs adds no stderr handler: records go back
    camlir_log.propagate = False
    compile_service.send(protocol_out, {"ready": True, "pid": os.getpid()})
    while True:
        try:
            request = compile_service.receive(protocol_in)
        except EOFError:
            return 0  # the requester closed: it exits or shut the service down
        compile_service.send(protocol_out, handle(request))


if __name__ == "__main__":
    sys.exit(main())
