"""Hooking camlir into `backward()` and `torch.autograd.grad()`: which calls are captured,
with which settings.

`torch.autograd.backward` (which `Tensor.backward` calls, `inputs=` included) and
`torch.autograd.grad` are wrapped while camlir is on (globally through
`camlir.config.enabled`, or inside `camlir.enable()`). A wrapped call runs the autograd
engine under PyTorch's compiled autograd with camlir's compiler function, so the engine
hands camlir one graph of the whole backward (for `autograd.grad`, the graph that computes
the requested gradients, which are returned instead of accumulated).

Left to PyTorch, each with its reason logged (a warning the first time), recorded as a
`fallback` event (`camlir.explain()`) and counted in `camlir.counters["fallbacks"]`; under
`fullgraph=True` they raise `UnsupportedError` instead:
- `create_graph=True` (double backward): compiled autograd's gradients would not require
  grad (measured on torch 2.13: no `grad_fn`, so the second backward fails or is wrong);
- `is_grads_batched=True`: `vmap` over the backward, which compiled autograd's fake-tensor
  capture rejects.
A backward or `autograd.grad` called from inside a compiled backward (a hook) runs as plain
PyTorch, as before.

PyTorch keeps its compiled-autograd cache per graph structure, across calls; on a miss it
explains why ("Cache miss due to ..."). Those reasons are collected through the verbose
logger hook of compiled autograd's C++ side and attached to the capture.
"""

import inspect
import os
import logging
import threading
import time
from typing import Callable, Optional

import torch
from torch._dynamo import compiled_autograd as ca_mod

from camlir import events, graph_choice, logs, pending_program, profiling
from camlir.capture import dynamo_off, shape_env_files
from camlir.errors import UnsupportedError, without_pytorch_hints
from camlir.settings import active_settings, in_use, on_change
from camlir.stats import counters

# The first capture of a process no longer imports Inductor to name source files (0.19 s, 18 MB).
shape_env_files.install()

_original_backward = torch.autograd.backward
_original_grad = torch.autograd.grad
_original_engine = torch.autograd.Variable._execution_engine
_grad_signature = inspect.signature(_original_grad)


class _ThreadState(threading.local):
    """What this thread is doing with camlir: every flag the capture and routing read.

    `inside`: a backward camlir runs is on this thread (the outermost one, its hooks and the
    backwards they start; an inner backward runs as plain PyTorch). `keep_callbacks`:
    compiled autograd is running a backward for camlir, so a callback queued on the engine
    goes to `at_end`. `at_end`: the outermost backward's end-of-backward callbacks.
    `graph`: the compiled backward (`compiled.CompiledBackward`) that started running in
    this call, None until one does; from then on an error is the backward's own, not a
    failed capture. `capture_failed`: why compiled autograd could not capture this call
    (None: it could)."""

    def __init__(self):
        self.inside = False
        self.keep_callbacks = False
        self.at_end: list = []
        self.graph = None
        self.capture_failed: Optional[str] = None
        self.started = 0.0  # perf_counter() when this call's capture began (`capture_started`)


_local = _ThreadState()
_lock = threading.Lock()
# What compiles a captured graph: fn(gm, reasons) -> the callable handed back to the
# autograd engine. Set by camlir.api (`set_compiler`), so that this module never imports
# the compiler above it.
_compiler: list = [None]


def set_compiler(fn: Optional[Callable]) -> None:
    """Sets what compiles each captured graph: `fn(gm, reasons)` returns the callable the
    autograd engine runs for that graph (camlir.api hands it `compiled.CompiledBackward`)."""
    _compiler[0] = fn


def refresh_patch() -> None:
    """Installs the backward wrapper (and the engine that keeps queued callbacks,
    `_CallbackKeepingEngine`) while anything uses camlir, removes them otherwise."""
    with _lock:
        wanted = in_use()
        backward = _camlir_backward if wanted else _original_backward
        if torch.autograd.backward is not backward:
            torch.autograd.backward = backward
            torch.autograd.grad = _camlir_grad if wanted else _original_grad
            torch.autograd.Variable._execution_engine = _keeping_engine if wanted else _original_engine


class _CallbackKeepingEngine:
    """`Variable._execution_engine` while camlir is in use: PyTorch's engine, except that a
    callback queued (`queue_callback`) while compiled autograd runs a backward for camlir
    runs when that backward ends (`at_end`), as the eager engine runs it. Compiled autograd
    drops such callbacks (torch 2.13): a Python hook or custom backward that finishes its
    work in one (FSDP- and DDP-style reducers do) never had it run under camlir, silently.
    Everything else is PyTorch's engine's."""

    def __init__(self):
        self.run_backward = _original_engine.run_backward  # every backward: no __getattr__

    def queue_callback(self, callback):
        if not _local.keep_callbacks:
            return _original_engine.queue_callback(callback)
        if _tracing():
            # camlir is tracing a custom backward or a hook on fake tensors: what the callback
            # does must happen on every backward, not once now. The trace refuses it, so the
            # backward runs as Python (and its callback runs when the backward ends).
            raise UnsupportedError("queues a callback on the autograd engine (queue_callback): it must run "
                                   "on every backward, so this Python cannot be traced into the program")
        _local.at_end.append(lambda failed: None if failed else callback())
        return None

    def __getattr__(self, name):
        return getattr(_original_engine, name)


_keeping_engine = _CallbackKeepingEngine()


class _ReasonCollector(logging.Handler):
    """Keeps the cache-miss reasons compiled autograd's C++ side logs during a capture.
    Where the user asked for PyTorch's own verbose log (`TORCH_LOGS=compiled_autograd_verbose`,
    which camlir's logger replaces during the capture), every message is passed on to it
    (`forward`), as without camlir."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.reasons = []
        self.forward = None  # PyTorch's verbose logger while the user has it on

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("Cache miss"):
            self.reasons.append(message)
        if self.forward is not None:
            self.forward.debug("%s", message)


_reasons = _ReasonCollector()
_reason_logger = logging.getLogger("camlir.internal.compiled_autograd")
_reason_logger.setLevel(logging.DEBUG)
_reason_logger.propagate = False
_reason_logger.addHandler(_reasons)


def take_reasons() -> list:
    """The cache-miss reasons compiled autograd logged since the last call, emptying the list.

    E.g. `["Cache miss due to new autograd node: ..."]`; `[]` for a graph's first capture.
    """
    reasons, _reasons.reasons = _reasons.reasons, []
    return reasons


def _the_compiler() -> Callable:
    compile_graph = _compiler[0]
    if compile_graph is None:
        raise RuntimeError("camlir's capture engine has no compiler set: import camlir.api (or use "
                           "camlir.enable / camlir.compile_backward / camlir.config), which sets it "
                           "through camlir.capture.engine.set_compiler")
    return compile_graph


def _compiler_fn(gm):
    return _the_compiler()(gm, take_reasons())


# PyTorch's compiled autograd is one per process: a second compiled backward starting on
# another thread while one runs fails ("Trying to run compiled autograd within another
# compiled autograd call", and a later "Nested Compiled Autograd Contexts" assertion). So
# camlir's backward calls take turns; each is still compiled and exact. (Measured: four
# threads, each training its own model, failed three of four before; all exact now.)
# Re-entrant: a backward left to PyTorch (create_graph=True, ...) can call another
# backward on the same thread from inside (a custom Function's backward, reentrant
# checkpointing); with a plain Lock that one waited forever (PyTorch's
# test_no_nested_compiled_autograd hung).
_one_at_a_time = threading.RLock()


# A DistributedDataParallel built with its C++ reducer cannot run under compiled autograd
# (PyTorch refuses before the backward starts). Importing camlir selects DDP's Python
# reducer for modules built afterwards (camlir/ddp.py); one built before gets eager backwards.
_CPP_REDUCER = "not compatible with C++ DDP Reducer"
_warned_cpp_reducer = []


def running(graph) -> None:
    """Called by the compiled backward `graph` when it starts running (a program or the
    captured graph): from then on an error is the backward's own, not a failed capture."""
    _local.graph = graph


def _past_capture(exc: BaseException) -> bool:
    """Whether `exc` came out of compiled autograd's `runtime_wrapper`, which runs a captured
    graph (the anomaly-mode NaN check, then the compiled function). PyTorch has released the
    graph's saved tensors by then (measured on torch 2.13: an eager backward afterwards fails
    with "Trying to backward through the graph a second time"), so that error is the
    backward's own and cannot be answered by rerunning the backward eagerly."""
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "runtime_wrapper" and code.co_filename.endswith(
                os.path.join("_dynamo", "compiled_autograd.py")):
            return True
        tb = tb.tb_next
    return False


def _capture_failed(exc: BaseException, settings) -> None:
    """PyTorch's compiled-autograd capture (or camlir before running anything) raised: under
    fullgraph that is the error; otherwise the backward runs eagerly, counted and recorded.
    Seen: `StopIteration` in compiled autograd's `reorder_pre_hook_nodes_to_mimic_eager`
    (fuzz seeds 762, 1449: node pre-hooks in a torch.compile'd step)."""
    reason = (f"compiled autograd could not capture this backward ({type(exc).__name__}: "
              f"{without_pytorch_hints(str(exc))}); it runs eagerly")
    if settings.fullgraph:
        raise UnsupportedError(reason) from exc
    counters["fallbacks"] += 1
    events.record(events.Event(0, "fallback", reason, "capture"))
    if reason not in _reported:  # once per reason: a graph whose capture fails, fails every step
        _reported.add(reason)
        logs.log.warning("%s", reason)


def _ddp_cpp_reducer_fallback() -> None:
    from camlir.stats import counters

    counters["fallbacks"] += 1
    if not _warned_cpp_reducer:
        _warned_cpp_reducer.append(True)
        logging.getLogger("camlir").warning(
            "a DistributedDataParallel module uses its C++ reducer, which compiled autograd "
            "cannot run; its backwards run eagerly (correct, not compiled). Build DDP after "
            "`import camlir` (camlir selects DDP's Python reducer, see camlir/ddp.py) to compile them.")


def _camlir_backward_impl(tensors, grad_tensors=None, retain_graph=None, create_graph=False,
                          grad_variables=None, inputs=None):
    def call():
        return _original_backward(tensors, grad_tensors, retain_graph, create_graph, grad_variables,
                                  inputs=inputs)

    if graph_choice.routes.shortcuts and inputs is None and not create_graph and not retain_graph:
        # (a backward that keeps its graph goes through `_run`, which decides where it runs)
        route = _eager_by_shortcut(tensors)
        if route is not None:
            return _eager_now(call, route)
    roots = _tensors(tensors)
    return _run_to_end("backward()", call, create_graph, roots=roots, inputs=_tensors(inputs),
                       keep_graph=bool(retain_graph) or bool(create_graph),
                       vmapped=lambda: _under_vmap(roots, _tensors(grad_tensors if grad_tensors is not None
                                                                   else grad_variables)))


def _camlir_grad_impl(*args, **kwargs):
    try:
        bound = _grad_signature.bind(*args, **kwargs)
    except TypeError:  # let PyTorch say what is wrong with the call
        return _original_grad(*args, **kwargs)
    options = bound.arguments
    roots = _tensors(options.get("outputs"))
    keep = options.get("retain_graph")
    return _run_to_end("torch.autograd.grad()", lambda: _original_grad(*args, **kwargs),
                       options.get("create_graph", False), options.get("is_grads_batched", False),
                       keep_graph=bool(keep if keep is not None else options.get("create_graph", False)),
                       roots=roots, inputs=_tensors(options.get("inputs")),
                       vmapped=lambda: _under_vmap(roots, _tensors(options.get("grad_outputs"))))


def _under_vmap(*groups) -> bool:
    """Whether this backward runs under vmap: a functorch transform is active, or a root or
    gradient is a batched tensor of the legacy `torch._vmap_internals` (gradcheck's batched
    check). A compiled program takes plain tensors: handed a BatchedTensor it failed with
    "Cannot access storage of BatchedTensorImpl" (PyTorch's
    test_custom_function_non_tensor_inputs_outputs under camlir)."""
    if torch._C._are_functorch_transforms_active():
        return True
    return any(torch._C._functorch.is_legacy_batchedtensor(t) for group in groups for t in group)


def _tensors(value) -> tuple:
    """A tensor-or-sequence argument as a tuple of tensors (what else it holds is dropped:
    only `graph_choice.structure_key` reads it)."""
    if value is None:
        return ()
    if isinstance(value, torch.Tensor):
        return (value,)
    try:
        return tuple(v for v in value if isinstance(v, torch.Tensor))
    except TypeError:
        return ()


_PROXY_MODE, _FAKE_MODE = torch._C._TorchDispatchModeKey.PROXY, torch._C._TorchDispatchModeKey.FAKE
_current_graph_task_id = torch._C._current_graph_task_id
_dispatch_mode = torch._C._get_dispatch_mode


def _tracing() -> bool:
    """Whether a tracer's proxy or fake-tensor mode is active: then the autograd call is
    being recorded into someone's graph, not run, and camlir must stay out of it."""
    return _dispatch_mode(_PROXY_MODE) is not None or _dispatch_mode(_FAKE_MODE) is not None


def _run(api: str, call: Callable, create_graph: bool = False, batched: bool = False,
         roots: tuple = (), inputs: tuple = (), vmapped: Callable[[], bool] = lambda: False,
         keep_graph: bool = False):
    """Runs `call` (the original backward or grad with the user's arguments) captured by
    camlir, or as plain PyTorch where camlir is off, inside a compiled backward, or where
    the call is one camlir cannot capture (`_not_capturable`; `vmapped()` says whether it
    runs under vmap), or where `graph_choice` routes this backward's structure to the eager
    engine."""
    if _local.inside or _tracing() or torch._C._current_graph_task_id() != -1:
        # A backward inside a hook of a compiled backward, or one that a tracer records
        # (AOTAutograd traces a compiled region's backward with autograd.grad on fake tensors).
        # The graph-task id covers a backward run from inside another on any thread: past a
        # reentrant depth of 60 the engine runs the inner backward on a worker thread, whose
        # `_local` is fresh; it then waited for `_one_at_a_time`, held by the thread waiting
        # for it (a deadlock; PyTorch's test_deep_reentrant).
        keep, _local.keep_callbacks = _local.keep_callbacks, False
        try:  # its own callbacks run when it ends, on PyTorch's engine
            return call()
        finally:
            _local.keep_callbacks = keep
    settings = active_settings()
    route = None
    if (settings is not None and graph_choice.routes.shortcuts and not settings.fullgraph
            and not (create_graph or batched)):
        # Some structure is decided for the eager engine: route first, and where this is one,
        # go straight there (on W1 the checks below cost ~8 us of a ~45 us backward; vmap
        # needs no check, the eager engine handles it).
        with _one_at_a_time:
            route = graph_choice.routes.for_backward(roots, inputs)
            if route.decided == "eager" and (route.final or not keep_graph):
                return _eager_inside(call, route)
    reason = None if settings is None else _not_capturable(api, create_graph, batched, vmapped())
    if reason is not None:
        _fall_back(reason, settings)
    if settings is None or reason is not None:
        # Left to PyTorch; it still takes its turn, since a compiled backward running on
        # another thread would capture it too.
        with _one_at_a_time:
            return call()
    # Checked before the autograd engine starts: an exception raised from inside compiled
    # autograd's compile step leaves PyTorch's compiled-autograd state broken for later calls.
    _the_compiler()
    _local.inside = True
    _local.graph = None
    profile = profiling.current()
    start = profiling.clock() if profile is not None else None
    try:
        with _one_at_a_time:
            if pending_program.any_unresolved() and not settings.fullgraph and not keep_graph:
                # Some program compiles in a worker: a backward of its structure runs on the
                # eager engine, before any capture, until it is ready (compile_service.py).
                # Not one that keeps the graph: the eager engine refuses retain_graph=True for
                # a torch.compile'd region whose forward donated buffers, where compiled
                # autograd's capture (which then runs its graph) does not (fuzz seed 154).
                if route is None:
                    route = graph_choice.routes.for_backward(roots, inputs)
                graph = route.pending
                if graph is not None:
                    if graph.compile_in_flight() and not settings.wait:
                        return _eager_while_compiling(call)
                    route.pending = None
            routed = graph_choice.routes.awake and not settings.fullgraph
            if routed:
                if route is None:
                    route = graph_choice.routes.for_backward(roots, inputs)
                if route.decided == "compiled" and route.due() and _timed_choice():
                    route.reopen()  # the decision is taken again (graph_choice.RECHECK)
                if route.decided is not None:
                    which = route.decided
                elif _timed_choice():
                    which = route.pick()
                else:
                    which, route.timing = "compiled", False
                if which == "eager":
                    if route.final or not keep_graph:
                        return _eager(call, route)
                    # A backward that keeps its graph is not sent to the eager engine for speed
                    # (see above): captured instead, and not timed. A structure that fell back
                    # (`final`) still goes there: the eager engine's answer is the exact one.
                    route.timing = False
            elif not settings.fullgraph and graph_choice.routes.tick_asleep() and _timed_choice():
                graph_choice.routes.reopen_all()  # taken again next call (graph_choice.RECHECK)
            timed = route is not None and route.measuring()
            clock = time.perf_counter() if timed else 0.0
            _local.capture_failed = None
            _local.started = started = time.perf_counter()
            result = _captured(call, settings)
            graph = _local.graph
            if graph is not None and graph.first_backward is not None and not graph.first_backward_told:
                graph.first_backward_told = True
                _tell_first_backward(graph, time.perf_counter() - started)
            if _local.capture_failed is not None and not settings.fullgraph:
                # Its next capture would fail the same way (PyTorch's cache entry for it stays
                # broken), after paying for the capture: send the structure to the eager engine.
                if route is None:
                    route = graph_choice.routes.route(graph_choice.structure_key(roots, inputs))
                    graph_choice.routes.wake()
                if route.decided != "eager":
                    route.to_eager(f"{_local.capture_failed}; later backwards of this structure run on "
                                   f"the eager engine")
                    events.record(events.Event(0, "choice", route.reason, "fallback"))
                return result
            if _local.graph is not None and _local.graph.ran_pending:
                if route is None:
                    route = graph_choice.routes.route(graph_choice.structure_key(roots, inputs))
                route.pending = _local.graph
                route.graph = _local.graph.capture_id
                return result  # not timed: it ran PyTorch's graph, not the program
            if route is not None and _local.graph is not None:
                route.graph = _local.graph.capture_id
            if timed and _local.graph is not None and _local.graph.fallback_reason is None:
                _decide(route, "compiled", time.perf_counter() - clock)
            if not settings.fullgraph and _local.graph is not None and _local.graph.fallback_reason is not None:
                if route is None:  # the table woke during this call: name the structure now
                    route = graph_choice.routes.route(graph_choice.structure_key(roots, inputs))
                _route_fallback(route, _local.graph)
            return result
    finally:
        _local.inside = False
        _local.started = 0.0  # a CompiledBackward made outside a capture times none
        if profile is not None:
            profile.add_backward(start)


def _captured(call: Callable, settings):
    """`call` under compiled autograd with camlir's compiler; an error raised before any of
    the backward ran (PyTorch's capture, or camlir before its program started) leaves the
    graph intact, so the backward then runs eagerly."""
    try:
        with ca_mod._enable(_compiler_fn, dynamic=bool(settings.dynamic)):
            _reasons.forward = ca_mod.verbose_log if ca_mod.snapshot_verbose_logging_enabled() else None
            torch._C._dynamo.compiled_autograd.set_verbose_logger(_reason_logger)
            _local.keep_callbacks = True
            try:
                return call()
            finally:
                _local.keep_callbacks = False
                torch._C._dynamo.compiled_autograd.set_verbose_logger(None)
    except Exception as exc:  # noqa: BLE001 - re-raised unless nothing of the backward ran
        _close_failed_capture(exc)
        if _local.graph is not None or _past_capture(exc):
            raise
        failed = exc
    cpp_reducer = _CPP_REDUCER in str(failed)
    if settings.fullgraph and not cpp_reducer:
        _capture_failed(failed, settings)  # raises UnsupportedError
    # Nothing of the backward ran: the eager engine answers. Where it refuses the call too
    # (a root that needs no grad, a second backward without retain_graph), the error is the
    # user's: PyTorch's own, unchanged, and no camlir fallback is counted or reported.
    result = call()
    if cpp_reducer:
        _ddp_cpp_reducer_fallback()
    else:
        _capture_failed(failed, settings)
    _local.capture_failed = f"compiled autograd could not capture it ({type(failed).__name__})"
    return result


def _close_failed_capture(exc: BaseException) -> None:
    """Ends the compile context of a compiled-autograd capture that raised before its end.

    PyTorch's capture enters a `compile_context` in `begin_capture` and leaves it in
    `end_capture` (torch 2.13); a capture that raises in between (the StopIteration of fuzz
    seed 762) leaves the context's generator unfinished. When the garbage collector later
    finalizes it, it restores the context it replaced, at whatever moment that is: a later
    `torch.compile` then failed in its own compile step ("compile_context is not set"), now
    and then, depending on when the collector ran. Leaving it here, now, restores the right
    one. The capture is found through the frames of the traceback."""
    tb = exc.__traceback__
    seen = set()
    while tb is not None:
        instance = tb.tb_frame.f_locals.get("self")
        if (isinstance(instance, ca_mod.AutogradCompilerInstance) and id(instance) not in seen):
            seen.add(id(instance))
            context = getattr(instance, "compile_context", None)
            generator = getattr(context, "gen", None)
            if generator is not None and generator.gi_frame is not None:  # entered, not left
                try:
                    context.__exit__(None, None, None)
                except Exception:  # noqa: BLE001 - best effort: the capture's own error matters
                    pass
        tb = tb.tb_next


def _timed_choice() -> bool:
    """Whether routes may be decided by timing here: on unless `CAMLIR_GRAPH_CHOICE=0`, and
    never in a torch.distributed group, where ranks deciding differently would issue
    different collectives."""
    if not graph_choice.enabled():
        return False
    distributed = getattr(torch, "distributed", None)
    return not (distributed is not None and distributed.is_available() and distributed.is_initialized())


def _eager(call: Callable, route):
    """One backward on the eager engine, for a route that chose it or is timing it."""
    timed = route.measuring()
    if route.decided is not None and route.due() and _timed_choice():
        route.reopen()  # this call still runs eagerly; the next ones measure again
        graph_choice.routes.wake()
    clock = time.perf_counter() if timed else 0.0
    result = call()
    counters["eager_runs"] += 1
    if timed:
        _decide(route, "eager", time.perf_counter() - clock)
    return result


def capture_started() -> float:
    """When the capture of the backward running on this thread began (`time.perf_counter()`;
    0.0 outside one): the compiler function subtracts it to time PyTorch's capture."""
    return _local.started


def _tell_first_backward(graph, wall: float) -> None:
    """The `backward` event of a graph's first backward: its wall time split into PyTorch's
    capture, camlir's work before anything ran (re-trace, import, stages here, or a disk
    load), the run (the program, or PyTorch's graph while it compiles), and the rest
    (PyTorch's engine and compiled autograd's wrappers around them)."""
    capture, prepare, run, ran = graph.first_backward
    rest = max(0.0, wall - capture - prepare - run)
    events.record(events.Event(
        graph.capture_id, "backward",
        f"first backward {wall:.3f} s: PyTorch's capture {capture:.3f} s, camlir {prepare:.3f} s (re-trace, "
        f"import, the stages in this process, or the disk cache), running {run:.3f} s ({ran}), the rest "
        f"{rest:.3f} s", "first call", seconds=wall))


def _eager_while_compiling(call: Callable):
    """One backward on the eager engine while its structure's program compiles in a worker."""
    result = call()
    counters["eager_runs"] += 1
    counters["while_compiling"] += 1
    return result


def _eager_by_shortcut(root):
    """The eager-decided route of `loss.backward()` for the tensor `root`, found by its
    shallow key (`graph_choice.Routes.eager_shortcut`), where nothing else decides this call
    first; else None, and `_run` decides. The short way matters on small backwards: W1's
    overhead over the eager engine was 23 us of a ~46 us backward through `_run`."""
    if not isinstance(root, torch.Tensor):
        return None
    # The shortcut's own lookup first (~0.2 us): most calls have none, and then the checks
    # below (~1 us, more with the caches cold after a forward) are not paid at all.
    route = graph_choice.routes.eager_shortcut(root)
    if route is None or _local.inside or _current_graph_task_id() != -1 or _tracing():
        return None
    settings = active_settings()
    if settings is None or settings.fullgraph:
        return None
    return route


def _eager_now(call: Callable, route):
    """An outermost backward whose route `_eager_by_shortcut` found decided for the eager
    engine: in turn with other backwards, then `_eager_inside`, then its `at_end` callbacks
    (what `_run_to_end` and `_run` would do, without their checks)."""
    _local.at_end = []
    try:
        with _one_at_a_time:
            result = _eager_inside(call, route)
    except BaseException:
        _ended(failed=True)
        raise
    _ended(failed=False)
    return result


def _eager_inside(call: Callable, route):
    """`_eager`, marked as inside camlir (a backward its hooks start runs plain), profiled."""
    profile = profiling.current()
    start = profiling.clock() if profile is not None else None
    _local.inside = True
    try:
        return _eager(call, route)
    finally:
        _local.inside = False
        if profile is not None:
            profile.add_backward(start)


def _decide(route, which: str, seconds: float) -> None:
    if not route.record(which, seconds):
        return
    graph = route.graph
    events.record(events.Event(graph, "choice", route.reason, "speed", 1e3 * route.compiled_s, 1e3 * route.eager_s))
    if route.decided == "eager":
        if graph not in _warned_eager:  # once per graph: the recheck may decide so again
            _warned_eager.add(graph)
            logs.log.warning("graph %d %s; camlir measures it again after %d backwards "
                             "(CAMLIR_GRAPH_CHOICE=0 keeps the compiled program)", graph, route.reason,
                             graph_choice.RECHECK[0])
        else:
            logs.log.info("graph %d %s", graph, route.reason)
    else:
        graph_choice.routes.forget_shortcuts(route)  # decided again, the other way
    graph_choice.routes.settle()


def _route_fallback(route, graph) -> None:
    """A compiled backward that fell back runs compiled autograd's own graph; from the next
    call on, its structure runs on the eager engine, so it gets exactly eager's answer."""
    route.graph = graph.capture_id
    if route.decided == "eager":
        return
    route.to_eager(f"graph {graph.capture_id} fell back ({graph.fallback_reason}); later backwards of "
                   f"this structure run on the eager engine")
    events.record(events.Event(graph.capture_id, "choice", route.reason, "fallback"))


def _run_to_end(*args, **kwargs):
    """`_run`, then the `at_end` callbacks of the outermost backward on this thread."""
    if _local.inside:  # a backward inside a hook: the outer one ends later
        return _run(*args, **kwargs)
    _local.at_end = []
    try:
        result = _run(*args, **kwargs)
    except BaseException:
        _ended(failed=True)
        raise
    _ended(failed=False)
    return result


def at_end(fn: Callable[[bool], None]) -> None:
    """Runs `fn(failed)` when the backward running on this thread ends: `fn(False)` just
    before `backward()` returns, `fn(True)` when it raises. For hooks that must finish
    something before the backward returns (camlir/ddp.py waits for its all-reduces here):
    PyTorch drops the final callbacks a hook queues with
    `Variable._execution_engine.queue_callback` in a compiled backward (torch 2.13), so
    while camlir is in use that call lands here too (`_CallbackKeepingEngine`)."""
    _local.at_end.append(fn)


def in_backward() -> bool:
    """Whether this thread is inside a backward that camlir runs (its hooks included)."""
    return _local.inside


def _ended(failed: bool) -> None:
    # A callback may queue more: as on the eager engine, they run too, in order.
    callbacks, _local.at_end = _local.at_end, []
    keep, _local.keep_callbacks = _local.keep_callbacks, True
    try:
        while callbacks:
            for fn in callbacks:
                if not failed:
                    fn(False)
                    continue
                try:
                    fn(True)
                except Exception:  # noqa: BLE001 - the backward's own error is the one to raise
                    logs.log.exception("an end-of-backward callback failed after the backward failed")
            callbacks, _local.at_end = _local.at_end, []
    finally:
        _local.keep_callbacks = keep


def _not_capturable(api: str, create_graph: bool, batched: bool, vmapped: bool = False) -> Optional[str]:
    """Why a call must run as plain PyTorch, or None."""
    if vmapped:
        return (f"{api} under vmap runs uncompiled: compiled backwards take plain tensors, and "
                f"this one's gradients are batched")
    if create_graph:
        return (f"{api} with create_graph=True (double backward) runs uncompiled: compiled autograd's "
                f"gradients do not require grad, so the graph of the gradients would be lost")
    if batched:
        return (f"{api} with is_grads_batched=True runs uncompiled: compiled autograd cannot capture "
                f"a vmap over the backward")
    return None


_reported: set = set()  # fallback reasons already logged and recorded since the last reset
_warned_eager: set = set()  # graphs whose move to the eager engine was warned about


def _fall_back(reason: str, settings) -> None:
    """Raises under fullgraph; else counts the fallback and, the first time for this reason,
    warns and records a `fallback` event (graph 0: nothing was captured)."""
    if settings.fullgraph:
        raise UnsupportedError(reason)
    counters["fallbacks"] += 1
    if reason not in _reported:
        _reported.add(reason)
        events.record(events.Event(0, "fallback", reason, "call"))
        logs.log.warning("%s", reason)


# camlir's capture and compile machinery must never be traced by Dynamo (dynamo_off.py): the
# call is a graph break that runs as plain Python, and the backward compiles natively as
# anywhere else.
_camlir_backward = dynamo_off.never_traced(_camlir_backward_impl)
_camlir_grad = dynamo_off.never_traced(_camlir_grad_impl)


def reset() -> None:
    """Forgets every captured graph (PyTorch's compiled-autograd cache included) and every
    route (`graph_choice`)."""
    ca_mod.reset()
    graph_choice.routes.clear()
    take_reasons()
    _reported.clear()
    _warned_eager.clear()


# Follow config.enabled and the enable() scopes from now on, and catch up with any change
# made before this module was imported.
on_change(refresh_patch)
refresh_patch()
