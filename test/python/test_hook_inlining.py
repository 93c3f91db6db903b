"""Hook inlining: `trace_hooks` (what is traced, what is refused and why, the guard) and the
`ca-inline-hooks` pass, on modules captured from real backward passes."""

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch_mlir import ir

import camlir
from camlir import compiled
from camlir.backends.eager import EagerProgram
from camlir.cache import HookGuard
from camlir.capture.hook_trace import trace_hooks
from camlir.dialects.ca import verify_or_raise
from camlir.passes import run_pipeline
from helpers import camlir_logs

SCALE = 0.5  # read by a hook below; the guard must notice when it changes


@pytest.fixture(autouse=True)
def fresh():
    camlir.reset()
    yield
    camlir.reset()


@pytest.fixture
def capture(monkeypatch):
    """Runs a backward through camlir and returns (the captured module parsed in a fresh
    context, the hooks list and the inputs the engine passed)."""
    seen = {}
    original = compiled.CompiledBackward.__call__

    def spy(self, inputs, sizes, scalars, hooks, packed_data):
        seen["hooks"], seen["inputs"] = list(hooks), list(inputs)
        return original(self, inputs, sizes, scalars, hooks, packed_data)

    monkeypatch.setattr(compiled.CompiledBackward, "__call__", spy)

    def run(loss):
        with camlir.enable(backend="eager"):
            loss.backward()
        (_, text), = camlir.captured_graphs()
        module = ir.Module.parse(text, context=camlir.make_context())
        return module, seen["hooks"], seen["inputs"]

    return run


def _id_of(hooks, hook) -> int:
    return next(i for i, h in enumerate(hooks) if h is hook)


def _model_with_hooks(hooks):
    """A linear layer whose weight, bias and input each get one of `hooks` (in that order)."""
    torch.manual_seed(0)
    layer = nn.Linear(4, 3)
    x = torch.randn(2, 4, requires_grad=True)
    for tensor, hook in zip((layer.weight, layer.bias, x), hooks):
        tensor.register_hook(hook)
    return layer, x


def test_scale_hook_is_inlined_and_gradients_match(capture):
    half = lambda g: g * 0.5  # noqa: E731
    layer, x = _model_with_hooks([half])
    module, hooks, inputs = capture(layer(x).pow(2).sum())
    expected = [layer.weight.grad.clone(), layer.bias.grad.clone(), x.grad.clone()]
    assert "ca.hook" in str(module)

    with camlir_logs("verbose") as messages:
        guard = trace_hooks(module, hooks)
    hook_id = _id_of(hooks, half)
    assert guard.inlined == {hook_id: f"hook_{hook_id}"}
    assert any(f"hook {hook_id} (tensor_pre_hook <" in m and f"traced into @hook_{hook_id}" in m
               for m in messages)
    verify_or_raise(module.operation)
    assert f"body = @hook_{hook_id}" in str(module)

    run_pipeline(module, "ca-inline-hooks")
    text = str(module)
    assert "ca.hook" not in text
    assert "torch.aten.mul.Scalar" in text
    assert f'index = {hook_id} : i64, node = "hook"' in text
    assert "func.func private @hook_" not in text  # the body was erased once inlined

    # The inlined module computes the same gradients as the eager engine did.
    for t in (layer.weight, layer.bias, x):
        t.grad = None
    with torch.no_grad():
        EagerProgram(module)(inputs, hooks)
    for got, want in zip((layer.weight.grad, layer.bias.grad, x.grad), expected):
        torch.testing.assert_close(got, want)


seen_outside = []


def printing(g):
    print("grad norm", g.norm())
    return g * 2


def reads_item(g):
    return g * g.abs().max().item()


def branches_on_data(g):
    if g.sum() > 0:
        return g * 2
    return -g


def uses_numpy(g):
    return g * float(np.sqrt(2.0))


def test_untraceable_hooks_stay_calls_and_say_why(capture):
    def mutates_closure(g, seen=seen_outside):  # default binds a list: outside state
        seen.append(1)
        return g

    calls = []
    closure = lambda g: calls.append(g.shape) or g  # noqa: E731
    layer, x = _model_with_hooks([printing, reads_item, branches_on_data])
    y = torch.randn(3, requires_grad=True)
    z = torch.randn(3, requires_grad=True)
    w = torch.randn(3, requires_grad=True)
    y.register_hook(closure)
    z.register_hook(uses_numpy)
    w.register_hook(mutates_closure)
    loss = layer(x).sum() + (y * z * w).sum()
    module, hooks, _ = capture(loss)
    assert len(calls) == 1 and len(seen_outside) == 1  # each ran once, at run time

    with camlir_logs("verbose") as messages:
        guard = trace_hooks(module, hooks)
    assert guard.inlined == {}
    expected = {
        printing: "calls builtin 'print'",
        reads_item: "calls .item()",
        branches_on_data: "tracing on fake tensors failed",
        closure: "reads closure variable 'calls', a list",
        uses_numpy: "reads global 'np', module numpy",
        mutates_closure: "has a default argument",
    }
    for hook, why in expected.items():
        hook_id = _id_of(hooks, hook)
        assert why in guard.refused[hook_id], (hook, guard.refused[hook_id])
        assert any(m.startswith(f"hook {hook_id} (tensor_pre_hook") and "not inlined" in m and why in m
                   for m in messages), (hook, messages)

    before = str(module)
    run_pipeline(module, "ca-inline-hooks")
    assert str(module) == before  # nothing had a body: every hook stays a call
    assert before.count('"ca.hook"') == len(expected)
    assert len(calls) == 1 and len(seen_outside) == 1  # tracing never ran them


def test_guard_identity_and_baked_numbers(capture):
    def scaled(g):
        return g * SCALE

    factor = 3.0
    closure = lambda g: g * factor  # noqa: E731
    layer, x = _model_with_hooks([scaled, closure])
    module, hooks, _ = capture(layer(x).sum())
    guard = trace_hooks(module, hooks)
    ids = (_id_of(hooks, scaled), _id_of(hooks, closure))
    assert set(guard.inlined) == set(ids)

    assert guard.holds(hooks) and guard.reason(hooks) == ""
    assert guard.holds(list(hooks))  # a new list holding the same hooks

    other = list(hooks)
    other[ids[0]] = lambda g: g * SCALE  # does the same, but is another function
    assert not guard.holds(other)
    assert guard.reason(other).startswith(f"hook {ids[0]} changed: <")
    assert "test_hook_inlining.py:" in guard.reason(other)
    assert "is not the traced hook <" in guard.reason(other)

    global SCALE
    old = SCALE
    SCALE = 2.0
    try:
        assert not guard.holds(hooks)
        assert "global 'SCALE' changed from 0.5 to 2.0" in guard.reason(hooks)
    finally:
        SCALE = old
    assert guard.holds(hooks)

    factor = 4.0
    assert not guard.holds(hooks)
    assert "closure variable 'factor' changed from 3.0 to 4.0" in guard.reason(hooks)
    factor = 3.0
    assert guard.holds(hooks)
    assert not guard.holds(hooks[:min(ids)])  # fewer hooks than the traced ids


def _scaler(factor):
    return lambda g: g * factor


def test_guard_accepts_the_same_lambda_made_again():
    """Activation hooks are registered anew on every forward: a new function object with the
    same code, globals and baked values computes what the traced body computes."""
    module = ir.Module.parse(_ONE_HOOK, context=camlir.make_context())
    guard = trace_hooks(module, [_scaler(2.0)])
    assert guard.inlined == {0: "hook_0"}
    assert guard.holds([_scaler(2.0)])
    assert not guard.holds([_scaler(3.0)])
    assert guard.reason([_scaler(3.0)]).endswith("closure variable 'factor' changed from 2.0 to 3.0")
    assert not guard.holds([lambda g: g * 2.0])  # other code


def test_module_pre_hook_on_a_node_is_inlined(capture):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    h = model[0](torch.randn(3, 4))
    doubled = lambda grads: (grads[0] * 2,)  # noqa: E731
    h.grad_fn.register_prehook(doubled)
    module, hooks, inputs = capture(model[2](model[1](h)).sum())
    expected = [p.grad.clone() for p in model.parameters()]
    guard = trace_hooks(module, hooks)
    assert _id_of(hooks, doubled) in guard.inlined
    run_pipeline(module, "ca-inline-hooks")
    assert 'kind = "pre_hook"' not in str(module)
    for p in model.parameters():
        p.grad = None
    with torch.no_grad():
        EagerProgram(module)(inputs, hooks)
    for p, want in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, want)


# Fast cases on a hand-written module: one tensor_pre_hook on a [4] f32 gradient.
_ONE_HOOK = """
func.func @backward(%p: !torch.vtensor<[4],f32>, %g: !torch.vtensor<[4],f32>) {
  %h = "ca.hook"(%g) {kind = "tensor_pre_hook", hook_id = 0 : i64} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  "ca.accumulate_grad"(%p, %h) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
  return
}
"""

COUNT = 0


def counts(g):
    global COUNT
    COUNT += 1
    return g


def swallows(g):
    try:  # would swallow the error fake tensors raise and bake in the fallback
        return g * float(g.sum())
    except Exception:
        return g


MASK = torch.ones(4)


@pytest.mark.parametrize("hook,why", [
    (counts, "assigns a global"),
    (swallows, "catches exceptions"),
    (lambda g: g.mul_(2), "calls .mul_(), which works in place"),
    (lambda g: g * MASK, "reads global 'MASK', a tensor"),
    (lambda g: g + torch.rand_like(g), "draws random numbers"),
    (lambda g: g.sum(0, keepdim=True), "changes gradient #0 from (4,)"),
    (lambda g: g * float(g.sum()), "tracing on fake tensors failed"),
    (lambda g: g * torch.tensor(2.0), "creates a tensor constant"),
    (nn.Identity(), "is a Identity, not a plain function"),
    (torch.Tensor.neg, "not a plain function"),
])
def test_refused_hooks(hook, why):
    module = ir.Module.parse(_ONE_HOOK, context=camlir.make_context())
    guard = trace_hooks(module, [hook])
    assert guard.inlined == {}
    assert why in guard.refused[0]
    assert "body" not in str(module)
    assert guard.holds([hook]) and guard.holds([lambda g: g])  # nothing inlined, nothing to guard


@pytest.mark.parametrize("hook,op", [
    (lambda g: None, None),
    (torch.neg, "torch.aten.neg"),
    (lambda g: torch.nn.functional.relu(g) * SCALE, "torch.aten.relu"),
    (lambda g: torch.clamp(g, min=-1.0, max=1.0), "torch.aten.clamp"),
    (lambda g, s=2: sum([g * i for i in range(s)]), "torch.aten.mul"),
])
def test_traced_hooks(hook, op):
    module = ir.Module.parse(_ONE_HOOK, context=camlir.make_context())
    guard = trace_hooks(module, [hook])
    assert guard.inlined == {0: "hook_0"}, guard.refused
    run_pipeline(module, "ca-inline-hooks")
    text = str(module)
    assert "ca.hook" not in text
    if op is None:
        assert '"ca.accumulate_grad"(%arg0, %arg1)' in text
    else:
        assert op in text
    assert guard.holds([hook]) and not guard.holds([lambda g: g])


def test_symbolic_sizes_are_not_traced():
    module = ir.Module.parse(_ONE_HOOK.replace("[4]", "[?]"), context=camlir.make_context())
    guard = trace_hooks(module, [lambda g: g * 2])
    assert "symbolic sizes" in guard.refused[0]


def test_guard_is_cheap_when_nothing_was_inlined():
    guard = HookGuard()
    assert guard.holds([]) and guard.reason([]) == ""
