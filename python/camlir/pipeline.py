"""How a captured backward becomes a program: the shared stages, and the loop over a backend's.

Every backend starts from the same two stages, run once per capture by the driver:

    retrace      the captured graph on fake tensors, down to aten ops    make_aten
    import       the aten graph as a `ca` module                         make_ca

`compile(backend, module, args, hooks, dump, variant)` then builds one program of that
module: it runs `backend.stages(variant)` in order over one `Work`, the record that stages
read and fill. A static capture has one variant; a symbolic one has one per size set, or
one for every size with `Variant(runtime_sizes=True)` (see `cache.SizeVariants`). The
backends that compile kernels (cpu, gpu) start their lists with the kernel stages written
here, `KERNEL_STAGES`:

    specialize   sizes become constants (a variant with sizes) ca-flatten-nodes, ca-specialize-shapes
    trace-hooks  safe Python hooks traced into @hook_<id> bodies capture/hook_trace.py
    layouts      strided inputs passed as contiguous permutations ca-specialize-layouts
    kernels      hook bodies inlined, compute outlined into       ca-inline-hooks, ca-flatten-nodes,
                 kernels (cut at Python hooks and host ops);       ca-outline-kernels, ca-sink-views
                 views that cross a cut recomputed by the kernels   ca-host-result-layouts
                 reading them; host results torch lays out
                 permuted handed over as they are
    linalg       kernels to linalg on tensors, fused; each         ca-lower-to-linalg{twins=true},
                 kernel's torch original kept as its twin;         ca-depthwise-kernels{twins=true},
                 depthwise convolution backwards on small maps as  ca-fuse-elementwise,
                 kernels of window loops                           ca-unique-kernel-results
    split        kernels into a module of their own; the host function stays (the runtime walks it)

and each backend's own stages follow, in its own folder: `backends/cpu/compiler.py` (math,
bufferize, blas, threads, loops, llvm, jit), `backends/gpu/compiler.py` (gpu-bufferize ..
ptx); the reference backend (`backends/eager.py`) has one stage, `interpret`. A backend is
an object registered by name (`backend_registry.py`; the interface: `backends/base.py`).

Every stage is dumpable (`stages.Dump`: CAMLIR_LOGS=verbose, CAMLIR_DUMP_DIR) and every
stage whose result is MLIR can be replayed, or started from, with `ca-opt`.
"""

import time
from dataclasses import dataclass, field
from typing import Any, Optional

from torch_mlir import ir

from camlir import compile_progress, effects, logs
from camlir.compile_thread import run_apart
from camlir.context import make_context
from camlir.dialects.ca.ir_helpers import funcs, function_type, is_kernel, require_func
from camlir.passes.specialize_layouts import format_perms, needs_identity
from camlir.stages import Dump, Stage, StageError, run_stage
from camlir.variant import STATIC, Variant

# The stages that need torch (retrace, import, trace-hooks, layouts) import it where they
# run: a compile worker imports this module for the later stages and `compile_apart`
# without torch (it starts in 0.4 s instead of 3.3 s: compile_worker.py).

__all__ = ["KERNEL_STAGES", "STATIC", "Variant", "Work", "bufferize_passes", "compile", "dynamic_shapes", "make_aten", "make_ca"]


# --------------------------------------------------------------------------- what a compile carries

@dataclass
class Work:
    """What one compile carries from stage to stage. `module` is the module the next stage
    changes (the kernel stages work on a copy of `captured`, which is never changed)."""

    captured: ir.Module
    args: list
    hooks: Any
    dump: Dump
    variant: Variant
    start: float = field(default_factory=time.perf_counter)
    module: Optional[ir.Module] = None
    guard: Any = None           # trace-hooks: the HookGuard of the traced hook bodies
    perms: list = None          # layouts: per argument, the permutation it is passed with
    expected_effects: Any = None  # layouts: the accumulations and Python hooks linalg must keep
    lowered_text: str = ""      # the module after linalg (tests and `compiled_programs()` read it)
    kernels: Optional[ir.Module] = None  # split: the kernels' own module
    host: Any = None            # split: the host function
    program: Any = None         # the backend's last stage: what runs
    artifact: Any = None        # in a compile worker: the program's (files, meta) (compile_apart)
    # A backend's own stages add their own fields (the cpu's `specs`, `engine`, ...).

    def seconds(self) -> float:
        return time.perf_counter() - self.start


# --------------------------------------------------------------------------- the loop

def compile(backend, module: ir.Module, args: list, hooks, dump: Dump, variant: Variant = STATIC, service=None):
    """Builds `backend`'s program of the captured `module` (not changed) for `variant`, with
    this call's `args` and `hooks`; returns (program, the hook guard of what it traced, or
    None). Raises what a stage raised (`StageError` names the stage); the driver decides
    what runs instead (`compiled.CompiledBackward.build`).

    With a compile `service` (`compile_service.Service`) and a backend that names
    `service_from`, the stages before that one run here (they need this process: the
    user's hooks, this call's tensors) and the rest in a worker process: the program is then
    a `compile_service.Job`, whose answer `load_answer` turns into the program.

    Without one, the stages from `backend.apart_from` on run in a thread of their own: what
    they leave in memory stays out of the malloc arena the training loop's tensors come from
    (compile_thread.py says why, with the measurement). The stages before it run in the
    backward's thread: tracing calls the user's hooks."""
    work = Work(module, list(args), hooks, dump, variant)
    stages = list(backend.stages(variant))
    names = [s.name for s in stages]
    if service is not None and backend.service_from in names:
        cut = names.index(backend.service_from)
        _run(stages[:cut], work)
        job = service.submit(service_request(backend, work), dump.label)
        logs.log.debug("%s: sent to a compile worker after %.3f s here", dump.label, work.seconds())
        return job, work.guard
    split_at = names.index(backend.apart_from) if backend.apart_from in names else len(stages)
    _run(stages[:split_at], work)
    if split_at < len(stages):
        run_apart(_run, stages[split_at:], work)
    logs.log.debug("%s: %s program built in %.3f s", dump.label, backend.name, work.seconds())
    return work.program, work.guard


def service_request(backend, work: Work) -> dict:
    """What a compile worker needs to run `backend`'s stages from `service_from` on: the
    module as the earlier stages left it, and what they put in `work` for the later ones."""
    from camlir import environment

    return {
        "backend": backend.name,
        "module": work.module.operation.get_asm(assume_verified=True),
        "variant": work.variant,
        "perms": work.perms,
        "expected_effects": work.expected_effects,
        "dump": Dump(work.dump.label, work.dump.directory, work.dump.count, work.dump.previous),
        "environment": environment.snapshot(),
        "log_kinds": sorted(k for k in logs.KINDS if logs.enabled(k)),
        "facts": backend.worker_facts(),
        "seconds_here": work.seconds(),
    }


def compile_apart(request: dict) -> dict:
    """In a compile worker (or, where no worker can run, here): the stages from the
    backend's `service_from` on, over the request's module; the program as
    `backend.to_files` gives it (the disk cache's files), with `lowered_text` and the
    seconds it took."""
    from camlir import backend_registry as registry

    backend = registry.get(request["backend"])
    backend.assume(request.get("facts", {}))
    start = time.perf_counter()
    module = ir.Module.parse(request["module"], make_context())
    work = Work(module, [], None, request["dump"], request["variant"])
    work.module, work.perms, work.expected_effects = module, request["perms"], request["expected_effects"]
    _run(list(backend.service_stages(work.variant)), work)
    files, meta = work.artifact if work.artifact is not None else backend.to_files(work.program)
    return {"files": files, "meta": meta, "lowered_text": work.lowered_text,
            "seconds": time.perf_counter() - start}


def _run(stages: list, work: Work) -> None:
    """`stages` in order, in the captured module's MLIR context (entered per thread)."""
    with work.captured.context, ir.Location.unknown():
        for stage in stages:
            compile_progress.at_stage(stage.name)
            stage.run(work)


# --------------------------------------------------------------------------- shared by every backend

def make_aten(gm, inputs, sizes, scalars, hooks, packed_data, dump: Dump, unpacked=None, host_calls=None):
    """retrace: the captured graph on fake tensors, down to aten ops with node provenance
    (`unpacked`, `host_calls`: what saved-tensor unpack hooks and host-call nodes returned
    when the graph ran for real, see `retrace.record_run`); a `capture.retrace.Retraced`."""
    from camlir.capture.retrace import retrace

    retraced = retrace(gm, inputs, sizes, scalars, hooks, packed_data, unpacked, host_calls)
    dump("retrace", retraced.graph.code)
    return retraced


def make_ca(retraced, dump: Dump, expected_effects=None) -> ir.Module:
    """import: the aten graph as a `ca` module (autograd nodes, hooks, accumulation, sizes).
    With `expected_effects` (`effects.in_captured_graph` of the capture), checks that every
    accumulation and hook made it into the module."""
    from camlir.capture.to_ca import import_graph

    module = import_graph(retraced.graph.graph, make_context())
    strided = _strided_views_of_strided_tensors(retraced.graph)
    if strided:
        with module.context:
            module.operation.attributes["ca.layout_sensitive"] = ir.StringAttr.get(strided)
    dump("import", module)
    if expected_effects is not None:
        effects.check(expected_effects, effects.in_module(module), f"{dump.label}, stage 'import'")
    return module


def _strided_views_of_strided_tensors(gm) -> str:
    """Why the graph depends on physical strides ("" when it does not): an `as_strided`
    (or its scatter) of a tensor that is not contiguous, e.g. the backward of an in-place
    update through a view of a transposed result. The reference interpreter runs torch ops,
    which keep those strides; compiled kernels make every tensor contiguous, so the same
    storage offsets would pick other elements (wrong gradients, found by the fuzzer)."""
    import torch

    targets = (torch.ops.aten.as_strided.default, torch.ops.aten.as_strided_scatter.default)
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in targets and n.args:
            val = getattr(n.args[0], "meta", {}).get("val")
            if isinstance(val, torch.Tensor) and not val.is_contiguous():
                return f"{n.target.name()} of a tensor with strides {tuple(val.stride())}"
    return ""


def dynamic_shapes(module: ir.Module, args: list, n_inputs: int) -> dict:
    """The shapes of the arguments whose types have `?` dims, from this call's tensors."""
    import torch

    host = require_func(module, "backward")
    return {i: tuple(args[i].shape) for i, t in enumerate(list(function_type(host).inputs)[:n_inputs])
            if "?" in str(t) and isinstance(args[i], torch.Tensor)}


# --------------------------------------------------------------------------- the kernel stages

def specialize(work: Work) -> None:
    """specialize: the kernel stages work on a copy of the captured module; a variant with
    sizes makes them constants and its dynamic argument dims the observed ones, so the
    kernels get static shapes. Refuses a module that reads physical strides."""
    work.module = ir.Module.parse(str(work.captured))
    if "ca.layout_sensitive" in work.module.operation.attributes:
        why = ir.StringAttr(work.module.operation.attributes["ca.layout_sensitive"]).value
        raise StageError("import", f"the backward reads physical strides ({why}); kernels assume "
                                   f"contiguous tensors")
    sizes, shapes = work.variant.sizes, work.variant.shapes
    if sizes is None:
        return
    shape_text = ",".join(f"{i}:{'x'.join(str(d) for d in shape)}" for i, shape in shapes)
    run_stage("specialize", work.module, [
        "ca-flatten-nodes",
        "ca-specialize-shapes{sizes=%s shapes=%s}" % (",".join(str(s) for s in sizes), shape_text),
    ], work.dump)


def hooks_traced(work: Work) -> None:
    """trace-hooks: after specialization, since tracing needs static shapes (a specialized
    capture's hooks are traced per size set; with runtime sizes only hooks whose operands
    have static shapes, such as a parameter's gradient, are traced, the others stay Python
    calls). Runs in the backward's own thread: tracing calls the user's hooks."""
    from camlir.capture.hook_trace import trace_hooks

    work.guard = trace_hooks(work.module, work.hooks, device="cpu")
    work.dump("trace-hooks", work.module)


def layouts(work: Work) -> None:
    """layouts: per argument, the permutation the runtime passes it with (from the first
    call's tensors; a later call with another layout is copied at the kernel)."""
    work.expected_effects = effects.in_module(work.module, python_hooks_only=True)  # traced hooks become code
    host = require_func(work.module, "backward")
    from camlir.lowering.layouts import input_permutations

    perms = input_permutations(list(function_type(host).inputs), work.args, work.variant.runtime_sizes)
    block_args = list(host.regions[0].blocks[0].arguments)
    work.perms = [None if p is not None and needs_identity(block_args[i]) else p for i, p in enumerate(perms)]
    if any(work.perms):
        run_stage("layouts", work.module, ["ca-specialize-layouts{perms=%s}" % format_perms(work.perms)], work.dump)


def kernels(work: Work) -> None:
    """kernels: traced hook bodies inlined, the nodes flattened, gradients scattered into
    disjoint slices of zeros summed as one scatter chain (ca-disjoint-scatters), every run of compute between
    barriers (Python hooks, host ops) outlined into a `ca.kernel` function; a view that one
    kernel returns only for later kernels (a transposed weight, the `t` of a weight gradient
    that TBackward undoes) crosses the cut as its base and is recomputed where it is read,
    so kernels split by a hook read what one kernel would have (ca-sink-views); a host op's
    result that torch lays out permuted (the flash-attention backward's gradients) reaches
    the kernels as its contiguous permutation, not a copy (ca-host-result-layouts)."""
    run_stage("kernels", work.module, ["ca-inline-hooks", "ca-flatten-nodes", "ca-disjoint-scatters",
                                       "ca-outline-kernels", "ca-sink-views", "ca-host-result-layouts"], work.dump)


def linalg(work: Work) -> None:
    """linalg: kernels lowered to linalg on tensors and fused; ops the lowering cannot take
    move to the host (logged, one line per op name). Then checks that every accumulation
    and Python hook is still there exactly once."""
    run_stage("linalg", work.module, ["ca-lower-to-linalg{twins=true}", "ca-depthwise-kernels{twins=true}",
                                      "ca-fuse-elementwise", "ca-unique-kernel-results"],
              work.dump)
    attrs = work.module.operation.attributes
    if "ca.host_ops" in attrs:
        for name in sorted({ir.StringAttr(a).value for a in ir.ArrayAttr(attrs["ca.host_ops"])}):
            logs.log.info("%s: %s cannot be lowered; kept on the host, run through torch", work.dump.label, name)
    if work.expected_effects is not None:  # None: no layouts stage ran (drawing.py)
        effects.check(work.expected_effects, effects.in_module(work.module), f"{work.dump.label}, stage 'linalg'")
    work.lowered_text = str(work.module)


def split(work: Work) -> None:
    """split: the kernels move to a module of their own (`work.kernels`, still on tensors);
    the host function (`work.host`) stays in `work.module`."""
    work.kernels = ir.Module.create(ir.Location.unknown(work.module.context))
    for fn in funcs(work.module, is_kernel):
        fn.clone(ir.InsertionPoint(work.kernels.body))
    work.host = require_func(work.module, "backward")
    work.dump("split", work.kernels)


def bufferize_passes(runtime_sizes: bool = False) -> list:
    """Tensors to buffers, as both compiling backends bufferize their kernels (the cpu's
    bufferize stage, the gpu's gpu-bufferize): read-only inputs, results as out-parameters."""
    hoist = "hoist-static-allocs=true" + (" hoist-dynamic-allocs=true" if runtime_sizes else "")
    return [
        "ca-prepare-kernel-abi",
        "func.func(convert-elementwise-to-linalg)",  # bool/byte casts the ABI left on tensors
        "canonicalize",  # drops transposes that the transpose fold left without users
        "one-shot-bufferize{bufferize-function-boundaries function-boundary-type-conversion=identity-layout-map}",
        "canonicalize", "cse",
        "buffer-results-to-out-params{%s modify-public-functions=true}" % hoist,
        "canonicalize",
        "ca-copies-to-linalg",
        "buffer-deallocation-pipeline", "canonicalize",
    ]


KERNEL_STAGES = (Stage("specialize", specialize), Stage("trace-hooks", hooks_traced), Stage("layouts", layouts),
                 Stage("kernels", kernels), Stage("linalg", linalg), Stage("split", split))
