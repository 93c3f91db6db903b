"""What camlir hands back to the autograd engine for one captured backward graph.

The engine calls it with each backward's `(inputs, sizes, scalars, hooks, packed_data)`.
On the first call (only then are real inputs known) the graph is re-traced, imported into
the `ca` dialect and compiled for the backend in force; later calls reuse that artifact
while its shape guards hold. The backend and `fullgraph` are read at call time, so one
captured graph serves `enable(backend=...)` scopes with different settings.

When camlir cannot handle a graph, `fullgraph=True` raises `UnsupportedError` naming the
node or op; otherwise PyTorch runs the captured graph itself (logged, counted in
`fallbacks`), so gradients are never wrong.
"""

import hashlib
import time

import torch

from . import logs
from .backends.cpu.program import CpuProgram, SpecializingProgram
from .backends.eager import EagerProgram, InterpreterError
from .settings import active_settings
from .capture.hook_trace import trace_hooks
from .capture.retrace import RetraceError, plain_sizes, retrace
from .capture.to_ca import import_graph
from .context import make_context
from .stats import counters
from .errors import UnsupportedError

_seen_graphs = set()
_capture_count = [0]
_compiled = []  # (capture id, Artifact), newest last; cleared by camlir.reset()


def forget_graphs() -> None:
    _seen_graphs.clear()
    _compiled.clear()
    _capture_count[0] = 0


def captured_graphs() -> list:
    """The `ca` modules compiled since the last reset, as (capture id, module text)."""
    return [(capture_id, str(artifact.module)) for capture_id, artifact in _compiled]


def compiled_programs() -> list:
    """(capture id, backend, program) for every artifact compiled since the last reset.
    A cpu program has `kernels` (name -> compiled kernel), `lowered_text` (the module after
    the lowering passes) and `compile_seconds`."""
    return [(capture_id, artifact.backend, artifact.program) for capture_id, artifact in _compiled]


class Artifact:
    """One compiled variant: the `ca` module, its program, and the guards it assumes."""

    def __init__(self, retraced, module, program, backend, hook_guard=None):
        self.retraced = retraced
        self.module = module
        self.program = program
        self.backend = backend
        self.hook_guard = hook_guard  # what inlined hook bodies assume (None: nothing inlined)


class CompiledBackward:
    def __init__(self, gm, reasons):
        self.gm = gm
        self.reasons = reasons
        self.artifacts = []
        self.fallback_reason = None
        counters["captures"] += 1
        _capture_count[0] += 1
        self.capture_id = _capture_count[0]
        if logs.enabled("recompiles"):
            why = "; ".join(reasons) if reasons else "first backward"
            logs.log.info("capture %d: %s", self.capture_id, why)

    def __call__(self, inputs, sizes, scalars, hooks, packed_data):
        settings = active_settings()
        if settings is None:  # the engine reused this graph after camlir was switched off
            return list(self.gm(inputs, sizes, scalars, hooks, packed_data))
        if self.fallback_reason is not None:
            if settings.fullgraph:
                raise UnsupportedError(self.fallback_reason)
            return list(self.gm(inputs, sizes, scalars, hooks, packed_data))
        sizes_ = plain_sizes(sizes)
        artifact = self._find(settings.backend, inputs, sizes_, hooks)
        if artifact is None:
            try:
                artifact = self._compile(settings, inputs, sizes, scalars, hooks, packed_data)
            except UnsupportedError as exc:
                if settings.fullgraph:
                    raise
                self.fallback_reason = str(exc)
                counters["fallbacks"] += 1
                logs.log.warning("camlir: falling back to PyTorch for this backward: %s", exc)
                return list(self.gm(inputs, sizes, scalars, hooks, packed_data))
        else:
            counters["cache_hits"] += 1
        args = list(inputs) + (sizes_ if artifact.retraced.symbolic else [])
        with torch.no_grad():
            return list(artifact.program(args, hooks))

    def _eager_program(self, module):
        try:
            return EagerProgram(module)
        except InterpreterError as exc:
            raise UnsupportedError(f"op {exc.op_name} cannot run: {exc}") from exc

    def _cpu_program(self, module, retraced, inputs):
        """Native code when the cpu backend can compile the graph; otherwise the reference
        interpreter, which is slower but exact (logged and counted in `interpreted`)."""
        if retraced.symbolic:
            return SpecializingProgram(module, len(inputs), f"graph {self.capture_id}",
                                       lambda: self._eager_program(module))
        else:
            try:
                program = CpuProgram(module, list(inputs))
                logs.log.debug("graph %d: %d kernels compiled in %.3f s", self.capture_id,
                               len(program.kernels), program.compile_seconds)
                return program
            except Exception as exc:  # noqa: BLE001 - any compile failure has the same remedy
                reason = _headline(exc)
                if logs.enabled("verbose"):
                    logs.log.info("cpu compile failure of graph %d in full:\n%s", self.capture_id, exc)
        counters["interpreted"] += 1
        logs.log.warning("camlir: the cpu backend cannot compile graph %d (%s); it runs on the "
                         "reference interpreter", self.capture_id, reason)
        return self._eager_program(module)

    def _find(self, backend, inputs, sizes, hooks):
        for artifact in self.artifacts:
            if artifact.backend != backend or not artifact.retraced.guards_hold(inputs, sizes):
                continue
            guard = artifact.hook_guard
            if guard is None or guard.holds(hooks):
                return artifact
            if logs.enabled("recompiles"):
                logs.log.info("capture %d recompiles: %s", self.capture_id, guard.reason(hooks))
        return None

    def _compile(self, settings, inputs, sizes, scalars, hooks, packed_data) -> Artifact:
        start = time.perf_counter()
        try:
            retraced = retrace(self.gm, inputs, sizes, scalars, hooks, packed_data)
        except RetraceError as exc:
            raise UnsupportedError(str(exc)) from exc
        except Exception as exc:  # noqa: BLE001 - anything else in tracing is also "cannot handle"
            raise UnsupportedError(f"re-tracing the backward failed: {type(exc).__name__}: {exc}") from exc
        if logs.enabled("verbose"):
            logs.log.info("graph %d, stage 'retrace' (aten ops, %s sizes):\n%s", self.capture_id,
                          "symbolic" if retraced.symbolic else "static", retraced.graph.code)
        context = make_context()
        try:
            module = import_graph(retraced.graph.graph, context)
        except Exception as exc:  # noqa: BLE001
            raise UnsupportedError(f"importing the backward into the ca dialect failed: {exc}") from exc
        text = str(module)
        if logs.enabled("graph"):
            logs.log.info("captured backward graph %d (%s):\n%s", self.capture_id,
                          "symbolic sizes" if retraced.symbolic else "static sizes", text)
        if logs.enabled("verbose"):
            logs.log.info("inputs of graph %d: %s", self.capture_id, _describe(inputs))
        hook_guard = None
        if settings.backend == "cpu":
            # Hooks that are safe to trace get bodies that ca-inline-hooks inlines; the
            # reference backend keeps calling every hook, as the eager engine does.
            hook_guard = trace_hooks(module, hooks, device="cpu")
            program = self._cpu_program(module, retraced, inputs)
        else:
            program = self._eager_program(module)
        counters["compiles"] += 1
        digest = hashlib.sha256(text.encode()).hexdigest()
        if digest not in _seen_graphs:
            _seen_graphs.add(digest)
            counters["unique_graphs"] += 1
        artifact = Artifact(retraced, module, program, settings.backend, hook_guard)
        self.artifacts.append(artifact)
        _compiled.append((self.capture_id, artifact))
        logs.log.debug("compiled graph %d in %.3f s", self.capture_id, time.perf_counter() - start)
        return artifact


def _headline(exc: BaseException) -> str:
    """The line of an exception that says what went wrong: MLIR's pipeline errors put the
    diagnostic (`error: ... 'op' ...`) after a generic first line."""
    lines = [l.strip() for l in str(exc).splitlines() if l.strip()]
    for line in lines:
        if "error:" in line:
            return f"{type(exc).__name__}: {line}"
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _describe(values) -> str:
    parts = []
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor):
            kind = "param" if isinstance(v, torch.nn.Parameter) else "tensor"
            parts.append(f"#{i} {kind} {tuple(v.shape)} {v.dtype} stride={v.stride()}")
        else:
            parts.append(f"#{i} {type(v).__name__}")
    return "; ".join(parts)
