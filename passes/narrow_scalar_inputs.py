"""ca-narrow-scalar-inputs: a 0-d f64 input that a generic only rounds to f32 is rounded once,
before the loop, so no f64 vector is made.

Why: PyTorch saves a Python float a backward needs as a 0-d float64 tensor (`scores /
math.sqrt(d)` in Hugging Face BERT's attention: `DivBackward0` keeps the divisor). The
kernel reads it in a loop over f32 data as `arith.truncf %s : f64 to f32`, which the
vectorizer turns into a broadcast to `vector<16xf64>` (two registers) and a truncation
per vector, in every iteration. Rounded once before the loop, the body is f32 (or bf16
under autocast) only. (The 8 lanes BERT's whole kernel module ran at came from the cpu
compiler counting its 0-d f64 buffer as f64 data, `loops_and_llvm`: fixed there.)
"""

import dataclasses

from torch_mlir import ir
from torch_mlir.dialects import arith, tensor

from camlir.dialects.ca.ir_helpers import funcs, is_kernel, ops_named

from .base import CAPass
from .lazy_dialects import linalg


@dataclasses.dataclass(frozen=True)
class NarrowScalarInputs(CAPass):
    """In the `ca.kernel` functions, a `linalg.generic` input of type `tensor<f64>`, read
    through a map with no results, whose block argument is used only by `arith.truncf`s to
    one type (f32, bf16 or f16), is replaced by a tensor of that type made by a 0-d generic
    that does the truncation once; the body reads the narrow value directly. Same bits (the same
    rounding, once instead of per element).

    Before:
    ```mlir
    %r = linalg.generic {indexing_maps = [#id, #scalar, #id], ...}
        ins(%x, %s : tensor<8xf32>, tensor<f64>) outs(%e : tensor<8xf32>) {
    ^bb0(%in: f32, %d: f64, %out: f32):
      %0 = arith.truncf %d : f64 to f32
      %1 = arith.divf %in, %0 : f32
      linalg.yield %1 : f32
    } -> tensor<8xf32>
    ```
    After:
    ```mlir
    %n = linalg.generic {indexing_maps = [affine_map<() -> ()>, affine_map<() -> ()>], iterator_types = []}
        ins(%s : tensor<f64>) outs(%e0 : tensor<f32>) {
    ^bb0(%d: f64, %out: f32):
      %0 = arith.truncf %d : f64 to f32
      linalg.yield %0 : f32
    } -> tensor<f32>
    %r = linalg.generic {indexing_maps = [#id, #scalar, #id], ...}
        ins(%x, %n : tensor<8xf32>, tensor<f32>) outs(%e : tensor<8xf32>) {
    ^bb0(%in: f32, %d: f32, %out: f32):
      %1 = arith.divf %in, %d : f32
      linalg.yield %1 : f32
    } -> tensor<8xf32>
    ```
    """

    argument = "ca-narrow-scalar-inputs"
    summary = "0-d f64 inputs that a generic only rounds to f32 are rounded once, before the loop"

    def run(self, module: ir.Operation) -> None:
        narrow_scalar_inputs(module)


def narrow_scalar_inputs(module: ir.Operation) -> int:
    """Rewrites every such input in the kernels of `module`; returns how many."""
    count = 0
    narrowed: dict = {}  # (function, the f64 value) -> its f32 tensor, made once per function
    for fn in funcs(module, is_kernel):
        for g in ops_named(fn, "linalg.generic"):
            count += _narrow(g, fn, narrowed)
    return count


def _narrow(g, fn, narrowed: dict) -> int:
    if any(not isinstance(r.type, ir.RankedTensorType) for r in g.results):
        return 0
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(g.attributes["indexing_maps"])]
    n_in = len(g.operands) - len(g.results)
    block = g.regions[0].blocks[0]
    f64 = ir.F64Type.get(g.context)
    done = 0
    for i in range(n_in):
        value = g.operands[i]
        if str(value.type) != "tensor<f64>" or len(maps[i].results) != 0:
            continue
        arg = block.arguments[i]
        uses = list(arg.uses)
        if not uses or any(u.owner.name != "arith.truncf" for u in uses):
            continue
        narrow = {str(u.owner.results[0].type) for u in uses}
        if len(narrow) != 1 or next(iter(narrow)) not in _NARROW:
            continue
        to = _NARROW[next(iter(narrow))](g.context)
        key = (str(fn.operation.attributes["sym_name"]), value, str(to))
        small = _lookup(narrowed, key)
        if small is None:
            small = _truncated(value, g, to, f64)
            narrowed[key] = small
        g.operands[i] = small
        arg.set_type(to)
        for use in uses:
            truncf = use.owner
            truncf.results[0].replace_all_uses_with(arg)
            truncf.erase()
        done += 1
    return done


def _lookup(narrowed: dict, key):
    for (name, value, to), small in narrowed.items():
        if name == key[0] and value == key[1] and to == key[2]:
            return small
    return None


# What a 0-d f64 input may be rounded to once (an autocast region's scalars round to bf16).
_NARROW = {"f32": ir.F32Type.get, "bf16": ir.BF16Type.get, "f16": ir.F16Type.get}


def _truncated(value, before, to, f64) -> ir.Value:
    """A 0-d generic computing `truncf(value)`: at the function's start for a kernel
    argument, else just before `before`, so every later generic of the function may read it."""
    owner = value.owner
    if isinstance(owner, (ir.Operation, ir.OpView)):
        point = ir.InsertionPoint(before)  # later generics of the function come after it
    else:
        point = ir.InsertionPoint.at_block_begin(owner)  # a kernel argument
    empty_map = ir.AffineMap.get(0, 0, [])
    with before.context, before.location, point:
        init = tensor.EmptyOp([], to)
        op = linalg.GenericOp([ir.RankedTensorType.get([], to)], [value], [init.result],
                              ir.ArrayAttr.get([ir.AffineMapAttr.get(empty_map)] * 2), ir.ArrayAttr.get([]))
        body = op.regions[0].blocks.append(f64, to)
        with ir.InsertionPoint(body):
            linalg.YieldOp([arith.TruncFOp(to, body.arguments[0]).result])
    return op.results[0]
