"""From linalg-on-tensors kernels to native code, one readable stage at a time.

    math        f32 exp/erf become polynomials LLVM can vectorize (math_approx.py)
    bufferize   one-shot-bufferize; inputs are read-only; results become out-parameters
                that the runtime allocates with torch; temporaries are freed
    blas-calls  matmuls become calls into MKL through the wrappers in blas.py
    loops       8-wide vectorized affine loops (scalar loops where that is refused)
    llvm        the LLVM dialect; f64 `math.erf` and friends go to libm
    jit         MLIR's ExecutionEngine at -O2 (-O3 measured no faster to run or compile), BLAS symbols registered

Every stage can be printed with `CA_LOGS=verbose`. Kernels are public functions with the
C interface, so each gets a `_mlir_ciface_<name>` entry taking memref descriptors.
"""

import ctypes
import time

from torch_mlir import ir
from torch_mlir.execution_engine import ExecutionEngine
from torch_mlir.passmanager import PassManager

from camlir import logs

from . import blas, math_approx

_BUFFERIZE = (
    "canonicalize",  # drops transposes that fold_transposes left without users
    "one-shot-bufferize{bufferize-function-boundaries function-boundary-type-conversion=identity-layout-map}",
    "canonicalize", "cse",
    "buffer-results-to-out-params{hoist-static-allocs=true modify-public-functions=true}",
    "canonicalize",
)
_DEALLOC = ("buffer-deallocation-pipeline", "canonicalize")
# Affine loops so the super-vectorizer can turn innermost unit-stride loops into 8-wide
# vector code (AVX2); LLVM's own loop vectorizer left these loops scalar (GELU's backward
# ran 3.6x slower than PyTorch's). The affine conversion refuses some strided buffers
# ("non-trivial layout map"): such a module takes plain loops instead.
_VECTOR_LOOPS = (
    "convert-linalg-to-affine-loops",
    "func.func(affine-super-vectorize{virtual-vector-size=8 vectorize-reductions=true})",
    "lower-affine",
    "func.func(convert-vector-to-scf)",
)
_SCALAR_LOOPS = ("func.func(convert-linalg-to-loops)",)
_TO_LLVM = (
    "func.func(convert-linalg-to-loops)",
    "convert-scf-to-cf",
    "expand-strided-metadata",
    "lower-affine",
    "convert-math-to-llvm",
    "convert-math-to-libm",
    "convert-vector-to-llvm",  # also lowers the vectorizer's transfer ops to loads/stores
    "finalize-memref-to-llvm",
    "convert-to-llvm",
    "reconcile-unrealized-casts",
)


def _to_llvm(module: ir.Module) -> ir.Module:
    """Vectorized loops down to LLVM, tried on a copy; scalar loops when any step of that
    refuses the module (strided layouts the affine conversion rejects, vector ops the
    LLVM dialect cannot express, such as `powi` on vectors)."""
    try:
        trial = ir.Module.parse(str(module), module.context)
        _run(trial, "loops", _VECTOR_LOOPS)
        _dump("loops", trial)
        _run(trial, "llvm", _TO_LLVM)
        return trial
    except (CodegenError, ir.MLIRError) as exc:
        logs.log.debug("vectorized loops refused (%s); using scalar loops", str(exc).splitlines()[0])
    _run(module, "loops", _SCALAR_LOOPS)
    _dump("loops", module)
    _run(module, "llvm", _TO_LLVM)
    return module


class CodegenError(RuntimeError):
    """A kernel could not be compiled to native code; names the stage."""


def _run(module: ir.Module, stage: str, passes) -> None:
    text = "builtin.module(" + ",".join(passes) + ")"
    try:
        PassManager.parse(text, module.context).run(module.operation)
    except ir.MLIRError as exc:
        raise CodegenError(f"stage '{stage}' failed: {exc}") from exc


def _dump(stage: str, module: ir.Module) -> None:
    if logs.enabled("verbose"):
        logs.log.info("cpu codegen, after stage '%s':\n%s", stage, module)


def _mark_inputs_read_only(module: ir.Module) -> None:
    """Bufferization may otherwise reuse an input's buffer for a result, and inputs are the
    user's saved tensors and gradients."""
    false = ir.BoolAttr.get(False)
    for op in module.body.operations:
        op = op.operation
        if op.name != "func.func" or "ca.kernel" not in op.attributes:
            continue
        n = len(op.regions[0].blocks[0].arguments)
        attrs = [ir.DictAttr.get({"bufferization.writable": false}) for _ in range(n)]
        op.attributes["arg_attrs"] = ir.ArrayAttr.get(attrs)
        op.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
        op.attributes["sym_visibility"] = ir.StringAttr.get("public")


def _copies_to_linalg(module: ir.Module) -> None:
    """`memref.copy` of a strided buffer needs `memrefCopy` from MLIR's C runner library,
    which the wheel lacks: make every copy a `linalg.copy` loop nest instead."""
    from torch_mlir.dialects import linalg

    copies = []
    module.operation.walk(lambda o: (copies.append(o.operation) if o.operation.name == "memref.copy" else None)
                          or ir.WalkResult.ADVANCE)
    for op in copies:
        with op.context, op.location, ir.InsertionPoint(op):
            linalg.copy(op.operands[0], outs=[op.operands[1]])
        op.erase()


def compile_kernels(module: ir.Module, *, opt_level: int = 2) -> ExecutionEngine:
    """Lowers a module of linalg-on-tensors kernels (in place) and JIT-compiles it.
    Kernels are expected to have been through ca-fuse-elementwise, which also folds
    transposes into matmul maps."""
    start = time.perf_counter()
    with module.context, ir.Location.unknown():
        math_approx.approximate_math(module)
        _dump("math", module)
        _mark_inputs_read_only(module)
        _run(module, "bufferize", _BUFFERIZE)
        _copies_to_linalg(module)
        _run(module, "dealloc", _DEALLOC)
        _dump("bufferize", module)
        wrappers = blas.matmuls_to_calls(module)
        _copies_to_linalg(module)
        _dump("blas-calls", module)
        blas.add_wrappers(module, wrappers)
        module = _to_llvm(module)
        _dump("llvm", module)
    try:
        engine = ExecutionEngine(module, opt_level=opt_level)
    except Exception as exc:  # noqa: BLE001 - the engine raises plain RuntimeErrors
        raise CodegenError(f"stage 'jit' failed: {exc}") from exc
    for name, address in blas.blas_symbols().items():
        engine.raw_register_runtime(name, ctypes.c_void_p(address))
    engine.initialize()
    logs.log.debug("cpu codegen took %.3f s", time.perf_counter() - start)
    return engine
