"""Loading the `ca` dialect into an MLIR context."""

from torch_mlir import ir
from torch_mlir.dialects.ext import DialectAlreadyLoadedError

from .effects import attach_effects
from .ops import CA


def load_into(context: ir.Context) -> None:
    """Loads `ca` (IRDL definitions, verifiers, memory effects) into `context`, once."""
    with context:
        try:
            CA.load()
        except DialectAlreadyLoadedError:
            return
        attach_effects(context)
