"""The lift-or-guard rule for Python values a re-trace bakes into the graph.

Re-tracing runs the captured backward on fake tensors, and whatever Python value the code
reads becomes part of the traced graph: a float from a custom Function's `ctx` turns into a
constant of the aten graph. The rule (also in docs/capture.md), enforced here for `ctx`:

- a tensor is a graph input (saved with `save_for_backward`, or lifted by compiled
  autograd) or the backward is refused: a tensor kept as a plain `ctx` attribute would be
  baked in by value with nothing to check it against;
- a plain immutable value (None, bool, int, float, complex, str, dtype, device, a tuple of
  these, e.g. `ctx.needs_input_grad`) is baked in and guarded by value;
- a class (`ctx._forward_cls`) or a known-pure torch/math function or module is guarded by
  identity;
- anything else (an object with state that the backward may read through) is refused.

Refused means `UnsupportedError` naming the node and attribute: the backward falls back to
PyTorch with that reason, or fails under `fullgraph=True`. Guarded means the artifact checks
the value on every call (`cache.ValueGuard`) and recompiles when it changed. Hook bodies
follow the same rule through `hook_purity` (closures, globals, defaults).
"""

import torch
from torch._dynamo.external_utils import FakeBackwardCFunction

from camlir.cache import ValueGuard
from camlir.capture.hook_purity import value_rule


class BakedValueRefused(RuntimeError):
    """A value the backward reads cannot be lifted or guarded; says which and why."""


def admit(what: str, value) -> bool:
    """Whether `value` (described as `what`) is guarded by value (True) or by identity
    (False); raises BakedValueRefused when it can be neither."""
    if isinstance(value, torch.Tensor):
        raise BakedValueRefused(f"{what} is a tensor that is not saved with save_for_backward: "
                                f"its values would be baked into the compiled code unchecked")
    if isinstance(value, type):
        return False
    if isinstance(value, torch.Size):
        return True
    ok, by_value, why = value_rule(value)
    if not ok:
        raise BakedValueRefused(f"{what} is {why}; camlir can neither lift nor guard it")
    return by_value


class RecordingCtx(FakeBackwardCFunction):
    """What `call_backward` hands a custom Function's backward during the re-trace: the
    real `ctx` behind it, with every attribute read admitted and added to `guard` under
    the ctx's slot in the hooks list."""

    def __init__(self, real, saved_tensors, slot: int, label: str, guard: ValueGuard):
        super().__init__(real, saved_tensors)
        self._camlir = (slot, label, guard)

    def __getattr__(self, name: str):
        value = super().__getattr__(name)
        slot, label, guard = self.__dict__["_camlir"]
        by_value = admit(f"{label}: ctx.{name}", value)
        guard.add(slot, name, value, by_value, f"{label}: ctx.{name}")
        return value
