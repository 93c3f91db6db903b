"""Host calls: a custom autograd.Function whose backward camlir cannot trace runs its own
backward in Python at its place in the compiled program; the rest stays compiled.

Each case compares every step's gradients with eager PyTorch and checks that the graph
compiled (no fallback) with one host-call node. Before host calls, each of these graphs
fell back whole (`fallbacks == 1`, nothing compiled)."""

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import camlir
from helpers import assert_grads_equal, eager_and_camlir


class PrintsInBackward(torch.autograd.Function):
    """A backward with a side effect (here a call into Python that records each call)."""

    calls = []

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        print("backward of PrintsInBackward", tuple(g.shape))
        PrintsInBackward.calls.append(tuple(g.shape))
        return g * w, (g * x).sum(0)


class Counter:
    def __init__(self):
        self.n = 0


class MutableCtx(torch.autograd.Function):
    """`ctx` holds an object with state that the backward changes (FSDP2's param group is
    one): camlir can neither lift nor guard it."""

    @staticmethod
    def forward(ctx, x, state):
        ctx.state = state
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        ctx.state.n += 1
        return g * ctx.state.n, None


class NoneForAnInput(torch.autograd.Function):
    """Returns no gradient for an input that requires one: eager leaves its .grad None."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        (w,) = ctx.saved_tensors
        print("no gradient for w")
        return g * w, None


class BroadcastAndCast(torch.autograd.Function):
    """Returns a gradient shaped like the output for a broadcast input, in another dtype:
    the engine sums it to the input's shape and casts it (validate_outputs)."""

    @staticmethod
    def forward(ctx, x, b):
        return x + b

    @staticmethod
    def backward(ctx, g):
        print("broadcast")
        return g, g.double()


def _mlp_through(fn_apply):
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(6, 5)
            self.w = nn.Parameter(torch.randn(5))
            self.b = nn.Linear(5, 3)

        def forward(self, x):
            return self.b(fn_apply(torch.tanh(self.a(x)), self.w)).square().sum()

    return Model


def _host_calls():
    return [e.what for e in camlir.explain(kind="host_call")]


def test_backward_with_side_effects_runs_once_per_step(each_backend, capsys):
    PrintsInBackward.calls.clear()
    model = _mlp_through(PrintsInBackward.apply)
    eager, ours = eager_and_camlir(model, lambda: [torch.randn(4, 6)], lambda m, x: m(x), steps=4)
    assert_grads_equal(eager, ours)
    assert len(PrintsInBackward.calls) == 8  # 4 eager + 4 through camlir: once each, never at trace time
    assert capsys.readouterr().out.count("backward of PrintsInBackward") == 8
    assert camlir.counters["fallbacks"] == 0
    assert camlir.counters["compiles"] == 1
    assert _host_calls() == ["node PrintsInBackwardBackward#6"]
    graph_id, text = camlir.captured_graphs()[-1]
    assert camlir.summarize(text)["hooks"] == {"custom_backward": 1}


def test_mutable_ctx_state_is_read_at_run_time(each_backend):
    def make():
        return nn.Linear(3, 3)

    state_e, state_c = Counter(), Counter()
    states = {}

    def loss(m, x):
        state = states.setdefault(id(m), state_e if not states else state_c)
        return MutableCtx.apply(m(x), state).sum()

    eager, ours = eager_and_camlir(make, lambda: [torch.randn(2, 3)], loss, steps=4)
    assert_grads_equal(eager, ours)  # the scale grows by one each step on both sides
    assert state_e.n == state_c.n == 4
    assert camlir.counters["fallbacks"] == 0
    assert _host_calls() == ["node MutableCtxBackward#2"]


def test_reentrant_checkpoint_compiles_around_the_checkpoint(each_backend):
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(8, 16), nn.Linear(16, 8), nn.Linear(8, 1)

        def forward(self, x):
            h = checkpoint(lambda t: self.b(torch.relu(t)), self.a(x), use_reentrant=True)
            return self.c(h).sum()

    eager, ours = eager_and_camlir(Model, lambda: [torch.randn(4, 8)], lambda m, x: m(x), steps=3)
    assert_grads_equal(eager, ours)
    assert camlir.counters["fallbacks"] == 0
    assert camlir.counters["compiles"] == 1
    assert _host_calls() == ["node CheckpointFunctionBackward#5"]


def test_a_none_gradient_stays_none(each_backend):
    model = _mlp_through(NoneForAnInput.apply)
    eager, ours = eager_and_camlir(model, lambda: [torch.randn(4, 6)], lambda m, x: m(x), steps=3)
    assert_grads_equal(eager, ours)
    assert ours[-1][0] is None  # model.w (registered first): no gradient, as eagerly
    assert camlir.counters["fallbacks"] == 0
    assert camlir.counters["compiles"] == 1


def test_broadcast_and_dtype_of_a_returned_gradient_follow_the_engine(each_backend):
    model = _mlp_through(BroadcastAndCast.apply)
    eager, ours = eager_and_camlir(model, lambda: [torch.randn(4, 6)], lambda m, x: m(x), steps=3)
    assert_grads_equal(eager, ours)
    assert ours[-1][0].shape == (5,) and ours[-1][0].dtype == torch.float32
    assert camlir.counters["fallbacks"] == 0


def test_host_call_with_changing_sizes(each_backend):
    model = _mlp_through(PrintsInBackward.apply)
    batches = iter([4, 4, 6, 7, 9])
    eager, ours = eager_and_camlir(model, lambda: [torch.randn(next(batches), 6)], lambda m, x: m(x), steps=5)
    assert_grads_equal(eager, ours)
    assert camlir.counters["fallbacks"] == 0
    assert camlir.counters["compiles"] >= 1


def test_fullgraph_names_the_host_call(each_backend):
    model = _mlp_through(PrintsInBackward.apply)
    with pytest.raises(camlir.UnsupportedError, match=r"PrintsInBackwardBackward#6 would run its backward in Python"):
        eager_and_camlir(model, lambda: [torch.randn(4, 6)], lambda m, x: m(x), fullgraph=True)


class SometimesNone(torch.autograd.Function):
    """Returns a gradient for w on the first calls, then None."""

    calls = [0]

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        (w,) = ctx.saved_tensors
        SometimesNone.calls[0] += 1
        return g * w, (g if SometimesNone.calls[0] < 3 else None)


def test_a_gradient_that_turns_none_is_a_clear_error(each_backend):
    SometimesNone.calls[0] = 0
    x = torch.randn(5, requires_grad=True)
    w = torch.randn(5, requires_grad=True)
    with camlir.enable(wait=True):
        for _ in range(2):  # the first runs PyTorch's graph (to see what the node returns), the second compiles
            x.grad = w.grad = None
            SometimesNone.apply(x, w).sum().backward()
        x.grad = w.grad = None
        with pytest.raises(RuntimeError, match=r"returned NoneType as gradient #1.*built for a tensor"):
            SometimesNone.apply(x, w).sum().backward()


class _Shared:
    calls = [0]
    log = {}


def _writes_item_of_a_global_part(ctx, g):
    _Shared.calls[0] += 1
    return g


def _writes_through_a_local_alias(ctx, g):
    log = _Shared.log
    log["last"] = g
    return g


def _writes_only_its_own_values(ctx, g):
    grads = [None] * 2
    grads[len(grads) - 1] = g
    ctx.seen = 1
    ctx.seen += 1
    table = {}
    table["g"] = g
    return tuple(grads)


def test_outside_writes_are_followed_through_the_bytecode():
    """Each of these was traced once before (the write happened at trace time only)."""
    from camlir.capture.backward_effects import outside_writes

    assert "writes an item of the global '_Shared'" in outside_writes(_writes_item_of_a_global_part)
    assert "bound to a value from outside the backward" in outside_writes(_writes_through_a_local_alias)
    assert outside_writes(_writes_only_its_own_values) is None
