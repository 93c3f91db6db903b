"""The `ca` dialect (compiled autograd): op definitions, loading, and builders."""

from .ops import (  # noqa: F401
    CA,
    HOOK_KINDS,
    OPS,
    AccumulateGradOp,
    CallPythonOp,
    HookOp,
    NodeOp,
    SizeOp,
    YieldOp,
)
from .load import load_into  # noqa: F401
from . import build  # noqa: F401
