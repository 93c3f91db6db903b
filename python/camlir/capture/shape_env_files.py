"""The ShapeEnv's list of "uninteresting" source files, found without importing Inductor.

Every capture creates symbols in a `ShapeEnv` (compiled autograd lifts sizes as symbols),
and each new symbol records the user frame that made it: the first frame whose file is not
in `symbolic_shapes.uninteresting_files()`. On its first call (once per process) that
function imports the modules it names to read their `__file__`, among them
`torch._inductor.sizevars` and `torch.export._trace`, which pull in Inductor, AOTAutograd's
partitioner and about 400 modules that camlir never uses: 0.19 s and 18 MB of the training
process (torch 2.13; a warm second process's first Transformer backward 1.35-1.48 s against
1.22-1.39 s without them, peak RSS 568 against 550 MB; a cold one 5.78 against 5.53 s).

`install()` puts in its place a function that returns the same set of file names, finding
the files of modules not yet imported with `importlib.util.find_spec` (which reads the
file system and runs nothing). Where that cannot answer (a module renamed in another torch),
PyTorch's own function answers, imports and all: only where log lines say a symbol was made
depends on it, never a value. `test_shape_env_files.py` checks the two sets are equal.
"""

import functools
import glob
import importlib.util
import os
import sys

from torch.fx.experimental import symbolic_shapes

# The modules PyTorch's `uninteresting_files` (torch 2.13) names, besides the files of
# `torch._higher_order_ops` and `torch._dynamo.guards.uninteresting_files()`.
_MODULES = (
    "torch.fx.experimental.symbolic_shapes", "torch.export._trace", "torch.fx.experimental.recording",
    "torch.fx.experimental.sym_node", "torch.fx.interpreter", "torch.fx._symbolic_trace", "torch",
    "torch._compile", "torch._dynamo.eval_frame", "torch._inductor.sizevars", "torch._library.custom_ops",
    "torch._library.fake_impl", "torch._subclasses.meta_utils", "torch._subclasses.fake_tensor",
    "torch._logging._internal", "torch._logging.structured",
)

_pytorchs = symbolic_shapes.uninteresting_files


def _file_of(name: str) -> str:
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__file__", None):
        return module.__file__
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        raise LookupError(f"no source file found for module {name}")
    return spec.origin


@functools.lru_cache(None)
def uninteresting_files() -> set:
    """`symbolic_shapes.uninteresting_files()`, without importing the modules it names."""
    try:
        import torch._dynamo.guards

        files = {_file_of(name) for name in _MODULES}
        hop_dir = os.path.dirname(_file_of("torch._higher_order_ops"))
        files |= set(glob.glob(os.path.join(hop_dir, "*.py")))
        return files | torch._dynamo.guards.uninteresting_files() | {"<string>"}
    except Exception:  # noqa: BLE001 - another torch: PyTorch's own answer, imports included
        return _pytorchs()


def install() -> None:
    """Makes the ShapeEnv use `uninteresting_files` above (once; only over PyTorch's own)."""
    if symbolic_shapes.uninteresting_files is _pytorchs:
        symbolic_shapes.uninteresting_files = uninteresting_files
