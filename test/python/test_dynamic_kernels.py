"""One native compile for every size: `pipeline.compile(cpu, ..., Variant(runtime_sizes=True))`.

Each case runs its backward through camlir's reference backend at two batch sizes, so that
the capture becomes symbolic, compiles that capture's `ca` module once with dynamic dims,
puts the program in place of the capture's artifact (the runtime then calls it with the
inputs plus the lifted sizes, as it calls a size variant) and compares gradients with
eager PyTorch at several sizes. No size compiles anything again.
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import camlir
from camlir import compiled, pipeline
from camlir import backend_registry as registry
from camlir.cache import SizeVariants
from camlir.stages import Dump, StageError
from camlir.variant import Variant
from camlir.backends.cpu import abi, shapes

SIZES = (7, 10, 37, 64, 100, 1)


@pytest.fixture(autouse=True)
def fresh():
    camlir.reset()
    yield
    camlir.reset()


RUNTIME_SIZES = Variant(runtime_sizes=True)


class _Dynamic:
    """Stands in for the artifact's program: compiles the capture's module with dynamic
    dims on the first call (with that call's tensors, as the driver does: their layouts pick
    the permuted inputs), then runs that one program on every call, counting them."""

    def __init__(self, module):
        self.module = module
        self.program = None
        self.calls = 0

    def __call__(self, args, hooks, callbacks=()):
        if self.program is None:
            self.program, guard = pipeline.compile(registry.get("cpu"), self.module, list(args), hooks,
                                                   Dump("dynamic test"), RUNTIME_SIZES)
            assert guard is not None
            assert self.program.kernels
            assert all(isinstance(k, abi.DynamicKernel) for k in self.program.kernels.values())
        self.calls += 1
        return self.program(args, hooks, callbacks)


def _grads(make_model, make_inputs, loss_fn, n, use_camlir):
    torch.manual_seed(0)
    model = make_model()
    torch.manual_seed(n)
    inputs = [t.requires_grad_() if t.is_floating_point() else t for t in make_inputs(n)]
    loss = loss_fn(model, *inputs)
    if use_camlir:
        with camlir.enable(backend="eager"):
            loss.backward()
    else:
        loss.backward()
    return [p.grad for p in model.parameters()] + [t.grad for t in inputs if t.requires_grad]


def _check_dynamic(make_model, make_inputs, loss_fn, sizes=SIZES):
    """Captures at batch 10 and 100 (symbolic), compiles once with dynamic=True, checks
    every size in `sizes`; returns the program."""
    for n in (10, 100):
        _grads(make_model, make_inputs, loss_fn, n, use_camlir=True)
    _, artifact = compiled._compiled[-1]
    assert artifact.retraced.symbolic, "the capture did not become symbolic"
    counting = _Dynamic(artifact.module)
    artifact.program = counting
    # Batch 1 is outside the symbolic trace's guards (PyTorch specializes sizes 0 and 1), so
    # the capture would not be used for it: the guard is opened to run the kernels at 1 too.
    artifact.retraced.guards_hold = lambda inputs, sizes: True
    captures = len(compiled._compiled)
    for i, n in enumerate(sizes):
        eager = _grads(make_model, make_inputs, loss_fn, n, use_camlir=False)
        ours = _grads(make_model, make_inputs, loss_fn, n, use_camlir=True)
        assert counting.calls == i + 1, f"batch {n} did not run the dynamic program"
        assert len(eager) == len(ours)
        for e, o in zip(eager, ours):
            assert (e is None) == (o is None)
            if e is not None:
                torch.testing.assert_close(o, e, rtol=1e-4, atol=1e-5)
    assert len(compiled._compiled) == captures, "a size compiled again"
    return counting.program


def test_elementwise():
    _check_dynamic(lambda: nn.Identity(), lambda n: [torch.randn(n, 3)], lambda m, y: (y.sin() * y).sum())


def test_mlp_matmuls_go_to_blas():
    program = _check_dynamic(lambda: nn.Sequential(nn.Linear(12, 24), nn.GELU(), nn.Linear(24, 5)),
                             lambda n: [torch.randn(n, 12)], lambda m, x: m(x).pow(2).mean())
    assert "linalg.matmul" in program.lowered_text


def test_softmax_and_cross_entropy():
    def loss(m, x, target):
        logits = m(x)
        return F.cross_entropy(logits, target) + logits.softmax(-1).pow(2).sum() + logits.log_softmax(-1).mean()

    _check_dynamic(lambda: nn.Linear(8, 6), lambda n: [torch.randn(n, 8), torch.randint(0, 6, (n,))], loss)


def test_mean_over_the_dynamic_dim():
    _check_dynamic(lambda: nn.Linear(4, 4),
                   lambda n: [torch.randn(n, 4)], lambda m, x: (m(x).tanh().mean(dim=0) * torch.arange(4.0)).sum())


def test_sequence_length_dynamic():
    _check_dynamic(lambda: nn.Linear(16, 8), lambda n: [torch.randn(2, n, 16)],
                   lambda m, x: F.gelu(m(x)).pow(2).sum())


def test_shape_function_of_a_kernel():
    from torch_mlir import ir

    from camlir.context import make_context

    text = """
    func.func @k(%a: tensor<?x3xf32>, %n: i64) -> (tensor<?x3xf32>, tensor<3xf32>) {
      %c0 = arith.constant 0 : index
      %d = tensor.dim %a, %c0 : tensor<?x3xf32>
      %e = tensor.empty(%d) : tensor<?x3xf32>
      %s = tensor.empty() : tensor<3xf32>
      return %e, %s : tensor<?x3xf32>, tensor<3xf32>
    }"""
    with make_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        fn = shapes.derive(module.body.operations[0].operation)
    assert fn(torch.empty(5, 3), 5) == ((5, 3), (3,))


def test_hooks_static_ones_traced_dynamic_ones_stay_calls():
    def loss(m, x):
        m.weight.register_hook(lambda g: g * 2)   # a parameter's gradient: static shape, traced
        h = m(x)
        h.register_hook(lambda g: g * 3)          # batch-sized: stays a Python call
        return h.tanh().sum()

    program = _check_dynamic(lambda: nn.Linear(6, 4), lambda n: [torch.randn(n, 6)], loss)
    assert program.lowered_text.count('"ca.hook"') == 1


def test_layer_norm_view_and_cat():
    def loss(m, x):
        h = m(x)
        return torch.cat([h.view(-1, 2, 4).softmax(-1).flatten(1), x.exp()], 0).sum()

    _check_dynamic(lambda: nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 8)), lambda n: [torch.randn(n, 8)], loss)


def test_a_result_shape_that_does_not_resolve_is_refused():
    # max(dim=0)'s backward scatters in an scf.for loop: the dim of the loop's result does
    # not resolve to the arguments, so no shape function: a StageError (the driver then
    # compiles per size set), never a process abort.
    for n in (10, 100):
        _grads(lambda: nn.Linear(4, 4), lambda n: [torch.randn(n, 4)],
               lambda m, x: m(x).max(dim=0).values.sum(), n, use_camlir=True)
    _, artifact = compiled._compiled[-1]
    assert artifact.retraced.symbolic
    with pytest.raises(StageError, match="stage 'split'.*shape function cannot compute"):
        pipeline.compile(registry.get("cpu"), artifact.module, [], [], Dump("dynamic test"), RUNTIME_SIZES)


def test_shape_function_raises_where_the_kernel_would_abort():
    from torch_mlir import ir

    from camlir.context import make_context

    text = """
    func.func @k(%a: tensor<?xf32>, %b: tensor<?xf32>) -> tensor<?xf32> {
      %c0 = arith.constant 0 : index
      %d = tensor.dim %a, %c0 : tensor<?xf32>
      %e = tensor.dim %b, %c0 : tensor<?xf32>
      %ok = arith.cmpi eq, %d, %e : index
      cf.assert %ok, "mismatched size for broadcast"
      return %a : tensor<?xf32>
    }"""
    with make_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        fn = shapes.derive(module.body.operations[0].operation)
    assert fn(torch.empty(4), torch.empty(4)) == ((4,),)
    with pytest.raises(shapes.ShapeError, match="mismatched size"):
        fn(torch.empty(4), torch.empty(5))


def test_a_dynamic_program_that_refuses_its_sizes_is_answered_by_a_specialized_one():
    # A symbolic TransformerEncoderLayer capture: the program with runtime sizes fails a size
    # check of its first kernel (a dynamic-dims lowering gap, docs/driver.md). Its shape
    # function raised out of the backward and left PyTorch's compiled autograd broken (the
    # next backward aborted the process); refused before any effect, a program specialized
    # to the sizes answers the call instead, and every gradient is eager's.
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    for shape in [(2, 8, 32), (8, 64, 32), (3, 5, 32)]:
        x = torch.randn(*shape)
        layer.zero_grad(set_to_none=True)
        layer(x).sum().backward()
        expected = [p.grad.clone() for p in layer.parameters()]
        layer.zero_grad(set_to_none=True)
        camlir.compile_backward(layer(x).sum())
        for p, e in zip(layer.parameters(), expected):
            torch.testing.assert_close(p.grad, e)
    assert camlir.counters["fallbacks"] == 0
    variants = [p for _, _, p in camlir.compiled_programs() if isinstance(p, SizeVariants)]
    assert variants and "refused" in variants[0].runtime_sizes_error
