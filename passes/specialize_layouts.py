"""ca-specialize-layouts: strided inputs become permutes of contiguous ones, in the IR."""

import dataclasses

from torch_mlir import ir

from camlir.dialects.ca.ir_helpers import find_func, function_type

from .base import CAPass, OptionError, PassFailure


def parse_perms(text: str) -> dict:
    """`1:1x0,3:0x2x1` -> {1: (1, 0), 3: (0, 2, 1)} (argument number: permutation)."""
    perms = {}
    for item in filter(None, text.split(",")):
        arg, sep, dims = item.partition(":")
        try:
            perm = tuple(int(d) for d in dims.split("x"))
            index = int(arg)
        except ValueError:
            perm, sep = (), ""
        if not sep or sorted(perm) != list(range(len(perm))) or len(perm) < 2:
            raise OptionError(f"ca-specialize-layouts: '{item}' is not 'ARG:P0xP1...' with a permutation")
        perms[index] = perm
    return perms


def format_perms(perms) -> str:
    """The inverse of `parse_perms`, from a list with None for arguments passed as they are."""
    return ",".join(f"{i}:{'x'.join(map(str, p))}" for i, p in enumerate(perms) if p is not None)


@dataclasses.dataclass(frozen=True)
class SpecializeLayouts(CAPass):
    """Makes the layout of strided inputs explicit, so kernels only ever see contiguous
    buffers.

    Kernels take contiguous buffers (the compiler then knows every stride, which is what
    lets LLVM vectorize). Inputs of a backward are often not contiguous: saved tensors
    such as `W.t()` are transposed views, and copying them costs as much as a matmul. For
    each argument `ARG` listed in `perms` with a permutation `p` (the runtime passes
    `t.permute(p)`, a contiguous view of the same storage), the argument's type becomes the
    permuted one and the function permutes it back with the inverse permutation, which the
    later passes fold into its user (a matmul's transpose flag, a fused loop's indexing map).
    The cpu backend computes `perms` from the first call's tensors; the host program checks
    the layout on every call. Dims may be dynamic (`?`, a symbolic capture compiled with
    dynamic dims): they are permuted like static ones.

    Before (`--ca-specialize-layouts=perms=0:1x0`):
    ```mlir
    func.func @backward(%w: !torch.vtensor<[4,3],f32>) {
      %0 = torch.aten.neg %w : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[4,3],f32>
    ```
    After:
    ```mlir
    func.func @backward(%w: !torch.vtensor<[3,4],f32>) {
      %int1 = torch.constant.int 1
      %int0 = torch.constant.int 0
      %l = torch.prim.ListConstruct %int1, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
      %p = torch.aten.permute %w, %l : !torch.vtensor<[3,4],f32>, !torch.list<int> -> !torch.vtensor<[4,3],f32>
      %0 = torch.aten.neg %p : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[4,3],f32>
    ```
    """

    argument = "ca-specialize-layouts"
    summary = "Pass strided inputs as contiguous permutations and permute them back in the IR"

    perms: str = ""
    function: str = "backward"

    def __post_init__(self):
        parse_perms(self.perms)  # a bad option is a pipeline error, before anything runs

    def run(self, module: ir.Operation) -> None:
        perms = parse_perms(self.perms)
        fn = find_func(module, self.function)
        if fn is None:
            raise PassFailure(f"no function @{self.function} to specialize", module)
        block = fn.regions[0].blocks[0]
        args = list(block.arguments)
        with module.context, ir.Location.unknown():
            for index, perm in sorted(perms.items()):
                if index >= len(args):
                    raise PassFailure(f"@{self.function} has no argument {index}", fn)
                _permute_argument(args[index], perm, block, fn)
            fn.attributes["function_type"] = ir.TypeAttr.get(
                ir.FunctionType.get([a.type for a in block.arguments], list(function_type(fn).results)))


def needs_identity(arg: ir.Value) -> bool:
    """True when a `ca` op uses the argument itself: `ca.accumulate_grad` writes the `.grad`
    of that very tensor and a hook is handed it. A permuted view would get the `.grad`
    instead (the leaf's gradient lost: found by the OpInfo differential run)."""
    return any(u.owner.name in ("ca.accumulate_grad", "ca.hook") for u in arg.uses)


def _permute_argument(arg: ir.Value, perm: tuple, block: ir.Block, fn: ir.Operation) -> None:
    if needs_identity(arg):
        raise PassFailure("argument is used as itself by a ca op (accumulation or hook); it cannot "
                          "be passed as a permuted view", fn)
    old_type = str(arg.type)
    if not old_type.startswith("!torch.vtensor<["):
        raise PassFailure(f"argument of type {old_type} is not a ranked value tensor", fn)
    dims_text, elem = old_type[len("!torch.vtensor<["):-1].split("],")
    dims = dims_text.split(",")
    if len(dims) != len(perm):
        raise PassFailure(f"permutation {perm} does not fit argument type {old_type}", fn)
    uses = list(arg.uses)
    arg.set_type(ir.Type.parse(f"!torch.vtensor<[{','.join(dims[d] for d in perm)}],{elem}>"))
    with ir.InsertionPoint(list(block.operations)[0]):
        ints = [_constant_int(d) for d in _inverse(perm)]
        lst = ir.Operation.create("torch.prim.ListConstruct", results=[ir.Type.parse("!torch.list<int>")],
                                  operands=ints).results[0]
        permuted = ir.Operation.create("torch.aten.permute", results=[ir.Type.parse(old_type)],
                                       operands=[arg, lst]).results[0]
    for use in uses:
        use.owner.operands[use.operand_number] = permuted


def _inverse(p) -> list:
    q = [0] * len(p)
    for i, d in enumerate(p):
        q[d] = i
    return q


def _constant_int(value: int) -> ir.Value:
    attr = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)
    return ir.Operation.create("torch.constant.int", results=[ir.Type.parse("!torch.int")],
                               attributes={"value": attr}).results[0]
