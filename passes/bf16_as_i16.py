"""ca-bf16-as-i16: in the LLVM dialect, bf16 values that are only moved become i16 values.

Why: after `arith-expand{include-bf16=true}` the llvm stage has no bf16 arithmetic left;
bf16 values are only loaded, stored, shuffled between vectors, selected and passed between
blocks. The x86 backend has no bf16 registers without AVX512-BF16, and it legalizes some of
those moves by widening the lanes to f32 and narrowing them back, through calls of
`__truncsfbf2` that the JIT cannot resolve ("JIT session error: Symbols not found:
[ __truncsfbf2 ]"). Seen: masked vector loads and stores at the end of a row whose length
is not a multiple of 8 (a bf16 ResNet-18 under autocast), and the element-by-element
transposes the vectorizer's strided reads become (`vector<1xbf16>` arrays, insertelement /
extractelement: GPT-2 and BERT under autocast). The whole graph was then interpreted. A
move of bits is the same move on i16, which every x86 backend handles as it is.

What it does: every bf16 type in the module (scalars, vectors, arrays, structs, function
signatures, globals, the element types of `alloca` and `getelementptr`) becomes i16; bf16
constants and globals' values become i16 ones with the same bits; a bitcast between bf16
and i16 (what arith-expand left around its integer rounding) disappears. All or nothing:
where an op still computes on bf16 (arithmetic, a comparison, an intrinsic that is not a
masked load or store: i16 would change its meaning) or a constant cannot be rewritten (a
`dense_resource` blob), the module is left as it was, as LLVM got it before this pass
existed. (A bf16 `memref.global` of constant zeros, fuzz seed 165, was such a case in this
pass's first version, which failed the stage and had the graph interpreted.)
"""

import dataclasses
import re
import struct

from torch_mlir import ir

from camlir.dialects.ca.ir_helpers import ops_matching

from .base import CAPass

# Ops that move bits: their meaning on i16 lanes is their meaning on bf16 lanes.
_MOVES = frozenset((
    "llvm.load", "llvm.store", "llvm.alloca", "llvm.getelementptr", "llvm.bitcast",
    "llvm.insertelement", "llvm.extractelement", "llvm.shufflevector",
    "llvm.insertvalue", "llvm.extractvalue", "llvm.select", "llvm.mlir.constant", "llvm.mlir.global",
    "llvm.mlir.addressof",
    "llvm.mlir.poison", "llvm.mlir.undef", "llvm.mlir.zero", "llvm.br", "llvm.cond_br",
    "llvm.switch", "llvm.return", "llvm.call", "llvm.func", "llvm.intr.masked.load",
    "llvm.intr.masked.store", "llvm.intr.masked.gather", "llvm.intr.masked.scatter",
    "llvm.intr.masked.expandload", "llvm.intr.masked.compressstore", "llvm.intr.memcpy",
    "llvm.intr.memmove", "llvm.intr.memset", "builtin.module",
))
# Ops that name types in attributes (element, global and function types).
_TYPED = frozenset(("llvm.func", "llvm.alloca", "llvm.getelementptr", "llvm.mlir.global", "llvm.call"))
# bf16 as a type in a type's text: alone, or a shaped type's element (`vector<8xbf16>`).
# Ops that name types in attributes (element, global and function types).
_TYPED = frozenset(("llvm.func", "llvm.alloca", "llvm.getelementptr", "llvm.mlir.global", "llvm.call"))
# bf16 as a type in a type's text: alone, or a shaped type's element (`vector<8xbf16>`).
# Where a bf16 value can start (its other ops take one as an operand).
_SOURCES = frozenset(("llvm.load", "llvm.intr.masked.load", "llvm.intr.masked.gather", "llvm.intr.masked.expandload",
                      "llvm.mlir.constant", "llvm.mlir.poison", "llvm.mlir.undef", "llvm.mlir.zero", "llvm.bitcast",
                      "llvm.func", "llvm.alloca", "llvm.call", "llvm.fptrunc", "llvm.sitofp", "llvm.uitofp"))
_BF16 = re.compile(r"(?:(?<=[\d\]?]x)|(?<![\w.]))bf16(?!\w)")


@dataclasses.dataclass(frozen=True)
class BF16AsI16(CAPass):
    """Rewrites every bf16 type in an LLVM-dialect module to i16, for ops that only move
    values (loads, stores, masked loads and stores, vector and aggregate inserts and
    extracts, shuffles, selects, allocas, block arguments, calls, constants with the same
    bits); bitcasts between bf16 and i16 fold away. All or nothing: a module where an op
    computes on bf16 is left as it was.

    Before:
    ```mlir
    %p = llvm.mlir.poison : vector<8xbf16>
    %v = llvm.intr.masked.load %a, %m, %p {alignment = 2 : i32} : (!llvm.ptr, vector<8xi1>, vector<8xbf16>) -> vector<8xbf16>
    %b = llvm.bitcast %i : vector<8xi16> to vector<8xbf16>
    %s = llvm.select %c, %v, %b : vector<8xi1>, vector<8xbf16>
    llvm.store %s, %q : vector<8xbf16>, !llvm.ptr
    ```
    After:
    ```mlir
    %p = llvm.mlir.poison : vector<8xi16>
    %v = llvm.intr.masked.load %a, %m, %p {alignment = 2 : i32} : (!llvm.ptr, vector<8xi1>, vector<8xi16>) -> vector<8xi16>
    %s = llvm.select %c, %v, %i : vector<8xi1>, vector<8xi16>
    llvm.store %s, %q : vector<8xi16>, !llvm.ptr
    ```
    """

    argument = "ca-bf16-as-i16"
    summary = "bf16 values the LLVM dialect only moves, as i16 (no soft-float calls)"

    def run(self, module: ir.Operation) -> None:
        bf16_as_i16(module)


def bf16_as_i16(module) -> int:
    """Rewrites `module` in place; returns how many ops were touched."""
    has_bf16 = _bf16_test()
    # The ops that define a bf16 value or name a bf16 type; an op that only takes one (an
    # fadd, a store) is found among the defining ones' users, so operands are not looked
    # at (GPT-2-bf16's 43k ops: 0.8 s against 1.5 s with them).
    touched = ops_matching(module, lambda op: _defines_bf16(op, has_bf16))
    users = [use.owner for op in touched for value in _defined(op) if has_bf16(value.type) for use in value.uses]
    if any(op.name not in _MOVES for op in users) or any(
            op.name not in _MOVES or not _convertible(op) for op in touched):
        return 0  # as it was: LLVM may still take it (it did before this pass existed)
    takers = {op: None for op in users if not _defines_bf16(op, has_bf16)}  # stores, returns, ...
    touched += list(takers)  # once each: a bitcast among them is erased below
    for op in touched:
        with op.context:
            _retype(op)
    for op in touched:
        if op.name == "llvm.bitcast" and op.operands[0].type == op.results[0].type:
            op.results[0].replace_all_uses_with(op.operands[0])
            op.erase()
    return len(touched)


def holds_bf16(module) -> bool:
    """Whether any value in `module` (any dialect) has a bf16 type: the cpu pipeline asks it
    of the loops stage's module, ~10x smaller than the LLVM dialect's, and runs this pass
    only then (it costs ~1 s on an f32 MobileNetV3's 43,008 LLVM-dialect ops)."""
    has_bf16 = _bf16_test()

    def visit(op):
        if any(has_bf16(v.type) for v in op.results) or any(
                has_bf16(a.type) for region in op.regions for block in region for a in block.arguments):
            found.append(op)
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    found = []
    module.walk(visit)
    return bool(found)


def _defines_bf16(op, has_bf16) -> bool:
    """Whether `op` has a bf16 result or block argument, or a bf16 type among its attributes."""
    if any(has_bf16(v.type) for v in _defined(op)):
        return True
    return op.name in _TYPED and any(isinstance(a.attr, ir.TypeAttr) and has_bf16(a.attr.value) for a in _named(op))


def _defined(op) -> list:
    """The values `op` defines: its results and its regions' block arguments."""
    values = list(op.results)
    for region in op.regions:
        for block in region:
            values += list(block.arguments)
    return values


def _named(op) -> list:
    """`op`'s attributes as NamedAttributes (iterating the map gives their names only)."""
    return [op.attributes[i] for i in range(len(op.attributes))]


def _bf16_test():
    """`_has_bf16` remembering its answers: types are uniqued, and printing one is slow."""
    seen = {}

    def has_bf16(t) -> bool:
        found = seen.get(t)
        if found is None:
            found = seen[t] = _has_bf16(t)
        return found
    return has_bf16


def _has_bf16(t) -> bool:
    return _BF16.search(str(t)) is not None


def _i16(t):
    return ir.Type.parse(_BF16.sub("i16", str(t))) if _has_bf16(t) else t


def _retype(op) -> None:
    for value in op.results:
        value.set_type(_i16(value.type))
    for region in op.regions:
        for block in region:
            for arg in block.arguments:
                arg.set_type(_i16(arg.type))
    for named in _named(op):
        attr = named.attr
        if isinstance(attr, ir.TypeAttr) and _has_bf16(attr.value):
            op.attributes[named.name] = ir.TypeAttr.get(_i16(attr.value))
    if op.name in ("llvm.mlir.constant", "llvm.mlir.global") and "value" in op.attributes:
        op.attributes["value"] = _bits(op.attributes["value"])


def _convertible(op) -> bool:
    """Whether `op`'s constant value, if it has one, can be rewritten (a float or dense
    attribute; not, e.g., a `dense_resource` blob)."""
    if op.name not in ("llvm.mlir.constant", "llvm.mlir.global") or "value" not in op.attributes:
        return True
    value = op.attributes["value"]
    return not _has_bf16(value.type) or isinstance(value, (ir.FloatAttr, ir.DenseFPElementsAttr))


def _bits(attr):
    """A bf16 float or dense attribute as the i16 attribute of the same bits."""
    i16 = ir.IntegerType.get_signless(16)
    if isinstance(attr, ir.FloatAttr) and isinstance(attr.type, ir.BF16Type):
        return ir.IntegerAttr.get(i16, _bf16_bits(attr.value))
    if isinstance(attr, ir.DenseFPElementsAttr) and isinstance(ir.ShapedType(attr.type).element_type, ir.BF16Type):
        # The bindings cannot read bf16 elements, so the attribute's text is read: each
        # element is printed as a decimal that converts back exactly, or as its hex bits.
        elements = str(attr).rsplit(" : ", 1)[0][len("dense<"):-1].strip("[]")
        bits = [int(e, 16) if e.startswith("0x") else _bf16_bits(float(e)) for e in elements.split(", ")]
        bits = [b - 0x10000 if b >= 0x8000 else b for b in bits]
        target = _i16(attr.type)
        if attr.is_splat or len(bits) == 1:
            return ir.Attribute.parse(f"dense<{bits[0]}> : {target}")
        return ir.Attribute.parse(f"dense<[{', '.join(map(str, bits))}]> : {target}")  # LLVM vectors are 1-D
    return attr


def _bf16_bits(value: float) -> int:
    """The bf16 bits of `value`, which is a bf16 number (exact in f32), as a signed i16."""
    bits = struct.unpack("<I", struct.pack("<f", value))[0] >> 16
    return bits - 0x10000 if bits >= 0x8000 else bits
