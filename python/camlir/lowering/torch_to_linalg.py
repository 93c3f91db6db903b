"""From plain torch-dialect functions to linalg on tensors.

Input: a module whose functions hold torch-dialect ops on `!torch.vtensor` values (value
semantics), as camlir's outlining produces for the pure-compute parts of a backward.
Output, in place: the same functions on builtin tensors, with ops only from `func`,
`linalg`, `tensor`, `arith`, `math` and `scf` (the set `ALLOWED_DIALECTS`), plus `cf.assert`
run-time size checks where dims are dynamic.

Steps:
0. With dynamic dims, static sizes the import claims but torch-mlir cannot derive are
   handled first (`dynamic_dims.py`): casts onto transpose inputs, results returned through
   an identity op typed as declared, and same-rank views with a dynamic dim sent through a
   1-d view (torch-mlir would lower them as a cast, wrong when they move elements between dims).
1. torch-mlir's `torch-function-to-torch-backend-pipeline`: shape/dtype refinement and
   torch-mlir's own decompositions, down to its backend contract.
2. `torch-backend-to-linalg-on-tensors-backend-pipeline`: torch ops to linalg/tensor/arith/
   math/scf, plus `tm_tensor` ops for what linalg cannot express (scatter with duplicates).
3. `tm_tensor.scatter` rewritten as `scf.for` loops over tensors (`tm_tensor.py`); torch-mlir's
   own `tm-tensor-to-loops` only works on buffers. Then canonicalize, `lower-affine`, cse.

Ops in `EXTERN_OPS` have no lowering and no exact decomposition: they must stay outside the
kernels and run through torch at run time, so a kernel containing one is refused.

A failure says which input ops did not convert as data, not as text: every op is given a
location `"ca.lower.<n>"` (n: its position in a pre-order walk of the input, the original
location kept inside), which torch-mlir's conversions carry to the ops they create and to
their diagnostics. `LoweringError.sources` lists those positions, so a caller can move the
very ops that failed out of its kernels (ca-lower-to-linalg does).
"""

from torch_mlir import ir
from torch_mlir.passmanager import PassManager

from camlir.dialects.ca.ir_helpers import aten_name, ops_matching

from .dynamic_dims import flatten_same_rank_views, pin_results, refine_transpose_inputs
from .negative_dims import normalize_negative_dims
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

_STAMP = "ca.lower."


class LoweringError(RuntimeError):
    """Lowering failed in `stage`. `ops` names what did not convert (aten ops as
    "aten.foo", other ops left over such as "tm_tensor.scan" by their full name);
    `sources` the positions (pre-order walk of the input module) of the input ops they
    come from, where the locations tell."""

    def __init__(self, stage: str, ops, detail: str, sources=()):
        self.stage = stage
        self.ops = sorted(set(ops))
        self.sources = sorted(set(sources))
        named = ", ".join(self.ops) if self.ops else "no op identified"
        super().__init__(f"lowering to linalg failed in {stage}: not converted: {named}\n{detail}")


class _Stamps:
    """Locations `"ca.lower.<n>"` on every op of a module, and the way back from a location."""

    def __init__(self, module: ir.Module):
        self.names = []
        with module.context:
            for n, op in enumerate(ops_matching(module, lambda op: True)):
                self.names.append(aten_name(op) or op.name)
                op.location = ir.Location.name(f"{_STAMP}{n}", childLoc=op.location)

    def sources(self, location) -> list:
        """The stamped positions a location (possibly fused or nested) refers to."""
        text = str(location)
        found, start = [], text.find('"' + _STAMP)
        while start >= 0:
            end = text.find('"', start + 1)
            digits = text[start + 1 + len(_STAMP):end]
            if digits.isdigit():
                found.append(int(digits))
            start = text.find('"' + _STAMP, end + 1)
        return found

    def of_ops(self, ops) -> list:
        return [n for op in ops for n in self.sources(op.location)]

    def of_error(self, exc: ir.MLIRError) -> list:
        found = []
        pending = list(exc.error_diagnostics)
        while pending:
            diag = pending.pop()
            found += self.sources(diag.location)
            pending += list(diag.notes)
        return found


def _aten_ops(module: ir.Module, unregistered_only: bool = False) -> list:
    return [op for op in ops_matching(module, lambda op: aten_name(op) is not None)
            if not unregistered_only or op.name == "torch.operator"]


def _run(module: ir.Module, pipeline: str) -> None:
    with module.context:
        PassManager.parse(pipeline).run(module.operation)


def lower_to_linalg(module: ir.Module) -> None:
    """Lowers every function of `module` from the torch dialect to linalg on tensors, in
    place. Raises `LoweringError` naming the aten ops left unconverted and their positions
    in the input; the module is then partly lowered and should be dropped."""
    stamps = _Stamps(module)
    externs = [op for op in _aten_ops(module) if aten_name(op) in EXTERN_OPS]
    if externs:
        raise LoweringError("input check", [aten_name(op) for op in externs],
                            "these ops are extern: call them through torch", stamps.of_ops(externs))
    normalize_negative_dims(module)
    refine_transpose_inputs(module)
    flatten_same_rank_views(module)
    pin_results(module)
    try:
        _run(module, _TORCH_BACKEND)
    except ir.MLIRError as exc:
        # Ops the torch dialect does not know (imported as torch.operator) are the usual
        # culprits; otherwise the diagnostics' locations point at the op. Other ops still
        # present are not evidence: this pipeline stops at the first failure.
        sources = stamps.of_ops(_aten_ops(module, unregistered_only=True)) + stamps.of_error(exc)
        raise LoweringError("torch-function-to-torch-backend-pipeline",
                            [stamps.names[n] for n in sources], _short(exc), sources) from None
    try:
        _run(module, _LINALG_BACKEND)
    except ir.MLIRError as exc:
        # The conversion is partial: every aten op still present failed to convert. The
        # diagnostic itself often names an innocent constant (`torch.constant.bool`) that
        # only survives because its user did not convert.
        left = _aten_ops(module)
        raise LoweringError("torch-backend-to-linalg-on-tensors-backend-pipeline",
                            [aten_name(op) for op in left], _short(exc), stamps.of_ops(left)) from None
    lower_tm_tensor(module)
    _run(module, _CLEANUP)
    _check_contract(module, stamps)


def _check_contract(module: ir.Module, stamps: _Stamps) -> None:
    def outside(op):
        return (op.name.split(".", 1)[0] not in ALLOWED_DIALECTS and op.name not in ALLOWED_OPS)

    bad = ops_matching(module, outside)
    if bad:
        names = sorted({op.name for op in bad})
        raise LoweringError("contract check", [n.removeprefix("torch.") for n in names],
                            f"ops outside {sorted(ALLOWED_DIALECTS)} remain: {names}", stamps.of_ops(bad))


def _short(exc: BaseException, limit: int = 2000) -> str:
    text = str(exc)
    return text if len(text) <= limit else text[:limit] + " ..."
