"""ca-depthwise-kernels: a depthwise convolution's backward as a kernel of two window loops."""

import dataclasses
import math

from torch_mlir import ir
from torch_mlir.dialects import func

from camlir.dialects.ca.ir_helpers import find_func, func_name, funcs, ops_named
from camlir.dialects.ca.types import tensor_sig

from .base import CAPass
from .lower_to_linalg import TWIN_ATTR, TWIN_SUFFIX

# Where torch's CPU kernel is slow: maps of at most 4x4 outputs (the late layers of a mobile
# network). Per layer of MobileNetV3-small (batch 8, 1 thread, backward alone, eager against
# these loops): 576 channels at 2x2 with 5x5 taps 1.58 ms against 0.55; 240 at 4x4 1.20
# against 0.74; 96 at 8x8 -> 4x4 (stride 2) 0.64 against 0.54. On larger maps torch's
# kernel wins: 88 at 8x8 0.28 against 0.38-0.43 ms.
MAX_OUTPUT_POSITIONS = 16
MAX_TAPS = 64  # 7x7 (ConvNeXt) is 49
_ELEMENT = {"f32": "f32", "f64": "f64"}


@dataclasses.dataclass(frozen=True)
class DepthwiseKernels(CAPass):
    """Replaces each host `torch.aten.convolution_backward` of a depthwise convolution
    (groups = input channels = output channels, static shapes, f32/f64, not transposed,
    padding within the kernel's reach, dilation 1 along the last dim, at most
    `MAX_TAPS` taps and `MAX_OUTPUT_POSITIONS` output positions) by a call of a new
    `ca.kernel` holding its gradients as `linalg.generic` window loops:

    - input: `grad_y` placed (strided) into a zero tensor of extent `(k-1)*d + H` per spatial
      dim, then `gx[n,c,h] += g[n,c,h + (k-1-t)*d] * w[c,t]` over the taps `t`;
    - weight: `gw[c,t] += grad_y[n,c,o] * pad(x)[n,c,o*s + t*d]` over `n` and the outputs `o`;
    - bias: `gb[c] += grad_y[n,c,o]`.

    Torch's CPU kernel for it is slow on small maps (0.5-1.6 ms per MobileNet layer where
    these loops take a third to a half), and torch-mlir has no lowering for a grouped
    `convolution_backward`. With `twins=true` the op itself stays as the kernel's torch twin
    (`@<kernel>__torch`, as ca-lower-to-linalg keeps them), so the cpu runtime measures the
    loops against torch's kernel on the real inputs and runs the faster. The loop order
    keeps the vectorizer right: the innermost loop
    is a parallel dim read and written with unit steps (the last spatial dim for the input,
    the last tap dim for the weight, the channels for the bias), never a reduction, whose
    partial vectors it would sum past the loop's end.

    Before:
    ```mlir
    %r:3 = torch.aten.convolution_backward %gy, %x, %w, ... {ca.host} : ... -> !torch.vtensor<[2,8,4,4],f32>, !torch.vtensor<[8,1,3,3],f32>, !torch.none
    ```
    After:
    ```mlir
    %0 = torch_c.to_builtin_tensor %gy ...
    %k:2 = call @backward_kernel_3(%0, %1, %2) : (...) -> (tensor<2x8x4x4xf32>, tensor<8x1x3x3xf32>)
    %gx = torch_c.from_builtin_tensor %k#0 ...
    func.func private @backward_kernel_3(...) attributes {ca.kernel} {
      ... linalg.generic {iterator_types = ["parallel", "parallel", "parallel", "reduction", "reduction", "parallel"]} ...
    }
    ```
    """

    argument = "ca-depthwise-kernels"
    summary = "Depthwise convolution backwards on small maps as kernels of window loops"

    function: str = "backward"
    twins: bool = False

    def run(self, module: ir.Operation) -> None:
        host = find_func(module, self.function)
        if host is None:
            return
        for op in ops_named(host, "torch.aten.convolution_backward"):
            plan = _plan(op)
            if plan is not None:
                _replace(module, host, op, plan, self.twins)


@dataclasses.dataclass
class _Plan:
    n: int
    c: int
    spatial: list      # input extents
    outputs: list      # output extents
    kernel: list
    stride: list
    padding: list
    dilation: list
    mask: list
    element: str


def _constant(value: ir.Value):
    owner = value.owner
    if not isinstance(owner, ir.OpView):
        return None
    op = owner.operation
    if op.name in ("torch.constant.int", "torch.constant.bool"):
        attr = op.attributes["value"]
        return bool(ir.BoolAttr(attr).value) if op.name == "torch.constant.bool" else ir.IntegerAttr(attr).value
    if op.name == "torch.constant.none":
        return ()
    if op.name == "torch.prim.ListConstruct":
        items = [_constant(v) for v in op.operands]
        return None if any(i is None for i in items) else items
    return None


def _plan(op: ir.Operation):
    if len(op.operands) != 11:
        return None
    gy, x, w = (tensor_sig(v.type) for v in op.operands[:3])
    consts = [_constant(v) for v in op.operands[3:]]
    if None in (gy, x, w) or any(c is None for c in consts):
        return None
    _bias, stride, padding, dilation, transposed, _out_pad, groups, mask = consts
    if any(s is None or s.shape is None or None in s.shape for s in (gy, x, w)):
        return None
    element = _ELEMENT.get(x.dtype)
    spatial = len(x.shape) - 2
    if element is None or gy.dtype != x.dtype or w.dtype != x.dtype or transposed or spatial not in (1, 2, 3):
        return None
    n, c = x.shape[:2]
    if groups != c or tuple(w.shape[:2]) != (c, 1) or gy.shape[:2] != (n, c):
        return None
    per_dim = []
    for v in (stride, padding, dilation):
        v = list(v) * spatial if len(v) == 1 else list(v)
        if len(v) != spatial or any(type(i) is not int or i < 0 for i in v):
            return None
        per_dim.append(v)
    stride, padding, dilation = per_dim
    kernel, outputs = list(w.shape[2:]), list(gy.shape[2:])
    if (math.prod(outputs) > MAX_OUTPUT_POSITIONS or math.prod(kernel) > MAX_TAPS or dilation[-1] != 1
            or 0 in stride or 0 in dilation or any(p > (k - 1) * d for p, k, d in zip(padding, kernel, dilation))
            or 0 in x.shape or 0 in gy.shape):
        return None
    return _Plan(n, c, list(x.shape[2:]), outputs, kernel, stride, padding, dilation, [bool(m) for m in mask],
                 element)


def _t(shape, element) -> str:
    return "tensor<" + "x".join(str(s) for s in shape) + ("x" if shape else "") + element + ">"


def _kernel_text(name: str, p: _Plan) -> tuple:
    """The kernel as MLIR text, and its result types (builtin tensors)."""
    e, D = p.element, len(p.spatial)
    gy_t, x_t, w_t = _t([p.n, p.c] + p.outputs, e), _t([p.n, p.c] + p.spatial, e), _t([p.c, 1] + p.kernel, e)
    wc_t = _t([p.c] + p.kernel, e)
    lines = [f"func.func private @{name}(%gy: {gy_t}, %x: {x_t}, %w: {w_t}) -> (RESULTS) attributes {{ca.kernel}} {{",
             f"  %zero = arith.constant 0.0 : {e}"]
    results, types = [], []
    collapse = "[[0, 1]" + "".join(f", [{i + 2}]" for i in range(D)) + "]"
    body = (f"^bb0(%a: {e}, %b: {e}, %o: {e}):\n    %m = arith.mulf %a, %b : {e}\n"
            f"    %s = arith.addf %o, %m : {e}\n    linalg.yield %s : {e}\n  }}")
    if p.mask[0]:
        lefts = [(k - 1) * d - q for k, d, q in zip(p.kernel, p.dilation, p.padding)]
        extents = [(k - 1) * d + h for k, d, h in zip(p.kernel, p.dilation, p.spatial)]
        g_t = _t([p.n, p.c] + extents, e)
        offsets = ", ".join(["0", "0"] + [str(v) for v in lefts])
        sizes = ", ".join(str(v) for v in [p.n, p.c] + p.outputs)
        strides = ", ".join(["1", "1"] + [str(s) for s in p.stride])
        # dims: n, c, h_0..h_{D-2}, t_0..t_{D-1}, h_{D-1} (innermost: unit steps, parallel)
        h = [f"d{2 + a}" for a in range(D - 1)] + [f"d{2 + 2 * D - 1}"]
        t = [f"d{1 + D + a}" for a in range(D)]
        dims = ", ".join(f"d{i}" for i in range(2 + 2 * D))
        g_map = ", ".join(["d0", "d1"] + [f"{h[a]} + {(p.kernel[a] - 1) * p.dilation[a]} - {t[a]} * {p.dilation[a]}"
                                          for a in range(D)])
        iters = ", ".join(['"parallel"'] * (1 + D) + ['"reduction"'] * D + ['"parallel"'])
        out_t = x_t
        lines += [
            f"  %ge = tensor.empty() : {g_t}",
            f"  %gz = linalg.fill ins(%zero : {e}) outs(%ge : {g_t}) -> {g_t}",
            f"  %g = tensor.insert_slice %gy into %gz[{offsets}] [{sizes}] [{strides}] : {gy_t} into {g_t}",
            f"  %wc = tensor.collapse_shape %w {collapse} : {w_t} into {wc_t}",
            f"  %xe = tensor.empty() : {out_t}",
            f"  %xz = linalg.fill ins(%zero : {e}) outs(%xe : {out_t}) -> {out_t}",
            f"  %gx = linalg.generic {{indexing_maps = [affine_map<({dims}) -> ({g_map})>, "
            f"affine_map<({dims}) -> (d1, {', '.join(t)})>, affine_map<({dims}) -> (d0, d1, {', '.join(h)})>], "
            f"iterator_types = [{iters}]}} ins(%g, %wc : {g_t}, {wc_t}) outs(%xz : {out_t}) {{",
            "  " + body + f" -> {out_t}"]
        results.append("%gx")
        types.append(out_t)
    if p.mask[1]:
        pad = ", ".join(["0", "0"] + [str(q) for q in p.padding])
        xp_t = _t([p.n, p.c] + [h + 2 * q for h, q in zip(p.spatial, p.padding)], e)
        # dims: c, t_0..t_{D-2}, n, o_0..o_{D-1}, t_{D-1} (innermost: unit steps, parallel)
        t = [f"d{1 + a}" for a in range(D - 1)] + [f"d{2 * D + 1}"]
        nd = f"d{D}"
        o = [f"d{D + 1 + a}" for a in range(D)]
        dims = ", ".join(f"d{i}" for i in range(2 * D + 2))
        x_map = ", ".join([nd, "d0"] + [f"{o[a]} * {p.stride[a]} + {t[a]} * {p.dilation[a]}" for a in range(D)])
        iters = ", ".join(['"parallel"'] * D + ['"reduction"'] * (1 + D) + ['"parallel"'])
        lines += [
            f"  %xp = tensor.pad %x low[{pad}] high[{pad}] {{",
            "  ^bb0(" + ", ".join(f"%i{i}: index" for i in range(D + 2)) + "):",
            f"    tensor.yield %zero : {e}",
            f"  }} : {x_t} to {xp_t}",
            f"  %we = tensor.empty() : {wc_t}",
            f"  %wz = linalg.fill ins(%zero : {e}) outs(%we : {wc_t}) -> {wc_t}",
            f"  %gwc = linalg.generic {{indexing_maps = [affine_map<({dims}) -> ({nd}, d0, {', '.join(o)})>, "
            f"affine_map<({dims}) -> ({x_map})>, affine_map<({dims}) -> (d0, {', '.join(t)})>], "
            f"iterator_types = [{iters}]}} ins(%gy, %xp : {gy_t}, {xp_t}) outs(%wz : {wc_t}) {{",
            "  " + body + f" -> {wc_t}",
            f"  %gw = tensor.expand_shape %gwc {collapse} output_shape "
            f"[{', '.join(str(v) for v in [p.c, 1] + p.kernel)}] : {wc_t} into {w_t}"]
        results.append("%gw")
        types.append(w_t)
    if p.mask[2]:
        b_t = _t([p.c], e)
        # dims: n, o_0..o_{D-1}, c (innermost: the channels, parallel)
        dims = ", ".join(f"d{i}" for i in range(D + 2))
        c = f"d{D + 1}"
        iters = ", ".join(['"reduction"'] * (1 + D) + ['"parallel"'])
        lines += [
            f"  %be = tensor.empty() : {b_t}",
            f"  %bz = linalg.fill ins(%zero : {e}) outs(%be : {b_t}) -> {b_t}",
            f"  %gb = linalg.generic {{indexing_maps = [affine_map<({dims}) -> "
            f"(d0, {c}, {', '.join(f'd{1 + a}' for a in range(D))})>, affine_map<({dims}) -> ({c})>], "
            f"iterator_types = [{iters}]}} ins(%gy : {gy_t}) outs(%bz : {b_t}) {{",
            f"  ^bb0(%a: {e}, %o: {e}):\n    %s = arith.addf %o, %a : {e}\n    linalg.yield %s : {e}\n  }} -> {b_t}"]
        results.append("%gb")
        types.append(b_t)
    lines += [f"  return {', '.join(results)} : {', '.join(types)}", "}"]
    return "\n".join(lines).replace("RESULTS", ", ".join(types)), types


def _replace(module: ir.Operation, host: ir.Operation, op: ir.Operation, plan: _Plan, twins: bool) -> None:
    prefix = f"{func_name(host)}_kernel_"
    taken = [func_name(fn)[len(prefix):] for fn in funcs(module) if func_name(fn).startswith(prefix)]
    name = f"{prefix}{1 + max((int(t) for t in taken if t.isdigit()), default=-1)}"
    text, types = _kernel_text(name, plan)
    context = module.context
    parsed = ir.Module.parse(text, context)
    parsed.body.operations[0].clone(ir.InsertionPoint(module.regions[0].blocks[0]))
    if twins:
        _add_twin(module, op, name, plan.mask)
    with context, op.location, ir.InsertionPoint(op):
        args = [ir.Operation.create("torch_c.to_builtin_tensor", results=[ir.Type.parse(_builtin(v.type), context)],
                                    operands=[v]).results[0] for v in op.operands[:3]]
        call = func.CallOp([ir.Type.parse(t, context) for t in types], ir.FlatSymbolRefAttr.get(name), args)
        produced = iter(call.results)
        for result, wanted in zip(op.results, plan.mask):
            if wanted:
                back = ir.Operation.create("torch_c.from_builtin_tensor", results=[result.type],
                                           operands=[next(produced)]).results[0]
            else:
                back = ir.Operation.create("torch.constant.none", results=[result.type]).results[0]
            result.replace_all_uses_with(back)
    op.erase()


def _add_twin(module: ir.Operation, op: ir.Operation, name: str, mask: list) -> None:
    """`@<name>__torch`: the op itself, its constant operands cloned in, on the kernel's
    three tensors, returning the gradients the kernel returns."""
    arg_types = [v.type for v in op.operands[:3]]
    result_types = [r.type for r, wanted in zip(op.results, mask) if wanted]
    with module.context, op.location:
        twin = func.FuncOp(name + TWIN_SUFFIX, (arg_types, result_types), visibility="private",
                           ip=ir.InsertionPoint(module.regions[0].blocks[0]))
        twin.operation.attributes[TWIN_ATTR] = ir.StringAttr.get(name)
        block = twin.add_entry_block()
        mapping = dict(zip(list(op.operands[:3]), list(block.arguments)))
        with ir.InsertionPoint(block):
            for value in op.operands[3:]:
                _clone_constant(value, mapping)
            copy = op.clone()
            for i, v in enumerate(list(copy.operands)):
                copy.operands[i] = mapping[v]
            if "ca.host" in copy.attributes:
                del copy.attributes["ca.host"]
            func.ReturnOp([r for r, wanted in zip(copy.results, mask) if wanted])


def _clone_constant(value: ir.Value, mapping: dict) -> None:
    """Clones the constant (or list of constants) making `value`, its operands first."""
    if value in mapping:
        return
    owner = value.owner.operation
    for v in owner.operands:
        _clone_constant(v, mapping)
    copy = owner.clone()
    for i, v in enumerate(list(copy.operands)):
        copy.operands[i] = mapping[v]
    mapping[value] = copy.results[0]


def _builtin(t: ir.Type) -> str:
    sig = tensor_sig(t)
    return _t(list(sig.shape), _ELEMENT[sig.dtype])
