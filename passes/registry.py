"""The list of camlir passes, shared by `ca-opt`, the compile pipeline and the docs.

A table of names, not imports: a pass's module is imported the first time the pass is
looked up. The training process runs a few passes only (the stages before the cut to a
compile worker; none on a disk-cache hit), and importing all thirty with their dialect
bindings cost 126 ms and 4 MB of every process's first backward (torch 2.13, this
machine: `import camlir.passes.specialize_layouts` pulled in the whole registry).
`PASSES` (every class, in pipeline order) still exists: it imports them all when read.
"""

import importlib
from typing import Optional

# (command-line name, module in this package, class), in the order the cpu pipeline
# (python/camlir/pipeline.py) runs them; `test_pass_registry.py` checks each entry against
# its class's `argument`.
_TABLE = (
    ("ca-flatten-nodes", "flatten_nodes", "FlattenNodes"),
    ("ca-specialize-shapes", "specialize_shapes", "SpecializeShapes"),
    ("ca-specialize-layouts", "specialize_layouts", "SpecializeLayouts"),
    ("ca-inline-hooks", "inline_hooks", "InlineHooks"),
    ("ca-disjoint-scatters", "disjoint_scatters", "DisjointScatters"),
    ("ca-outline-kernels", "outline_kernels", "OutlineKernels"),
    ("ca-sink-views", "sink_views", "SinkViews"),
    ("ca-host-result-layouts", "host_result_layouts", "HostResultLayouts"),
    ("ca-lower-to-linalg", "lower_to_linalg", "LowerToLinalg"),
    ("ca-depthwise-kernels", "depthwise_kernels", "DepthwiseKernels"),
    ("ca-fuse-elementwise", "fuse_elementwise", "FuseElementwise"),
    ("ca-unique-kernel-results", "unique_kernel_results", "UniqueKernelResults"),
    ("ca-index-as-input", "index_as_input", "IndexAsInput"),
    ("ca-narrow-scalar-inputs", "narrow_scalar_inputs", "NarrowScalarInputs"),
    ("ca-expand-powers", "expand_powers", "ExpandPowers"),
    ("ca-approximate-math", "approximate_math", "ApproximateMath"),
    ("ca-bf16-matmuls", "bf16_matmuls", "Bf16Matmuls"),
    ("ca-prepare-kernel-abi", "kernel_abi", "PrepareKernelABI"),
    ("ca-copies-to-linalg", "copies_to_linalg", "CopiesToLinalg"),
    ("ca-matmul-to-blas", "matmul_to_blas", "MatmulToBlas"),
    ("ca-define-blas-wrappers", "matmul_to_blas", "DefineBlasWrappers"),
    ("ca-outline-parallel-loops", "parallel_loops", "OutlineParallelLoops"),
    ("ca-fold-views", "fold_views", "FoldViews"),
    ("ca-register-reductions", "register_reductions", "RegisterReductions"),
    ("ca-bound-parallel-loops", "parallel_loops", "BoundParallelLoops"),
    ("ca-narrow-float-conversions", "narrow_float_conversions", "NarrowFloatConversions"),
    ("ca-bf16-as-i16", "bf16_as_i16", "BF16AsI16"),
    ("ca-define-parallel-forks", "parallel_loops", "DefineParallelForks"),
    # the gpu pipeline's own (it shares the rest up to ca-matmul-to-blas)
    ("ca-gpu-parallel-dims-first", "gpu_loops", "ParallelDimsFirst"),
    ("ca-gpu-flatten-parallel", "gpu_loops", "FlattenParallel"),
)

_WHERE = {name: (module, cls) for name, module, cls in _TABLE}
_BY_NAME: dict = {}  # classes looked up so far (and any a test adds), by command-line name


def names():
    """The command-line names of all camlir passes (`"ca-flatten-nodes"`, ...), in
    pipeline order."""
    return list(_WHERE) + [name for name in _BY_NAME if name not in _WHERE]


def lookup(name: str) -> Optional[type]:
    """The pass class whose `argument` is `name`, or None (e.g. for an upstream pass):
    `lookup("ca-flatten-nodes")` is `FlattenNodes`. Imports its module the first time."""
    cls = _BY_NAME.get(name)
    if cls is not None:
        return cls
    where = _WHERE.get(name)
    if where is None:
        return None
    module, cls_name = where
    cls = _BY_NAME[name] = getattr(importlib.import_module(f"{__package__}.{module}"), cls_name)
    return cls


def all_passes() -> tuple:
    """Every pass class, in pipeline order (imports them all)."""
    return tuple(lookup(name) for name in names())


def __getattr__(attr):
    if attr == "PASSES":
        return all_passes()
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
