"""The cpu backend: a captured `ca` module compiled to native kernels plus a host program.

Compile (once per variant; each stage printable with `CA_LOGS=verbose`):

    specialized symbolic captures only: ca-specialize-shapes for the observed sizes
    layouts     strided inputs become permutes of contiguous ones      (layouts.py)
    lowered     ca-inline-hooks, ca-flatten-nodes, ca-outline-kernels, ca-lower-to-linalg,
                ca-fuse-elementwise; an op that cannot be lowered moves to the host
    codegen     math, bufferize, BLAS calls, loops, LLVM, JIT          (codegen.py)
    host        the rest of @backward as a list of steps               (backends/eager.py)

Run: the host program walks its steps: a kernel call (native, through pre-built
descriptors), a hook that stayed a Python call, an accumulation into `.grad` (PyTorch's
own rule: steal or assign when `.grad` is None, add in place otherwise), an extern op.
"""

import re
import time

from torch._dynamo.external_utils import call_accumulate_grad
from torch_mlir import ir

from camlir import logs
from camlir.backends.eager import ALIAS, Runtime, _compile_block
from camlir.passes.outline_kernels import torch_op_name
from camlir.passes.pipeline import run_pipeline

from . import abi, codegen, layouts

LOWERING = "ca-inline-hooks,ca-flatten-nodes,ca-outline-kernels{extern-ops=%s},ca-lower-to-linalg,ca-fuse-elementwise"
_UNCONVERTED = re.compile(r"not converted: ([A-Za-z0-9_.,\s]+)")
_MAX_RETRIES = 3
# torch-mlir ops a failed lowering can leave behind, and the aten ops that produce them.
_LEFTOVER_SOURCES = {
    "tm_tensor.scan": ("aten.cumsum", "aten.cumprod", "aten.logcumsumexp"),
    "tm_tensor.sort": ("aten.sort",),
    "tm_tensor.topk": ("aten.topk",),
    "tm_tensor.attention": ("aten._scaled_dot_product_flash_attention_for_cpu",),
}


class CpuProgram:
    def __init__(self, module: ir.Module, example_args: list, func_name: str = "backward",
                 specialize: str = ""):
        start = time.perf_counter()
        with module.context, ir.Location.unknown():
            work, host = self._lower(module, example_args, func_name, specialize)
            self.lowered_text = str(work)
            kernel_module = ir.Module.create()
            specs = {}
            for op in list(work.body.operations):
                op = op.operation
                if op.name == "func.func" and "ca.kernel" in op.attributes:
                    name = ir.StringAttr(op.attributes["sym_name"]).value
                    ftype = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
                    specs[name] = ([abi.TensorSpec.from_type(t) for t in ftype.inputs],
                                   [abi.TensorSpec.from_type(t) for t in ftype.results])
                    op.clone(ir.InsertionPoint(kernel_module.body))
        engine = codegen.compile_kernels(kernel_module) if specs else None
        self.kernels = {name: abi.Kernel(engine, name, ins, outs) for name, (ins, outs) in specs.items()}
        self.program = _compile_block(host.regions[0].blocks[0], terminator="func.return", extra=self._extra)
        self._perm_args = [(i, p) for i, p in enumerate(self.arg_perms) if p is not None]
        self.compile_seconds = time.perf_counter() - start

    def _lower(self, module, example_args, func_name, specialize):
        """Runs the lowering; an aten op it cannot convert is kept on the host (run through
        torch between kernels) and the lowering starts again, rather than the whole graph
        dropping to the interpreter."""
        extern = []
        for attempt in range(_MAX_RETRIES + 1):
            work = ir.Module.parse(str(module))
            if specialize:
                run_pipeline(work, f"ca-flatten-nodes,{specialize}")
                _dump("specialized", work)
            host = _func(work, func_name)
            self.arg_perms = layouts.specialize_layouts(host, example_args)
            if any(self.arg_perms):
                _dump("layouts", work)
            try:
                run_pipeline(work, LOWERING % ",".join(extern))
            except ir.MLIRError as exc:
                new = [n for n in _culprits(str(exc), work) if n not in extern]
                if not new or attempt == _MAX_RETRIES:
                    raise
                logs.log.info("camlir: %s cannot be lowered; kept on the host, run through torch",
                              ", ".join(new))
                extern += new
                continue
            _dump("lowered", work)
            return work, host

    def _extra(self, op: ir.Operation):
        if op.name == "ca.accumulate_grad" and _fresh_and_private(op.operands[1]):
            return _steal_or_accumulate
        if op.name == "func.call":
            kernel = self.kernels[ir.FlatSymbolRefAttr(op.attributes["callee"]).value]
            return lambda ins, rt: kernel(ins)
        if op.name.startswith("torch_c."):
            return ALIAS  # only the static type changes
        return None

    def __call__(self, args, hooks, callbacks=()):
        args = list(args)
        for i, p in self._perm_args:
            args[i] = args[i].permute(p)
        return self.program.run(args, Runtime(hooks, callbacks))


class SpecializingProgram:
    """A capture with symbolic sizes, compiled once per set of observed sizes.

    Kernels are compiled for static shapes (static shapes are what let the loops vectorize
    and the descriptors be built once), so each new size set runs `ca-specialize-shapes`
    and compiles a `CpuProgram` for it; later calls with those sizes reuse it. The
    `?`-typed module stays what was captured, and the reference backend runs it as is.
    """

    def __init__(self, module: ir.Module, n_inputs: int, name: str, fallback):
        self.module = module
        self.n_inputs = n_inputs
        self.name = name
        self.fallback = fallback  # builds the reference interpreter when a variant fails
        self.variants = {}
        self.kernels = {}
        self.compile_seconds = 0.0
        self.lowered_text = str(module)
        host = _func(module, "backward")
        args = list(host.regions[0].blocks[0].arguments)
        self._dynamic_args = [i for i, a in enumerate(args[:n_inputs]) if "?" in str(a.type)]

    def _key(self, args):
        sizes = tuple(int(s) for s in args[self.n_inputs:])
        shapes = tuple(tuple(args[i].shape) for i in self._dynamic_args)
        return sizes, shapes

    def __call__(self, args, hooks, callbacks=()):
        args = list(args)
        key = self._key(args)
        program = self.variants.get(key)
        if program is None:
            program = self._compile(key, args)
        return program(args, hooks, callbacks)

    def _compile(self, key, args):
        sizes, shapes = key
        spec = "ca-specialize-shapes{sizes=%s shapes=%s}" % (
            ",".join(str(s) for s in sizes),
            ",".join(f"{i}:{'x'.join(str(d) for d in shape)}" for i, shape in zip(self._dynamic_args, shapes)))
        if logs.enabled("recompiles"):
            logs.log.info("%s: compiling native code for sizes %s", self.name, list(sizes))
        try:
            program = CpuProgram(self.module, args, specialize=spec)
            self.compile_seconds += program.compile_seconds
            self.kernels.update(program.kernels)
            self.lowered_text = program.lowered_text
        except Exception as exc:  # noqa: BLE001 - same remedy for every failure
            logs.log.warning("camlir: %s: native code for sizes %s failed (%s); the reference "
                             "interpreter runs them", self.name, list(sizes), str(exc).splitlines()[0])
            program = self.fallback()
        self.variants[key] = program
        return program


def _culprits(message: str, work: ir.Module) -> list:
    """The aten ops a lowering failure names, directly or through what they left behind."""
    found = _UNCONVERTED.search(message)
    names = [n.strip() for n in found.group(1).split(",")] if found else []
    present = set()
    work.operation.walk(lambda o: present.add(torch_op_name(o.operation)) or ir.WalkResult.ADVANCE)
    culprits = []
    for name in names:
        for source in (name,) if name.startswith("aten.") else _LEFTOVER_SOURCES.get(name, ()):
            if source in present and source not in culprits:
                culprits.append(source)
    return culprits


def _fresh_and_private(value: ir.Value) -> bool:
    """True when `value` is a kernel result (a tensor the runtime just allocated) that
    nothing but this accumulation reads, so `.grad` may take it without a copy."""
    if len(list(value.uses)) != 1:
        return False
    owner = value.owner
    if isinstance(owner, ir.OpView) and owner.operation.name == "torch_c.from_builtin_tensor":
        value = owner.operation.operands[0]
        if len(list(value.uses)) != 1:
            return False
        owner = value.owner
    return isinstance(owner, ir.OpView) and owner.operation.name == "func.call"


def _steal_or_accumulate(ins, rt):
    """The eager engine's AccumulateGrad with `.grad` unset: it steals a gradient nobody
    else holds when its layout matches the parameter's, else it copies; with `.grad` set
    it adds in place. PyTorch's helper cannot see that our kernel output is private (the
    interpreter holds references), so it would always copy: 4 MB per 1024x1024 weight."""
    param, grad = ins
    if param.grad is None and param.is_contiguous() and grad.dtype == param.dtype and grad.shape == param.shape:
        param.grad = grad
    else:
        call_accumulate_grad(param, param.grad, grad, False)
    return ()


def _func(module: ir.Module, name: str) -> ir.Operation:
    for op in module.body.operations:
        op = op.operation
        if op.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == name:
            return op
    raise ValueError(f"no function @{name}")


def _dump(stage: str, module: ir.Module) -> None:
    if logs.enabled("verbose"):
        logs.log.info("cpu backend, after stage '%s':\n%s", stage, module)
