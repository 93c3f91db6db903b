"""ca-bf16-matmuls: a matmul of two bf16 tensors widened to f32 reads the bf16 tensors
themselves, so that the BLAS stage calls MKL's bf16 GEMM (f32 accumulation and result).

Why: under `torch.autocast("cpu", dtype=torch.bfloat16)` a backward's matmuls are bf16
GEMMs; eager PyTorch runs them through oneDNN, with the CPU's bf16 units (AMX on this
Sapphire Rapids Xeon). The lowering widens both operands to f32 (a conversion pass over each)
and camlir called `sgemm_`: GPT2-bf16's backward spent 4.4 ms in sgemm where eager's whole
backward took 6.2 ms. MKL's `gemm_bf16bf16f32_` on the same shapes, one thread: 44 us
against sgemm's 214 (256 x 512 x 128), 102 against 425 (256 x 1000 x 128); PyTorch's bf16
`mm` 60 and 94. Products of two bf16 values are exact in f32 and both accumulate in f32, so
the result differs from sgemm on the widened operands only in the order of additions.

The cpu backend runs it (math stage) only where the CPU has bf16 units (`avx512_bf16` or
`amx_bf16`: `jit.native_bf16_gemm`); elsewhere MKL would emulate them, and sgemm stays.
"""

import dataclasses

from torch_mlir import ir

from camlir.dialects.ca.ir_helpers import funcs, is_kernel, ops_named

from .base import CAPass
from .fuse_elementwise import contraction_maps
from .lazy_dialects import linalg


@dataclasses.dataclass(frozen=True)
class Bf16Matmuls(CAPass):
    """In the `ca.kernel` functions, a 2-D `linalg.matmul` on tensors with an f32 result
    whose two inputs are each a widening `linalg.generic` (one bf16 input, identity maps,
    body `arith.extf` to f32 only) reads those bf16 inputs instead; a widening left without
    users is erased. A bf16 transpose behind a widening becomes a transposed indexing map
    (the GEMM reads either order). `ca-matmul-to-blas` then calls `gemm_bf16bf16f32_`. A matmul with one
    bf16 operand, or a batched one (MKL has no bf16 batch GEMM), is left as it is.

    Before:
    ```mlir
    %wa = linalg.generic {indexing_maps = [#id, #id], ...} ins(%a : tensor<4x3xbf16>) outs(%ea : tensor<4x3xf32>) {
    ^bb0(%in: bf16, %out: f32):
      %0 = arith.extf %in : bf16 to f32
      linalg.yield %0 : f32
    } -> tensor<4x3xf32>
    %wb = linalg.generic ... ins(%b : tensor<3x5xbf16>) outs(%eb : tensor<3x5xf32>) ...
    %c = linalg.matmul ins(%wa, %wb : tensor<4x3xf32>, tensor<3x5xf32>) outs(%z : tensor<4x5xf32>) -> tensor<4x5xf32>
    ```
    After:
    ```mlir
    %c = linalg.matmul ins(%a, %b : tensor<4x3xbf16>, tensor<3x5xbf16>) outs(%z : tensor<4x5xf32>) -> tensor<4x5xf32>
    ```
    """

    argument = "ca-bf16-matmuls"
    summary = "Matmuls of bf16 tensors widened to f32 read the bf16 tensors (for MKL's bf16 GEMM)"

    def run(self, module: ir.Operation) -> None:
        bf16_matmuls(module)


def bf16_matmuls(module: ir.Operation) -> int:
    """Rewrites every such matmul in the kernels of `module`; returns how many."""
    count = 0
    for fn in funcs(module, is_kernel):
        for op in list(ops_named(fn, "linalg.matmul")):
            if len(op.results) != 1 or not isinstance(op.results[0].type, ir.RankedTensorType):
                continue
            if str(ir.RankedTensorType(op.results[0].type).element_type) != "f32":
                continue
            sources = [_widened_bf16(op.operands[i]) for i in (0, 1)]
            if any(s is None for s in sources):
                continue
            widenings = [op.operands[0].owner.operation, op.operands[1].owner.operation]
            maps = contraction_maps(op)
            for i in (0, 1):
                # a bf16 transpose behind the widening: a transposed map instead (the GEMM
                # reads either order), as ca-fuse-elementwise folds f32 transposes
                untransposed = _transpose_source(sources[i])
                if untransposed is not None:
                    sources[i] = untransposed
                    maps[i] = _swap_results(maps[i])
            with op.context, op.location, ir.InsertionPoint(op):
                new = linalg.matmul(sources[0], sources[1], outs=[op.operands[2]], indexing_maps=maps)
            if "ca.alpha" in op.attributes:
                new.owner.attributes["ca.alpha"] = op.attributes["ca.alpha"]
            op.results[0].replace_all_uses_with(new)
            op.erase()
            for w in widenings:
                _erase_if_unused(w)
            count += 1
    return count


def _erase_if_unused(op) -> None:
    if any(True for r in op.results for _ in r.uses):
        return
    inputs = [v.owner.operation for v in op.operands if isinstance(v.owner, ir.OpView)]
    op.erase()
    for producer in inputs:  # a transpose that fed only the widening
        if producer.name in ("linalg.transpose", "linalg.generic"):
            _erase_if_unused(producer)


def _swap_results(m):
    exprs = list(m.results)
    return ir.AffineMap.get(m.n_dims, m.n_symbols, [exprs[1], exprs[0]])


def _transpose_source(value):
    """`x` where `value` is a 2-D transpose of `x` (`linalg.transpose` [1, 0], or a copy
    generic reading through `(d0, d1) -> (d1, d0)`), else None."""
    owner = value.owner
    if not isinstance(owner, ir.OpView):
        return None
    op = owner.operation
    if op.name == "linalg.transpose":
        perm = str(op.attributes["permutation"])
        return op.operands[0] if perm.replace(" ", "") == "array<i64:1,0>" else None
    if op.name != "linalg.generic" or len(op.operands) != 2 or len(op.results) != 1:
        return None
    maps = [str(ir.AffineMapAttr(m).value) for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    if maps != ["(d0, d1) -> (d1, d0)", "(d0, d1) -> (d0, d1)"]:
        return None
    body = [o.operation for o in op.regions[0].blocks[0].operations]
    block = op.regions[0].blocks[0]
    if len(body) != 1 or body[0].name != "linalg.yield" or body[0].operands[0] != block.arguments[0]:
        return None
    return op.operands[0]


def _widened_bf16(value):
    """The bf16 tensor `value` widens, when `value` is an identity `extf` generic of one."""
    owner = value.owner
    if not isinstance(owner, (ir.Operation, ir.OpView)) or owner.operation.name != "linalg.generic":
        return None
    g = owner.operation
    if len(g.operands) != 2 or len(g.results) != 1:
        return None
    source = g.operands[0]
    if not isinstance(source.type, ir.RankedTensorType):
        return None
    src_type = ir.RankedTensorType(source.type)
    if str(src_type.element_type) != "bf16" or src_type.shape != ir.RankedTensorType(value.type).shape:
        return None
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(g.attributes["indexing_maps"])]
    identity = str(ir.AffineMap.get_identity(src_type.rank, g.context))
    if any(str(m) != identity for m in maps):
        return None
    body = [op.operation for op in g.regions[0].blocks[0].operations]
    block = g.regions[0].blocks[0]
    if (len(body) != 2 or body[0].name != "arith.extf" or body[1].name != "linalg.yield"
            or body[0].operands[0] != block.arguments[0] or body[1].operands[0] != body[0].results[0]):
        return None
    return source
