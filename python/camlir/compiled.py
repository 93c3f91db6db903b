"""What camlir hands back to the autograd engine for one captured backward graph.

The engine calls it with each backward's `(inputs, sizes, scalars, hooks, packed_data)`.
On the first call (only then are real inputs known) the graph goes through the stages of
`camlir.pipeline` for the backend in force; later calls reuse that artifact while its
guards hold (`camlir.cache`). The backend and `fullgraph` are read at call time, so one
captured graph serves `enable(backend=...)` scopes with different settings.

Counters tell the truth: `compiles` counts every program built (each size set of a
symbolic capture included), and a call is a `cache_hit` only when nothing was compiled.
Every capture and compile is recorded with its reason and cost (`camlir.explain()`,
`CA_LOGS=recompiles`). A graph that needs more than `config.recompile_limit` programs
warns once, with the reasons, and runs uncompiled from then on (`fullgraph=True` raises).
A structure whose compiled backward measures slower than the eager engine runs on the eager
engine (`graph_choice.py`, decided in `capture/engine.py` before compiled autograd runs;
never under `fullgraph=True`).

When camlir cannot handle a graph, `fullgraph=True` raises `UnsupportedError` naming the
node or op; otherwise PyTorch runs the captured graph itself (logged, counted in
`fallbacks`), so gradients are never wrong.
"""

import hashlib
import time
import weakref

import torch
from torch_mlir import ir

from . import compile_progress, compile_service, disk_cache, effects, environment, events, graph_choice, logs, pipeline, profiling
from . import backend_registry as registry
from .cache import Artifact, Artifacts, RecompileLimitReached, SizeVariants
from .capture import engine, miss_reasons, tensor_names
from .capture.hook_trace import TRACED_KINDS
from .capture.retrace import RetraceError, has_unpack_hooks, plain_sizes, record_run
from .context import make_context
from .dialects.ca.ir_helpers import ops_named
from .errors import ProgramRefused, UnsupportedError
from .pending_program import CompileAbandoned, PendingProgram
from .settings import active_settings, config
from . import stages
from .stages import Dump
from .stats import counters
from .variant import STATIC, Variant

_seen_graphs = set()
_capture_count = [0]
_compiled = []  # (capture id, Artifact), newest last; cleared by camlir.reset()


def forget_graphs() -> None:
    """Forgets what this module remembers across captures (part of `camlir.reset()`): the
    compiled artifacts `captured_graphs()`/`compiled_programs()` list, the modules seen for
    `unique_graphs`, and the capture ids, which start again at 1."""
    _seen_graphs.clear()
    _compiled.clear()
    _capture_count[0] = 0
    for graph in list(_live):
        graph.release()
    _live.clear()
    events.forget()


def captured_graphs() -> list:
    """The `ca` modules compiled since the last `camlir.reset()`, as a list of
    (capture id, module text) pairs, oldest first; the text is the captured backward as
    `ca-opt` reads it. No arguments.

        camlir.compile_backward(model(x).sum())
        graph_id, text = camlir.captured_graphs()[-1]
        print(text)                     # func.func @backward(...) with ca.node regions
    """
    return [(capture_id, str(artifact.module)) for capture_id, artifact in _compiled]


def compiled_programs() -> list:
    """(capture id, backend name, program) for every artifact compiled since the last
    `camlir.reset()`, oldest first. No arguments. A cpu program has `kernels` (name ->
    compiled kernel), `lowered_text` (the module after the linalg stage) and
    `compile_seconds`.

        for graph_id, backend, program in camlir.compiled_programs():
            print(graph_id, backend, sorted(getattr(program, "kernels", {})))
    """
    return [(capture_id, artifact.backend, artifact.program) for capture_id, artifact in _compiled]


def input_names(capture_id: int) -> dict:
    """{input index: module path} for captured backward `capture_id`'s parameters and
    buffers ("2.bias"); {} when the graph is gone or none of its inputs has a name."""
    for graph in list(_live):
        if graph.capture_id == capture_id:
            return graph.input_names()
    return {}


# Every CompiledBackward not yet released. PyTorch's compiled-autograd cache keeps each
# compiled function it was handed after `clear_cache()` (torch 2.13: the (runtime wrapper,
# compiled function) pair stays referenced from C++), so a graph's programs, MLIR context
# and FX graph outlived `camlir.reset()`: 7 MB per compiled graph, measured over 40 small
# models; a long fuzzing run grew past 6 GB. `reset()` releases them instead.
_live: "weakref.WeakSet" = weakref.WeakSet()


class CompiledBackward:
    """The compiled form of one captured graph: the autograd engine calls it on every
    backward with that graph's structure, and it runs the artifact whose guards hold
    (compiling one first when none does)."""

    def __init__(self, gm, reasons):
        self.gm = gm
        self.reasons = reasons
        self.artifacts = Artifacts()
        self.fallback_reason = None
        self.compiles = 0       # programs built for this graph, checked against the limit
        self.compile_log = []   # their reasons, for the recompile-limit warning
        self._miss = None       # (what, reason) of the last guard that failed in a lookup
        self._pending_seconds = 0.0  # re-trace and import time, charged to the next compile
        self._disk_key = None        # this call's disk-cache key (None: not keyable or off)
        self._unpacked = None        # what saved-tensor unpack hooks returned (record_run)
        self._host_calls = {}        # host-call node -> the entries its backward returned as None
        self._host_labels = {}       # hook index of a host-call node's ctx -> (node label, why)
        self._first_call = True      # no program of this graph has run yet
        self._pending = []           # PendingPrograms of this graph not yet resolved
        self.ran_pending = False     # this call ran PyTorch's graph: its program is compiling
        # (capture, camlir's preparation, run seconds, what ran) of the first call, for the
        # engine's `backward` event; the capture: from the backward's start to here.
        started = engine.capture_started()
        self.capture_seconds = time.perf_counter() - started if started else 0.0
        self.first_backward = None
        self.first_backward_told = False
        self.leaves = None  # the parameters among the inputs, named on request (`input_names`)
        _live.add(self)
        counters["captures"] += 1
        _capture_count[0] += 1
        self.capture_id = _capture_count[0]
        what, _ = miss_reasons.cause(reasons)  # (which sizes changed: in the sentence)
        events.record(events.Event(self.capture_id, "capture",
                                   "; ".join(miss_reasons.explained(r) for r in reasons) or "first backward",
                                   what, seconds=self.capture_seconds))
        if graph_choice.enabled():
            graph_choice.routes.wake()  # time this new structure against the eager engine

    def input_names(self) -> dict:
        """{input index: module path} of the parameters and buffers among this graph's
        inputs (`%arg8` is "2.bias"); found on the first request (tensor_names.py)."""
        return self.leaves.names() if self.leaves is not None else {}

    def names_note(self) -> str:
        """"; %arg3 is 0.weight, %arg8 is 2.bias" for the graph log, or ""."""
        names = self.input_names()
        return "".join(f"; %arg{i} is {name}" if n == 0 else f", %arg{i} is {name}"
                       for n, (i, name) in enumerate(sorted(names.items())))

    def release(self) -> None:
        """Drops what this graph holds (its programs, modules, captured graph): `camlir.reset()`
        calls it, after which PyTorch never calls this object again."""
        self.artifacts = Artifacts()
        self.gm = None
        self._unpacked = None
        self._pending = []

    def compile_in_flight(self) -> bool:
        """Whether a program of this graph is compiling in a worker (never blocks)."""
        self._pending = [p for p in self._pending if p.in_flight()]
        return bool(self._pending)

    def __call__(self, inputs, sizes, scalars, hooks, packed_data):
        if self.gm is None:
            raise RuntimeError(f"camlir: graph {self.capture_id} was released by camlir.reset() and cannot run")
        engine.running(self)  # from here on, an error is the backward's own (see engine._run)
        self.ran_pending = False
        if self.leaves is None:  # once per graph: weak references only (tensor_names.py)
            self.leaves = tensor_names.Leaves(inputs)
        entered = time.perf_counter() if self.first_backward is None else 0.0
        settings = active_settings()
        if settings is None:  # the engine reused this graph after camlir was switched off
            return list(self.gm(inputs, sizes, scalars, hooks, packed_data))
        if self.fallback_reason is not None:
            if settings.fullgraph:
                raise UnsupportedError(self.fallback_reason)
            return list(self.gm(inputs, sizes, scalars, hooks, packed_data))
        compiles_before = counters["compiles"]
        sizes_ = plain_sizes(sizes)
        try:
            artifact = self.artifacts.find(settings.backend, inputs, sizes_, hooks, self._log_miss, scalars)
            if artifact is None:
                artifact = self._from_disk(settings, inputs, sizes_, scalars, hooks)
            if artifact is None and self._unpacked is None and has_unpack_hooks(self.gm):
                ready = time.perf_counter()
                results = self._learn(inputs, sizes, scalars, hooks, packed_data)
                if entered:
                    self._first_timed(entered, ready, "PyTorch's graph, to see what its unpack hooks return")
                return results
            if artifact is None:
                try:
                    artifact = self._compile(settings, inputs, sizes, scalars, hooks, packed_data)
                except _RunForReal as first:
                    ready = time.perf_counter()
                    results = self._learn(inputs, sizes, scalars, hooks, packed_data, first.host_nodes)
                    if entered:
                        self._first_timed(entered, ready, "PyTorch's graph, to see what its host-call nodes return")
                    return results
            args = list(inputs) + (sizes_ if artifact.retraced.symbolic else [])
            program = artifact.program
            if isinstance(program, SizeVariants):
                program = program.variant(args, hooks, runtime_sizes=settings.dynamic is not False)
            if isinstance(program, PendingProgram):
                pending, program = program, program.resolve(wait=bool(settings.fullgraph or settings.wait))
                if program is not None and artifact.program is pending:
                    artifact.program = program  # arrived: later calls skip the pending object
        except (UnsupportedError, RecompileLimitReached) as exc:
            if settings.fullgraph:
                raise UnsupportedError(str(exc)) from exc
            self.fallback_reason = str(exc)
            counters["fallbacks"] += 1
            graph_choice.routes.wake()  # so that later backwards of this structure run eagerly
            kind = "recompile_limit" if isinstance(exc, RecompileLimitReached) else "fallback"
            events.record(events.Event(self.capture_id, kind, str(exc)))
            logs.log.warning("graph %d runs uncompiled from now on: %s", self.capture_id, exc)
            if events.listening("fallback"):
                events.tell("fallback", capture_id=self.capture_id, reason=str(exc), gm=self.gm, inputs=inputs,
                            sizes=sizes, scalars=scalars, hooks=hooks, packed_data=packed_data,
                            unpacked=self._unpacked)
            ready = time.perf_counter()
            results = list(self.gm(inputs, sizes, scalars, hooks, packed_data))
            if entered:
                self._first_timed(entered, ready, "PyTorch's graph: camlir handed it back")
            return results
        if program is None:
            # Its program is compiling in a worker: this call runs PyTorch's captured graph
            # (the capture has run; the eager engine cannot answer it any more) and later
            # ones the eager engine, before any capture (capture/engine.py), until it is ready.
            self.ran_pending = True
            counters["while_compiling"] += 1
            ready = time.perf_counter()
            results = list(self.gm(inputs, sizes, scalars, hooks, packed_data))
            if entered:
                self._first_timed(entered, ready, "PyTorch's graph, while the program compiles in a worker")
            return results
        if self._first_call:  # repro.py listens: it keeps first-call inputs when asked to
            self._first_call = False
            if events.listening("first_call"):
                events.tell("first_call", capture_id=self.capture_id, module=artifact.module, args=args,
                            n_inputs=len(inputs), sizes=sizes_, symbolic=artifact.retraced.symbolic, hooks=hooks)
        if settings.fullgraph and getattr(program, "not_native", ""):
            # fullgraph: the whole backward is compiled code, or an error naming what is not.
            raise UnsupportedError(f"graph {self.capture_id} is not all compiled code: {program.not_native}")
        profile = profiling.current()
        start = time.perf_counter() if (profile is not None or entered) else 0.0
        with torch.no_grad():
            try:
                results = list(program(args, hooks, packed=packed_data) if packed_data else program(args, hooks))
            except ProgramRefused as exc:  # before any effect: a specialized program answers it
                variants = artifact.program
                if not isinstance(variants, SizeVariants):
                    raise RuntimeError(f"camlir: graph {self.capture_id}: {exc}") from exc
                variants.refuse_runtime_sizes(str(exc))
                program = variants.variant(args, hooks)
                results = list(program(args, hooks, packed=packed_data) if packed_data else program(args, hooks))
        if profile is not None:
            profile.add_program(time.perf_counter() - start)
        if entered:
            self._first_timed(entered, start, "the compiled program")
        if counters["compiles"] == compiles_before:
            counters["cache_hits"] += 1
        return results

    def _first_timed(self, entered: float, ready: float, ran: str) -> None:
        """Keeps the first call's phases for the engine's `backward` event."""
        self.first_backward = (self.capture_seconds, ready - entered, time.perf_counter() - ready, ran)

    def _learn(self, inputs, sizes, scalars, hooks, packed_data, host_nodes=()) -> list:
        """A graph with saved-tensor unpack hooks (activation checkpointing) or host-call
        nodes: its first call runs the captured graph itself, recording what the hooks
        return (for checkpointing, the recomputed activations) and which entries the
        host-call nodes' backwards return as None, which the re-trace of the next call
        needs. That call then compiles; hooks and host calls stay Python calls inside the
        compiled backward."""
        start = time.perf_counter()
        results, unpacked, host_calls = record_run(self.gm, inputs, sizes, scalars, hooks, packed_data, host_nodes)
        self._unpacked = unpacked
        self._host_calls.update(host_calls)
        if host_nodes:
            what, why = "host calls", f"{len(host_nodes)} host-call nodes return (which of their gradients are None)"
        else:
            what, why = "unpack hooks", f"{len(unpacked)} saved-tensor unpack hooks return"
        events.record(events.Event(self.capture_id, "fallback",
                                   f"first call runs PyTorch's graph to see what its {why}; the next call compiles",
                                   what, seconds=time.perf_counter() - start))
        return list(results)

    def _tell_host_calls(self, host_nodes: dict) -> None:
        """One `host_call` event (and an INFO line) per node whose backward runs in Python."""
        self._host_labels = {hook_id: (label, why) for label, (hook_id, why) in host_nodes.items()}
        for label, (_, why) in host_nodes.items():
            reason = (f"autograd node {label} runs its own backward in Python inside the compiled program (a host "
                      f"call; the kernels around it stay compiled): it could not be traced: {why}")
            events.record(events.Event(self.capture_id, "host_call", reason, f"node {label}"))
            logs.log.info("graph %d: %s", self.capture_id, reason)

    def compiling(self, what: str, reason: str, old, new, build):
        """The gate every compile of this graph goes through: refuses past
        `config.recompile_limit` (raising `RecompileLimitReached` with every reason so far),
        else runs `build()`, counts it, and records it with what it cost."""
        self._check_limit(reason, new)
        start = time.perf_counter()
        with compile_progress.Watch(f"graph {self.capture_id}", reason) as watch:
            result = build()
            program = result[0] if isinstance(result, tuple) else result
            if isinstance(program, PendingProgram) and program.in_flight():
                watch.background(program)
        seconds = time.perf_counter() - start + self._pending_seconds
        self._pending_seconds = 0.0
        self.compiles += 1
        counters["compiles"] += 1
        self.compile_log.append(reason if new is None else f"{reason} {new}")
        events.record(events.Event(self.capture_id, "compile", reason, what, old, new, seconds))
        return result

    def _check_limit(self, reason: str, new=None) -> None:
        limit = config.recompile_limit
        if self.compiles >= limit:
            refused = reason if new is None else f"{reason} {new}"  # with its sizes, as the others
            raise RecompileLimitReached(
                f"graph {self.capture_id} reached camlir.config.recompile_limit={limit} compiles (raise "
                f"the limit, or enable(dynamic=True)); their reasons: {'; '.join(self.compile_log)}; "
                f"the one refused: {refused}")

    def _log_miss(self, reason: str) -> None:
        what = "hooks" if reason.startswith("hook") else "scalars" if reason.startswith("scalar") else "ctx value"
        self._miss = (what, reason)

    def _compile(self, settings, inputs, sizes, scalars, hooks, packed_data) -> Artifact:
        if self._miss is not None:
            what, reason = self._miss
        elif any(a.backend == settings.backend for a in self.artifacts.items):
            what, reason = "sizes", "sizes outside the guards of the symbolic trace"
        elif self.artifacts.items:
            what, reason = "backend", f"first backward with backend {settings.backend!r}"
        else:
            what, reason = "first call", "first backward of this graph"
        self._miss = None
        self._check_limit(reason)
        _refuse_unstrided(inputs)
        backend = registry.get(settings.backend)
        backend.require_device()
        start = time.perf_counter()
        dump = Dump.for_graph(self.capture_id)
        try:
            retraced = pipeline.make_aten(self.gm, inputs, sizes, scalars, hooks, packed_data, dump, self._unpacked,
                                          self._host_calls)
        except RetraceError as exc:
            raise UnsupportedError(str(exc)) from exc
        except Exception as exc:  # noqa: BLE001 - anything else in tracing is also "cannot handle"
            raise UnsupportedError(f"re-tracing the backward failed: {type(exc).__name__}: {exc}") from exc
        if retraced.host_nodes and settings.fullgraph:
            raise UnsupportedError(f"graph {self.capture_id} is not all compiled code: " + "; ".join(
                f"autograd node {label} would run its backward in Python (a host call: it could not be traced: "
                f"{why})" for label, (_, why) in retraced.host_nodes.items()))
        if retraced.unseen:
            raise _RunForReal(retraced.unseen)
        self._tell_host_calls(retraced.host_nodes)
        try:
            module = pipeline.make_ca(retraced, dump, effects.in_captured_graph(
                self.gm, len(retraced.host_nodes), retraced.skipped_accumulations))
        except UnsupportedError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise UnsupportedError(f"importing the backward into the ca dialect failed: {exc}") from exc
        text = str(module)
        if logs.enabled("graph"):
            logs.log.info("captured backward graph %d (%s%s):\n%s", self.capture_id,
                          "symbolic sizes" if retraced.symbolic else "static sizes", self.names_note(), text)
        if logs.enabled("verbose"):
            logs.log.info("inputs of graph %d: %s", self.capture_id, _describe(inputs))
        self._pending_seconds = time.perf_counter() - start
        hook_guard = None
        if retraced.symbolic and backend.needs_static_sizes:
            program = self._size_variants(backend, module, inputs)  # compiles on its first call
        else:
            background = _may_defer(settings)
            program, hook_guard = self.compiling(what, reason, None, None,
                                                 lambda: self.build(backend, module, STATIC, list(inputs), hooks,
                                                                    dump=dump, background=background))
        digest = hashlib.sha256(text.encode()).hexdigest()
        if digest not in _seen_graphs:
            _seen_graphs.add(digest)
            counters["unique_graphs"] += 1
        artifact = Artifact(retraced, module, program, settings.backend, hook_guard, tuple(scalars))
        self.artifacts.add(artifact)
        _compiled.append((self.capture_id, artifact))
        logs.log.debug("compiled graph %d in %.3f s", self.capture_id, time.perf_counter() - start)
        if self._disk_key is not None:
            self._store(self._disk_key, artifact, text)
        return artifact

    # ------------------------------------------------------------------ the disk cache

    def _from_disk(self, settings, inputs, sizes, scalars, hooks):
        """The artifact stored for this call by an earlier process, or None (and the key
        to store this call's artifact under, in `_disk_key`). See disk_cache.py."""
        self._disk_key = None
        backend = registry.get(settings.backend)
        if not backend.stores_programs or not disk_cache.enabled():
            return None
        start = time.perf_counter()
        key = disk_cache.graph_key(self.gm, inputs, sizes, scalars, hooks,
                                   f"{settings.backend} {backend.code_options()}", settings.dynamic)
        self._disk_key = key
        entry = disk_cache.store().get(key) if key is not None else None
        if entry is None:
            return None
        try:
            retraced = disk_cache.guards_from_meta(entry.meta["guards"])
            context = make_context()
            module = ir.Module.parse(entry.read("ca.mlir").decode(), context)
            if retraced.symbolic and backend.needs_static_sizes:
                program = self._size_variants(backend, module, inputs, stored=_Stored(self, backend, key, context))
            else:
                program = backend.from_files(entry, context)
        except Exception as exc:  # noqa: BLE001 - a bad entry is a miss, never a failure
            logs.log.warning("disk cache entry %s could not be used (%s: %s); compiling instead",
                             key[:16], type(exc).__name__, exc)
            return None
        if not retraced.guards_hold(inputs, sizes) or not retraced.value_guard.holds(hooks):
            return None
        # the disk key holds the scalars' values, so the stored program was traced with these
        artifact = Artifact(retraced, module, program, settings.backend, None, tuple(scalars))
        self.artifacts.add(artifact)
        _compiled.append((self.capture_id, artifact))
        self._disk_key = None  # nothing to store: it came from there
        self._disk_hit("graph loaded from the disk cache", start)
        self._show_loaded(module, retraced.symbolic)
        return artifact

    def _show_loaded(self, module, symbolic: bool) -> None:
        """The debugging switches on a disk hit: `CAMLIR_LOGS=graph` prints the stored `ca`
        module, and `CAMLIR_LOGS=verbose` / `CAMLIR_DUMP_DIR` get that module as the import
        stage plus a note that no later stage ran here (they used to go silent)."""
        if logs.enabled("graph"):
            logs.log.info("captured backward graph %d (%s%s; its program came from the disk cache):\n%s",
                          self.capture_id, "symbolic sizes" if symbolic else "static sizes", self.names_note(),
                          module)
        dump = Dump.for_graph(self.capture_id)
        if dump.directory or logs.enabled("verbose"):
            dump("import", module)
            stages.note(dump, "from-disk-cache",
                        "its program was loaded from the disk cache, so no later stage ran in this process; "
                        "CAMLIR_DISK_CACHE=0 (or camlir.config.disk_cache = False) compiles it again and shows "
                        "every stage")

    def _disk_hit(self, reason: str, start: float) -> None:
        counters["disk_cache_hits"] += 1
        events.record(events.Event(self.capture_id, "disk_hit", reason, "disk",
                                   seconds=time.perf_counter() - start))

    def _store(self, key: str, artifact: Artifact, module_text: str) -> None:
        """Stores a fresh artifact under `key`, off the critical path, when it can be
        rebuilt exactly in another process (disk_cache.py says what cannot)."""
        try:
            guards = disk_cache.guards_meta(artifact.retraced)
        except disk_cache.Unkeyable as exc:
            logs.log.debug("graph %d not stored on disk: %s", self.capture_id, exc)
            return
        program = artifact.program
        backend = registry.get(artifact.backend)
        if isinstance(program, SizeVariants):
            program.stored = _Stored(self, backend, key, None)
            files, meta = {"ca.mlir": module_text.encode()}, {"guards": guards}
            disk_cache.put_later(key, lambda: (files, meta))
            return
        if isinstance(program, PendingProgram):
            if artifact.hook_guard is not None and artifact.hook_guard.inlined:
                return
            _store_when_answered(program, key, {"ca.mlir": module_text.encode()}, {"guards": guards})
            return
        why = _not_storable(backend, program, artifact.hook_guard)
        if why:
            logs.log.debug("graph %d not stored on disk: %s", self.capture_id, why)
            return

        def make_files():
            files, meta = _files_of(backend, program)
            files["ca.mlir"] = module_text.encode()
            meta["guards"] = guards
            return files, meta

        disk_cache.put_later(key, make_files)

    # ------------------------------------------------------------------ building a program

    def build(self, backend, module, variant: Variant, args, hooks, interpret_on_failure: bool = True, dump=None,
              background: bool = False):
        """`backend`'s program of `module` for `variant`, and the guard on the hooks it traced.

        The one fallback policy, for every backend: when a backend cannot build the
        program, the reference interpreter runs it instead (slower, exact; warned, counted
        in `interpreted`, told to the "interpreted" listeners); when the reference
        interpreter cannot run it either, `UnsupportedError` hands the graph back to
        PyTorch. With `interpret_on_failure` False the backend's error is raised instead
        (`SizeVariants` then specializes). A program's `not_native` says what of it is not
        compiled code, for `fullgraph=True` (docs/hooks.md). `dump`: where the stages go (a
        static capture's continue the numbering of its retrace and import stages).

        With the compile service (`_service`), the backend's later stages run in a worker:
        with `background` the program is a `PendingProgram` at once (the same policy applies
        when it resolves), else this waits for it. A compile the service could not finish
        (timed out, its worker died twice) raises `CompileAbandoned` (an `UnsupportedError`):
        the graph goes to PyTorch, exact and faster than the reference interpreter."""
        dump = dump or Dump.for_graph(self.capture_id, variant.label)
        try:
            program, guard = pipeline.compile(backend, module, args, hooks, dump, variant, service=_service(backend))
            if isinstance(program, compile_service.Job):
                if background:
                    return self._deferred(program, backend, module, variant, args, hooks, dump, guard,
                                          interpret_on_failure), guard

                def failed(exc):
                    raise exc

                compile_progress.waits_in_worker()

                program = PendingProgram(program, backend, module.context, dump.label, failed,
                                         run_here=pipeline.compile_apart).resolve(wait=True)
        except CompileAbandoned:
            raise
        except Exception as exc:  # noqa: BLE001 - any compile failure has the same remedy
            if backend.reference:
                what = f"op {exc.op_name}" if hasattr(exc, "op_name") else "the reference interpreter"
                raise UnsupportedError(f"{what} cannot run: {exc}") from exc
            if not interpret_on_failure:
                raise
            return self._interpreted(backend, module, variant, args, hooks, dump, exc)
        if not backend.reference:
            program.not_native = self._not_native(module, guard)
        else:
            program.not_native = self._not_native_interpreted(module, hooks)
        return program, guard

    def _not_native_interpreted(self, module, hooks) -> str:
        """What of a reference-backend program would not be compiled code on a compiling
        backend, so that `fullgraph=True` means the same on every backend: host calls, and
        hooks that cannot be traced (found by tracing them on a copy, as the cpu backend's
        trace-hooks stage does; only under `fullgraph`, the one reader)."""
        settings = active_settings()
        if settings is None or not settings.fullgraph:
            return ""
        from .capture.hook_trace import trace_hooks

        guard = trace_hooks(ir.Module.parse(str(module), module.context), hooks, device="cpu")
        return self._not_native(module, guard)

    def _interpreted(self, backend, module, variant: Variant, args, hooks, dump, exc):
        """The reference interpreter's program, for a compile of `backend` that raised `exc`."""
        if logs.enabled("verbose"):
            logs.log.info("%s compile failure of %s in full:\n%s", backend.name, dump.label, exc)
        counters["interpreted"] += 1
        headline = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
        logs.log.warning("the %s backend cannot compile %s (%s); it runs on the "
                         "reference interpreter", backend.name, dump.label, headline)
        if events.listening("interpreted"):
            events.tell("interpreted", capture_id=self.capture_id, reason=headline, module=module, args=args,
                        hooks=hooks, sizes=None if variant.sizes is None else list(variant.sizes))
        program, _ = self.build(registry.get("eager"), module, variant, args, hooks, dump=dump)
        program.not_native = f"the {backend.name} backend could not compile it and interprets it ({headline})"
        return program, None

    def _deferred(self, job, backend, module, variant, args, hooks, dump, guard,
                  interpret_on_failure: bool = True) -> PendingProgram:
        """The `PendingProgram` of a compile running in a worker while backwards go on. Its
        failure resolves to the reference interpreter's program, or (`interpret_on_failure`
        False: the variant with runtime sizes, which `SizeVariants` replaces by specialized
        ones) is raised by `resolve`."""
        def on_failure(exc):
            if not interpret_on_failure:
                raise exc
            return self._interpreted(backend, module, variant, args, hooks, dump, exc)[0]

        def on_ready(program, answer):
            seconds = answer.get("seconds", 0.0)
            events.record(events.Event(self.capture_id, "ready", f"program built in a compile worker in "
                                       f"{seconds:.2f} s; the next backward runs it", "compile service",
                                       seconds=seconds))

        pending = PendingProgram(job, backend, module.context, dump.label, on_failure, on_ready,
                                 run_here=pipeline.compile_apart)
        pending.not_native = self._not_native(module, guard)
        self._pending.append(pending)
        return pending

    def _not_native(self, module, guard) -> str:
        """The hooks camlir would compile but left as Python calls ("" when none). A
        program built without tracing hooks (`guard` None: runtime sizes) leaves them all.
        Kinds camlir always runs in Python (module post hooks, post-accumulate-grad hooks:
        they exist for their effects in Python) do not count."""
        kinds = {ir.IntegerAttr(op.attributes["hook_id"]).value: ir.StringAttr(op.attributes["kind"]).value
                 for op in ops_named(module, "ca.hook")}
        host = []
        for hook_id, kind in sorted(kinds.items()):
            if kind == "custom_backward":
                label, why = self._host_labels.get(hook_id, (f"with ctx hook {hook_id}", "?"))
                host.append(f"autograd node {label} runs its backward in Python (a host call: it could not be "
                            f"traced: {why})")
        if guard is None:
            return "; ".join(host + [f"hook {hook_id} stays a Python call (hooks are traced only with static sizes)"
                                     for hook_id, kind in sorted(kinds.items()) if kind in TRACED_KINDS])
        return "; ".join(host + [f"hook {hook_id} stays a Python call ({why})"
                                 for hook_id, why in sorted(guard.refused.items())
                                 if kinds.get(hook_id) in TRACED_KINDS])

    def _size_variants(self, backend, module, inputs, stored=None) -> SizeVariants:
        """A symbolic capture on a backend that compiles static sizes: one program with
        runtime sizes (where the backend has them), or one per observed size set."""
        shaped = sorted(pipeline.dynamic_shapes(module, list(inputs), len(inputs)))

        def build(variant, args, hooks, interpret_on_failure):
            settings = active_settings()
            background = settings is not None and _may_defer(settings)
            return self.build(backend, module, variant, args, hooks, interpret_on_failure, background=background)

        return SizeVariants(len(inputs), shaped, build, self.compiling, backend.runtime_sizes, stored)


class _RunForReal(Exception):
    """The re-trace made nodes host calls without knowing what their backwards return:
    this call runs PyTorch's graph to see it (`CompiledBackward._learn`), the next compiles."""

    def __init__(self, host_nodes):
        super().__init__(f"host-call nodes {sorted(host_nodes)} have not run yet")
        self.host_nodes = set(host_nodes)


def service_workers() -> int:
    """How many compile workers: `config.compile_workers`, else `CAMLIR_COMPILE_WORKERS`,
    else the cores left over (at least 1). 0: compiles run in this process."""
    if config.compile_workers is not None:
        return config.compile_workers
    value = environment.integer("CAMLIR_COMPILE_WORKERS")
    return max(0, value) if value is not None else compile_service.default_workers()


def service_timeout() -> float:
    """Seconds a compile may run in its worker: `config.compile_timeout_s`, else
    `CAMLIR_COMPILE_TIMEOUT_S`, else 120 (the longest compile of `bench/` and the model sweeps
    measured ~25 s on 2 cores; timm MobileViT's never ended)."""
    if config.compile_timeout_s is not None:
        return float(config.compile_timeout_s)
    text = environment.text("CAMLIR_COMPILE_TIMEOUT_S")
    try:
        value = float(text) if text else 120.0
    except ValueError:
        raise ValueError(f"CAMLIR_COMPILE_TIMEOUT_S must be a number of seconds, got {text!r}") from None
    if not value > 0:
        raise ValueError(f"CAMLIR_COMPILE_TIMEOUT_S must be > 0, got {text!r}")
    return value


def _service(backend):
    """The compile service for `backend`'s compiles, or None (compile here)."""
    if backend.service_from is None:
        return None
    workers = service_workers()
    return compile_service.get(workers, service_timeout()) if workers else None


def prestart_service() -> None:
    """Starts a compile worker now, where the configured backend would use one (camlir was
    just switched on: the worker imports torch and MLIR while the forward runs)."""
    try:
        backend = registry.get(config.backend)
        service = _service(backend)
    except Exception:  # noqa: BLE001 - a bad setting is reported where it is used
        return
    if service is not None:
        service.prestart()


def _may_defer(settings) -> bool:
    """Whether a backward may go on while its program compiles: not under `fullgraph`
    (every backward is compiled code) or `wait`, and not in a torch.distributed group,
    where ranks whose compiles finish at different steps would run different backwards."""
    if settings.fullgraph or settings.wait:
        return False
    distributed = getattr(torch, "distributed", None)
    return not (distributed is not None and distributed.is_available() and distributed.is_initialized())


def _store_when_answered(pending: PendingProgram, key: str, more_files: dict, more_meta: dict) -> None:
    """Stores a background compile's files under `key` as soon as its worker answers (on
    the service's thread, even if no backward resolves it before the process exits)."""
    def store(job):
        if job.error is None:
            files = dict(job.answer["files"], **more_files)
            meta = dict(job.answer["meta"], not_native=pending.not_native, **more_meta)
            disk_cache.put_later(key, lambda: (files, meta))

    pending.job.add_done_callback(store)


def _files_of(backend, program) -> tuple:
    """(files, meta) of `program` for the disk cache: the compile worker's, for a program
    loaded from them (it has no engine to link again), else `backend.to_files`."""
    made = getattr(program, "service_files", None)
    if made is not None:  # the worker did not know what the driver says is not native
        return dict(made[0]), dict(made[1], not_native=getattr(program, "not_native", ""))
    return backend.to_files(program)


def _not_storable(backend, program, hook_guard) -> str:
    """Why a program cannot go to the disk cache ("" when it can)."""
    why = backend.not_storable(program)
    if why:
        return why
    if hook_guard is not None and hook_guard.inlined:
        return "it inlines Python hook bodies, whose guard holds only in this process"
    return ""


class _Stored:
    """The disk side of a symbolic capture's programs (`SizeVariants.stored`): each is an
    entry keyed on the capture's key plus "dynamic" or its size set."""

    def __init__(self, owner: "CompiledBackward", backend, key: str, context):
        self.owner = owner
        self.backend = backend
        self.key = key
        self.context = context

    def load(self, name: str):
        if not disk_cache.enabled():
            return None
        start = time.perf_counter()
        entry = disk_cache.store().get(disk_cache.program_key(self.key, name))
        if entry is None:
            return None
        try:
            program = self.backend.from_files(entry, self.context or make_context())
        except Exception as exc:  # noqa: BLE001 - a bad entry is a miss
            logs.log.warning("disk cache entry for %s could not be used (%s); compiling instead", name, exc)
            return None
        self.owner._disk_hit(f"program for {name} loaded from the disk cache", start)
        return program, None

    def save(self, name: str, program, guard) -> None:
        if not disk_cache.enabled():
            return
        key = disk_cache.program_key(self.key, name)
        if isinstance(program, PendingProgram):
            if guard is None or not guard.inlined:
                _store_when_answered(program, key, {}, {})
            return
        why = _not_storable(self.backend, program, guard)
        if why:
            return
        disk_cache.put_later(key, lambda: _files_of(self.backend, program))


def _describe(values) -> str:
    parts = []
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor):
            kind = "param" if isinstance(v, torch.nn.Parameter) else "tensor"
            parts.append(f"#{i} {kind} {tuple(v.shape)} {v.dtype} stride={v.stride()}")
        else:
            parts.append(f"#{i} {type(v).__name__}")
    return "; ".join(parts)


def _refuse_unstrided(inputs) -> None:
    """A sparse (or other non-strided) tensor among a graph's inputs: the re-trace makes
    every tensor a strided fake, so the compiled program would hand a dense gradient to a
    sparse CSR leaf (PyTorch then refuses it: "a gradient ... of a different type"; found by
    the OpInfo run on `sparse.sampled_addmm`). Such a graph is handed back to PyTorch."""
    for i, v in enumerate(inputs):
        if isinstance(v, torch.Tensor) and v.layout != torch.strided:
            raise UnsupportedError(f"graph input {i} is a {str(v.layout).removeprefix('torch.')} tensor "
                                   f"{tuple(v.shape)}: camlir compiles strided tensors only")

