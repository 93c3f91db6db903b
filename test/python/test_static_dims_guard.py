"""A program traced while a tensor had a dim of size 1 (or 0) must not run for a later
call where that dim is larger. The shape environment specialises such dims to constants
and `produce_guards` leaves no guard for them, so camlir checks every static dim of a
symbolic trace's inputs itself. Found by PyTorch's test_autograd `test_indexing` run under
camlir: `y[i, j]` with `j` of one element, then of two, gave wrong gradients on the cpu
backend (the kernel broadcast `j[0]`)."""

import pytest
import torch

import camlir


def _grads(steps, body, backend):
    out = []
    for args in steps:
        leaves, loss = body(*args)
        if backend is None:
            loss.backward()
        else:
            with camlir.enable(backend=backend):
                loss.backward()
        out.append([t.grad for t in leaves])
    return out


def _index(i, j):
    y = torch.arange(1.0, 49).view(4, 3, 4).requires_grad_(True)
    return [y], (y[i, j] * torch.arange(1.0, 5)).sum()


def _broadcast(rows):
    torch.manual_seed(rows)
    a = torch.randn(5, 1, 4, requires_grad=True)
    b = torch.randn(rows, 4, requires_grad=True)
    return [a, b], (a * b).tanh().sum()


CASES = {
    "index_lists": (_index, [([0], [0]), ([0, 1, 2], [0]), ([1, 2], [2, 1]), ([1, 2], [0, 1]), ([2], [1])]),
    "broadcast_dim_of_one": (_broadcast, [(3,), (1,), (2,), (5,), (1,)]),
}


@pytest.mark.parametrize("backend", ["eager", "cpu"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_static_dim_of_size_one_is_guarded(case, backend):
    body, steps = CASES[case]
    camlir.reset()
    expected = _grads(steps, body, None)
    got = _grads(steps, body, backend)
    for n, (e, g) in enumerate(zip(expected, got)):
        for et, gt in zip(e, g):
            torch.testing.assert_close(gt, et, msg=lambda m, n=n: f"step {n}: {m}")
    camlir.reset()
