"""Hooks of every kind, accumulation, retain_graph, and what camlir cannot handle."""

import pytest
import torch
import torch.nn as nn

import camlir
from helpers import assert_grads_equal, camlir_logs, eager_and_camlir, grads_of


# Every case runs on the reference interpreter and on the cpu backend (conftest.py).
pytestmark = pytest.mark.usefixtures("each_backend")


def _hooked_model(record):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 2))
    model[0].weight.register_hook(lambda g: g * 0.5)                   # parameter hook
    model[2].bias.register_hook(lambda g: record.append("bias") or None)  # returns None
    model[1].register_full_backward_hook(lambda mod, gi, go: (gi[0] * 2,))
    return model


def test_parameter_activation_and_module_hooks():
    def run(use_camlir):
        record = []
        model = _hooked_model(record)
        x = torch.randn(3, 6, requires_grad=True)
        h = model[0](x)
        h.register_hook(lambda g: g + 1.0)                             # activation hook
        out = model[2](model[1](h)).sum()
        if use_camlir:
            camlir.compile_backward(out)
        else:
            out.backward()
        return grads_of(list(model.parameters()) + [x]), record

    expected, rec_e = run(False)
    got, rec_o = run(True)
    assert_grads_equal([expected], [got])
    assert rec_e == rec_o == ["bias"]
    assert camlir.counters["fallbacks"] == 0


def test_hook_kinds_appear_in_the_module():
    record = []
    model = _hooked_model(record)
    model[2].weight.register_post_accumulate_grad_hook(lambda p: record.append("acc"))
    with camlir_logs("graph") as messages:
        camlir.compile_backward(model(torch.randn(2, 6)).sum())
    text = "\n".join(messages)
    for kind in ("tensor_pre_hook", "post_hook", "post_acc_grad_hook"):
        assert f'kind = "{kind}"' in text, kind
    assert record == ["bias", "acc"]


def test_optimizer_in_backward():
    """register_post_accumulate_grad_hook doing an in-place SGD step, then dropping .grad."""
    def run(use_camlir):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(5, 5), nn.Tanh(), nn.Linear(5, 1))

        def sgd(p):
            with torch.no_grad():
                p.add_(p.grad, alpha=-0.1)
            p.grad = None

        for p in model.parameters():
            p.register_post_accumulate_grad_hook(sgd)
        for step in range(3):
            torch.manual_seed(step)
            loss = model(torch.randn(4, 5)).pow(2).sum()
            if use_camlir:
                with camlir.enable():
                    loss.backward()
            else:
                loss.backward()
        return [p.detach().clone() for p in model.parameters()], [p.grad for p in model.parameters()]

    (eager_params, eager_grads), (ours, our_grads) = run(False), run(True)
    for a, b in zip(eager_params, ours):
        torch.testing.assert_close(b, a)
    assert all(g is None for g in our_grads) and all(g is None for g in eager_grads)
    assert camlir.counters["fallbacks"] == 0
    assert camlir.counters["cache_hits"] >= 1


def test_existing_grads_accumulate():
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    x = torch.randn(2, 4)
    model(x).sum().backward()
    model(x * 2).sum().backward()
    expected = grads_of(model.parameters())
    model.zero_grad(set_to_none=True)
    with camlir.enable():
        model(x).sum().backward()
        grad_objects = [p.grad for p in model.parameters()]
        model(x * 2).sum().backward()
    assert_grads_equal([expected], [grads_of(model.parameters())])
    # The second backward accumulated in place into the .grad tensors of the first.
    assert all(a is b for a, b in zip(grad_objects, [p.grad for p in model.parameters()]))


def test_retain_graph_twice():
    torch.manual_seed(0)
    w = torch.randn(5, requires_grad=True)
    loss = (w.sin() * w).sum()
    loss.backward(retain_graph=True)
    loss.backward()
    expected = w.grad.clone()
    w.grad = None
    loss = (w.sin() * w).sum()
    camlir.compile_backward(loss, retain_graph=True)
    camlir.compile_backward(loss, retain_graph=True)
    torch.testing.assert_close(w.grad, expected)
    camlir.compile_backward(loss)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        camlir.compile_backward(loss)


def test_explicit_gradient_argument():
    torch.manual_seed(0)
    w = torch.randn(3, 4, requires_grad=True)
    out = w.exp()
    seed = torch.randn(3, 4)
    out.backward(seed, retain_graph=True)
    expected = w.grad.clone()
    w.grad = None
    camlir.compile_backward(out, seed)
    torch.testing.assert_close(w.grad, expected)


class ItemInBackward(torch.autograd.Function):
    """A backward that reads a value with .item(): data-dependent, cannot be traced."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        scale = 2.0 if x.sum().item() > 0 else -3.0
        return g * scale


def test_untraceable_backward_is_a_host_call_or_raises():
    """A data-dependent custom backward runs in Python inside the compiled program (not a
    fallback of the whole graph); under fullgraph=True that is an error naming the node."""
    def make():
        return nn.Linear(4, 4)

    def loss(m, x):
        return ItemInBackward.apply(m(x)).sum()

    eager, ours = eager_and_camlir(make, lambda: [torch.randn(2, 4)], loss, steps=3)
    assert_grads_equal(eager, ours)
    assert camlir.counters["fallbacks"] == 0
    assert camlir.counters["compiles"] == 1
    assert [e.what for e in camlir.explain(kind="host_call")] == ["node ItemInBackwardBackward#2"]
    camlir.reset()
    with pytest.raises(camlir.UnsupportedError, match="ItemInBackward"):
        eager_and_camlir(make, lambda: [torch.randn(2, 4)], loss, fullgraph=True)


def test_hooks_are_not_run_at_capture():
    calls = []
    x = torch.randn(4, requires_grad=True)
    x.register_hook(lambda g: calls.append(g.clone()) or g * 3)
    camlir.compile_backward((x * 2).sum())
    assert len(calls) == 1  # once, at run time, with the real gradient
    torch.testing.assert_close(calls[0], torch.full((4,), 2.0))
    torch.testing.assert_close(x.grad, torch.full((4,), 6.0))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="unknown camlir backend 'tpu'"):
        with camlir.enable(backend="tpu"):
            pass
    with pytest.raises(ValueError, match="unknown camlir backend"):
        camlir.config.backend = "nope"
    with pytest.raises(TypeError, match="expects a tensor"):
        camlir.compile_backward([1, 2])
    with pytest.raises(ValueError, match="unknown CAMLIR_LOGS kind"):
        camlir.set_logs("graphs")


def test_module_pre_hook():
    def run(use_camlir):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
        model[1].register_full_backward_pre_hook(lambda mod, grad_out: (grad_out[0] * 3,))
        loss = model(torch.randn(3, 4)).sum()
        if use_camlir:
            camlir.compile_backward(loss, fullgraph=True)
        else:
            loss.backward()
        return grads_of(model.parameters())

    assert_grads_equal([run(False)], [run(True)])
    assert camlir.counters["fallbacks"] == 0


def test_unsupported_op_is_named():
    """Sparse embedding gradients have no MLIR tensor type: fall back, or name the op."""
    def run(use_camlir, fullgraph=None):
        torch.manual_seed(0)
        emb = nn.Embedding(10, 3, sparse=True)
        loss = emb(torch.tensor([1, 2, 2])).sum()
        if use_camlir:
            camlir.compile_backward(loss, fullgraph=fullgraph)
        else:
            loss.backward()
        return emb.weight.grad

    torch.testing.assert_close(run(True).to_dense(), run(False).to_dense())
    assert camlir.counters["fallbacks"] == 1
    camlir.reset()
    with pytest.raises(camlir.UnsupportedError, match=r"_sparse_coo_tensor.*EmbeddingBackward0.*sparse_coo"):
        run(True, fullgraph=True)


def test_bad_hooks_give_clear_errors():
    x = torch.randn(10, requires_grad=True)
    handle = x.register_hook(lambda g: g.sum(0, keepdim=True))  # wrong shape
    with pytest.raises(RuntimeError, match=r"tensor_pre_hook '.*<lambda>' changed gradient #0 from \(10,\)"):
        camlir.compile_backward((x * 2).sum())
    handle.remove()
    assert x.grad is None  # nothing was accumulated from the failed backward

    def broken(g):
        raise ValueError("my hook is broken")

    x.register_hook(broken)
    with pytest.raises(ValueError, match="my hook is broken"):
        camlir.compile_backward((x * 3).sum())
