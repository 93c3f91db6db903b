"""From plain torch-dialect functions to linalg on tensors.

Input: a module whose functions hold torch-dialect ops on `!torch.vtensor` values (value
semantics), as camlir's outlining produces for the pure-compute parts of a backward.
Output, in place: the same functions on builtin tensors, with ops only from `func`,
`linalg`, `tensor`, `arith`, `math` and `scf` (the set `ALLOWED_DIALECTS`), plus `cf.assert`
run-time size checks where dims are dynamic.

Steps:
0. With dynamic dims, static sizes the import claims but torch-mlir cannot derive are
   handled first (`dynamic_dims.py`): casts onto transpose inputs, results returned through
   an identity op typed as declared.
1. torch-mlir's `torch-function-to-torch-backend-pipeline`: shape/dtype refinement and
   torch-mlir's own decompositions, down to its backend contract.
2. `torch-backend-to-linalg-on-tensors-backend-pipeline`: torch ops to linalg/tensor/arith/
   math/scf, plus `tm_tensor` ops for what linalg cannot express (scatter with duplicates).
3. `tm_tensor.scatter` rewritten as `scf.for` loops over tensors (`tm_tensor.py`); torch-mlir's
   own `tm-tensor-to-loops` only works on buffers. Then canonicalize, `lower-affine`, cse.

Ops in `EXTERN_OPS` have no lowering and no exact decomposition: they must stay outside the
kernels and run through torch at run time, so a kernel containing one is refused.
"""

import re
from typing import Optional

from torch_mlir import ir
from torch_mlir.passmanager import PassManager

from .dynamic_dims import pin_results, refine_transpose_inputs
from .tm_tensor import lower_tm_tensor

# Ops that stay outside the JIT kernels and are called through torch at run time.
EXTERN_OPS = frozenset({
    # The backward of CPU flash attention (what nn.MultiheadAttention / SDPA save for on
    # CPU). torch-mlir has no lowering and PyTorch no decomposition: the op recomputes the
    # attention blockwise from the saved logsumexp, and a math-path rewrite would need the
    # forward's dropout mask and scale conventions re-derived, so it is called as is.
    "aten._scaled_dot_product_flash_attention_for_cpu_backward",
})

ALLOWED_DIALECTS = frozenset({"builtin", "func", "linalg", "tensor", "arith", "math", "scf"})
# With dynamic dims, torch-mlir checks at run time that sizes agree (broadcasts, views,
# matmul operands): `cf.assert`, which the LLVM lowering turns into an abort with message.
ALLOWED_OPS = frozenset({"cf.assert"})

# allow-non-finites: keep -inf as the start of max reductions (max-pool, amax), as eager
# does; the option's other setting clamps to the dtype's finite range and changes results.
_TORCH_BACKEND = "builtin.module(torch-function-to-torch-backend-pipeline{allow-non-finites=true})"
_LINALG_BACKEND = "builtin.module(torch-backend-to-linalg-on-tensors-backend-pipeline{allow-non-finites=true})"
# lower-affine: index arithmetic for dynamic dims comes as affine.apply; arith is enough.
_CLEANUP = "builtin.module(func.func(canonicalize, lower-affine, cse))"

_ATEN_IN_TEXT = re.compile(r"torch\.(aten\.[A-Za-z0-9_.]+|prims\.[A-Za-z0-9_.]+)")


class LoweringError(RuntimeError):
    """Lowering failed; `ops` names what did not convert (aten ops as "aten.foo", other
    ops left over such as "tm_tensor.scan" by their full name), `stage` the failing step."""

    def __init__(self, stage: str, ops, detail: str):
        self.stage = stage
        self.ops = sorted(set(ops))
        named = ", ".join(self.ops) if self.ops else "no op identified"
        super().__init__(f"lowering to linalg failed in {stage}: not converted: {named}\n{detail}")


def aten_name(op: ir.Operation) -> Optional[str]:
    """`aten.mm` for `torch.aten.mm` and for `torch.operator "torch.aten.mm"` (how the
    importer writes ops the torch dialect does not define); None for other ops."""
    name = op.name
    if name == "torch.operator":
        name = ir.StringAttr(op.attributes["name"]).value
    if name.startswith(("torch.aten.", "torch.prims.")):
        return name.removeprefix("torch.")
    return None


def _aten_ops(module: ir.Module, unregistered_only: bool = False) -> list:
    found = []

    def visit(op):
        name = aten_name(op.operation)
        if name is not None and (not unregistered_only or op.operation.name == "torch.operator"):
            found.append(name)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def _run(module: ir.Module, pipeline: str) -> None:
    with module.context:
        PassManager.parse(pipeline).run(module.operation)


def lower_to_linalg(module: ir.Module) -> None:
    """Lowers every function of `module` from the torch dialect to linalg on tensors, in
    place. Raises `LoweringError` naming the aten ops left unconverted; the module is then
    partly lowered and should be dropped."""
    externs = sorted(n for n in set(_aten_ops(module)) if n in EXTERN_OPS)
    if externs:
        raise LoweringError("input check", externs, "these ops are extern: call them through torch")
    refine_transpose_inputs(module)
    pin_results(module)
    try:
        _run(module, _TORCH_BACKEND)
    except ir.MLIRError as exc:
        # Ops the torch dialect does not know (imported as torch.operator) are the usual
        # culprits; otherwise the diagnostics name the op. Other ops still present are not
        # evidence: this pipeline stops at the first failure.
        unknown = _aten_ops(module, unregistered_only=True)
        raise LoweringError("torch-function-to-torch-backend-pipeline",
                            unknown + [m.group(1) for m in _ATEN_IN_TEXT.finditer(str(exc))],
                            _short(exc)) from None
    try:
        _run(module, _LINALG_BACKEND)
    except ir.MLIRError as exc:
        # The conversion is partial: every aten op still present failed to convert. The
        # diagnostic itself often names an innocent constant (`torch.constant.bool`) that
        # only survives because its user did not convert.
        raise LoweringError("torch-backend-to-linalg-on-tensors-backend-pipeline",
                            _aten_ops(module), _short(exc)) from None
    lower_tm_tensor(module)
    _run(module, _CLEANUP)
    _check_contract(module)


def _check_contract(module: ir.Module) -> None:
    bad = set()

    def visit(op):
        dialect = op.operation.name.split(".", 1)[0]
        if dialect not in ALLOWED_DIALECTS and op.operation.name not in ALLOWED_OPS:
            bad.add(op.operation.name)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    if bad:
        raise LoweringError("contract check", [n.removeprefix("torch.") for n in bad],
                            f"ops outside {sorted(ALLOWED_DIALECTS)} remain: {sorted(bad)}")


def _short(exc: BaseException, limit: int = 2000) -> str:
    text = str(exc)
    return text if len(text) <= limit else text[:limit] + " ..."
