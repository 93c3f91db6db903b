"""The list of camlir passes, shared by `ca-opt`, the compile pipeline and the docs."""

from typing import Optional

from .approximate_math import ApproximateMath
from .bf16_as_i16 import BF16AsI16
from .bf16_matmuls import Bf16Matmuls
from .copies_to_linalg import CopiesToLinalg
from .depthwise_kernels import DepthwiseKernels
from .disjoint_scatters import DisjointScatters
from .expand_powers import ExpandPowers
from .flatten_nodes import FlattenNodes
from .fold_views import FoldViews
from .fuse_elementwise import FuseElementwise
from .host_result_layouts import HostResultLayouts
from .index_as_input import IndexAsInput
from .gpu_loops import FlattenParallel, ParallelDimsFirst
from .inline_hooks import InlineHooks
from .kernel_abi import PrepareKernelABI
from .lower_to_linalg import LowerToLinalg
from .matmul_to_blas import DefineBlasWrappers, MatmulToBlas
from .narrow_float_conversions import NarrowFloatConversions
from .narrow_scalar_inputs import NarrowScalarInputs
from .outline_kernels import OutlineKernels
from .parallel_loops import BoundParallelLoops, DefineParallelForks, OutlineParallelLoops
from .register_reductions import RegisterReductions
from .sink_views import SinkViews
from .specialize_layouts import SpecializeLayouts
from .specialize_shapes import SpecializeShapes
from .unique_kernel_results import UniqueKernelResults

# In the order the cpu pipeline (python/camlir/pipeline.py) runs them.
PASSES = (FlattenNodes, SpecializeShapes, SpecializeLayouts, InlineHooks, DisjointScatters, OutlineKernels, SinkViews, HostResultLayouts,
          LowerToLinalg, DepthwiseKernels,
          FuseElementwise, UniqueKernelResults, IndexAsInput, NarrowScalarInputs, ExpandPowers, ApproximateMath, Bf16Matmuls, PrepareKernelABI, CopiesToLinalg,
          MatmulToBlas, DefineBlasWrappers, OutlineParallelLoops, FoldViews, RegisterReductions, BoundParallelLoops, NarrowFloatConversions,
          BF16AsI16, DefineParallelForks,
          # the gpu pipeline's own (it shares the rest up to ca-matmul-to-blas)
          ParallelDimsFirst, FlattenParallel)

_BY_NAME = {p.argument: p for p in PASSES}


def names():
    """The command-line names of all camlir passes (`"ca-flatten-nodes"`, ...), in
    pipeline order."""
    return _BY_NAME.keys()


def lookup(name: str) -> Optional[type]:
    """The pass class whose `argument` is `name`, or None (e.g. for an upstream pass):
    `lookup("ca-flatten-nodes")` is `FlattenNodes`."""
    return _BY_NAME.get(name)
