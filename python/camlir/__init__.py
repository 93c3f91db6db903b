"""camlir: a compiled-autograd compiler for PyTorch built on MLIR."""

from .context import make_context  # noqa: F401

__version__ = "0.1.0"
