"""The gpu backend's stages: linalg kernels through NVVM to PTX, run by `program.GpuProgram`.

After the shared kernel stages (`pipeline.KERNEL_STAGES`: specialize .. split), on static
sizes only (a symbolic capture compiles one program per size set; docs/gpu-backend.md):

    gpu-bufferize  pow by small constants expanded; tensors to buffers ca-expand-powers, bufferize's passes
    gpu-matmuls    matmuls become host calls (torch addmm/baddbmm:     ca-matmul-to-blas
                   cuBLAS on torch's stream), never naive loops
    gpu-map        the rest: parallel loops (parallel dims outer,      linalg-generalize-named-ops,
                   reductions serial per output element), flattened,   ca-gpu-parallel-dims-first,
                   256 threads a block, mapped to blocks and threads   convert-linalg-to-parallel-loops,
                                                                       ca-gpu-flatten-parallel,
                                                                       scf-parallel-loop-tiling,
                                                                       gpu-map-parallel-loops,
                                                                       convert-parallel-loops-to-gpu
    gpu-outline    each launch's body into a gpu.module; the host side gpu-kernel-outlining
                   checked and written as a launch plan               (backends/gpu/plan.py)
    nvvm           device code to the llvm/nvvm dialects, math to      convert-gpu-to-nvvm
                   libdevice calls, memref arguments as bare pointers
    llvm-ir        every kernel in one LLVM module                     translate_module_to_llvmir
    ptx            libdevice linked, O3, NVPTX (llvmlite), PTX ISA 8.0 backends/gpu/codegen.py

No GPU is needed to compile: `GpuBackend(require_device=False)` (tests, `export`) builds
programs anywhere; only running one needs a CUDA device.
"""

import re

from torch_mlir import ir

from camlir.backends.base import Backend
from camlir.backends.gpu import codegen as gpu_codegen
from camlir.backends.gpu import plan as gpu_plan
from camlir.backends.gpu import program as gpu_program
from camlir.dialects.ca.ir_helpers import func_name, funcs, function_type, is_kernel
from camlir.pipeline import KERNEL_STAGES, Work, bufferize_passes
from camlir.stages import Dump, Stage, StageError, diagnostics, run_stage

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


def gpu_outline(kernel_module: ir.Module, n_results: dict, dump: Dump) -> dict:
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
            plans[name] = gpu_plan.kernel_plan(fn, n_results[name])
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
        raise StageError("llvm-ir", diagnostics(exc)) from exc
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


def make_gpu_kernels(kernel_module: ir.Module, dump: Dump, target: str = gpu_codegen.DEFAULT_TARGET):
    """gpu-bufferize .. ptx on a module of linalg-on-tensors kernels (changed in place):
    returns (launch plans by kernel function, PTX text)."""
    n_results = {func_name(fn): len(function_type(fn).results) for fn in funcs(kernel_module, is_kernel)}
    if not n_results:
        return {}, ""
    with kernel_module.context, ir.Location.unknown():
        gpu_bufferize(kernel_module, dump)
        gpu_matmuls(kernel_module, dump)
        gpu_map(kernel_module, dump)
        plans = gpu_outline(kernel_module, n_results, dump)
        nvvm(kernel_module, dump)
        llvm_ir, entries = gpu_llvm_ir(kernel_module, dump)
        return plans, gpu_ptx(llvm_ir, entries, dump, target)


class GpuBackend(Backend):
    """PTX kernels launched on torch's CUDA stream; static sizes only; nothing kept on disk.
    `target` names the GPU architecture the PTX is for; with `require_device=False` it
    compiles on a machine without a GPU."""

    name = "gpu"

    def __init__(self, target: str = gpu_codegen.DEFAULT_TARGET, require_device: bool = True):
        self.target = target
        self.needs_device = require_device

    def require_device(self) -> None:
        """Raises "backend 'gpu' needs a CUDA device: torch.cuda.is_available() is False" when
        torch sees no CUDA device (not inside `backends.gpu.program.recording()`, which
        compiles without running)."""
        if self.needs_device:
            gpu_program.require_cuda()

    def stages(self, variant) -> tuple:
        if variant.runtime_sizes:
            raise StageError("specialize", "the gpu backend compiles static sizes")
        return KERNEL_STAGES + (Stage("ptx", self._kernels), Stage("program", self._program))

    def _kernels(self, work: Work) -> None:
        work.plans, work.ptx = make_gpu_kernels(work.kernels, work.dump, self.target)

    def _program(self, work: Work) -> None:
        program = gpu_program.GpuProgram(work.host, work.plans, work.ptx, work.perms, work.lowered_text,
                                         work.seconds(), label=work.dump.label, target=self.target)
        program.module, program.reference = work.module, work.captured  # the host IR (export reads it), the ca module
        work.program = program
