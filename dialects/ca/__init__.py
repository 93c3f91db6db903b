"""The `ca` dialect (compiled autograd): op definitions, verifier, and builders."""

from .ops import (  # noqa: F401
    HOOK_KINDS,
    OPS,
    OPS_BY_NAME,
    AccumulateGradOp,
    CallPythonOp,
    HookOp,
    NodeOp,
    SizeOp,
    YieldOp,
)
from .load import load_into  # noqa: F401
from .verify import Problem, VerificationError, verify, verify_or_raise  # noqa: F401
from . import build  # noqa: F401
