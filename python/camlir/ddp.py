"""DistributedDataParallel under the compiled backward: DDP's Python reducer, selected for camlir.

DDP's C++ reducer cannot run under compiled autograd (PyTorch refuses before the backward
starts, and its reducer was once silently wrong under it, pytorch #152735). DDP's Python
reducer can: one all-reduce per gradient, from a post-accumulate-grad hook, which runs as a
Python call inside camlir's compiled backward. DDP picks its reducer when a module is
built, from `torch._dynamo.config.optimize_ddp`; `install()` makes every DDP module built
from then on pick the Python one (it wraps `DistributedDataParallel.__init__`, which sets
the option just before DDP reads it). `import camlir` installs it when torch is already
imported, and loading camlir's API does in any case. A module built earlier keeps the C++
reducer: its backwards run eagerly, with a warning (`capture/engine.py`).
"""

import functools

_installed = []


def select_python_reducer() -> None:
    """Sets `torch._dynamo.config.optimize_ddp = "python_reducer"` (DDP reads it at build time)."""
    import torch._dynamo

    if torch._dynamo.utils.get_optimize_ddp_mode() != "python_reducer":
        torch._dynamo.config.optimize_ddp = "python_reducer"


def install() -> None:
    """Every DistributedDataParallel built from now on uses the Python reducer."""
    if _installed:
        return
    from torch.nn.parallel import DistributedDataParallel

    original = DistributedDataParallel.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        select_python_reducer()
        original(self, *args, **kwargs)

    DistributedDataParallel.__init__ = __init__
    _installed.append(original)
