"""Functions Dynamo must never trace: camlir's `backward()` and `autograd.grad()` wrappers.

Inside a `torch.compile`d function that calls `loss.backward()`, Dynamo would otherwise
trace into camlir's wrapper and, from there, into the compiler itself (torch-mlir's
importer, MLIR bindings), breaking it. `torch._dynamo.disable(fn, recursive=True)` prevents
that, but its wrapper cost ~5 us of every backward, measured on W1 (a ~45 us backward, calls
interleaved with the eager engine's): four eval-frame switches, the compile-stance and export
checks, arguments packed twice. `never_traced(fn)` keeps what the two cases need:

- while Dynamo traces a caller, it sees the wrapper's `_torchdynamo_disable` mark (what
  `torch._dynamo.disable` sets) and makes the call a graph break, run as plain Python;
- when the wrapper runs, Dynamo skips the wrapper's own frame (`skip_code`) and the wrapper
  turns Dynamo's frame evaluation off for everything the call runs, then restores it.

Where PyTorch lacks either private hook, `torch._dynamo.disable` is used as before.

    backward = never_traced(backward_impl)
"""

import functools
from typing import Callable

import torch


def never_traced(fn: Callable) -> Callable:
    """`fn`, wrapped so that Dynamo never traces it nor anything it calls."""
    try:
        from torch._C._dynamo.eval_frame import set_eval_frame
        from torch._dynamo.eval_frame import skip_code
    except ImportError:
        return torch._dynamo.disable(fn, recursive=True)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        prior = set_eval_frame(None)
        try:
            return fn(*args, **kwargs)
        finally:
            set_eval_frame(prior)

    skip_code(wrapper.__code__)
    wrapper._torchdynamo_disable = True
    wrapper._torchdynamo_disable_recursive = True
    wrapper._torchdynamo_orig_callable = fn
    return wrapper
