"""Regressions found by running PyTorch's own compiled-autograd tests with camlir as the
compiler (`test/python/pytorch_ca_suite.py`, docs/pytorch-suite.md). Each test says the
class of bug in our words; gradients are compared with eager PyTorch."""

import pytest
import torch

import camlir

BACKENDS = ["eager", "cpu"]


@pytest.fixture(autouse=True)
def _fresh():
    camlir.reset()
    yield
    camlir.reset()


@pytest.mark.parametrize("backend", BACKENDS)
def test_error_while_running_the_graph_is_raised_not_retried_eagerly(backend):
    # Anomaly mode makes compiled autograd check for NaNs when it starts running a captured
    # graph, after it has released the graph's saved tensors. Its error must reach the
    # caller; retrying the backward eagerly (what camlir does for a failed capture) can only
    # fail with "backward through the graph a second time" and hides the real message.
    with torch.autograd.detect_anomaly():
        a = torch.randn(5, 5, requires_grad=True)
        a.grad = torch.full((5, 5), float("nan"))
        loss = torch.matmul(a, torch.randn(5, 5)).sum()
        with pytest.raises(AssertionError, match="already having NaN gradient"):
            with camlir.enable(backend=backend):
                loss.backward()


@pytest.mark.parametrize("backend", BACKENDS)
def test_anomaly_mode_without_nans_still_compiles_exactly(backend):
    # The same path without a NaN: the graph runs through camlir, gradients as eager.
    w = torch.randn(4, 3, requires_grad=True)
    x = torch.randn(2, 4)

    def step():
        return (torch.matmul(x, w).sin() * 3).sum()

    step().backward()
    expected = w.grad.clone()
    w.grad = None
    with torch.autograd.detect_anomaly(), camlir.enable(backend=backend):
        step().backward()
    torch.testing.assert_close(w.grad, expected)
    assert camlir.counters["fallbacks"] == 0


def _steps(backend, dynamic, make_loss, shapes, params):
    """Gradients of `params` for one backward per entry of `shapes`, eager and through
    camlir; compared step by step."""
    for shape in shapes:
        torch.manual_seed(sum(shape))
        loss = make_loss(*shape)
        expected = torch.autograd.grad(loss, params, retain_graph=True)
        for p in params:
            p.grad = None
        with camlir.enable(backend=backend, dynamic=dynamic):
            loss.backward()
        for p, e in zip(params, expected):
            torch.testing.assert_close(p.grad, e)


@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_same_rank_view_that_moves_elements_between_dims(backend, dynamic):
    # A view of the same rank whose dims change, in a program compiled with dynamic sizes:
    # (b, 4) -> (s, 4b/s) forward, so the backward views the gradient from (s, 4b/s) back
    # to (b, 4). torch-mlir lowered such a view as a cast, as if the shape were kept
    # (PyTorch's test_dynamic_shapes_eager_node: a size check failed in the kernel).
    torch.manual_seed(0)
    lin1, lin2 = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    params = list(lin1.parameters()) + list(lin2.parameters())

    def make_loss(b, s):
        x = torch.randn(b, 4)
        return lin2(lin1(x).relu()).relu().view(s, -1).sum()

    _steps(backend, dynamic, make_loss, [(10, 2), (20, 4), (30, 8), (12, 3)], params)


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_rank_view_feeding_the_accumulation_directly(backend):
    # The viewed gradient goes straight into `.grad`, with no later op whose size check
    # would catch a wrong shape: it must come out (n, 4) with the right values.
    w = torch.randn(4, requires_grad=True)

    def make_loss(n, s):
        x = torch.randn(n, 4)
        return ((x * w).view(s, -1).sin() * torch.arange(n * 4.0).view(s, -1)).sum()

    _steps(backend, True, make_loss, [(6, 3), (10, 5), (12, 8), (9, 4)], [w])


@pytest.fixture
def bump_op():
    """`camlir_regress::bump(Tensor(a!) x) -> Tensor`: adds 5 to `x` in place and returns
    the column sums of the new `x`."""
    with torch.library._scoped_library("camlir_regress", "FRAGMENT") as lib:
        lib.define("bump(Tensor(a!) x) -> Tensor", tags=torch.Tag.pt2_compliant_tag)

        def bump(x):
            x.add_(5)
            return x.sum(0)

        lib.impl("bump", bump, "CPU")
        lib.impl("bump", lambda x: x.sum(0), "Meta")
        yield torch.ops.camlir_regress.bump


@pytest.mark.parametrize("backend", BACKENDS)
def test_mutating_custom_op_recomputed_in_the_backward(backend, bump_op):
    # Selective checkpointing recomputes a custom op that writes into its argument inside
    # the AOT backward, where it appears functionalized (`auto_functionalized`): the op
    # must run on a copy, and both its result and the written copy be used. Both backends
    # called it in place with one result bound to two names (the eager backend failed with
    # "self must be a matrix", the cpu one returned wrong gradients; PyTorch's
    # test_trace_auto_functionalized).
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    def policy(ctx, func, *args, **kwargs):
        if func is torch.ops.higher_order.auto_functionalized:
            return CheckpointPolicy.MUST_RECOMPUTE
        return CheckpointPolicy.PREFER_RECOMPUTE

    def body(x):
        y = torch.matmul(x, x)
        col = bump_op(y)
        return torch.matmul(y, y) * col

    def context_fn():
        return create_selective_checkpoint_contexts(policy)

    def region(x):
        return checkpoint(body, x, use_reentrant=False, context_fn=context_fn)

    from torch._inductor import config as inductor_config

    with inductor_config.patch(enable_auto_functionalized_v2=False):
        grads = []
        for use_camlir in (False, True):
            torch._dynamo.reset()
            torch.manual_seed(3)
            x = torch.randn(4, 4, requires_grad=True)
            out = torch.compile(region, backend="aot_eager", fullgraph=True)(x)
            if use_camlir:
                with camlir.enable(backend=backend):
                    out.sum().backward()
            else:
                out.sum().backward()
            grads.append(x.grad)
    torch.testing.assert_close(grads[1], grads[0])
    assert camlir.counters["compiles"] == 1 and camlir.counters["fallbacks"] == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_inside_a_backward_left_to_pytorch_does_not_hang(backend):
    # create_graph=True is left to PyTorch's engine; a custom Function's backward in that
    # graph runs another, unrelated backward on the same thread. That inner call waited
    # forever for the lock the outer call held (PyTorch's test_no_nested_compiled_autograd).
    import threading

    class CallsBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            a = torch.randn(3, 3, requires_grad=True)
            (a.sin() * 3).sum().backward()
            inner.append(a.grad.clone() - 3 * a.detach().cos())
            return g * 2

    def run(use_camlir):
        x = torch.randn(4, requires_grad=True)
        loss = (CallsBackward.apply(x) ** 2).sum()
        if use_camlir:
            with camlir.enable(backend=backend):
                loss.backward(create_graph=True)
        else:
            loss.backward(create_graph=True)
        return x

    inner = []
    torch.manual_seed(0)
    expected = run(False)
    result = {}
    torch.manual_seed(0)
    worker = threading.Thread(target=lambda: result.setdefault("x", run(True)), daemon=True)
    worker.start()
    worker.join(timeout=120)
    assert not worker.is_alive(), "the nested backward hung"
    x = result["x"]
    torch.testing.assert_close(x.grad, expected.grad)
    assert x.grad.requires_grad  # create_graph kept the graph of the gradient
    for diff in inner:  # the inner backward's gradients were exact as well
        torch.testing.assert_close(diff, torch.zeros(3, 3))


@pytest.mark.parametrize("backend", BACKENDS)
def test_custom_backward_that_writes_outside_runs_for_real(backend):
    # A custom Function's backward that stores what it sees in an enclosing variable or
    # appends to an outside list (test_checkpointing_without_reentrant_saved_object_identity,
    # test_reentrant_priority): the re-trace ran it once on fake tensors, so the variable held
    # a FakeTensor and later backwards never appended. Such a backward is refused before it
    # runs and becomes a host call: it runs, every call, with the real tensors, inside the
    # compiled program (the first call runs PyTorch's graph to see what it returns).
    seen = []
    last = None

    class Keep(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            ctx.save_for_backward(y)
            return x * 3

        @staticmethod
        def backward(ctx, g):
            nonlocal last
            (last,) = ctx.saved_tensors
            seen.append(g.clone())
            return g * 3, None

    a = torch.tensor([1.0, 2.0], requires_grad=True)
    b = torch.tensor([4.0, 5.0], requires_grad=True)
    for step in range(3):
        with camlir.enable(backend=backend):
            (Keep.apply(a, b) * (step + 1)).sum().backward()
        assert last is b, f"step {step}: the backward saw {type(last).__name__}, not the saved tensor"
    assert [s.tolist() for s in seen] == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
    torch.testing.assert_close(a.grad, torch.full((2,), 18.0))
    assert camlir.counters["fallbacks"] == 0 and camlir.counters["eager_runs"] == 0
    # step 1 captures a graph and runs it to see what Keep returns; step 2 (a.grad now set)
    # is a new graph, seen the same way; step 3 compiles it
    assert camlir.counters["compiles"] == 1
    assert {e.what for e in camlir.explain(kind="host_call")} == {"node KeepBackward#3"}
    with pytest.raises(camlir.UnsupportedError, match="writes 'last' of an enclosing function"):
        with camlir.enable(backend=backend, fullgraph=True):
            Keep.apply(a, b).sum().backward()


def test_pure_custom_backward_still_compiles():
    # Writes to ctx and to the backward's own locals (a list it builds, a helper it defines)
    # are not outside writes.
    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.k = 2.0
            return x * ctx.k

        @staticmethod
        def backward(ctx, g):
            parts = []
            total = 0

            def add(v):
                nonlocal total
                total = v

            add(g)
            parts.append(total * ctx.k)
            ctx.used = True
            return parts[0]

    x = torch.randn(3, requires_grad=True)
    with camlir.enable(backend="cpu", fullgraph=True):
        Scale.apply(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))
    assert camlir.counters["compiles"] == 1 and camlir.counters["fallbacks"] == 0


def _graph_reading_a_scalar():
    """A graph with compiled autograd's calling convention, `(inputs, sizes, scalars,
    hooks, packed_data)`, whose result reads a lifted scalar: what PyTorch captures once for
    a C++ autograd::Function that keeps a number in `ctx->saved_data` (the scalar is lifted
    so that one capture serves every value)."""

    class Graph(torch.nn.Module):
        def forward(self, inputs, sizes, scalars, hooks, packed_data):
            x = inputs[0]
            return [x * scalars[0] + 1.0]

    return torch.fx.symbolic_trace(Graph())


def _graph_reading_a_size_and_a_scalar():
    """As `_graph_reading_a_scalar`, with a lifted size too: a graph with sizes is re-traced
    with symbolic sizes (PyTorch's test_autograd_cpp_node_saved_int under dynamic=True)."""

    class Graph(torch.nn.Module):
        def forward(self, inputs, sizes, scalars, hooks, packed_data):
            x = inputs[0]
            return [x.expand(sizes[0], sizes[1]) * scalars[0] + scalars[1]]

    return torch.fx.symbolic_trace(Graph())


@pytest.mark.parametrize("backend", BACKENDS)
def test_lifted_scalars_in_a_program_with_symbolic_sizes(backend):
    # The symbolic re-trace took the scalars as program arguments (make_fx makes an int a
    # SymInt placeholder) that the driver never passed: "'NoneType' object cannot be
    # interpreted as an integer" on both backends. They are the trace's constants, as in
    # a static trace, and a new value compiles anew (Artifacts.find's scalar guard).
    from camlir.compiled import CompiledBackward

    gm = _graph_reading_a_size_and_a_scalar()
    compiled = CompiledBackward(gm, [])
    with camlir.enable(backend=backend, dynamic=True):
        for rows, a, b in [(4, 1, 1), (5, 2, 2), (6, 3, 3), (7, 1, 1), (8, 3, 1)]:
            x = torch.randn(1, 3)
            [got] = compiled([x], [rows, 3], [a, b], [], [])
            torch.testing.assert_close(got, x.expand(rows, 3) * a + b)
    assert camlir.counters["compiles"] == 4  # one per scalar pair; the sizes are symbolic


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("values", [[1, 2, 3, 1], [1.1, 2.2, 3.3, 1.1], [2, 2.0]])
def test_a_lifted_scalar_that_changes_is_not_baked_in(backend, values):
    # test_autograd_cpp_node_saved_int/_float: the re-trace bakes the scalars in as
    # constants, and the program compiled for the first value ran for every later one
    # (gradients 2, 2, 2, 2 where eager gives 2, 3, 4, 2). A program now fits only the
    # values it was traced with (2 and 2.0 differ: an int and a float trace differently).
    from camlir.compiled import CompiledBackward

    gm = _graph_reading_a_scalar()
    compiled = CompiledBackward(gm, [])
    x = torch.randn(4, 3)
    with camlir.enable(backend=backend):
        for value in values:
            [got] = compiled([x], [], [value], [], [])
            torch.testing.assert_close(got, x * value + 1.0)
    assert camlir.counters["compiles"] == len({(type(v), v) for v in values})
    assert camlir.counters["cache_hits"] == len(values) - camlir.counters["compiles"]
