"""ca-narrow-float-conversions: conversions between bf16/f16 and f64 or integers go through
f32, as PyTorch's `c10::BFloat16` and `c10::Half` convert, so that no soft-float call is
left for the JIT.

Why: LLVM lowers `fptrunc double to bfloat` to a call of `__truncdfbf2` (and f64 to f16 to
`__truncdfhf2`, integers to bf16/f16 to `__float*bf`/`__float*hf` calls): runtime functions
of libgcc/compiler-rt that the ExecutionEngine cannot resolve in the process ("JIT session
error: Symbols not found: [ __truncdfbf2 ]"), and the whole graph was then interpreted.
They appear where a bf16 kernel reads a Python scalar (an f64 operand, e.g. `clamp(min=0.1)`)
or an index. Through f32, the f32 <-> bf16 step is integer bit operations
(`arith-expand{include-bf16=true}` in the llvm stage) and f32 <-> f16 is one instruction
(F16C).

What becomes what (scalars and vectors; `lo` is bf16 or f16):
- `arith.truncf` f64 -> lo: `truncf` to f32, then to lo. This rounds twice, exactly as
  PyTorch does (`c10::BFloat16(double)` converts the double to float first).
- `arith.extf` lo -> f64: `extf` to f32, then to f64 (exact either way).
- `arith.sitofp` / `arith.uitofp` int -> lo: to f32, then `truncf` (PyTorch's integer to
  bf16/f16 also goes through float).
- `arith.fptosi` / `arith.fptoui` lo -> int: `extf` to f32 first (exact).
- every `arith.extf` / `arith.truncf` between lo and f32 loses its `contract` flag, which
  `arith-emulate-unsupported-floats` sets: with it, canonicalize folds `extf(truncf(x))`
  into `x` and a fused chain of bf16 ops was rounded once at its end instead of once per op
  as eager does (`a / b / b` differed from eager's in a third of the elements).
The cpu pipeline runs it twice: in the math stage right after the emulation (the flags),
and in the llvm stage after the last canonicalize (which folds `truncf(sitofp(x))` back).
"""

import dataclasses

from torch_mlir import ir
from torch_mlir.dialects import arith

from camlir.dialects.ca.ir_helpers import ops_matching

from .base import CAPass

_NAMES = ("arith.truncf", "arith.extf", "arith.sitofp", "arith.uitofp", "arith.fptosi", "arith.fptoui")


@dataclasses.dataclass(frozen=True)
class NarrowFloatConversions(CAPass):
    """Routes every conversion between bf16/f16 and f64 or an integer type through f32:
    `truncf` f64 -> bf16 becomes `truncf` to f32 then to bf16 (rounding twice, as PyTorch's
    `c10::BFloat16(double)` does), `extf` bf16 -> f64 becomes two exact `extf`s, `sitofp`/
    `uitofp` to bf16/f16 convert to f32 and `truncf`, `fptosi`/`fptoui` from bf16/f16 `extf`
    to f32 first. Conversions between bf16/f16 and f32 lose their `contract` fastmath flag,
    so that canonicalize keeps each op's rounding. Scalars and vectors, anywhere in the
    module. LLVM lowers the direct conversions to soft-float calls (`__truncdfbf2`, ...)
    the JIT cannot resolve.

    Before:
    ```mlir
    %b = arith.truncf %d : f64 to bf16
    %w = arith.extf %b : bf16 to f64
    ```
    After:
    ```mlir
    %0 = arith.truncf %d : f64 to f32
    %b = arith.truncf %0 : f32 to bf16
    %1 = arith.extf %b : bf16 to f32
    %w = arith.extf %1 : f32 to f64
    ```
    """

    argument = "ca-narrow-float-conversions"
    summary = "Convert between bf16/f16 and f64 or integers through f32"

    def run(self, module: ir.Operation) -> None:
        narrow_float_conversions(module)


def narrow_float_conversions(module) -> int:
    """Rewrites every such conversion in `module`; returns how many."""
    count = 0
    for op in ops_matching(module, lambda op: op.name in _NAMES):
        source, result = op.operands[0].type, op.results[0].type
        if op.name in ("arith.extf", "arith.truncf") and "fastmath" in op.attributes and (
                _narrow(_element(source)) or _narrow(_element(result))):
            del op.attributes["fastmath"]
        with op.context, op.location, ir.InsertionPoint(op):
            value = _through_f32(op.name, op.operands[0], _element(source), result, _element(result))
        if value is None:
            continue
        op.results[0].replace_all_uses_with(value)
        op.erase()
        count += 1
    return count


def _through_f32(name, x, source, result_type, result):
    f32 = _like(x.type, ir.F32Type.get())
    if name == "arith.truncf" and isinstance(source, ir.F64Type) and _narrow(result):
        return arith.truncf(result_type, arith.truncf(f32, x))
    if name == "arith.extf" and _narrow(source) and isinstance(result, ir.F64Type):
        return arith.extf(result_type, arith.extf(f32, x))
    if name in ("arith.sitofp", "arith.uitofp") and _narrow(result):
        f32 = _like(result_type, ir.F32Type.get())
        wide = arith.sitofp(f32, x) if name == "arith.sitofp" else arith.uitofp(f32, x)
        return arith.truncf(result_type, wide)
    if name in ("arith.fptosi", "arith.fptoui") and _narrow(source):
        wide = arith.extf(f32, x)
        return arith.fptosi(result_type, wide) if name == "arith.fptosi" else arith.fptoui(result_type, wide)
    return None


def _narrow(t) -> bool:
    return isinstance(t, (ir.BF16Type, ir.F16Type))


def _element(t):
    return ir.ShapedType(t).element_type if isinstance(t, (ir.VectorType, ir.RankedTensorType)) else t


def _like(t, element):
    """`t` with `element` as its element type (a scalar type: `element` itself)."""
    if isinstance(t, ir.VectorType):
        return ir.VectorType.get(t.shape, element)
    if isinstance(t, ir.RankedTensorType):
        return ir.RankedTensorType.get(t.shape, element)
    return element
