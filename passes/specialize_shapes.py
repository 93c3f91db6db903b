"""ca-specialize-shapes: make observed sizes constants and refine tensor types."""

import dataclasses

from torch_mlir import ir
from torch_mlir.passmanager import PassManager

from camlir.dialects.ca.ir_helpers import find_func, func_name, function_type, ops_named

from .base import CAPass, OptionError, PassFailure


def _parse_sizes(text: str) -> list:
    """`10,?,2` -> [10, None, 2] (None: keep that size symbolic)."""
    if not text:
        return []
    out = []
    for item in text.split(","):
        item = item.strip()
        if item == "?":
            out.append(None)
            continue
        try:
            out.append(int(item))
        except ValueError:
            raise OptionError(f"ca-specialize-shapes: size '{item}' is not an integer or '?'") from None
    return out


def _parse_shapes(text: str) -> dict:
    """`1:10x4,5:?x7` -> {1: [10, 4], 5: [None, 7]} (argument number: dims)."""
    shapes = {}
    if not text:
        return shapes
    for item in text.split(","):
        arg, sep, dims = item.partition(":")
        try:
            index = int(arg)
            shapes[index] = [] if dims == "" else [None if d == "?" else int(d) for d in dims.split("x")]
        except ValueError:
            raise OptionError(f"ca-specialize-shapes: shape '{item}' is not 'ARG:D0xD1...'") from None
        if not sep:
            raise OptionError(f"ca-specialize-shapes: shape '{item}' is not 'ARG:D0xD1...'")
    return shapes


@dataclasses.dataclass(frozen=True)
class SpecializeShapes(CAPass):
    """Specializes a symbolic backward to the sizes observed at capture.

    Options: `sizes` gives a value for each `ca.size` by index (`?` keeps that size
    symbolic), `shapes` the dims of function arguments whose types have `?` dims
    (`ARG:D0xD1...`, `?` keeps a dim dynamic). Each `ca.size` with a value becomes a
    constant; argument types are refined; torch-mlir's shape refinement then propagates
    static shapes through the ops, and canonicalization removes the shape checks that
    became trivially true (`torch.runtime.assert` on a folded comparison). Casts that
    refinement adds only to keep a `ca` op's old, less static operand type are dropped:
    `ca` ops accept the refined type. Dims marked `?` stay `?`, so one module still serves
    every value of them. Run it on flat code (after `ca-flatten-nodes`).

    Before (`--ca-specialize-shapes=sizes=10 shapes=1:10x4`):
    ```mlir
    func.func @backward(%g: !torch.vtensor<[],f32>, %x: !torch.vtensor<[?,4],f32>, %p: !torch.vtensor<[2,4],f32>, %s: !torch.int) {
      %n = "ca.size"(%s) {index = 0 : i64} : (!torch.int) -> !torch.int
      %l = torch.prim.ListConstruct %n, %int2 : (!torch.int, !torch.int) -> !torch.list<int>
      %e = torch.aten.expand %g, %l, %false : ... -> !torch.vtensor<[?,2],f32>
      %t = torch.aten.t %e : !torch.vtensor<[?,2],f32> -> !torch.vtensor<[2,?],f32>
      %w = torch.aten.mm %t, %x : !torch.vtensor<[2,?],f32>, !torch.vtensor<[?,4],f32> -> !torch.vtensor<[2,4],f32>
      "ca.accumulate_grad"(%p, %w) : ...
    ```
    After:
    ```mlir
    func.func @backward(%g: !torch.vtensor<[],f32>, %x: !torch.vtensor<[10,4],f32>, %p: !torch.vtensor<[2,4],f32>, %s: !torch.int) {
      %int10 = torch.constant.int 10
      %l = torch.prim.ListConstruct %int10, %int2 : (!torch.int, !torch.int) -> !torch.list<int>
      %e = torch.aten.expand %g, %l, %false : ... -> !torch.vtensor<[10,2],f32>
      %t = torch.aten.t %e : !torch.vtensor<[10,2],f32> -> !torch.vtensor<[2,10],f32>
      ...
    ```
    """

    argument = "ca-specialize-shapes"
    summary = "Replace observed sizes by constants and refine tensor types; '?' stays dynamic"

    sizes: str = ""
    shapes: str = ""
    function: str = "backward"

    def run(self, module: ir.Operation) -> None:
        sizes = _parse_sizes(self.sizes)
        shapes = _parse_shapes(self.shapes)
        fn = find_func(module, self.function)
        if fn is None:
            raise PassFailure(f"no function @{self.function} to specialize", module)
        block = fn.regions[0].blocks[0]
        with module.context, ir.Location.unknown():
            self._constant_sizes(block, sizes, fn)
            self._refine_arguments(fn, block, shapes)
        PassManager.parse("builtin.module(torch-shape-refinement-pipeline, canonicalize)",
                          module.context).run(module)
        with module.context:
            _drop_casts_for_ca_ops(fn)

    @staticmethod
    def _constant_sizes(block: ir.Block, sizes: list, fn: ir.Operation) -> None:
        for op in list(block.operations):
            op = op.operation
            if op.name == "ca.node":
                raise PassFailure("ca-specialize-shapes needs flat code: run ca-flatten-nodes first", op)
            if op.name != "ca.size":
                continue
            index = ir.IntegerAttr(op.attributes["index"]).value
            value = ir.IntegerAttr(op.attributes["value"]).value if "value" in op.attributes else None
            if index < len(sizes) and sizes[index] is not None:
                value = sizes[index]
            elif index >= len(sizes) and sizes:
                raise PassFailure(f"ca.size #{index} has no value in sizes={','.join('?' if s is None else str(s) for s in sizes)}", op)
            if value is None:
                continue
            with ir.InsertionPoint(op):
                attr = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)
                const = ir.Operation.create("torch.constant.int", results=[ir.Type.parse("!torch.int")],
                                            attributes={"value": attr})
            op.results[0].replace_all_uses_with(const.results[0])
            op.erase()

    @staticmethod
    def _refine_arguments(fn: ir.Operation, block: ir.Block, shapes: dict) -> None:
        for index, dims in shapes.items():
            if index >= len(block.arguments):
                raise PassFailure(f"shapes names argument {index}, but @{func_name(fn)} has {len(block.arguments)}", fn)
            arg = block.arguments[index]
            text = str(arg.type)
            if not text.startswith("!torch.vtensor<["):
                raise PassFailure(f"argument {index} is {text}, not a tensor", fn)
            old_dims, elem = text[len("!torch.vtensor<["):-1].split("],")
            old = old_dims.split(",") if old_dims else []
            if len(old) != len(dims):
                raise PassFailure(f"argument {index} has rank {len(old)}, shapes gives {len(dims)} dims", fn)
            new = []
            for o, d in zip(old, dims):
                if o != "?" and d is not None and int(o) != d:
                    raise PassFailure(f"argument {index} has static dim {o}, shapes gives {d}", fn)
                new.append(o if d is None else str(d))
            arg.set_type(ir.Type.parse(f"!torch.vtensor<[{','.join(new)}],{elem}>"))
        ftype = function_type(fn)
        fn.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get([a.type for a in block.arguments], list(ftype.results)))


def _drop_casts_for_ca_ops(fn: ir.Operation) -> None:
    for cast in ops_named(fn, "torch.tensor_static_info_cast"):
        users = [u.owner for u in cast.results[0].uses]
        if users and all(u.name.startswith("ca.") for u in users):
            cast.results[0].replace_all_uses_with(cast.operands[0])
            cast.erase()
