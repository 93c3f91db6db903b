"""Every op in the backward of the zoo lowers from the torch dialect to linalg on tensors,
or is one of the extern ops called through torch; the scatter loops compute what torch does;
failures name the aten ops that did not convert."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx
from torch_mlir import ir
from torch_mlir.extras.fx_importer import FxImporter

import camlir
from camlir import make_context
from camlir.capture.decompositions import decomposition_table
from camlir.lowering import EXTERN_OPS, LoweringError, lower_to_linalg
from helpers import assert_grads_equal, eager_and_camlir
from linalg_jit import run_kernel
from lowering_cases import EXPECTED_EXTERNS, KNOWN_GAPS, SINGLE_OPS, ZOO, captured_modules, single_op_modules
from node_funcs import node_ops, outline_nodes


@pytest.fixture(autouse=True)
def fresh():
    camlir.reset()
    yield
    camlir.reset()


def _op_names(module: ir.Module) -> set:
    names = set()
    module.operation.walk(lambda op: names.add(op.operation.name) or ir.WalkResult.ADVANCE)
    return names


def _lower_all(texts) -> tuple:
    """Outlines and lowers every node of every module; returns (aten ops seen, externs)."""
    seen, externs = set(), set()
    assert texts, "nothing was captured"
    for text in texts:
        module, labels, skipped = outline_nodes(text)
        for op in module.body.operations:
            seen.update(node_ops(op.operation))
        for _label, ops in skipped:
            externs.update(ops)
        lower_to_linalg(module)
        left = {n for n in _op_names(module) if n.startswith(("torch.", "torch_c.", "tm_tensor."))}
        assert not left, f"not lowered: {sorted(left)}"
    return seen, externs


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_backward_lowers(name):
    make_model, make_inputs, loss, steps = ZOO[name]
    seen, externs = _lower_all(captured_modules(make_model, make_inputs, loss, steps))
    assert externs <= EXTERN_OPS
    assert externs == EXPECTED_EXTERNS.get(name, set())
    # Matmul-class ops and convolution stay whole (the JIT sends them to BLAS-like code).
    if name == "mlp_gelu":
        assert "aten.mm" in seen
    if name == "cnn":
        assert "aten.convolution_backward" in seen


@pytest.mark.parametrize("name", list(SINGLE_OPS))
def test_single_op_backward_lowers(name):
    _, externs = _lower_all(single_op_modules(name))
    assert externs == ({"aten._scaled_dot_product_flash_attention_for_cpu_backward"} if name == "sdpa" else set())


@pytest.mark.parametrize("name", list(KNOWN_GAPS))
def test_known_gap_still_fails_naming_the_op(name):
    with pytest.raises(LoweringError) as info:
        _lower_all(single_op_modules(name))
    assert KNOWN_GAPS[name][1] in info.value.ops


# Backwards camlir decomposes before import (capture/decompositions.py) still give eager's
# gradients on the reference backend.
_DECOMPOSED_CASES = ["layer_norm", "batch_norm", "batch_norm_eval", "embedding", "embedding_padding_idx",
                     "index_select", "slice", "select", "silu", "group_norm", "mse_loss", "smooth_l1_loss"]


@pytest.mark.parametrize("name", _DECOMPOSED_CASES)
def test_decomposed_backward_matches_eager(name):
    fn, make_inputs = SINGLE_OPS[name]
    eager, ours = eager_and_camlir(lambda: torch.nn.Module(), make_inputs,
                                   lambda _m, *inputs: (fn(*inputs) * 1.5).sum(), fullgraph=True)
    assert_grads_equal(eager, ours, rtol=1e-5, atol=1e-6)


# --- numbers: the scatter loops (tm_tensor.scatter rewritten by camlir) against torch ---

def _lower_traced(fn, *args):
    """make_fx with camlir's decompositions -> torch dialect -> linalg: the module."""
    graph = make_fx(fn, decomposition_table=decomposition_table())(*args)
    importer = FxImporter(context=make_context())
    importer.import_stateless_graph(graph.graph, func_name="main")
    module = importer.module
    lower_to_linalg(module)
    assert "scf.for" in _op_names(module)  # the scatter became loops
    return module


def _check_numbers(fn, *args):
    expected = fn(*args)
    module = _lower_traced(fn, *args)
    (got,) = run_kernel(module, "main", [a.numpy() for a in args],
                        [(tuple(expected.shape), expected.numpy().dtype)])
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-6, atol=1e-6)


def test_max_pool_backward_numbers_overlapping_windows():
    x = torch.randn(2, 3, 5, 5)
    out, indices = F.max_pool2d(x, 3, stride=1, padding=1, return_indices=True)
    grad = torch.randn_like(out)
    _check_numbers(lambda g, x, i: torch.ops.aten.max_pool2d_with_indices_backward(
        g, x, [3, 3], [1, 1], [1, 1], [1, 1], False, i), grad, x, indices)


def test_embedding_backward_numbers_repeated_and_padding_index():
    grad = torch.randn(2, 5, 4)
    tokens = torch.tensor([[1, 3, 1, 0, 3], [3, 3, 2, 1, 0]])
    _check_numbers(lambda g, t: torch.ops.aten.embedding_dense_backward(g, t, 6, 3, False), grad, tokens)


def test_index_add_numbers_repeated_index():
    base, src = torch.randn(5, 3), torch.randn(4, 3)
    index = torch.tensor([4, 0, 4, 4])
    _check_numbers(lambda b, i, s: torch.index_add(b, 0, i, s), base, index, src)


def test_scatter_without_accumulation_numbers():
    base, src = torch.randn(3, 5), torch.randn(3, 2)
    index = torch.tensor([[4, 0], [1, 2], [3, 3]])
    _check_numbers(lambda b, i, s: torch.scatter(b, 1, i, s), base, index, src)


# --- errors name the real culprits ---

_LAYER_NORM_BACKWARD = """
func.func @f(%g: !torch.vtensor<[3,5],f32>, %x: !torch.vtensor<[3,5],f32>, %mean: !torch.vtensor<[3,1],f32>,
             %rstd: !torch.vtensor<[3,1],f32>, %w: !torch.vtensor<[5],f32>, %b: !torch.vtensor<[5],f32>)
    -> !torch.vtensor<[3,5],f32> {
  %int5 = torch.constant.int 5
  %shape = torch.prim.ListConstruct %int5 : (!torch.int) -> !torch.list<int>
  %true = torch.constant.bool true
  %mask = torch.prim.ListConstruct %true, %true, %true : (!torch.bool, !torch.bool, !torch.bool) -> !torch.list<bool>
  %0, %1, %2 = torch.aten.native_layer_norm_backward %g, %x, %shape, %mean, %rstd, %w, %b, %mask : !torch.vtensor<[3,5],f32>, !torch.vtensor<[3,5],f32>, !torch.list<int>, !torch.vtensor<[3,1],f32>, !torch.vtensor<[3,1],f32>, !torch.vtensor<[5],f32>, !torch.vtensor<[5],f32>, !torch.list<bool> -> !torch.vtensor<[3,5],f32>, !torch.vtensor<[5],f32>, !torch.vtensor<[5],f32>
  %3 = torch.aten.neg %0 : !torch.vtensor<[3,5],f32> -> !torch.vtensor<[3,5],f32>
  return %3 : !torch.vtensor<[3,5],f32>
}
"""

_SELECT_BACKWARD = """
func.func @f(%g: !torch.vtensor<[5],f32>) -> !torch.vtensor<[4,5],f32> {
  %int4 = torch.constant.int 4
  %int5 = torch.constant.int 5
  %sizes = torch.prim.ListConstruct %int4, %int5 : (!torch.int, !torch.int) -> !torch.list<int>
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %0 = torch.operator "torch.aten.select_backward"(%g, %sizes, %int0, %int1) : (!torch.vtensor<[5],f32>, !torch.list<int>, !torch.int, !torch.int) -> !torch.vtensor<[4,5],f32>
  %1 = torch.aten.neg %0 : !torch.vtensor<[4,5],f32> -> !torch.vtensor<[4,5],f32>
  return %1 : !torch.vtensor<[4,5],f32>
}
"""


def _parse(text: str) -> ir.Module:
    return ir.Module.parse(text, make_context())


def test_error_names_the_op_without_lowering_not_a_constant():
    with pytest.raises(LoweringError) as info:
        lower_to_linalg(_parse(_LAYER_NORM_BACKWARD))
    assert info.value.ops == ["aten.native_layer_norm_backward"]  # the neg after it converts
    assert "aten.native_layer_norm_backward" in str(info.value).splitlines()[0]


def test_error_names_an_op_unknown_to_torch_mlir():
    with pytest.raises(LoweringError) as info:
        lower_to_linalg(_parse(_SELECT_BACKWARD))
    assert info.value.ops == ["aten.select_backward"]
    assert info.value.stage == "torch-function-to-torch-backend-pipeline"


def test_extern_op_is_refused():
    text = _SELECT_BACKWARD.replace("aten.select_backward", "aten._scaled_dot_product_flash_attention_for_cpu_backward")
    with pytest.raises(LoweringError, match="extern") as info:
        lower_to_linalg(_parse(text))
    assert info.value.ops == ["aten._scaled_dot_product_flash_attention_for_cpu_backward"]
