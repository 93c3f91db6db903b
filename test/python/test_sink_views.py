"""Backwards cut into kernels by Python hooks that stay calls (post-accumulate-grad hooks,
as DDP's reducer and optimizer-in-backward install): ca-sink-views keeps the views that one
kernel would have folded away out of the kernel results, and nothing about the hooks changes
(order, what they see, gradients)."""

import pytest
import torch
import torch.nn as nn

import camlir


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setenv("CAMLIR_GRAPH_CHOICE", "0")  # always camlir's program
    camlir.reset()
    yield
    camlir.reset()


def _mlp(width=32, layers=4):
    torch.manual_seed(0)
    mods = [nn.Linear(16, width), nn.GELU()]
    for _ in range(layers - 2):
        mods += [nn.Linear(width, width), nn.GELU()]
    mods.append(nn.Linear(width, 8))
    return nn.Sequential(*mods)


def _twins(hook_factory, layers=4):
    """The same MLP twice, each parameter with a hook from `hook_factory(name, log)`."""
    out = []
    for _ in range(2):
        model, log = _mlp(layers=layers), []
        for name, p in model.named_parameters():
            p.register_post_accumulate_grad_hook(hook_factory(model, name, log))
        out.append((model, log))
    return out


def _step(model, x, compiled):
    loss = model(x).pow(2).mean()
    if compiled:
        with camlir.enable(backend="cpu"):
            loss.backward()
    else:
        loss.backward()


def _kernel_counts(directory):
    """Kernels per captured graph after the kernels stage (CA_DUMP_DIR files)."""
    return [path.read_text().count("attributes {ca.kernel}") for path in sorted(directory.glob("*/*-kernels.mlir"))]


def test_noop_hooks_cut_one_kernel_per_layer_and_gradients_match(tmp_path, monkeypatch):
    monkeypatch.setenv("CA_DUMP_DIR", str(tmp_path))
    (eager, _), (compiled, _) = _twins(lambda model, name, log: (lambda p: None))
    x = torch.randn(8, 16)
    for _ in range(3):
        for model, c in ((eager, False), (compiled, True)):
            model.zero_grad(set_to_none=True)
            _step(model, x, c)
        for (name, p), q in zip(compiled.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=name)
    assert camlir.counters["interpreted"] == 0
    # One kernel per Linear's backward: the hooks cut between layers, and no kernel is left
    # that only transposes (TBackward's `t` of a weight gradient) or only permutes a saved
    # weight for a later one (before: 8 kernels, the first returning two transposed weights).
    [count] = _kernel_counts(tmp_path)
    assert count == 4
    [kernels] = sorted(tmp_path.glob("*/*-kernels.mlir"))
    host = kernels.read_text().split("func.func private")[0]
    assert host.count("call @backward_kernel_") == 4


def test_hooks_see_eagers_gradients_in_eagers_order():
    # Each hook records which parameter it ran for and every parameter's .grad at that time:
    # the order of hooks and what they can observe is eager's exactly.
    def factory(model, name, log):
        def hook(p):
            log.append((name, [None if q.grad is None else q.grad.clone() for q in model.parameters()]))
        return hook

    (eager, elog), (compiled, clog) = _twins(factory)
    x = torch.randn(8, 16)
    for model, c in ((eager, False), (compiled, True)):
        for _ in range(2):  # the second backward accumulates into existing .grad
            _step(model, x, c)
    assert camlir.counters["interpreted"] == 0
    assert [n for n, _ in clog] == [n for n, _ in elog]
    for (name, seen), (_, want) in zip(clog, elog):
        assert [s is None for s in seen] == [w is None for w in want], name
        for s, w in zip(seen, want):
            if w is not None:
                torch.testing.assert_close(s, w, msg=name)


def test_optimizer_in_backward_matches_eager():
    # SGD inside the backward: each hook updates its parameter in place and drops .grad.
    # Saved weights (W.t() of each Linear) are read by later kernels where eager's nodes read
    # them, so every update happens after the last read of its weight, as in eager.
    def factory(model, name, log):
        def hook(p):
            with torch.no_grad():
                p.add_(p.grad, alpha=-0.1)
            p.grad = None
        return hook

    (eager, _), (compiled, _) = _twins(factory)
    torch.manual_seed(1)
    for step in range(4):
        x = torch.randn(8, 16)
        for model, c in ((eager, False), (compiled, True)):
            _step(model, x, c)
        for (name, p), q in zip(compiled.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p, q, msg=f"step {step}: {name}")
            assert p.grad is None
    assert camlir.counters["interpreted"] == 0


def test_a_channels_last_convolution_backward_gets_channels_last_saved_tensors():
    """The saved input and weight of a channels_last convolution reach torch's convolution
    backward as channels_last tensors, as on the eager engine: they used to be written out
    by a kernel as NCHW copies (a 2.6x slower backward, channels_last + bf16 autocast)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Strides(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.convolution_backward.default:
                seen.append((args[1].stride(), args[2].stride()))
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    conv = nn.Conv2d(8, 8, 3, padding=1, bias=False).to(memory_format=torch.channels_last)
    x = torch.randn(2, 8, 6, 6).contiguous(memory_format=torch.channels_last)
    grads = []
    for enabled in (False, True):
        conv.zero_grad(set_to_none=True)
        loss = conv(x).square().sum()
        with Strides():
            if enabled:
                with camlir.enable(backend="cpu", fullgraph=True):
                    loss.backward()
            else:
                loss.backward()
        grads.append(conv.weight.grad.clone())
    assert camlir.counters["compiles"] == 1 and camlir.counters["interpreted"] == 0
    # eager's call, then the capture's (on fake tensors) and camlir's program's
    assert len(seen) == 3 and seen[0] == seen[2], f"eager's strides, then camlir's: {seen}"
    assert seen[2][0] == x.stride() and seen[2][1] == conv.weight.stride()
    torch.testing.assert_close(grads[1], grads[0])


class _LayoutsOf(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the strides of every tensor argument of the ops named `name`."""

    def __init__(self, name):
        super().__init__()
        self.name, self.seen = name, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.name in str(func):
            self.seen.append([a.stride() for a in args if isinstance(a, torch.Tensor)])
        return func(*args, **(kwargs or {}))


def test_attention_backward_reads_the_gradient_in_eagers_layout():
    # The gradient the flash-attention backward reads is the output projection's mm, viewed
    # and permuted: the host makes that view, so torch's kernel gets eager's (L, B, H, D)
    # layout, not a contiguous (B, H, L, D) copy (689 against 545 us a call in the bench
    # Transformer).
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    x = torch.randn(2, 8, 32)
    eager = _LayoutsOf("flash_attention_for_cpu_backward")
    with eager:
        layer(x).sum().backward()
    expected = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad(set_to_none=True)
    camlir.compile_backward(layer(x).sum())  # the capture and compile (the re-trace runs the op too)
    layer.zero_grad(set_to_none=True)
    loss = layer(x).sum()
    compiled = _LayoutsOf("flash_attention_for_cpu_backward")
    with compiled:
        camlir.compile_backward(loss)
    assert camlir.counters["cache_hits"] == 1
    for p, e in zip(layer.parameters(), expected):
        torch.testing.assert_close(p.grad, e)
    assert camlir.counters["interpreted"] == 0 and camlir.counters["fallbacks"] == 0
    assert eager.seen and compiled.seen == eager.seen
