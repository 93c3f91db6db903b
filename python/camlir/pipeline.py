"""How a captured backward becomes code: every stage, in order.

Shared by every backend (once per capture):

    retrace      the captured graph run on fake tensors down to aten ops     make_aten
    import       the aten graph as a `ca` module                             make_ca

The reference backend ("eager") interprets that module as it is (`make_eager`). The cpu
backend compiles it (`make_cpu`, once per variant: a static capture has one; a symbolic
capture one per size set, or one for all sizes with `dynamic=True`; see `cache.SizeVariants`):

    specialize   sizes become constants (symbolic captures only)   ca-flatten-nodes, ca-specialize-shapes
    trace-hooks  safe Python hooks traced into @hook_<id> bodies    capture/hook_trace.py
    layouts      strided inputs passed as contiguous permutations  ca-specialize-layouts
    kernels      hook bodies inlined, compute outlined into kernels ca-inline-hooks, ca-flatten-nodes,
                 (cut at Python hooks and host ops); views that     ca-outline-kernels, ca-sink-views
                 cross a cut recomputed by the kernels reading them
    linalg       kernels to linalg on tensors, fused; each kernel's  ca-lower-to-linalg{twins=true},
                 torch original kept as its twin (the runtime runs  ca-depthwise-kernels{twins=true},
                 whichever measures faster: backends/cpu/choice.py); ca-fuse-elementwise,
                 depthwise convolution backwards on small maps as   ca-unique-kernel-results
                 kernels of window loops
    split        kernels into their own module; the host function stays (the runtime walks it)
    same-code    a kernel that prints the same as an earlier one,   backends/cpu/same_kernels.py
                 its name aside, is dropped; the runtime calls the
                 earlier one's code for it (compiled once)
    math         pow by small constant exponents as multiplications ca-expand-powers,
                 and sqrt; bf16/f16 arithmetic and math functions   math-extend-to-supported-types,
                 in f32, rounded once per op (as PyTorch computes   arith-emulate-unsupported-floats,
                 them); f32 exp/erf/tanh as vectorizable polynomials ca-approximate-math
    bufferize    tensors to buffers; results become out-params     ca-prepare-kernel-abi, one-shot-bufferize, ...
    blas         matmuls become calls to MKL's gemm                 ca-matmul-to-blas, ca-define-blas-wrappers
    threads      big parallel generics outlined, each to run one   linalg-generalize-named-ops,
                 block of a dimension per OpenMP thread            ca-outline-parallel-loops
    loops        loads through static slices folded into their        ca-fold-views,
                 buffer's indices; 8-wide vectorized affine loops     ..., ca-bound-parallel-loops
                 (scalar loops where the vectorizer refuses); split
                 loops cut to a block
    llvm         the LLVM dialect; a powi left on vectors per lane; convert-math-to-funcs,
                 bf16/f16 conversions with f64 and integers through ca-narrow-float-conversions,
                 f32, f32<->bf16 as integer bit operations (no soft- arith-expand{include-bf16=true},
                 float calls left for the JIT: bf16 values that are convert-*-to-llvm,
                 only moved become i16); the threads stage's        ca-bf16-as-i16,
                 forks as GOMP_parallel calls                       ca-define-parallel-forks
    jit          MLIR's ExecutionEngine at -O2, BLAS symbols linked  backends/cpu/jit.py

With `dynamic=True` (a symbolic capture compiled once for every size its guards accept):
no specialize; trace-hooks traces only hooks whose operands have static shapes (the others
stay Python calls); kernels keep `?` dims and take the lifted sizes they read as `i64`
arguments; split also derives each kernel's output-shape function (backends/cpu/shapes.py:
resolve-ranked-shaped-type-result-dims on a clone, then a few lines of Python); bufferize
hoists dynamic result allocations into the out-params (hoist-dynamic-allocs); the runtime
kernel is `abi.DynamicKernel` (sizes and strides written per call, outputs allocated with
the shapes the shape function computes).

The gpu backend (`make_gpu`, section "gpu backend" below; docs/gpu-backend.md) runs the cpu's
stages up to split, then, on static sizes:

    gpu-bufferize  pow by small constants expanded; tensors to buffers ca-expand-powers, bufferize's passes
    gpu-matmuls    matmuls become host calls (torch addmm_/baddbmm_)   ca-matmul-to-blas
    gpu-map        parallel loops (parallel dims outer, reductions      ca-gpu-parallel-dims-first,
                   serial per output), flattened, 256 threads a block   ca-gpu-flatten-parallel, gpu-map-...
    gpu-outline    launches into gpu.modules; host side -> launch plan gpu-kernel-outlining, backends/gpu/plan.py
    nvvm           llvm/nvvm dialects, math to libdevice, bare pointers convert-gpu-to-nvvm
    llvm-ir        every kernel in one LLVM module                     translate_module_to_llvmir
    ptx            libdevice linked, O3, NVPTX (llvmlite), ISA 8.0      backends/gpu/codegen.py

Every stage is dumpable, the same way:
- `CA_LOGS=verbose` logs the IR after each stage ("graph 3, after stage 'linalg':");
- `CA_DUMP_DIR=dir` writes it to `dir/graph<id>[-<variant>]/<NN>-<stage>.mlir`; each file
  starts with the `ca-opt` command that turns the previous file into it, so any stage can
  be replayed (trace-hooks and split are not passes: their files are the new start);
- `CA_LOGS=passes` prints the IR after every pass inside a stage, as
  `ca-opt --mlir-print-ir-after-all` does (to stderr).
"""

import os
import re
import time
from dataclasses import dataclass
from typing import Optional

import torch
from torch_mlir import ir

from camlir import effects, logs
from camlir.backends.cpu import abi, jit, persist, same_kernels
from camlir.backends.cpu import shapes as kernel_shapes
from camlir.backends.cpu.layouts import input_permutations
from camlir.backends.cpu.program import CpuProgram, torch_twins
from camlir.backends.eager import EagerProgram
from camlir.backends.gpu import codegen as gpu_codegen
from camlir.backends.gpu import plan as gpu_plan
from camlir.backends.gpu import program as gpu_program
from camlir.capture.hook_trace import trace_hooks
from camlir.capture.retrace import Retraced, retrace
from camlir.capture.to_ca import import_graph
from camlir.compile_thread import run_apart
from camlir.context import make_context
from camlir.dialects.ca import verify_or_raise
from camlir.dialects.ca.ir_helpers import func_name, funcs, function_type, is_kernel, ops_named, require_func
from camlir.passes import build_pass_manager, parse_pipeline
from camlir.passes.bf16_as_i16 import holds_bf16
from camlir.passes.specialize_layouts import format_perms, needs_identity


class StageError(RuntimeError):
    """A stage failed; `stage` names it, the message says what failed in it."""

    def __init__(self, stage: str, message: str):
        self.stage = stage
        super().__init__(f"stage '{stage}' failed: {message}")


# --------------------------------------------------------------------------- dumping

@dataclass
class Dump:
    """Where the stages of one compile go: the log and, with CA_DUMP_DIR, numbered files."""

    label: str                       # "graph 3", "graph 3, sizes [10, 3]"
    directory: Optional[str] = None  # None: no files
    count: int = 0
    previous: Optional[str] = None   # the last file written

    @staticmethod
    def for_graph(capture_id: int, variant: str = "") -> "Dump":
        label = f"graph {capture_id}" + (f", {variant}" if variant else "")
        root = os.environ.get("CA_DUMP_DIR")
        directory = None
        if root:
            slug = re.sub(r"[^A-Za-z0-9]+", "-", variant).strip("-")
            directory = os.path.join(root, f"graph{capture_id}" + (f"-{slug}" if slug else ""))
            os.makedirs(directory, exist_ok=True)
        return Dump(label, directory)

    def __call__(self, stage: str, ir_text, pipeline: Optional[str] = None) -> None:
        if not (logs.enabled("verbose") or self.directory):
            return
        text = str(ir_text)
        if logs.enabled("verbose"):
            logs.log.info("%s, after stage '%s':\n%s", self.label, stage, text)
        if self.directory:
            path = os.path.join(self.directory, f"{self.count:02d}-{stage}.mlir")
            if pipeline and self.previous:
                how = f"ca-opt {os.path.basename(self.previous)} --pass-pipeline='{pipeline}'"
            else:
                how = "not a pass pipeline: a new starting point"
            comment = "#" if stage == "retrace" else "//"
            with open(path, "w") as f:
                f.write(f"{comment} {self.label}, stage '{stage}'; made by: {how}\n{text}")
            self.previous = path
            self.count += 1


def run_stage(stage: str, module: ir.Module, passes: list, dump: Dump) -> None:
    """Runs one stage's passes (camlir's and upstream ones alike) and dumps the result."""
    text = "builtin.module(" + ",".join(passes) + ")"
    try:
        pm = build_pass_manager(parse_pipeline(text), module.context)
        if logs.enabled("passes"):
            pm.enable_ir_printing(print_after_all=True)
        pm.run(module.operation)
        verify_or_raise(module.operation)
    except (ir.MLIRError, ValueError) as exc:
        raise StageError(stage, _diagnostics(exc)) from exc
    dump(stage, module, text)


def _diagnostics(exc: BaseException) -> str:
    """The error diagnostics of a failed pass manager (what the pass said), else the text."""
    messages = [d.message for d in getattr(exc, "error_diagnostics", ())]
    return "; ".join(messages) if messages else str(exc).strip().splitlines()[0]


# --------------------------------------------------------------------------- shared prefix

def make_aten(gm, inputs, sizes, scalars, hooks, packed_data, dump: Dump, unpacked=None) -> Retraced:
    """retrace: the captured graph on fake tensors, down to aten ops with node provenance
    (`unpacked`: what saved-tensor unpack hooks returned, see `retrace.record_unpacked`)."""
    retraced = retrace(gm, inputs, sizes, scalars, hooks, packed_data, unpacked)
    dump("retrace", retraced.graph.code)
    return retraced


def make_ca(retraced: Retraced, dump: Dump, expected_effects=None) -> ir.Module:
    """import: the aten graph as a `ca` module (autograd nodes, hooks, accumulation, sizes).
    With `expected_effects` (`effects.in_captured_graph` of the capture), checks that every
    accumulation and hook made it into the module."""
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
    targets = (torch.ops.aten.as_strided.default, torch.ops.aten.as_strided_scatter.default)
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in targets and n.args:
            val = getattr(n.args[0], "meta", {}).get("val")
            if isinstance(val, torch.Tensor) and not val.is_contiguous():
                return f"{n.target.name()} of a tensor with strides {tuple(val.stride())}"
    return ""


def make_eager(module: ir.Module) -> EagerProgram:
    """The reference backend: the `ca` module interpreted op by op through PyTorch."""
    return EagerProgram(module)


# --------------------------------------------------------------------------- cpu backend

def specialize(module: ir.Module, sizes: list, shapes: dict, dump: Dump) -> None:
    """specialize: a symbolic capture's sizes become constants and its dynamic argument dims
    the observed ones (`shapes`: argument number -> dims), so the kernels get static shapes."""
    shape_text = ",".join(f"{i}:{'x'.join(str(d) for d in shape)}" for i, shape in sorted(shapes.items()))
    run_stage("specialize", module, [
        "ca-flatten-nodes",
        "ca-specialize-shapes{sizes=%s shapes=%s}" % (",".join(str(s) for s in sizes), shape_text),
    ], dump)


def layouts(module: ir.Module, args: list, dump: Dump, dynamic: bool = False) -> list:
    """Returns, per argument, the permutation the runtime passes it with (from `args`, the
    first call's tensors; a later call with another layout is copied at the kernel)."""
    host = require_func(module, "backward")
    perms = input_permutations(list(function_type(host).inputs), args, dynamic)
    block_args = list(host.regions[0].blocks[0].arguments)
    perms = [None if p is not None and needs_identity(block_args[i]) else p for i, p in enumerate(perms)]
    if any(perms):
        run_stage("layouts", module, ["ca-specialize-layouts{perms=%s}" % format_perms(perms)], dump)
    return perms


def kernels(module: ir.Module, dump: Dump) -> None:
    """kernels: traced hook bodies inlined, the nodes flattened, every run of compute between
    barriers (Python hooks, host ops) outlined into a `ca.kernel` function; a view that one
    kernel returns only for later kernels (a transposed weight, the `t` of a weight gradient
    that TBackward undoes) crosses the cut as its base and is recomputed where it is read,
    so kernels split by a hook read what one kernel would have (ca-sink-views)."""
    run_stage("kernels", module, ["ca-inline-hooks", "ca-flatten-nodes", "ca-outline-kernels", "ca-sink-views"], dump)


def linalg(module: ir.Module, dump: Dump) -> None:
    """linalg: kernels lowered to linalg on tensors and fused; ops the lowering cannot take
    move to the host (logged, one line per op name)."""
    run_stage("linalg", module, ["ca-lower-to-linalg{twins=true}", "ca-depthwise-kernels{twins=true}", "ca-fuse-elementwise",
                                 "ca-unique-kernel-results"], dump)
    if "ca.host_ops" in module.operation.attributes:
        moved = sorted({ir.StringAttr(a).value for a in ir.ArrayAttr(module.operation.attributes["ca.host_ops"])})
        for name in moved:
            logs.log.info("camlir: %s: %s cannot be lowered; kept on the host, run through torch", dump.label, name)


def split(module: ir.Module, dump: Dump, dynamic: bool = False) -> tuple:
    """The kernels move to a module of their own; returns it, the host function and each
    kernel's (input specs, output specs, shape function). With `dynamic`, specs may have
    dynamic dims and scalar arguments, and each kernel gets the shape function of its
    results (`backends.cpu.shapes.derive`, while it is still on tensors); else the shape
    function is None."""
    kernel_module = ir.Module.create(ir.Location.unknown(module.context))
    specs = {}
    for fn in funcs(module, is_kernel):
        ftype = function_type(fn)
        try:
            ins = [abi.spec_of(t, dynamic) for t in ftype.inputs]
            outs = [abi.TensorSpec.from_type(t, dynamic) for t in ftype.results]
            shape_fn = kernel_shapes.derive(fn) if dynamic else None
        except (TypeError, kernel_shapes.ShapeError) as exc:
            raise StageError("split", f"kernel @{func_name(fn)}: {exc}") from exc
        specs[func_name(fn)] = (ins, outs, shape_fn)
        fn.clone(ir.InsertionPoint(kernel_module.body))
    dump("split", kernel_module)
    return kernel_module, require_func(module, "backward"), specs


# bf16/f16 arithmetic becomes f32 arithmetic with one rounding per op (what PyTorch's kernels
# compute), and bf16/f16 math functions f32 ones (then approximated like any f32 one). Left
# as it was, LLVM promotes it itself, through calls of `__truncsfbf2` that the JIT cannot
# resolve on a CPU without AVX512-BF16 (the graph was then interpreted).
_MATH = [
    "ca-expand-powers",
    "func.func(math-extend-to-supported-types{target-type=f32})",
    "func.func(arith-emulate-unsupported-floats{source-types=bf16,f16 target-type=f32})",
    "ca-narrow-float-conversions",  # keeps each op's rounding (drops the `contract` flags)
    "canonicalize",
    "ca-approximate-math",
]


def math(kernel_module: ir.Module, dump: Dump) -> None:
    """math: pow by a constant small integer (or +-0.5) as multiplications and sqrt (a
    vector `powi` has no LLVM form), and f32 exp/erf/tanh as polynomials the vectorizer
    can take (libm calls stop it)."""
    run_stage("math", kernel_module, _MATH, dump)


def bufferize(kernel_module: ir.Module, dump: Dump, dynamic: bool = False) -> None:
    """bufferize: kernels on memrefs with read-only inputs and results as out-parameters that
    the runtime allocates with torch; temporaries freed. With `dynamic`, a result allocated
    with dynamic sizes is replaced by its out-parameter too (`hoist-dynamic-allocs`: the
    runtime allocates it with the shape function's sizes); a result the pass cannot hoist
    (not an allocation of the kernel's own) is copied into the out-parameter."""
    run_stage("bufferize", kernel_module, bufferize_passes(dynamic), dump)


def bufferize_passes(dynamic: bool = False) -> list:
    """The passes of the bufferize stage (the gpu backend's gpu-bufferize runs them too)."""
    hoist = "hoist-static-allocs=true" + (" hoist-dynamic-allocs=true" if dynamic else "")
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


def blas(kernel_module: ir.Module, dump: Dump) -> None:
    """blas: matmuls become calls of MKL's gemm through wrappers written in MLIR."""
    run_stage("blas", kernel_module, ["ca-matmul-to-blas", "ca-copies-to-linalg", "ca-define-blas-wrappers"], dump)


# Affine loops so the super-vectorizer can turn innermost unit-stride loops into 8-wide
# vector code (AVX2); LLVM's own loop vectorizer left these loops scalar (GELU's backward
# ran 3.6x slower than PyTorch's). The affine conversion refuses some strided buffers
# ("non-trivial layout map"): such a module takes plain loops instead.
_VECTOR_LOOPS = [
    "convert-linalg-to-affine-loops",
    "ca-fold-views",  # loads through a slice read its buffer: the vectorizer refuses strided layouts
    "ca-register-reductions",  # reductions in iter_args, which the vectorizer takes
    "func.func(affine-super-vectorize{virtual-vector-size=8 vectorize-reductions=true})",
    "lower-affine",
    "func.func(convert-vector-to-scf)",
    "ca-bound-parallel-loops",  # the threads stage's loop nests: each thread's block only
]
_SCALAR_LOOPS = ["func.func(convert-linalg-to-loops)", "ca-bound-parallel-loops"]
_TO_LLVM = [
    "func.func(convert-linalg-to-loops)",
    "convert-scf-to-cf",
    "expand-strided-metadata",
    "lower-affine",
    # fpowi/ipowi the math stage left (non-constant or large exponents): as calls of
    # generated functions, a vector one unrolled per lane; `llvm.intr.powi` takes no
    # vector exponent, and such an op used to make the whole module take scalar loops.
    "convert-math-to-funcs",
    "convert-math-to-llvm",
    "convert-math-to-libm",    # f64 erf and friends
    # No soft-float calls for the JIT (it cannot resolve them: "Symbols not found:
    # __truncdfbf2"): bf16/f16 <-> f64/integer conversions go through f32 (after the last
    # canonicalize, which would fold them back), then f32 <-> bf16 become integer bit
    # operations, round to nearest even (this also expands min/max and ceil/floor divisions,
    # into the same compare-and-select code LLVM emits for them).
    "ca-narrow-float-conversions",
    "arith-expand{include-bf16=true}",
    "convert-vector-to-llvm",  # also lowers the vectorizer's transfer ops to loads/stores
    "finalize-memref-to-llvm",
    "convert-to-llvm",
    "reconcile-unrealized-casts",
    "ca-bf16-as-i16",  # else LLVM widens some moves of bf16 lanes through __truncsfbf2 calls
    "ca-define-parallel-forks",  # the threads stage's forks, as GOMP_parallel calls
]


def loops_and_llvm(kernel_module: ir.Module, dump: Dump) -> ir.Module:
    """loops, then llvm: vectorized loops tried on a copy; scalar loops when either stage
    refuses the vector code (strided layouts, vector ops the LLVM dialect cannot express
    such as `powi` on vectors)."""
    trial = ir.Module.parse(str(kernel_module), kernel_module.context)
    start = dump.previous
    try:
        run_stage("loops", trial, _VECTOR_LOOPS, dump)
        _no_bool_vectors(trial)
        run_stage("llvm", trial, _to_llvm(trial), dump)
        return trial
    except StageError as exc:
        logs.log.info("camlir: %s: vectorized loops refused (%s); using scalar loops", dump.label, exc)
    dump.previous = start  # the scalar loops start again from the blas stage's module
    run_stage("loops", kernel_module, _SCALAR_LOOPS, dump)
    run_stage("llvm", kernel_module, _to_llvm(kernel_module), dump)
    return kernel_module


def _to_llvm(loops_module: ir.Module) -> list:
    """The llvm stage's passes; ca-bf16-as-i16 only where the loops hold a bf16 value (asked
    of the loops stage's module: 0.07-0.14 s for an f32 MobileNetV3, against ~1 s for the
    pass on its LLVM-dialect module)."""
    return _TO_LLVM if holds_bf16(loops_module.operation) else [p for p in _TO_LLVM if p != "ca-bf16-as-i16"]


def _no_bool_vectors(module: ir.Module) -> None:
    """Refuses vector code that reads or writes an i1 buffer: LLVM stores `vector<8xi1>` as
    8 packed bits while a scalar i1 takes a byte, so such a loop reads masks wrong (a
    `torch.where` backward gave wrong gradients). Scalar loops are then used instead."""
    for op in ops_named(module, "vector.transfer_read", "vector.transfer_write"):
        buffer = op.operands[0] if op.name == "vector.transfer_read" else op.operands[1]
        if str(buffer.type).startswith("memref<") and str(ir.MemRefType(buffer.type).element_type) == "i1":
            raise StageError("loops", "vector access to an i1 buffer (LLVM packs vector<Nxi1> into bits)")


def threads(kernel_module: ir.Module, dump: Dump) -> None:
    """threads: big parallel loop nests outlined, to run split over torch's OpenMP threads
    (passes/parallel_loops.py); nothing where libgomp is not in the process."""
    if jit.parallel_runtime():
        run_stage("threads", kernel_module,
                  # named ops (transposes, copies, fills) as generics, so that they split too
                  ["func.func(linalg-generalize-named-ops)",
                   "ca-outline-parallel-loops{min-elements=%d}" % jit.parallel_min_elements()], dump)


def make_native(kernel_module: ir.Module, dump: Dump, dynamic: bool = False):
    """math, bufferize, blas, threads, loops, llvm, jit: a module of linalg-on-tensors kernels
    (changed in place) to an ExecutionEngine with a `_mlir_ciface_<name>` entry per kernel."""
    with kernel_module.context, ir.Location.unknown():
        math(kernel_module, dump)
        bufferize(kernel_module, dump, dynamic)
        blas(kernel_module, dump)
        threads(kernel_module, dump)
        llvm_module = loops_and_llvm(kernel_module, dump)
    try:
        return jit.compile_kernels(llvm_module)
    except Exception as exc:  # noqa: BLE001 - the engine raises plain RuntimeErrors
        raise StageError("jit", str(exc)) from exc


def with_hooks_traced(module: ir.Module, hooks, dump: Dump, sizes: Optional[list] = None,
                      shapes: Optional[dict] = None) -> tuple:
    """specialize (with `sizes`) and trace-hooks, on a copy of `module`; returns (the copy,
    the hook guard). Runs in the backward's own thread: tracing calls the user's hooks."""
    work = ir.Module.parse(str(module))
    if "ca.layout_sensitive" in work.operation.attributes:
        why = ir.StringAttr(work.operation.attributes["ca.layout_sensitive"]).value
        raise StageError("import", f"the backward reads physical strides ({why}); kernels assume "
                                   f"contiguous tensors")
    if sizes is not None:
        specialize(work, sizes, shapes or {}, dump)
    # After specialization: tracing needs static shapes, so a specialized capture's hooks
    # are traced per size set; with `dynamic`, only hooks whose operands have static shapes
    # (a parameter's gradient) are traced, the others stay Python calls.
    guard = trace_hooks(work, hooks, device="cpu")
    dump("trace-hooks", work)
    return work, guard


def lower_kernels(work: ir.Module, args: list, dump: Dump, dynamic: bool = False) -> list:
    """layouts, kernels, linalg, on `work` (changed in place; see `with_hooks_traced`);
    returns the input permutations, after checking that every accumulation and Python hook
    is still there exactly once."""
    expected = effects.in_module(work, python_hooks_only=True)  # traced hooks become kernel code
    perms = layouts(work, args, dump, dynamic)
    kernels(work, dump)
    linalg(work, dump)
    effects.check(expected, effects.in_module(work), f"{dump.label}, stage 'linalg'")
    return perms


def to_kernels(module: ir.Module, args: list, hooks, dump: Dump, sizes: Optional[list] = None,
               shapes: Optional[dict] = None, dynamic: bool = False) -> tuple:
    """The stages every compiling backend shares, on a copy of `module`: specialize (with
    `sizes`), trace-hooks, layouts, kernels, linalg. Returns (the module, now a host
    function plus linalg-on-tensors kernels; the hook guard; the input permutations)."""
    work, guard = with_hooks_traced(module, hooks, dump, sizes, shapes)
    return work, guard, lower_kernels(work, args, dump, dynamic)


def make_cpu(module: ir.Module, args: list, hooks, dump: Dump, sizes: Optional[list] = None,
             shapes: Optional[dict] = None, dynamic: bool = False):
    """Compiles one variant of a captured `ca` module for the cpu; returns the program and
    the guard on the hooks it traced. `module` is not changed. A symbolic capture passes
    the observed `sizes` and the `shapes` of its dynamic arguments.

    `dynamic=True` (a symbolic capture, without `sizes`/`shapes`) compiles one program for
    every size set the capture's guards accept: the kernels keep their `?` dims and take the
    lifted sizes they read as `i64` arguments; the program is called with the inputs plus
    the sizes, like a variant. Hook tracing needs static shapes: a hook whose operands have
    `?` dims stays a Python call (listed in the guard's `refused`), one on statically shaped
    tensors (a parameter's gradient) is traced as usual. What the dynamic path cannot
    compile raises `StageError` (the caller then specializes, as before)."""
    if dynamic and (sizes is not None or shapes):
        raise ValueError("make_cpu: dynamic=True compiles without sizes; pass sizes or dynamic, not both")
    start = time.perf_counter()
    with module.context, ir.Location.unknown():
        work, guard = with_hooks_traced(module, hooks, dump, sizes, shapes)
    # The rest in a thread of its own: what the compile leaves in memory then stays out of
    # the malloc arena the training loop's tensors come from (compile_thread.py says why)
    program = run_apart(_cpu_from_hooks_traced, work, args, dump, dynamic, start)
    logs.log.debug("%s: %d kernels compiled in %.3f s", dump.label, len(program.kernels), program.compile_seconds)
    return program, guard


def _cpu_from_hooks_traced(work: ir.Module, args: list, dump: Dump, dynamic: bool, start: float):
    """`make_cpu` from layouts on: the program."""
    with work.context, ir.Location.unknown():
        perms = lower_kernels(work, args, dump, dynamic)
        lowered_text = str(work)
        kernel_module, host, specs = split(work, dump, dynamic)
        shared = same_kernels.merge_identical(kernel_module)  # {kernel: the one whose code it runs}
        dump("same-code", kernel_module)
        engine = make_native(kernel_module, dump, dynamic) if specs else None
        compiled = {name: (abi.DynamicKernel(engine, name, ins, outs, shape_fn, shared.get(name, "")) if dynamic
                           else abi.Kernel(engine, name, ins, outs, shared.get(name, "")))
                    for name, (ins, outs, shape_fn) in specs.items()}
        program = CpuProgram(host, compiled, perms, lowered_text, time.perf_counter() - start,
                             twins=torch_twins(work), label=dump.label)
        # What the disk cache stores of it (backends/cpu/persist.py).
        program.host_text, program.engine, program.dynamic = persist.host_text(work), engine, dynamic
        program.shared_kernels = shared
    return program


def dynamic_shapes(module: ir.Module, args: list, n_inputs: int) -> dict:
    """The shapes of the arguments whose types have `?` dims, from this call's tensors."""
    host = require_func(module, "backward")
    return {i: tuple(args[i].shape) for i, t in enumerate(list(function_type(host).inputs)[:n_inputs])
            if "?" in str(t) and isinstance(args[i], torch.Tensor)}


# --------------------------------------------------------------------------- gpu backend
#
# The shared prefix and the cpu backend's specialize .. split stages, then (gpu.md):
#
#     gpu-bufferize  pow by small constants expanded; tensors to buffers ca-expand-powers, bufferize's passes
#     gpu-matmuls    matmuls become host calls (torch addmm/baddbmm:     ca-matmul-to-blas
#                    cuBLAS on torch's stream), never naive loops
#     gpu-map        the rest: parallel loops (parallel dims outer,      linalg-generalize-named-ops,
#                    reductions serial per output element), flattened,   ca-gpu-parallel-dims-first,
#                    256 threads a block, mapped to blocks and threads   convert-linalg-to-parallel-loops,
#                                                                        ca-gpu-flatten-parallel,
#                                                                        scf-parallel-loop-tiling,
#                                                                        gpu-map-parallel-loops,
#                                                                        convert-parallel-loops-to-gpu
#     gpu-outline    each launch's body into a gpu.module; the host side gpu-kernel-outlining
#                    checked and written as a launch plan               (backends/gpu/plan.py)
#     nvvm           device code to the llvm/nvvm dialects, math to      convert-gpu-to-nvvm
#                    libdevice calls, memref arguments as bare pointers
#     llvm-ir        every kernel in one LLVM module                     translate_module_to_llvmir
#     ptx            libdevice linked, O3, NVPTX (llvmlite), PTX ISA 8.0 backends/gpu/codegen.py

GPU_THREADS = 256  # threads a block: every loop is flattened to one dim first


def gpu_bufferize(kernel_module: ir.Module, dump: Dump) -> None:
    """gpu-bufferize: the cpu's bufferize, after `ca-expand-powers` (no polynomial math:
    libdevice's functions are exact and fast on the device)."""
    run_stage("gpu-bufferize", kernel_module, ["ca-expand-powers"] + bufferize_passes(), dump)


def gpu_matmuls(kernel_module: ir.Module, dump: Dump) -> None:
    """gpu-matmuls: `linalg.matmul`/`batch_matmul` (f32/f64) become calls of
    `@camlir_gemm_<t>`/`@camlir_bgemm_<t>` with transposes as views and `beta = 0` for a
    zero-filled output; the gpu runtime runs them as `c.addmm_`/`c.baddbmm_` (cuBLAS through
    torch, on torch's current stream). The declarations get no bodies here."""
    run_stage("gpu-matmuls", kernel_module, ["ca-matmul-to-blas"], dump)


def gpu_map(kernel_module: ir.Module, dump: Dump) -> None:
    """gpu-map: every other linalg op a parallel loop nest (one thread per output element,
    its reduction dims a serial loop inside), flattened to one dim, tiled by GPU_THREADS,
    and converted to `gpu.launch` (outer loop: blocks, inner: threads)."""
    run_stage("gpu-map", kernel_module, [
        "func.func(linalg-generalize-named-ops)",
        "ca-gpu-parallel-dims-first",
        "func.func(convert-linalg-to-parallel-loops)",
        "canonicalize",
        "ca-gpu-flatten-parallel",  # no canonicalize after: it would fold the one-iteration loops back
        "func.func(scf-parallel-loop-tiling{parallel-loop-tile-sizes=%d no-min-max-bounds=true})" % GPU_THREADS,
        "func.func(gpu-map-parallel-loops)",
        "func.func(convert-parallel-loops-to-gpu)",
    ], dump)


def gpu_outline(kernel_module: ir.Module, specs: dict, dump: Dump) -> dict:
    """gpu-outline: each `gpu.launch` body becomes a `gpu.func` in its own `gpu.module`;
    returns the launch plan of every kernel function (`backends.gpu.plan.kernel_plan`),
    which also checks that nothing but buffers, views, matmul calls and launches stayed on
    the host."""
    run_stage("gpu-outline", kernel_module,
              ["func.func(gpu-launch-sink-index-computations)", "gpu-kernel-outlining", "canonicalize"], dump)
    plans = {}
    for fn in funcs(kernel_module, is_kernel):
        name = func_name(fn)
        try:
            plans[name] = gpu_plan.kernel_plan(fn, len(specs[name][1]))
        except gpu_plan.PlanError as exc:
            raise StageError("gpu-outline", str(exc)) from exc
    return plans


def nvvm(kernel_module: ir.Module, dump: Dump) -> None:
    """nvvm: the device code to the llvm and nvvm dialects; math ops become libdevice calls
    (`__nv_expf`, ...), memref arguments bare pointers (static shapes and layouts)."""
    run_stage("nvvm", kernel_module, [
        "gpu.module(expand-strided-metadata,lower-affine,convert-scf-to-cf,"
        "convert-gpu-to-nvvm{use-bare-ptr-memref-call-conv=true},canonicalize,cse)",
        "reconcile-unrealized-casts",
    ], dump)


# LLVM intrinsics the NVPTX backend has no lowering for: it aborts the process on them.
_NO_NVPTX = re.compile(r"@llvm\.(exp|exp2|exp10|log|log2|log10|pow|powi|sin|cos|tan|sinh|cosh|tanh|asin|acos|atan|"
                       r"atan2|erf|frem)\.")


def gpu_llvm_ir(kernel_module: ir.Module, dump: Dump) -> tuple:
    """llvm-ir: the `gpu.module`s merged into one LLVM module, each kernel named after its
    module (the launch plan's `entry`); returns (LLVM IR text, kernel names)."""
    from torch_mlir.dialects import llvm as llvm_dialect

    merged = ir.Module.create()
    seen, entries = set(), []
    for op in kernel_module.body.operations:
        op = op.operation
        if op.name != "gpu.module":
            continue
        module_name = ir.StringAttr(op.attributes["sym_name"]).value
        for fn in op.regions[0].blocks[0].operations:
            fn = fn.operation
            kernel = "gpu.kernel" in fn.attributes or "nvvm.kernel" in fn.attributes
            name = ir.StringAttr(fn.attributes["sym_name"]).value if "sym_name" in fn.attributes else None
            if not kernel and name in seen:
                continue  # a libdevice declaration every module repeats
            seen.add(name)
            copy = fn.clone(ir.InsertionPoint(merged.body))
            if kernel:
                copy.attributes["sym_name"] = ir.StringAttr.get(module_name)
                entries.append(module_name)
    try:
        text = llvm_dialect.translate_module_to_llvmir(merged.operation)
    except Exception as exc:  # noqa: BLE001 - the translation raises plain errors
        raise StageError("llvm-ir", _diagnostics(exc)) from exc
    bad = _NO_NVPTX.search(text)
    if bad:
        raise StageError("llvm-ir", f"{bad.group(0)}* has no NVPTX lowering (it would abort codegen); "
                                    f"math must reach libdevice")
    dump("llvm-ir", text)
    return text, entries


def gpu_ptx(llvm_ir: str, entries: list, dump: Dump, target: str = gpu_codegen.DEFAULT_TARGET) -> str:
    """ptx: libdevice linked, non-kernel functions internal, LLVM O3, PTX for `target`."""
    try:
        ptx = gpu_codegen.ptx_from_llvm_ir(llvm_ir, entries, target)
    except gpu_codegen.CodegenError as exc:
        raise StageError("ptx", str(exc)) from exc
    dump("ptx", ptx)
    return ptx


def make_gpu_kernels(kernel_module: ir.Module, specs: dict, dump: Dump, target: str = gpu_codegen.DEFAULT_TARGET):
    """gpu-bufferize .. ptx on a module of linalg-on-tensors kernels (changed in place):
    returns (launch plans by kernel function, PTX text)."""
    with kernel_module.context, ir.Location.unknown():
        gpu_bufferize(kernel_module, dump)
        gpu_matmuls(kernel_module, dump)
        gpu_map(kernel_module, dump)
        plans = gpu_outline(kernel_module, specs, dump)
        nvvm(kernel_module, dump)
        llvm_ir, entries = gpu_llvm_ir(kernel_module, dump)
        return plans, gpu_ptx(llvm_ir, entries, dump, target)


def require_gpu() -> None:
    """Raises "backend 'gpu' needs a CUDA device: torch.cuda.is_available() is False" when
    torch sees no CUDA device (the driver's first step for `backend="gpu"`; not inside
    `backends.gpu.program.recording()`, which compiles without running)."""
    gpu_program.require_cuda()


def make_gpu(module: ir.Module, args: list, hooks, dump: Dump, sizes: Optional[list] = None,
             shapes: Optional[dict] = None, target: str = gpu_codegen.DEFAULT_TARGET,
             require_device: bool = True):
    """Compiles one (static-size) variant of a captured `ca` module for the gpu; returns the
    program (`backends.gpu.program.GpuProgram`) and the guard on the hooks it traced.
    `module` is not changed. With `require_device` (the driver), raises at once when torch
    sees no CUDA device; without (tests, `backends.gpu.export`), it compiles anyway: only
    running the program needs a GPU."""
    if require_device:
        require_gpu()
    start = time.perf_counter()
    with module.context, ir.Location.unknown():
        work, guard, perms = to_kernels(module, args, hooks, dump, sizes, shapes)
        lowered_text = str(work)
        kernel_module, host, specs = split(work, dump)
        plans, ptx = make_gpu_kernels(kernel_module, specs, dump, target) if specs else ({}, "")
        program = gpu_program.GpuProgram(host, plans, ptx, perms, lowered_text, time.perf_counter() - start,
                                         label=dump.label, target=target)
        program.module, program.reference = work, module  # the host IR (export reads it), the ca module
    logs.log.debug("%s: %d gpu kernels compiled in %.3f s", dump.label, len(plans), program.compile_seconds)
    return program, guard
