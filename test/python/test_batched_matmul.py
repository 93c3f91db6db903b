"""Batched matmuls on the cpu backend against eager: every layout the BLAS wrappers meet.

`camlir_bgemm` sends a batch BLAS can read as it is to `?gemm_batch_` in one call (pointers
from the batch stride) and loops over the matrices otherwise; transposed operands arrive as
maps (ca-fuse-elementwise). Each case here takes one of those paths; the gradients must
match eager's, natively (fullgraph)."""

import pytest
import torch

import camlir


@pytest.fixture(autouse=True)
def fresh():
    camlir.reset()
    yield
    camlir.reset()


CASES = {
    "plain": (lambda a, b: torch.bmm(a, b), [(16, 8, 4), (16, 4, 6)]),
    "first transposed": (lambda a, b: torch.bmm(a.transpose(1, 2), b), [(5, 4, 8), (5, 4, 3)]),
    "both transposed": (lambda a, b: torch.bmm(a.transpose(1, 2), b.transpose(1, 2)), [(5, 7, 3), (5, 4, 7)]),
    "attention": (lambda q, k: (q @ k.transpose(-1, -2)).softmax(-1) @ k, [(2, 3, 6, 4), (2, 3, 6, 4)]),
    "expanded batch (stride 0)": (lambda a, w: torch.matmul(a, w.expand(3, 5, 6)), [(3, 4, 5), (5, 6)]),
    "broadcast batch dims": (lambda a, b: torch.matmul(a, b), [(2, 1, 4, 5), (1, 3, 5, 6)]),
    "strided batch": (lambda a, b: torch.bmm(a[::2], b[1::2]), [(6, 3, 4), (6, 4, 5)]),
    "strided in both matrix dims": (lambda w: torch.bmm(w[:, ::3, ::2], w[:, 1::3, 1::2].transpose(1, 2)), [(4, 9, 10)]),
    "baddbmm": (lambda c, a, b: torch.baddbmm(c, a, b, beta=0.5, alpha=2.0), [(4, 3, 5), (4, 3, 6), (4, 6, 5)]),
    "one matrix": (lambda a, b: torch.bmm(a, b), [(1, 5, 3), (1, 3, 7)]),
    "empty rows": (lambda a, b: torch.bmm(a, b), [(3, 0, 4), (3, 4, 5)]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", list(CASES))
def test_batched_matmul_gradients_match_eager(case, dtype):
    fn, shapes = CASES[case]
    torch.manual_seed(0)
    xs = [torch.randn(*s, dtype=dtype, requires_grad=True) for s in shapes]
    ours = [x.detach().clone().requires_grad_() for x in xs]
    fn(*xs).square().sum().backward()
    with camlir.enable(backend="cpu", fullgraph=True):
        fn(*ours).square().sum().backward()
    assert camlir.counters["interpreted"] == 0 and camlir.counters["fallbacks"] == 0
    for mine, theirs in zip(ours, xs):
        torch.testing.assert_close(mine.grad, theirs.grad)
