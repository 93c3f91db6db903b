"""The cpu backend's stages: linalg kernels to native code, run by `program.CpuProgram`.

After the shared kernel stages (`pipeline.KERNEL_STAGES`: specialize .. split):

    split        each kernel's argument specs (and, with runtime sizes, the shape function
                 of its results: backends/cpu/shapes.py, while it is still on tensors)
    same-code    a kernel that prints the same as an earlier one,   backends/cpu/same_kernels.py
                 its name aside, is dropped; the runtime calls the
                 earlier one's code for it (compiled once)
    math         loop indices read as constant inputs, 0-d f64       ca-index-as-input,
                 inputs rounded once (both: vectorizable loops);     ca-narrow-scalar-inputs,
                 pow by small constant exponents as multiplications ca-expand-powers,
                 and sqrt; bf16/f16 arithmetic and math functions   math-extend-to-supported-types,
                 in f32, rounded once per op (as PyTorch computes   arith-emulate-unsupported-floats,
                 them); f32 exp/erf/tanh as vectorizable polynomials ca-approximate-math
    bufferize    tensors to buffers; results become out-params     ca-prepare-kernel-abi, one-shot-bufferize, ...
    blas         matmuls become calls to MKL's gemm                 ca-matmul-to-blas, ca-define-blas-wrappers
    threads      big parallel generics outlined, each to run one   linalg-generalize-named-ops,
                 block of a dimension per OpenMP thread            ca-outline-parallel-loops
    loops        loads through static slices folded into their     ca-fold-views,
                 buffer's indices; 16-wide (AVX-512) or 8-wide      ..., ca-bound-parallel-loops
                 vectorized affine loops
                 (scalar loops where the vectorizer refuses); split
                 loops cut to a block
    llvm         the LLVM dialect; a powi left on vectors per lane; convert-math-to-funcs,
                 bf16/f16 conversions with f64 and integers through ca-narrow-float-conversions,
                 f32, f32<->bf16 as integer bit operations (no soft- arith-expand{include-bf16=true},
                 float calls left for the JIT: bf16 values that are convert-*-to-llvm,
                 only moved become i16); the threads stage's        ca-bf16-as-i16,
                 forks as GOMP_parallel calls                       ca-define-parallel-forks
    jit          MLIR's ExecutionEngine at -O2, BLAS symbols linked  backends/cpu/jit.py

With runtime sizes (`Variant(runtime_sizes=True)`): no specialize; trace-hooks traces only
hooks whose operands have static shapes (the others stay Python calls); kernels keep `?`
dims and take the lifted sizes they read as `i64` arguments; bufferize hoists dynamic
result allocations into the out-params (hoist-dynamic-allocs); the runtime kernel is
`abi.DynamicKernel` (sizes and strides written per call, outputs allocated with the shapes
the shape function computes).

With the compile service (`compile_service.py`, the default) the stages from kernels on run
in a worker process (`CpuBackend.service_from`), which answers with the files the disk cache
keeps (`persist.py`); without it, the stages from layouts on run in a thread of their own
(`CpuBackend.apart_from`).
"""

import re

from torch_mlir import ir

from camlir import logs
from camlir.backends.base import Backend
from camlir.backends.cpu import jit, persist, same_kernels
from camlir.backends.cpu import shapes as kernel_shapes
from camlir.dialects.ca.ir_helpers import func_name, funcs, function_type, is_kernel, ops_named
from camlir.passes.bf16_as_i16 import holds_bf16
from camlir.pipeline import KERNEL_STAGES, Work, bufferize_passes, split as split_kernels
from camlir.stages import Dump, Stage, StageError, run_stage


# The runtime (`abi`, `program`: they need torch) is imported in the stages that build a
# program, not at the top: a compile worker imports this module and runs the stages up to
# the program's files without torch (it starts in 0.4 s instead of 3.3 s; compile_worker.py).


def split(work: Work) -> None:
    """split, then each kernel's argument and result specs (`work.specs`: name -> (input
    specs, output specs, shape function or None)); with runtime sizes specs may have dynamic
    dims and scalar arguments, and each kernel gets the shape function of its results."""
    from camlir.backends.cpu import abi

    split_kernels(work)
    runtime_sizes = work.variant.runtime_sizes
    work.specs = {}
    for fn in funcs(work.kernels, is_kernel):
        ftype = function_type(fn)
        try:
            ins = [abi.spec_of(t, runtime_sizes) for t in ftype.inputs]
            outs = [abi.TensorSpec.from_type(t, runtime_sizes) for t in ftype.results]
            shape_fn = kernel_shapes.derive(fn) if runtime_sizes else None
        except (TypeError, kernel_shapes.ShapeError) as exc:
            raise StageError("split", f"kernel @{func_name(fn)}: {exc}") from exc
        work.specs[func_name(fn)] = (ins, outs, shape_fn)


def same_code(work: Work) -> None:
    """same-code: `work.shared` maps a dropped kernel to the one whose code it runs."""
    work.shared = same_kernels.merge_identical(work.kernels)
    work.dump("same-code", work.kernels)


# bf16/f16 arithmetic becomes f32 arithmetic with one rounding per op (what PyTorch's kernels
# compute), and bf16/f16 math functions f32 ones (then approximated like any f32 one). Left
# as it was, LLVM promotes it itself, through calls of `__truncsfbf2` that the JIT cannot
# resolve on a CPU without AVX512-BF16 (the graph was then interpreted).
_MATH = [
    # cpu only (the gpu's loops take loop indices and f64 scalars as they are): a loop index
    # read in a body becomes a constant input, a 0-d f64 input rounded once (vectorizer)
    "ca-index-as-input",
    "ca-narrow-scalar-inputs",
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
    can take (libm calls stop it); where the CPU has bf16 units, matmuls of widened bf16
    tensors read the bf16 tensors, for MKL's bf16 GEMM (ca-bf16-matmuls)."""
    passes = _MATH + (["ca-bf16-matmuls"] if jit.native_bf16_gemm() else [])
    run_stage("math", kernel_module, passes, dump)


def bufferize(kernel_module: ir.Module, dump: Dump, runtime_sizes: bool = False) -> None:
    """bufferize: kernels on memrefs with read-only inputs and results as out-parameters that
    the runtime allocates with torch; temporaries freed. With `runtime_sizes`, a result allocated
    with dynamic sizes is replaced by its out-parameter too (`hoist-dynamic-allocs`: the
    runtime allocates it with the shape function's sizes); a result the pass cannot hoist
    (not an allocation of the kernel's own) is copied into the out-parameter."""
    run_stage("bufferize", kernel_module, bufferize_passes(runtime_sizes), dump)


def blas(kernel_module: ir.Module, dump: Dump) -> None:
    """blas: matmuls become calls of MKL's gemm through wrappers written in MLIR."""
    run_stage("blas", kernel_module, ["ca-matmul-to-blas", "ca-copies-to-linalg", "ca-define-blas-wrappers"], dump)


# Affine loops so the super-vectorizer can turn innermost unit-stride loops into vector code
# (`jit.vector_width()` lanes: 16 with AVX-512, 8 with AVX2); LLVM's own loop vectorizer left these loops scalar (GELU's backward
# ran 3.6x slower than PyTorch's). The affine conversion refuses some strided buffers
# ("non-trivial layout map"): such a module takes plain loops instead.
_VECTOR_LOOPS = [
    "convert-linalg-to-affine-loops",
    "ca-fold-views",  # loads through a slice read its buffer: the vectorizer refuses strided layouts
    "ca-register-reductions",  # reductions in iter_args, which the vectorizer takes
    "func.func(affine-super-vectorize{virtual-vector-size=%d vectorize-reductions=true})",
    "lower-affine",
    "func.func(convert-vector-to-scf)",
    "ca-bound-parallel-loops",  # the threads stage's loop nests: each thread's block only
]


# An f64 buffer with at least one dimension: a 0-d one (`memref<f64>`: a Python float a node
# saved, such as BERT's attention scale 1/sqrt(d)) is read as one scalar, never as f64 lanes.
# Counting it put BERT's whole kernel module at 8 lanes.
# (f64 math on f32 data, such as ca-expand-powers' repeated squaring, vectorizes at 16 lanes
# without an f64 buffer, as before: test_speed_classes.py.)
_F64_BUFFER = re.compile(r"memref<[0-9?][^>]*f64")


def vector_loops(width: int = 0) -> list:
    """The loops stage's passes with `width` lanes (default: `jit.vector_width()`; a module
    with f64 values takes 8, `loops_and_llvm`)."""
    width = width or jit.vector_width()
    return [p % width if "%d" in p else p for p in _VECTOR_LOOPS]


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
    text = str(kernel_module)
    trial = ir.Module.parse(text, kernel_module.context)
    start = dump.previous
    # 16 lanes only where no f64 value is vectorized: 16 x f64 (two zmm registers a vector)
    # gave wrong gradients in the depthwise window loops of a float64 convolution (kernel 5,
    # stride 2, 8 positions: test_depthwise_conv.py); 8 x f64 is one zmm register anyway.
    width = 8 if _F64_BUFFER.search(text) else jit.vector_width()
    try:
        run_stage("loops", trial, vector_loops(width), dump)
        _no_bool_vectors(trial)
        run_stage("llvm", trial, _to_llvm(trial), dump)
        return trial
    except StageError as exc:
        logs.log.info("%s: vectorized loops refused (%s); using scalar loops", dump.label, exc)
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


def native(work: Work) -> None:
    """math, bufferize, blas, threads, loops, llvm, jit: the kernel module (changed in place)
    to an ExecutionEngine with a `_mlir_ciface_<name>` entry per kernel (`work.engine`;
    None when the backward has no kernels)."""
    work.engine = make_native(work.kernels, work.dump, work.variant.runtime_sizes) if work.specs else None


def make_native(kernel_module: ir.Module, dump: Dump, runtime_sizes: bool = False):
    """math .. jit on a module of linalg-on-tensors kernels (changed in place)."""
    with kernel_module.context, ir.Location.unknown():
        math(kernel_module, dump)
        bufferize(kernel_module, dump, runtime_sizes)
        blas(kernel_module, dump)
        threads(kernel_module, dump)
        llvm_module = loops_and_llvm(kernel_module, dump)
    try:
        return jit.compile_kernels(llvm_module)
    except Exception as exc:  # noqa: BLE001 - the engine raises plain RuntimeErrors
        raise StageError("jit", str(exc)) from exc


def program(work: Work) -> None:
    """The `CpuProgram`: the host function walked by the runtime, calling the kernels."""
    from camlir.backends.cpu import abi
    from camlir.backends.cpu.program import CpuProgram, torch_twins

    engine, shared = work.engine, work.shared
    compiled = {name: (abi.DynamicKernel(engine, name, ins, outs, shape_fn, shared.get(name, ""))
                       if work.variant.runtime_sizes
                       else abi.Kernel(engine, name, ins, outs, shared.get(name, "")))
                for name, (ins, outs, shape_fn) in work.specs.items()}
    work.program = CpuProgram(work.host, compiled, work.perms, work.lowered_text, work.seconds(),
                              twins=torch_twins(work.module), label=work.dump.label)
    # What the disk cache stores of it (backends/cpu/persist.py).
    work.program.host_text, work.program.engine = persist.host_text(work.module), engine
    work.program.runtime_sizes, work.program.shared_kernels = work.variant.runtime_sizes, shared


_CPU_STAGES = (Stage("same-code", same_code), Stage("native", native), Stage("program", program))


# --------------------------------------------------------------------------- in a compile worker

def split_apart(work: Work) -> None:
    """split, in a compile worker: with runtime sizes, each kernel's shape function (its
    source, `work.shape_sources`); the specs are read back from the stored host module's
    kernel declarations where the program is loaded (`persist.from_files`)."""
    split_kernels(work)
    work.shape_sources = {}
    if work.variant.runtime_sizes:
        for fn in funcs(work.kernels, is_kernel):
            try:
                work.shape_sources[func_name(fn)] = kernel_shapes.derive(fn).source
            except kernel_shapes.ShapeError as exc:
                raise StageError("split", f"kernel @{func_name(fn)}: {exc}") from exc


def native_apart(work: Work) -> None:
    """math .. llvm, then the kernels' machine code linked into one library (`work.library`;
    None without kernels), in a compile worker: objects only, nothing is loaded here."""
    work.library = None
    if not list(funcs(work.kernels, is_kernel)):
        return
    with work.kernels.context, ir.Location.unknown():
        math(work.kernels, work.dump)
        bufferize(work.kernels, work.dump, work.variant.runtime_sizes)
        blas(work.kernels, work.dump)
        threads(work.kernels, work.dump)
        llvm_module = loops_and_llvm(work.kernels, work.dump)
    try:
        work.library = jit.shared_library(*jit.compile_objects(llvm_module))
    except Exception as exc:  # noqa: BLE001 - LLVM and the linker raise plain errors
        raise StageError("jit", str(exc)) from exc


def artifact(work: Work) -> None:
    """The program's files as the disk cache keeps them (`persist.files`): `work.artifact`."""
    work.artifact = persist.files(persist.host_text(work.module), work.library, work.perms,
                                  work.variant.runtime_sizes, work.shape_sources, "", work.seconds(),
                                  work.shared)


_APART_STAGES = (Stage("same-code", same_code), Stage("native", native_apart), Stage("artifact", artifact))


class CpuBackend(Backend):
    """Native code for the cpu through MLIR's JIT; programs kept on disk."""

    name = "cpu"
    runtime_sizes = True
    apart_from = "layouts"
    service_from = "kernels"  # specialize, trace-hooks (user hooks) and layouts (tensors) run here
    stores_programs = True

    def stages(self, variant) -> tuple:
        return tuple(Stage("split", split) if s.name == "split" else s for s in KERNEL_STAGES) + _CPU_STAGES

    def service_stages(self, variant) -> tuple:
        names = [s.name for s in KERNEL_STAGES]
        shared = KERNEL_STAGES[names.index(self.service_from):]
        return tuple(Stage("split", split_apart) if s.name == "split" else s for s in shared) + _APART_STAGES

    def worker_facts(self) -> dict:
        return jit.facts()

    def assume(self, facts: dict) -> None:
        jit.assume(facts)

    def code_options(self) -> str:
        return f"vector width {jit.vector_width()}" + (", bf16 gemm" if jit.native_bf16_gemm() else "")

    def not_storable(self, program) -> str:
        from camlir.backends.cpu.program import CpuProgram

        if not isinstance(program, CpuProgram) or program.host_text is None:
            return "it is not native code (interpreted)"
        return ""

    def to_files(self, program) -> tuple:
        return persist.to_files(program)

    def from_files(self, entry, context):
        return persist.from_files(entry, context)
