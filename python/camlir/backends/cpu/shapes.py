"""Output shapes of kernels with dynamic dims, computed per call in a few microseconds.

A kernel compiled with `?` dims (`Variant(runtime_sizes=True)`) takes its results
as out-parameters that the runtime allocates with torch, so the runtime must know each
result's shape before the call. The shapes are derived from the kernel itself, the MLIR
way, while it is still linalg on tensors:

1. the kernel is cloned and made to return, instead of its results, the `tensor.dim` of
   every dynamic dim of every result (`index` values);
2. `resolve-ranked-shaped-type-result-dims` rewrites each `tensor.dim` of an op's result
   into the dims of its operands (a `linalg.generic`'s result dim is its init's, a
   `tensor.empty`'s is its size operand, ...), then `canonicalize`/`cse` drop the compute,
   now dead, and `lower-affine` turns the `affine.apply`s the resolution may leave into
   `arith` ops;
3. what remains is a handful of `arith` ops on `tensor.dim`s of the arguments and on the
   kernel's scalar arguments (lifted sizes), plus the `cf.assert`s the lowering wrote for
   its size checks. That is translated into a small Python function
   (`shape(a0, a1, ...) -> ((d0, d1), ...)`), compiled once with `exec`.

Why Python and not a compiled function next to the kernels: a call costs ~1-3 us either
way (a ctypes call alone is ~1 us, and the result would still have to be read into Python
to build the `torch.empty` calls), and Python needs no extra ABI. Why not re-derive the
shapes from the aten graph (torch's meta functions): that is 10-100 us per op per call.

The asserts are evaluated too: a size mismatch that the kernel's `cf.assert` would turn
into an `abort()` of the whole process raises `ShapeError` in Python instead. A result dim
that depends on anything else (data, an op the resolution cannot see through) makes
`derive` raise `ShapeError` at compile time: the caller refuses dynamic compilation.
"""

from torch_mlir import ir

from camlir.dialects.ca.ir_helpers import func_name
from camlir.passes import build_pass_manager, parse_pipeline


class ShapeError(RuntimeError):
    """A kernel's result shapes cannot be derived (at compile time), or a size check of the
    kernel fails (at run time)."""


_PASSES = ("builtin.module(resolve-ranked-shaped-type-result-dims,canonicalize,cse,"
           "lower-affine,canonicalize,cse)")

_BINARY = {
    "arith.addi": "({a} + {b})", "arith.subi": "({a} - {b})", "arith.muli": "({a} * {b})",
    "arith.divsi": "_divsi({a}, {b})", "arith.divui": "({a} // {b})",
    "arith.floordivsi": "({a} // {b})", "arith.ceildivsi": "(-((-{a}) // {b}))",
    "arith.ceildivui": "(-((-{a}) // {b}))",
    "arith.remsi": "_remsi({a}, {b})", "arith.remui": "({a} % {b})",
    "arith.maxsi": "max({a}, {b})", "arith.minsi": "min({a}, {b})",
    "arith.maxui": "max({a}, {b})", "arith.minui": "min({a}, {b})",
    "arith.andi": "({a} & {b})", "arith.ori": "({a} | {b})", "arith.xori": "({a} ^ {b})",
    "arith.shli": "({a} << {b})", "arith.shrsi": "({a} >> {b})", "arith.shrui": "({a} >> {b})",
}
_CASTS = ("arith.index_cast", "arith.index_castui", "arith.extsi", "arith.extui")
# arith.cmpi predicates by their enum value (mlir/Dialect/Arith/IR/ArithBase.td).
_CMPI = {0: "==", 1: "!=", 2: "<", 3: "<=", 4: ">", 5: ">=", 6: "<", 7: "<=", 8: ">", 9: ">="}


def _divsi(a, b):
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _remsi(a, b):
    return a - b * _divsi(a, b)


class ShapeFunction:
    """`fn(*kernel_args) -> tuple of result shapes` for one kernel. `source` is the
    generated Python (for logs and tests)."""

    def __init__(self, source: str, name: str):
        self.source = source
        scope = {"_divsi": _divsi, "_remsi": _remsi, "ShapeError": ShapeError}
        exec(compile(source, f"<shape function of {name}>", "exec"), scope)  # noqa: S102 - our own code
        self._fn = scope["shape"]

    def __call__(self, *args):
        return self._fn(*args)


def derive(kernel: ir.Operation) -> ShapeFunction:
    """The shape function of a linalg-on-tensors kernel (`func.func`, not changed)."""
    name = func_name(kernel)
    ftype = ir.FunctionType(ir.TypeAttr(kernel.attributes["function_type"]).value)
    # Per result, per dim: the static size, or None for a dynamic one.
    layout = []
    for t in ftype.results:
        t = ir.RankedTensorType(t)
        layout.append([None if t.is_dynamic_dim(d) else size for d, size in enumerate(t.shape)])
    lines, returned = [], []
    if any(None in dims for dims in layout):
        scratch = _resolved_dims(kernel, layout)  # keeps the function alive while translating
        lines, returned = _translate(scratch.body.operations[0], name)
    values = iter(returned)
    shapes = ["(" + "".join((str(d) if d is not None else next(values)) + ", " for d in dims) + ")"
              for dims in layout]
    source = [f"def shape({', '.join(f'a{i}' for i in range(len(ftype.inputs)))}):"]
    source += ["    " + line for line in lines]
    source.append("    return (" + "".join(s + ", " for s in shapes) + ")")
    return ShapeFunction("\n".join(source) + "\n", name)


def _resolved_dims(kernel: ir.Operation, layout: list) -> ir.Module:
    """A scratch module holding a clone of `kernel` that returns the dynamic dims of its
    results (in order), resolved down to the arguments."""
    context = kernel.context
    with context, ir.Location.unknown():
        scratch = ir.Module.create()
        fn = kernel.clone(ir.InsertionPoint(scratch.body))
        fn.attributes["sym_visibility"] = ir.StringAttr.get("public")
        block = fn.regions[0].blocks[0]
        ret = list(block.operations)[-1].operation
        index = ir.IndexType.get()
        dims = []
        with ir.InsertionPoint(ret):
            for value, layout_dims in zip(list(ret.operands), layout):
                for d, size in enumerate(layout_dims):
                    if size is None:
                        c = ir.Operation.create("arith.constant", results=[index],
                                                attributes={"value": ir.IntegerAttr.get(index, d)}).results[0]
                        dims.append(ir.Operation.create("tensor.dim", results=[index],
                                                        operands=[value, c]).results[0])
            ir.Operation.create("func.return", operands=dims)
        ret.erase()
        fn.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get([a.type for a in block.arguments], [index] * len(dims)))
        try:
            pm = build_pass_manager(parse_pipeline(_PASSES), context)
            pm.run(scratch.operation)
        except (ir.MLIRError, ValueError) as exc:
            raise ShapeError(f"its result shapes do not resolve: {exc}") from exc
    return scratch


def _translate(fn: ir.Operation, name: str) -> tuple:
    """(Python lines, expressions of the returned values) for the resolved function `fn`:
    only the ops the returned values and the translatable asserts read. An assert whose
    condition cannot be translated is left to the kernel; a returned value that cannot be
    is a `ShapeError`."""
    block = fn.regions[0].blocks[0]
    ops = [op.operation for op in block.operations]
    ret = ops[-1]
    names = {arg: f"a{i}" for i, arg in enumerate(block.arguments)}
    ok_cache = {}

    def ok(v) -> bool:
        if not isinstance(v.owner, ir.OpView):
            return True  # an argument
        op = v.owner.operation
        key = op  # ir.Operation hashes by identity of the underlying op
        if key not in ok_cache:
            ok_cache[key] = _expressible(op) and all(ok(x) for x in op.operands)
        return ok_cache[key]

    for v in ret.operands:
        if not ok(v):
            raise ShapeError(f"a result dim depends on {v.owner.operation.name}, which the shape "
                             f"function cannot compute (e.g. a dim of a loop's result: a scatter)")
    asserts = [op for op in ops if op.name == "cf.assert" and ok(op.operands[0])]
    needed = set()

    def need(v):
        if isinstance(v.owner, ir.OpView) and v.owner.operation not in needed:
            needed.add(v.owner.operation)
            for x in v.owner.operation.operands:
                need(x)

    for v in list(ret.operands) + [a.operands[0] for a in asserts]:
        need(v)
    lines = []
    for op in ops[:-1]:
        if op.name == "cf.assert" and op in asserts:
            message = f"kernel @{name}: " + ir.StringAttr(op.attributes["msg"]).value
            lines.append(f"if not {names[op.operands[0]]}:")
            lines.append(f"    raise ShapeError({message!r})")
        elif op in needed and (op.name == "arith.constant" or op.name in _CASTS):
            names[op.results[0]] = _expr(op, [names[v] for v in op.operands])  # inlined
        elif op in needed:
            var = f"v{len(names)}"
            lines.append(f"{var} = {_expr(op, [names[v] for v in op.operands])}")
            names[op.results[0]] = var
    return lines, [names[v] for v in ret.operands]


def _expressible(op: ir.Operation) -> bool:
    n = op.name
    if n == "arith.constant":
        return isinstance(op.attributes["value"], (ir.BoolAttr, ir.IntegerAttr, ir.FloatAttr))
    if n == "arith.cmpi":
        return ir.IntegerAttr(op.attributes["predicate"]).value in _CMPI
    if n == "arith.trunci":
        return str(op.results[0].type) == "i1"
    return n in ("tensor.dim", "arith.select") or n in _BINARY or n in _CASTS


def _expr(op: ir.Operation, operands: list) -> str:
    n = op.name
    if n == "arith.constant":
        attr = op.attributes["value"]
        if isinstance(attr, ir.BoolAttr):
            return str(bool(ir.BoolAttr(attr).value))
        if isinstance(attr, ir.FloatAttr):
            return repr(ir.FloatAttr(attr).value)
        value = ir.IntegerAttr(attr).value
        return str(bool(value & 1)) if str(attr.type) == "i1" else str(value)
    if n == "tensor.dim":
        return f"{operands[0]}.shape[{operands[1]}]"
    if n in _BINARY:
        return _BINARY[n].format(a=operands[0], b=operands[1])
    if n in _CASTS:
        return operands[0]
    if n == "arith.trunci":
        return f"bool({operands[0]} & 1)"
    if n == "arith.select":
        return f"({operands[1]} if {operands[0]} else {operands[2]})"
    pred = ir.IntegerAttr(op.attributes["predicate"]).value
    return f"({operands[0]} {_CMPI[pred]} {operands[1]})"
