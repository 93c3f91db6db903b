"""The gpu backend at run time: a host program that launches PTX kernels on torch's stream.

The gpu backend's stages (`compiler.py`) build one `GpuProgram` per compiled variant: the launch plan of
every kernel function (`plan.kernel_plan`) and the PTX of all device kernels. A call walks
the host function like `backends/cpu/program.py:CpuProgram`: a kernel call runs its plan
(`runner.KernelRunner`: buffers from torch's caching allocator, views, cuBLAS matmuls
through torch, `cuLaunchKernel`s), an accumulation follows PyTorch's rule, an op kept on
the host runs through torch on the CUDA tensors.

No GPU, no program: `require_cuda()` (the driver's first step for `backend="gpu"`) raises
"backend 'gpu' needs a CUDA device: torch.cuda.is_available() is False". The CUDA driver
is only touched when a program first runs, so importing camlir never needs it. Inside
`recording()` (what `export` uses to compile on a machine without a GPU) the check is off:
compiled programs are collected with the arguments of their first call, and the backward
runs on the reference interpreter instead.
"""

import contextlib
import threading

import torch
from torch_mlir import ir

from camlir.backends.eager import EagerProgram
from camlir.backends.host_runtime import ALIAS, Runtime, compile_block, fresh_and_private, literal_tensor
from camlir.backends.gpu import runner

_RECORDING = threading.local()


def require_cuda() -> None:
    """Raises the gpu backend's error when torch sees no CUDA device (not while recording)."""
    if getattr(_RECORDING, "programs", None) is None and not torch.cuda.is_available():
        raise RuntimeError(runner._NEEDS_CUDA)


@contextlib.contextmanager
def recording():
    """Collects `(program, args)` for every gpu program run inside, compiling without a GPU;
    the backward itself runs on the reference interpreter (on whatever device its tensors
    are). Yields the list."""
    previous = getattr(_RECORDING, "programs", None)
    _RECORDING.programs = []
    try:
        yield _RECORDING.programs
    finally:
        _RECORDING.programs = previous


class GpuProgram:
    """A compiled variant: `program(args, hooks)` runs the backward on CUDA tensors.

    `plans` maps each kernel function to its launch plan, `ptx` holds every device kernel;
    `arg_perms` as in CpuProgram; `kernels` maps names to their `runner.KernelRunner`."""

    def __init__(self, host: ir.Operation, plans: dict, ptx: str, arg_perms: list, lowered_text: str = "",
                 compile_seconds: float = 0.0, label: str = "", target: str = "sm_90"):
        self.host = host
        self.plans = plans
        self.ptx = ptx
        self.target = target
        self.label = label
        self.arg_perms = arg_perms
        self.lowered_text = lowered_text
        self.compile_seconds = compile_seconds
        self.module = None
        self.reference = None  # the captured ca module, for recording()
        self.not_native = ""
        self._entries = runner.ptx_entries(ptx)
        self.kernels = {name: runner.KernelRunner(name, plan, self._functions) for name, plan in plans.items()}
        self._literals = {}
        self.program = compile_block(host.regions[0].blocks[0], terminator="func.return", extra=self._extra)
        self._perm_args = [(i, p) for i, p in enumerate(arg_perms) if p is not None]

    def _functions(self, device: int) -> dict:
        return runner.Driver.get().functions(id(self), device, self.ptx, self._entries)

    def _extra(self, op: ir.Operation):
        if op.name == "ca.accumulate_grad":
            fresh = fresh_and_private(op.operands[1])
            return lambda ins, rt: (runner.accumulate(ins[0], ins[1], fresh), ())[1]
        if op.name == "func.call":
            kernel = self.kernels[ir.FlatSymbolRefAttr(op.attributes["callee"]).value]
            return lambda ins, rt: kernel(ins)
        if op.name.startswith("torch_c."):
            return ALIAS
        if op.name == "torch.constant.device":
            return lambda ins, rt: (torch.device("cuda", torch.cuda.current_device()),)
        if op.name == "torch.vtensor.literal":
            tensor = literal_tensor(op.attributes["value"], op)
            key = id(op)

            def literal(ins, rt):
                device = torch.cuda.current_device()
                if (key, device) not in self._literals:
                    self._literals[(key, device)] = tensor.to(device)
                return (self._literals[(key, device)],)
            return literal
        return None

    def __call__(self, args, hooks, callbacks=(), packed=()):
        extra = {"packed": packed} if packed else {}  # saved tensors' unpack hooks, when the capture has some
        recorded = getattr(_RECORDING, "programs", None)
        if recorded is not None:
            recorded.append((self, list(args)))
            if self.reference is None:
                raise RuntimeError("a gpu program without its ca module cannot run while recording")
            return EagerProgram(self.reference)(args, hooks, callbacks, **extra)
        require_cuda()
        args = list(args)
        for i, p in self._perm_args:
            args[i] = args[i].permute(p)
        return self.program.run(args, Runtime(hooks, callbacks, *extra.values()))
