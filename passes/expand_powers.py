"""ca-expand-powers: `pow` with a constant small exponent as multiplications (and `sqrt`),
so the vectorizer's code can still be lowered to LLVM.

Why: torch-mlir lowers `x ** 3`, `x.pow(2)` (tanh-GELU, RMSNorm, `var`, and every pow's
backward, which reads `x.pow(n - 1)`) to `math.fpowi`. The super-vectorizer makes it a
`math.fpowi` on `vector<8xf32>`, whose LLVM form (`llvm.intr.powi`) takes only a scalar
exponent: the LLVM conversion failed and the WHOLE kernel module fell back to scalar loops
(log: "vectorized loops refused ... using scalar loops"). Multiplications vectorize, and
cost less than a `pow` call anyway.

What becomes what (constant exponent `n`, `|n| <= max-exponent`; scalars and vectors):
- `n == 0` -> 1; `n == 1` -> x.
- `n` in {2, 3, -1, -2} -> `x*x`, `(x*x)*x`, `1/x`, `1/(x*x)` in the element type: bitwise
  what PyTorch's cpu kernel computes (it special-cases exactly these exponents).
- other `n` on f32: repeated squaring in f64, one division for `n < 0`, then rounded to
  f32: the correctly rounded power except for rare double roundings (PyTorch calls
  `pow`, within 1 ulp), never more than 1 ulp from it in the tests. On f64: repeated
  squaring in f64 (a few ulp for |n| >= 4; f64 has no wider type). f16/bf16 compute in f32.
- `math.powf` with a constant integer-valued exponent: as `fpowi`; 0.5 -> `sqrt(x)`,
  -0.5 -> `1/sqrt(x)` (PyTorch's cpu kernel runs `sqrt` and `1/sqrt` for these two:
  bitwise, including `(-0)^0.5 = -0` and `(-inf)^0.5 = nan` where `powf` would differ).
- `math.ipowi` with a constant `0 <= n <= max-exponent`: repeated squaring with `muli`
  (wraps the way PyTorch's integer pow does).
Anything else (a non-constant or large exponent) stays; the llvm stage unrolls what is
left on vectors into per-lane calls (`convert-math-to-funcs`), so it costs that op, not the
module's vectorization.
"""

import dataclasses

from torch_mlir import ir
from torch_mlir.dialects import arith, math

from camlir.dialects.ca.ir_helpers import ops_matching

from .base import CAPass

_NAMES = ("math.fpowi", "math.powf", "math.ipowi")


@dataclasses.dataclass(frozen=True)
class ExpandPowers(CAPass):
    """Expands pow by a constant small integer or by +-0.5 into multiplications and sqrt.

    `math.fpowi`, `math.ipowi` and `math.powf` whose exponent is a constant integer with
    `|n| <= max-exponent` become multiplications by repeated squaring (a division for
    `n < 0`); `powf` by 0.5 becomes `sqrt` and by -0.5 `1/sqrt`. Exponents 2, 3, -1, -2,
    0.5, -0.5 give exactly what PyTorch's cpu kernel computes; other f32 powers are computed
    in f64 and rounded once (correctly rounded but for rare double roundings). Scalars and
    vectors; other exponents are left alone. The cpu pipeline runs it on the kernels before
    vectorization: a `powi` on vectors has no LLVM form and made the whole module fall back
    to scalar loops.

    Before:
    ```mlir
    %c3 = arith.constant 3 : i64
    %y = math.fpowi %x, %c3 : f32, i64
    %h = arith.constant 5.000000e-01 : f32
    %r = math.powf %x, %h : f32
    ```
    After:
    ```mlir
    %0 = arith.mulf %x, %x : f32
    %y = arith.mulf %0, %x : f32
    %r = math.sqrt %x : f32
    ```
    """

    argument = "ca-expand-powers"
    summary = "Replace pow by a constant small integer (and +-0.5) by multiplications and sqrt"

    max_exponent: int = 16

    def run(self, module: ir.Operation) -> None:
        expand_powers(module, self.max_exponent)


def expand_powers(module, max_exponent: int = 16) -> int:
    """Rewrites every pow with a constant small exponent in `module`; returns how many."""
    count = 0
    for op in ops_matching(module, lambda op: op.name in _NAMES):
        exponent = _constant(op.operands[1])
        if exponent is None:
            continue
        with op.context, op.location, ir.InsertionPoint(op):
            value = _expand(op.name, op.operands[0], exponent, max_exponent)
        if value is None:
            continue
        op.results[0].replace_all_uses_with(value)
        op.erase()
        count += 1
    return count


def _constant(value):
    """The value of an `arith.constant` scalar or splat (int or float), else None."""
    owner = value.owner
    if not isinstance(owner, (ir.Operation, ir.OpView)) or owner.name != "arith.constant":
        return None
    attr = owner.attributes["value"]
    if isinstance(attr, ir.DenseElementsAttr):
        if not attr.is_splat:
            return None
        attr = attr.get_splat_value()
    if isinstance(attr, (ir.IntegerAttr, ir.FloatAttr)):
        return attr.value
    return None


def _expand(name: str, x, exponent, max_exponent: int):
    if name == "math.ipowi":
        if not (0 <= exponent <= max_exponent):
            return None  # negative integer powers: leave their semantics to math.ipowi
        return _int_power(x, exponent)
    if name == "math.powf":
        if exponent == 0.5:
            return math.sqrt(x)
        if exponent == -0.5:
            return arith.divf(_splat(x.type, 1.0), math.sqrt(x))
        if exponent != int(exponent):
            return None
        exponent = int(exponent)
    if abs(exponent) > max_exponent:
        return None
    return _float_power(x, exponent)


def _element_type(t):
    return t.element_type if isinstance(t, ir.VectorType) else t


def _with_element(t, element):
    return ir.VectorType.get(t.shape, element) if isinstance(t, ir.VectorType) else element


def _splat(t, number):
    element = _element_type(t)
    attr = ir.FloatAttr.get(element, number) if _is_float(element) else ir.IntegerAttr.get(element, number)
    if isinstance(t, ir.VectorType):
        attr = ir.DenseElementsAttr.get_splat(t, attr)
    return arith.constant(t, attr)


def _is_float(t) -> bool:
    return isinstance(t, (ir.F16Type, ir.BF16Type, ir.F32Type, ir.F64Type))


def _squarings(x, n: int, mul):
    """x^n for n >= 1 by repeated squaring, multiplying low bits first."""
    result, base = None, x
    while n:
        if n & 1:
            result = base if result is None else mul(result, base)
        n >>= 1
        if n:
            base = mul(base, base)
    return result


def _int_power(x, n: int):
    if n == 0:
        return _splat(x.type, 1)
    return _squarings(x, n, arith.muli)


def _float_power(x, n: int):
    t = x.type
    element = _element_type(t)
    if n == 0:
        return _splat(t, 1.0)
    if n == 1:
        return x
    if isinstance(element, (ir.F16Type, ir.BF16Type)):
        wide = _with_element(t, ir.F32Type.get())
        return arith.truncf(t, _float_power(arith.extf(wide, x), n))
    if n in (2, 3, -1, -2):  # PyTorch's own formulas, in the element type
        if n == -1:
            return arith.divf(_splat(t, 1.0), x)
        square = arith.mulf(x, x)
        if n == 2:
            return square
        if n == 3:
            return arith.mulf(square, x)
        return arith.divf(_splat(t, 1.0), square)
    wide_t = _with_element(t, ir.F64Type.get())
    wide = x if isinstance(element, ir.F64Type) else arith.extf(wide_t, x)
    power = _squarings(wide, abs(n), arith.mulf)
    if n < 0:
        power = arith.divf(_splat(wide_t, 1.0), power)
    return power if isinstance(element, ir.F64Type) else arith.truncf(t, power)
