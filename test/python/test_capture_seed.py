"""The seed document's scenarios, through camlir's reference backend."""

import pytest
import torch

import camlir
from helpers import assert_grads_equal, camlir_logs, grads_of


@pytest.fixture(autouse=True)
def fresh():
    camlir.reset()
    yield
    camlir.config.enabled = False
    camlir.reset()


def test_linear_global_switch():
    torch.manual_seed(0)
    model = torch.nn.Linear(10, 10)
    x = torch.randn(10)
    model(x).sum().backward()
    expected = grads_of(model.parameters())
    model.zero_grad(set_to_none=True)
    camlir.config.enabled = True
    model(x).sum().backward()
    camlir.config.enabled = False
    assert_grads_equal([expected], [grads_of(model.parameters())])
    assert camlir.counters["captures"] == 1
    assert camlir.counters["compiles"] == 1


def test_switch_off_restores_pytorch():
    camlir.config.enabled = True
    camlir.config.enabled = False
    model = torch.nn.Linear(4, 4)
    model(torch.randn(2, 4)).sum().backward()
    assert camlir.counters["captures"] == 0


def test_linear_enable_and_compile_backward():
    torch.manual_seed(0)
    model = torch.nn.Linear(10, 10)
    x = torch.randn(3, 10)
    model(x).sum().backward()
    expected = grads_of(model.parameters())
    model.zero_grad(set_to_none=True)
    with camlir.enable():
        model(x).sum().backward()
    assert_grads_equal([expected], [grads_of(model.parameters())])
    model.zero_grad(set_to_none=True)
    camlir.compile_backward(model(x).sum())
    assert_grads_equal([expected], [grads_of(model.parameters())])
    assert camlir.counters["captures"] == 1  # the second backward reused the graph
    assert camlir.counters["cache_hits"] == 1


def test_graph_breaks_give_one_backward_graph():
    torch._dynamo.reset()
    torch.manual_seed(0)
    lin = [torch.nn.Linear(8, 8) for _ in range(3)]

    def forward(x):
        x = torch.relu(lin[0](x))
        torch._dynamo.graph_break()
        x = torch.relu(lin[1](x))
        torch._dynamo.graph_break()
        return lin[2](x).sum()

    x = torch.randn(4, 8)
    forward(x).backward()
    params = [p for layer in lin for p in layer.parameters()]
    expected = grads_of(params)
    for p in params:
        p.grad = None
    compiled = torch.compile(forward, backend="aot_eager")
    with camlir.enable():
        compiled(x).backward()
    assert_grads_equal([expected], [grads_of(params)])
    assert camlir.counters["unique_graphs"] == 1
    assert camlir.counters["captures"] == 1
    (_, text), = camlir.captured_graphs()
    summary = camlir.summarize(text)
    assert summary["aot_nodes"] == 3  # one node per compiled region, each marked aot<N>
    assert all(count == 1 for count in summary["node_names"].values()), summary["node_names"]
    assert summary["accumulate_grad"] == 6


def test_tensor_hook_is_captured_as_ca_hook():
    torch.manual_seed(0)
    x = torch.randn(10, requires_grad=True)
    x.register_hook(lambda g: g * 10)
    (x * x).sum().backward()
    expected = x.grad.clone()
    x.grad = None
    with camlir_logs("graph") as messages, camlir.enable():
        (x * x).sum().backward()
    torch.testing.assert_close(x.grad, expected)
    text = "\n".join(messages)
    assert '"ca.hook"' in text and 'kind = "tensor_pre_hook"' in text
    assert '"ca.accumulate_grad"' in text


def test_new_autograd_node_recaptures_with_reasons():
    torch.manual_seed(0)
    x = torch.randn(4, requires_grad=True)
    y = torch.randn(4)
    with camlir_logs("recompiles") as messages:
        for op in (torch.add, torch.sub, torch.mul, torch.div):
            x.grad = None
            with camlir.enable():
                op(x, y).sum().backward()
            ref_x = x.detach().clone().requires_grad_()
            op(ref_x, y).sum().backward()
            torch.testing.assert_close(x.grad, ref_x.grad)
    assert camlir.counters["captures"] == 4
    for name in ("SubBackward0", "MulBackward0", "DivBackward0"):
        assert any("a new graph: autograd node" in m and f"({name})" in m for m in messages), messages


def test_verbose_logs_every_stage():
    with camlir_logs("verbose") as messages:
        camlir.compile_backward(torch.nn.Linear(3, 3)(torch.randn(2, 3)).sum())
    text = "\n".join(messages)
    for expected in ("graph 1: capture:", "stage 'retrace'", "stage 'import'", "captured backward graph 1",
                     "inputs of graph 1: #0 tensor ()", "param (3, 3) torch.float32"):
        assert expected in text, expected


def test_changing_sizes_capture_twice_and_reuse_symbolic_graph():
    torch.manual_seed(0)
    model = torch.nn.Linear(10, 10)
    with camlir_logs("recompiles") as messages:
        for batch in (10, 100, 10, 37, 100):
            x = torch.randn(batch, 10)
            model.zero_grad(set_to_none=True)
            model(x).sum().backward()
            expected = grads_of(model.parameters())
            model.zero_grad(set_to_none=True)
            with camlir.enable(dynamic=False):  # every size set specialised
                model(x).sum().backward()
            assert_grads_equal([expected], [grads_of(model.parameters())])
    assert camlir.counters["captures"] == 2
    assert any("capture: sizes changed:" in m for m in messages), messages
    # Counters are honest: the symbolic graph is reused, but each new size set (100, 10,
    # 37) is a native compile, and only the second 100 compiled nothing.
    assert camlir.counters["compiles"] == 4
    assert camlir.counters["cache_hits"] == 1
    assert sum("graph 2: compile: new sizes" in m for m in messages) == 3, messages
