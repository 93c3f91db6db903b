"""The list of camlir passes, shared by `ca-opt`, the compile pipeline and the docs."""

from typing import Optional

from .flatten_nodes import FlattenNodes
from .fuse_elementwise import FuseElementwise
from .inline_hooks import InlineHooks
from .lower_to_linalg import LowerToLinalg
from .outline_kernels import OutlineKernels
from .specialize_shapes import SpecializeShapes

# In the order the compile pipeline runs them.
PASSES = (InlineHooks, FlattenNodes, SpecializeShapes, OutlineKernels, LowerToLinalg, FuseElementwise)

_BY_NAME = {p.argument: p for p in PASSES}


def names():
    return _BY_NAME.keys()


def lookup(name: str) -> Optional[type]:
    return _BY_NAME.get(name)
