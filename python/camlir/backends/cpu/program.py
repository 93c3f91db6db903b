"""The cpu backend at run time: a host program that calls native kernels.

The cpu backend's stages (`compiler.py`) build one `CpuProgram` per compiled variant: the JIT-compiled
kernels and the host function (what ca-outline-kernels left in `@backward`). A call walks
the host program's steps: a kernel call (native, through pre-built descriptors), a hook
that stayed a Python call, an accumulation into `.grad` (PyTorch's own rule: steal or
assign when `.grad` is None, add in place otherwise), an op kept on the host (through torch).

A program compiled with runtime sizes (`Variant(runtime_sizes=True)`) is called the same way,
with the lifted sizes (plain ints) after the inputs: its kernels are `abi.DynamicKernel`s,
which take the sizes they read as scalar arguments and allocate outputs of this call's
shapes.
"""

from torch_mlir import ir

from camlir.backends.cpu import choice, malloc_tuning
from camlir.backends.cpu.shapes import ShapeError
from camlir.backends.host_runtime import (ALIAS, DeferredPermute, InterpreterError, Runtime, compile_block,
                                          fresh_and_private, steal_or_accumulate, storage_holds)
from camlir.errors import ProgramRefused
from camlir.passes.lower_to_linalg import TWIN_ATTR


class CpuProgram:
    """A compiled variant: `program(args, hooks)` runs the backward and returns its results.

    `kernels` maps each kernel name to its compiled `abi.Kernel`; `arg_perms` says, per
    argument, the permutation it is passed with (None: as it is; see ca-specialize-layouts);
    `lowered_text` is the module after the linalg stage, `compile_seconds` the compile time.
    `twins` (`torch_twins`) gives kernels a torch alternative: such a kernel's step is a
    `choice.KernelChoice`, in `choices`, which runs whichever measures faster.
    """

    def __init__(self, host: ir.Operation, kernels: dict, arg_perms: list, lowered_text: str = "",
                 compile_seconds: float = 0.0, twins: dict = None, label: str = ""):
        self.kernels = kernels
        self.twins = twins or {}  # kernel name -> EagerProgram of its torch original (torch_twins)
        self.choices = {}         # kernel name -> choice.KernelChoice, where a twin exists
        self.label = label
        self.host_text = None  # set by whoever can rebuild it (compiler.program): for the disk cache
        self.engine = None
        self.runtime_sizes = False  # kernels take their sizes at run time (abi.DynamicKernel)
        self.arg_perms = arg_perms
        self.lowered_text = lowered_text
        self.compile_seconds = compile_seconds
        self.program = compile_block(host.regions[0].blocks[0], terminator="func.return", extra=self._extra)
        self._perm_args = [(i, p) for i, p in enumerate(arg_perms) if p is not None]
        for step in self.program.steps:  # a decided choice puts its pick in the step itself
            kernel = getattr(step.fn, "kernel", None)
            step.blas = getattr(kernel, "blas", None)  # camlir.profile() splits the step's time
            if isinstance(step.fn, choice.KernelChoice):
                step.fn.step = step
                step.label = f"{step.label} ({twin_summary(step.fn.twin)})"
        malloc_tuning.apply()  # before the first native program runs (once per process)

    def _extra(self, op: ir.Operation):
        if op.name == "ca.accumulate_grad" and fresh_and_private(op.operands[1]):
            return steal_or_accumulate
        if op.name == "func.call":
            name = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
            kernel = self.kernels[name]
            if name in self.twins and choice.enabled():
                self.choices[name] = choice.KernelChoice(name, kernel, self.twins[name], self.label)
                return self.choices[name]
            call = lambda ins, rt: kernel(ins)  # noqa: E731
            call.kernel = kernel
            return call
        if op.name.startswith("torch_c."):
            return ALIAS  # only the static type changes
        if op.name == "ca.size" and "value" not in op.attributes:
            return ALIAS  # a lifted size, already a plain int (a dynamic program's argument)
        return None

    def __call__(self, args, hooks, callbacks=(), packed=()):
        deferred = False
        if self._perm_args:
            args = list(args)
            for i, p in self._perm_args:
                t = args[i]
                if storage_holds(t):
                    args[i] = t.permute(p)
                else:
                    args[i], deferred = DeferredPermute(t, p), True
        runtime = Runtime(hooks, callbacks, packed)
        try:
            if deferred:
                return self.program.run_deferring(args, runtime)
            return self.program.run(args, runtime)
        except ShapeError as exc:
            # A kernel with runtime sizes whose size checks fail for this call (its shape
            # function; compiled code would abort the process). Before any effect the
            # driver answers the call with a program specialized to these sizes.
            if not runtime.touched:
                raise ProgramRefused(str(exc)) from exc
            raise RuntimeError(f"camlir: {self.label}: {exc}, after the backward had run hooks or accumulated "
                               f"gradients; this is a camlir bug, please report it (camlir.save_repro writes a "
                               f"replayable case; enable(dynamic=False) avoids programs with runtime sizes)") from exc


def torch_twins(module: ir.Module) -> dict:
    """Kernel name -> the reference interpreter's program of its torch-dialect original, for
    each twin `ca-lower-to-linalg{twins=true}` kept in `module` (one the interpreter cannot
    run is left out: that kernel stays native)."""
    twins = {}
    for op in module.body.operations:
        op = op.operation
        if op.name == "func.func" and TWIN_ATTR in op.attributes:
            try:
                twins[ir.StringAttr(op.attributes[TWIN_ATTR]).value] = compile_block(
                    op.regions[0].blocks[0], terminator="func.return", extra=_value_views)
            except InterpreterError:
                continue
    return twins


def twin_summary(twin, most: int = 3) -> str:
    """What a kernel computes, for `camlir.profile()`: the aten ops of its torch twin, the
    most frequent first, overloads dropped (`"mm, add, sum +2"`), glue and views left out. Without it a profile
    lists `kernel @backward_kernel_21` and the reader has to dump IR to learn it is a GEMM."""
    counts: dict = {}
    for step in twin.steps:
        label = step.label
        if not label.startswith("host "):
            continue
        name = label.removeprefix("host ").removeprefix("aten.").removeprefix("prims.").split(".")[0]
        if name in _SHAPE_ONLY:
            continue
        counts[name] = counts.get(name, 0) + 1
    if not counts:
        return "views"
    names = sorted(counts, key=lambda n: -counts[n])
    more = f" +{len(names) - most}" if len(names) > most else ""
    return ", ".join(names[:most]) + more


_SHAPE_ONLY = frozenset(("view", "_unsafe_view", "reshape", "expand", "permute", "t", "transpose",
                         "unsqueeze", "squeeze", "slice", "select", "as_strided", "alias", "detach"))

_VIEWS = ("torch.aten.view", "torch.aten._unsafe_view")


def _value_views(op: ir.Operation):
    """A kernel's ops have value semantics: a `view` of a tensor that torch cannot view
    (a permuted input, a transpose's result) is a reshape there. Twins run it as one."""
    if op.name in _VIEWS:
        return lambda ins, rt: (ins[0].reshape(ins[1]),)
    return None
