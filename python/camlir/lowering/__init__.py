"""Lowering of camlir's pure-compute kernels (plain torch-dialect functions) towards the JIT."""

from .torch_to_linalg import EXTERN_OPS, LoweringError, aten_name, lower_to_linalg

__all__ = ["EXTERN_OPS", "LoweringError", "aten_name", "lower_to_linalg"]
