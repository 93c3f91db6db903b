"""camlir: a compiled-autograd compiler for PyTorch built on MLIR.

    import camlir
    camlir.compile_backward(loss)            # one backward
    with camlir.enable(backend="eager"):     # every backward in the scope
        loss.backward()
    camlir.config.enabled = True             # every backward in the process
"""

from . import logs
from .api import compile_backward, enable, reset  # noqa: F401
from .compiled import captured_graphs  # noqa: F401
from .summary import summarize  # noqa: F401
from .config import config  # noqa: F401
from .context import make_context  # noqa: F401
from .counters import counters  # noqa: F401
from .errors import UnsupportedError  # noqa: F401
from .logs import set_logs  # noqa: F401

__version__ = "0.1.0"

logs.set_from_environment()
