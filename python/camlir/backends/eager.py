"""The reference backend ("eager"): the captured `ca` module interpreted op by op with PyTorch.

It runs the captured module itself through the host runtime (torch-dialect ops through
`torch.ops`, `ca` ops through the autograd engine's own hook and accumulation helpers), so
every gradient it produces checks that capture and import were faithful. It is the
debugging backend, and what the driver runs a program on when a compiling backend cannot
build it. One stage, no copy of the module:

    interpret    the module decoded once into host-runtime steps   backends/host_runtime.py
"""

from torch_mlir import ir

from camlir.backends.base import Backend
from camlir.backends.host_runtime import InterpreterError, Runtime, compile_block
from camlir.dialects.ca.ir_helpers import require_func
from camlir.stages import Stage

__all__ = ["EagerBackend", "EagerProgram", "InterpreterError"]


class EagerProgram:
    """A `func.func` of a `ca` module, decoded for interpretation: `program(args, hooks)`."""

    def __init__(self, module: ir.Module, func_name: str = "backward"):
        fn = require_func(module, func_name)
        self.program = compile_block(fn.regions[0].blocks[0], terminator="func.return")

    def __call__(self, args, hooks, callbacks=(), packed=()):
        return self.program.run(list(args), Runtime(hooks, callbacks, packed))


def interpret(work) -> None:
    """interpret: the captured module as host-runtime steps (raises `InterpreterError` for an
    op it cannot run)."""
    work.program = EagerProgram(work.captured)


class EagerBackend(Backend):
    """The reference interpreter as a backend: every size set runs the same program."""

    name = "eager"
    reference = True
    needs_static_sizes = False

    def stages(self, variant) -> tuple:
        return (Stage("interpret", interpret),)
