"""argmax/argmin inside a compiled backward pick what eager picks: the first NaN of a row if
there is one, else the first extreme value (torch-mlir's lowering gave index 0 for a row
holding a NaN, so a custom Function routing its gradient by argmax sent it to the wrong
element). Decomposed in capture/decompositions.py (`_arg_extreme`)."""

import pytest
import torch

import camlir

NAN, INF = float("nan"), float("inf")


class _RouteToExtreme(torch.autograd.Function):
    """Passes the gradient to the arg-extreme element of each row, zero elsewhere."""

    @staticmethod
    def forward(ctx, x, largest):
        ctx.save_for_backward(x)
        ctx.largest = largest
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        index = (x.argmax if ctx.largest else x.argmin)(dim=1, keepdim=True)
        return grad * torch.zeros_like(x).scatter(1, index, 1.0), None


@pytest.mark.parametrize("backend", ["cpu", "eager"])
@pytest.mark.parametrize("largest", [True, False])
def test_arg_extreme_in_a_backward_matches_eager(backend, largest):
    x = torch.tensor([[1.0, NAN, 3.0, NAN],      # the first NaN wins
                      [2.0, 5.0, 5.0, -1.0],     # ties: the first
                      [-INF, 0.0, INF, INF],     # infinities are values
                      [4.0, 4.0, 4.0, 4.0]], requires_grad=True)
    weights = torch.arange(16.0).reshape(4, 4)
    (_RouteToExtreme.apply(x, largest) * weights).sum().backward()
    expected, x.grad = x.grad.clone(), None
    camlir.reset()
    with camlir.enable(backend=backend, fullgraph=True):
        (_RouteToExtreme.apply(x, largest) * weights).sum().backward()
    torch.testing.assert_close(x.grad, expected)
    camlir.reset()


def test_arg_extreme_decomposition_matches_eager_everywhere():
    from camlir.capture.decompositions import _arg_extreme

    torch.manual_seed(0)
    for _ in range(100):
        shape = [int(d) for d in torch.randint(1, 5, (int(torch.randint(1, 4, ())),))]
        x = torch.randint(-2, 3, shape).float()
        u = torch.rand(shape)
        x[u < 0.1], x[u > 0.9], x[(u > 0.85) & (u <= 0.9)] = NAN, INF, -INF
        for largest, op in ((True, torch.argmax), (False, torch.argmin)):
            for dim in [None] + list(range(-x.dim(), x.dim())):
                for keepdim in (False, True):
                    assert torch.equal(_arg_extreme(largest)(x, dim, keepdim), op(x, dim=dim, keepdim=keepdim))
