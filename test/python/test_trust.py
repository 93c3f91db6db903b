"""Regression tests for the silent-wrong-gradient and crash classes found by outside users
(issue "Trust"), each on both backends, each compared with eager PyTorch."""

import logging

import pytest
import torch

import camlir
from helpers import assert_grads_equal, camlir_logs, eager_and_camlir


class _Scale(torch.autograd.Function):
    """`ctx.s` is a Python float the backward reads: a baked value that must be guarded."""

    @staticmethod
    def forward(ctx, x, s):
        ctx.s = s
        return x * s

    @staticmethod
    def backward(ctx, g):
        return g * ctx.s, None


class _TensorOnCtx(torch.autograd.Function):
    """A tensor kept as a plain ctx attribute (not save_for_backward): cannot be guarded."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.w = w
        return x * w

    @staticmethod
    def backward(ctx, g):
        return g * ctx.w, None


def _grad(fn, backend=None):
    x = torch.linspace(-1, 1, 6, requires_grad=True)
    if backend is None:
        fn(x).sum().backward()
    else:
        with camlir.enable(backend=backend):
            fn(x).sum().backward()
    return x.grad


def test_ctx_values_are_guarded_not_baked(each_backend):
    with camlir_logs("recompiles") as messages:
        for s in (2.0, 3.0, 3.0, 2.0):
            torch.testing.assert_close(_grad(lambda x: _Scale.apply(x, s), each_backend),
                                       _grad(lambda x: _Scale.apply(x, s)))
    assert any("ctx.s changed from 2.0 to 3.0" in m for m in messages), messages
    assert camlir.counters["fallbacks"] == 0
    assert camlir.counters["cache_hits"] == 2  # the second 3.0 and the second 2.0


def test_tensor_on_ctx_is_a_host_call_with_its_reason(each_backend):
    """A tensor kept on ctx is never baked in: the node's backward runs in Python (a host
    call) on every call, so each call reads the tensor it holds then."""
    for value in (2.0, 5.0, 7.0):
        w = torch.full((6,), value)
        got = _grad(lambda x: _TensorOnCtx.apply(x, w), each_backend)
        torch.testing.assert_close(got, _grad(lambda x: _TensorOnCtx.apply(x, w)))
    assert camlir.counters["fallbacks"] == 0
    assert any("ctx.w is a tensor that is not saved with save_for_backward" in e.reason
               for e in camlir.explain(kind="host_call"))
    with pytest.raises(camlir.UnsupportedError, match="ctx.w"):
        x = torch.ones(6, requires_grad=True)
        camlir.reset()
        camlir.compile_backward(_TensorOnCtx.apply(x, torch.ones(6)).sum(), backend=each_backend, fullgraph=True)


def _as_strided_model():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 4)


def test_as_strided_backward_keeps_every_gradient(each_backend):
    eager, ours = eager_and_camlir(_as_strided_model, lambda: [torch.randn(2, 4)],
                                   lambda m, x: m(x).as_strided((2, 2), (1, 2)).sum(), steps=2)
    assert_grads_equal(eager, ours)
    assert camlir.counters["fallbacks"] == 0


def test_lost_accumulation_is_detected_not_silent(each_backend, monkeypatch, caplog):
    # Undo the leaves' side-effect declaration: torch-mlir's importer then drops the
    # accumulations of an as_strided backward, and the effects invariant must notice.
    from torch.fx import node as fx_node

    leaves = {getattr(torch.ops.camlir, n).default for n in
              ("accumulate_grad", "tensor_pre_hook", "pre_hook", "post_hook", "post_acc_grad_hook")}
    monkeypatch.setattr(fx_node, "_side_effectful_functions", fx_node._side_effectful_functions - leaves)
    with caplog.at_level(logging.WARNING, logger="camlir"):
        eager, ours = eager_and_camlir(_as_strided_model, lambda: [torch.randn(2, 4)],
                                       lambda m, x: m(x).as_strided((2, 2), (1, 2)).sum())
    assert_grads_equal(eager, ours)
    assert "accumulations into .grad: 2 captured, 0 in the program" in caplog.text
    assert camlir.counters["fallbacks"] == 1


def test_equal_gradients_of_two_leaves_do_not_crash_or_alias(each_backend):
    def run(enable):
        x = torch.randn(4, 4, requires_grad=True)
        y = torch.randn(4, 4, requires_grad=True)
        if enable:
            with camlir.enable(backend=each_backend):
                (x.sum() + y.sum()).backward()
        else:
            (x.sum() + y.sum()).backward()
        return x, y

    x, y = run(True)
    ex, ey = run(False)
    torch.testing.assert_close(x.grad, ex.grad)
    torch.testing.assert_close(y.grad, ey.grad)
    assert x.grad.data_ptr() != y.grad.data_ptr()  # each .grad is its own tensor, as in eager
    x.grad.add_(1)
    torch.testing.assert_close(y.grad, ey.grad)
    assert camlir.counters["interpreted"] == 0 and camlir.counters["fallbacks"] == 0


def test_retain_grad_gives_real_tensors_natively(each_backend):
    for step in range(3):
        x = torch.randn(3, requires_grad=True)
        h = x * 3
        h.retain_grad()
        with camlir.enable(backend=each_backend):
            (h * h).sum().backward()
        assert type(h.grad) is torch.Tensor  # was a FakeTensor from the re-trace
        torch.testing.assert_close(h.grad, 2 * h.detach())
        torch.testing.assert_close(x.grad, 18 * x.detach())
    assert camlir.counters["fallbacks"] == 0 and camlir.counters["interpreted"] == 0
    assert camlir.counters["cache_hits"] == 2


def test_fullgraph_refuses_a_hook_it_cannot_compile():
    x = torch.randn(4, requires_grad=True)
    x.register_hook(lambda g: g * float(g.sum().item() > 0))  # data-dependent: stays Python
    with pytest.raises(camlir.UnsupportedError, match=r"hook 0 stays a Python call \(calls .item\(\)"):
        camlir.compile_backward((x * 2).sum(), fullgraph=True)
    # Without fullgraph the same backward runs, the hook in Python, with eager's answer.
    y = torch.randn(4, requires_grad=True)
    y.register_hook(lambda g: g * float(g.sum().item() > 0))
    camlir.compile_backward((y * 2).sum())
    torch.testing.assert_close(y.grad, torch.full((4,), 2.0))


@pytest.mark.parametrize("kind", ["pre", "post", "acc_post"])
def test_hooks_with_none_gradients_compile_natively(each_backend, kind):
    # split's second half gets no gradient: the node's hooks see None in their lists.
    seen = []

    def run(enable):
        torch.manual_seed(0)
        x = torch.randn(4, 3, requires_grad=True)
        a, b = (x * 2).split(2)
        if kind == "pre":
            a.grad_fn.register_prehook(lambda go: (seen.append([g is None for g in go]),
                                                   tuple(None if g is None else g * 3 for g in go))[1])
        elif kind == "post":
            a.grad_fn.register_hook(lambda gi, go: (seen.append([g is None for g in go]),
                                                    tuple(None if g is None else g * 3 for g in gi))[1])
        else:  # a post hook on AccumulateGrad (empty grad_inputs) and a post-accumulate hook
            acc = (x * 1).grad_fn.next_functions[0][0]
            acc.register_hook(lambda gi, go: seen.append(len(gi)))
            x.register_post_accumulate_grad_hook(lambda p: [p.grad.mul_(-1)] and None)
        loss = (a * a).sum()
        if enable:
            with camlir.enable(backend=each_backend):
                loss.backward()
        else:
            loss.backward()
        return x.grad

    expected = run(False)
    eager_seen = list(seen)
    seen.clear()
    torch.testing.assert_close(run(True), expected)
    assert seen == eager_seen  # the hook saw the same Nones
    assert camlir.counters["fallbacks"] == 0


def test_backward_inside_a_compiled_function_compiles_natively(each_backend, caplog):
    # The seed's pattern: `@torch.compile def train(...): ... loss.backward()`, and
    # `torch.compile(lambda: loss.backward())()`. Dynamo must not trace camlir's machinery:
    # the backward call is a graph break, and at run time Dynamo must not try the wrapper's
    # frame either (capture/dynamo_off.py: marked only, it broke again on `set_eval_frame`
    # inside the wrapper, an extra graph break and frame per call).
    from torch._dynamo.utils import counters as dynamo_counters

    torch._dynamo.reset()
    dynamo_counters.clear()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    x = torch.randn(5, 4)

    @torch.compile(backend="aot_eager")
    def train(x):
        loss = model(x).sum()
        loss.backward()
        return loss

    model(x).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    with caplog.at_level(logging.WARNING, logger="camlir"):
        for _ in range(2):
            model.zero_grad(set_to_none=True)
            with camlir.enable(backend=each_backend):
                train(x)
            for p, e in zip(model.parameters(), expected):
                torch.testing.assert_close(p.grad, e)
        model.zero_grad(set_to_none=True)
        loss = model(x).sum()
        with camlir.enable(backend=each_backend):
            torch.compile(lambda: loss.backward(), backend="aot_eager")()
        for p, e in zip(model.parameters(), expected):
            torch.testing.assert_close(p.grad, e)
    assert camlir.counters["fallbacks"] == 0 and camlir.counters["interpreted"] == 0, caplog.text
    assert camlir.counters["compiles"] >= 1
    breaks = dict(dynamo_counters["graph_break"])
    assert breaks and all("backward()" in reason for reason in breaks), breaks
    torch._dynamo.reset()


@pytest.mark.parametrize("name", ["leaky_relu", "where_mask"])
def test_fuzzer_found_wrong_gradients(each_backend, name):
    # leaky_relu: torch-mlir lowered its backward as the forward's shape (camlir decomposes
    # it). where_mask: a bool mask read by 8-wide vector loads as packed bits (booleans now
    # cross the kernel boundary as bytes). Both were silent, both found by the fuzzer.
    torch.manual_seed(0)
    x = torch.randn(5, 9, requires_grad=True)
    y = torch.randn(5, 9, requires_grad=True)
    w = torch.randn(5, 9)
    fns = {
        "leaky_relu": lambda: (torch.nn.functional.leaky_relu(x, 0.1) * w).sum(),
        "where_mask": lambda: (torch.where(torch.cat([x, y], 1) > 0, torch.cat([x, y], 1), 1.0).sum(1) * w[:, 0]).sum(),
    }
    fns[name]().backward()
    expected = (x.grad.clone(), None if y.grad is None else y.grad.clone())
    x.grad = y.grad = None
    with camlir.enable(backend=each_backend):
        fns[name]().backward()
    torch.testing.assert_close(x.grad, expected[0])
    if expected[1] is not None:
        torch.testing.assert_close(y.grad, expected[1])
    assert camlir.counters["interpreted"] == 0 and camlir.counters["fallbacks"] == 0


def test_sort_backward_does_not_crash(each_backend):
    # sort's backward scatters along dim -1, which crashed torch-mlir's lowering (found by
    # the OpInfo differential run); the whole process died.
    torch.manual_seed(0)
    for n in (20, 3000):
        x = torch.randn(4, n, requires_grad=True)
        w = torch.randn(4, n)
        (torch.sort(x, dim=-1)[0] * w).sum().backward()
        expected = x.grad.clone()
        x.grad = None
        with camlir.enable(backend=each_backend):
            (torch.sort(x, dim=-1)[0] * w).sum().backward()
        torch.testing.assert_close(x.grad, expected)
    assert camlir.counters["interpreted"] == 0 and camlir.counters["fallbacks"] == 0


def test_embedding_of_a_single_index_does_not_hang(each_backend):
    # A 0-d index made torch-mlir's lowering of the embedding backward loop forever (found
    # by the OpInfo run); the decomposition now sees a 1-d index.
    torch.manual_seed(0)
    w = torch.randn(10, 5, requires_grad=True)
    for idx in (torch.tensor(5), torch.tensor([5, 5, 2])):
        loss = lambda: (torch.nn.functional.embedding(idx, w) * torch.arange(5.0)).sum()  # noqa: E731
        loss().backward()
        expected = w.grad.clone()
        w.grad = None
        with camlir.enable(backend=each_backend):
            loss().backward()
        torch.testing.assert_close(w.grad, expected)
        w.grad = None
    assert camlir.counters["interpreted"] == 0 and camlir.counters["fallbacks"] == 0


def test_backward_from_several_threads_is_exact():
    # PyTorch's compiled autograd is one per process; four threads each training their own
    # model failed ("Nested Compiled Autograd Contexts", "within another compiled autograd
    # call"). The eager references are computed first: a plain backward on one thread that
    # starts while no camlir scope is open can still collide with a compiled one starting on
    # another (the wrapper is only installed while camlir is in use; see the issue note).
    import threading

    camlir.reset()
    errors = []
    cases = []
    for i in range(4):
        torch.manual_seed(i)
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1 + i))
        x = torch.randn(4, 8)
        m(x).pow(2).sum().backward()
        cases.append((m, x, [p.grad.clone() for p in m.parameters()]))

    def work(i):
        m, x, expected = cases[i]
        try:
            for _ in range(4):
                m.zero_grad()
                with camlir.enable(backend="cpu"):
                    m(x).pow(2).sum().backward()
                for p, e in zip(m.parameters(), expected):
                    torch.testing.assert_close(p.grad, e)
        except Exception as exc:  # noqa: BLE001 - reported below, with the thread
            errors.append(f"thread {i}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    # Models of one structure but other parameter shapes share a capture; a symbolic
    # artifact traced with one model's parameters must not serve another's.
    assert camlir.counters["interpreted"] == 0 and camlir.counters["fallbacks"] == 0


def _transposed_leaf():
    torch.manual_seed(0)
    return torch.randn(5, 3).t().detach().requires_grad_()


_CRASHERS = {
    # each killed the process (SIGFPE, SIGSEGV, abort) or hung before; found by the OpInfo run
    "empty_view": lambda: (lambda a: (a, lambda: a.view(0, 25).sum()))(torch.randn(0, 5, 5, requires_grad=True)),
    "fft": lambda: (lambda a: (a, lambda: (torch.view_as_real(torch.fft.rfft(a)) ** 2).sum()))(
        torch.randn(8, requires_grad=True)),
    "circular_pad_empty": lambda: (lambda a: (a, lambda: torch.nn.functional.pad(a, (1, 2), mode="circular").sum()))(
        torch.randn(0, 3, 3, requires_grad=True)),
    "bool_mask_index_put": lambda: (lambda a, v, m: (a, lambda: (torch.index_put(a, (m,), v) ** 2).sum()))(
        torch.randn(5, 5, requires_grad=True), torch.randn(5), torch.tensor([True, False, True, False, True])),
    "median_0d": lambda: (lambda a: (a, lambda: torch.median(a, dim=-1).values.sum()))(torch.randn((), requires_grad=True)),
    # a transposed leaf: the layouts stage handed accumulation a permuted view (grad lost)
    "transposed_leaf": lambda: (lambda a, w: (a, lambda: (a * w).sum()))(_transposed_leaf(), torch.randn(3, 5)),
}


@pytest.mark.parametrize("name", list(_CRASHERS))
def test_opinfo_found_crashes_and_lost_gradients(each_backend, name):
    torch.manual_seed(0)
    leaf, loss = _CRASHERS[name]()
    loss().backward()
    expected = leaf.grad.clone()
    leaf.grad = None
    with camlir.enable(backend=each_backend):
        loss().backward()
    assert leaf.grad is not None, "the leaf got no gradient"
    torch.testing.assert_close(leaf.grad, expected)
    assert camlir.counters["fallbacks"] == 0


def test_plain_and_captured_backwards_on_two_threads_at_once():
    """A plain backward on one thread (no camlir scope open there) while another thread runs
    captured ones, many rounds: both get eager's gradients, and the plain ones are never
    captured (camlir's wrapper is installed and removed while they run)."""
    import threading

    camlir.reset()
    torch.manual_seed(0)
    plain_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    ours = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    x = torch.randn(4, 8)

    def reference(m):
        m.zero_grad()
        m(x).pow(2).sum().backward()
        return [p.grad.clone() for p in m.parameters()]

    expected_plain, expected_ours = reference(plain_model), reference(ours)
    errors, done, rounds = [], threading.Event(), [0]

    def plain():
        while not done.is_set():
            try:
                plain_model.zero_grad()
                plain_model(x).pow(2).sum().backward()
                for p, e in zip(plain_model.parameters(), expected_plain):
                    torch.testing.assert_close(p.grad, e)
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(f"plain: {type(exc).__name__}: {exc}")
            rounds[0] += 1

    def captured():
        try:
            for _ in range(120):
                ours.zero_grad()
                with camlir.enable(backend="cpu"):  # opens and closes: the wrapper comes and goes
                    ours(x).pow(2).sum().backward()
                for p, e in zip(ours.parameters(), expected_ours):
                    torch.testing.assert_close(p.grad, e)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"captured: {type(exc).__name__}: {exc}")
        finally:
            done.set()

    threads = [threading.Thread(target=plain), threading.Thread(target=captured)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert rounds[0] > 10  # they did overlap
    assert camlir.counters["captures"] == 1 and camlir.counters["fallbacks"] == 0
    assert camlir.counters["cache_hits"] == 119
