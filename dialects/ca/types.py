"""Reading shapes and element types off the tensor types that `ca` ops carry.

`ca` ops sit at two levels: around torch-dialect bodies (`!torch.vtensor<[4,?],f32>`) and,
after lowering, around builtin tensors (`tensor<4x?xf32>`). The verifiers compare the two
kinds the same way, so they go through one reader. The torch types have no Python classes
in the wheel, so they are read from their printed form.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from torch_mlir import ir

_TORCH_TENSOR = re.compile(r"^!torch\.(v?tensor)(?:<(.*)>)?$")
_TORCH_DTYPES = {
    "f16": "f16", "bf16": "bf16", "f32": "f32", "f64": "f64",
    "si8": "i8", "ui8": "ui8", "si16": "i16", "si32": "i32", "si64": "i64", "i1": "i1",
}


@dataclass(frozen=True)
class TensorSig:
    """Rank-aware shape (None for a dynamic dim) and a normalised element type name."""

    shape: Optional[tuple]  # None when unranked
    dtype: Optional[str]  # None when unknown

    def compatible(self, other: "TensorSig") -> bool:
        if self.dtype and other.dtype and self.dtype != other.dtype:
            return False
        if self.shape is None or other.shape is None:
            return True
        if len(self.shape) != len(other.shape):
            return False
        return all(a is None or b is None or a == b for a, b in zip(self.shape, other.shape))


def tensor_sig(t: ir.Type) -> Optional[TensorSig]:
    """Returns the signature of a tensor-like type, or None if `t` is not a tensor."""
    if isinstance(t, ir.RankedTensorType):
        rt = ir.RankedTensorType(t)
        shape = tuple(None if rt.is_dynamic_dim(i) else rt.shape[i] for i in range(rt.rank))
        return TensorSig(shape, str(rt.element_type))
    if isinstance(t, ir.UnrankedTensorType):
        return TensorSig(None, str(ir.UnrankedTensorType(t).element_type))
    m = _TORCH_TENSOR.match(str(t))
    if not m:
        return None
    if m.group(2) is None:
        return TensorSig(None, None)
    body = m.group(2).strip()
    # `[4,?],f32`, `*,f32`, and with a sparse encoding after the dtype `[5,5],f32,#sparse`
    if body.startswith("*"):
        shape, rest = None, body[1:]
    elif body.startswith("[") and "]" in body:
        inner, rest = body[1:].split("]", 1)
        shape = tuple(None if d.strip() == "?" else int(d) for d in inner.split(",")) if inner.strip() else ()
    else:
        return TensorSig(None, None)
    dtype = _first_top_level_item(rest.lstrip(","))
    return TensorSig(shape, _TORCH_DTYPES.get(dtype, dtype) if dtype != "unk" else None)


def _first_top_level_item(text: str) -> str:
    """`complex<f32>,#enc` -> `complex<f32>`: up to the first comma outside angle brackets."""
    depth = 0
    for i, ch in enumerate(text):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "," and depth == 0:
            return text[:i].strip()
    return text.strip()


def is_tensor(t: ir.Type) -> bool:
    """Whether `t` is a builtin or torch tensor type (`tensor<4xf32>`, `!torch.vtensor<[4],f32>`,
    unranked ones included), i.e. whether `tensor_sig` can read it."""
    return tensor_sig(t) is not None


def types_compatible(a: ir.Type, b: ir.Type) -> bool:
    """Equal types, or two tensors whose known dims and element types agree."""
    if a == b:
        return True
    sa, sb = tensor_sig(a), tensor_sig(b)
    if sa is None or sb is None:
        return False
    return sa.compatible(sb)


_INTEGER_LIKE = ("!torch.int", "index")


def is_integer_like(t: ir.Type) -> bool:
    """Types a lifted size may have: `!torch.int`, `index` or a signless integer."""
    return str(t) in _INTEGER_LIKE or isinstance(t, ir.IntegerType)
