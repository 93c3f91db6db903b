"""Negative integer indices in an index's backward (found by test/python/model_sweep.py).

The backward of `x[..., [-2], :]` (Falcon's multi-query attention splits its fused q/k/v
projection this way) is an `index_put(accumulate=True)` with the index -2. torch-mlir's
lowering used it as it is: wrong gradients, or a corrupted heap, on the cpu backend.
"""

import torch

import camlir


def _eager_and_camlir(f, *leaves):
    f(*leaves).backward()
    expected = [x.grad.clone() for x in leaves]
    for x in leaves:
        x.grad = None
    loss = f(*leaves)
    camlir.reset()
    with camlir.enable(backend="cpu"):
        loss.backward()
    assert camlir.counters["fallbacks"] == 0 and camlir.counters["interpreted"] == 0
    for x, e in zip(leaves, expected):
        torch.testing.assert_close(x.grad, e)


def test_negative_index_on_an_inner_dim():
    x = torch.randn(2, 3, 6, 4, requires_grad=True)
    weight = torch.randn(2, 3, 3, 4)
    # -1 and 5 name the same row: its gradient is the sum of both.
    _eager_and_camlir(lambda x: (x[..., [-1, 5, -6], :] * weight).sum(), x)


def test_negative_index_after_a_boolean_mask():
    x = torch.randn(4, 5, 3, requires_grad=True)
    mask = torch.tensor([True, False, True, True])
    cols = torch.tensor([-1, 0, -5])  # the mask takes dim 0, these index dim 1
    weight = torch.randn(3, 3)
    _eager_and_camlir(lambda x: (x[mask, cols] * weight).sum(), x)


def test_index_put_with_negative_indices_in_the_forward():
    # The forward's index_put is eager; its backward reads grad[idx] for the values (an
    # `index` gather, which torch-mlir wraps) and masks the overwritten rows for `base`.
    base = torch.randn(6, 4, requires_grad=True)
    values = torch.randn(2, 4, requires_grad=True)
    idx = torch.tensor([-1, 2])
    scale = torch.arange(24.0).reshape(6, 4)
    _eager_and_camlir(lambda b, v: (b.index_put((idx,), v * 3) * scale).sum(), base, values)
