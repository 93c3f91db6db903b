"""ca-masked-bf16-as-i16: masked vector loads and stores of bf16 move the same bits as i16.

Why: the x86 backend has no bf16 vector registers without AVX512-BF16, so it legalizes a
`llvm.intr.masked.load` / `masked.store` of `vector<8xbf16>` by widening the lanes to f32
and narrowing them back, through calls of `__truncsfbf2` that the JIT cannot resolve
("JIT session error: Symbols not found: [ __truncsfbf2 ]"). Plain loads, stores and selects
of bf16 vectors do not do this; the masked ones appear where the vectorizer's last vector
of a row is partial (a bf16 ResNet-18 under `torch.autocast` with 10 classes: its whole
backward was then interpreted, ~3 s a step against eager's 0.1 s). A load or store moves
bits, so an i16 one with bitcasts around it is the same operation, and i16 vectors are legal.
"""

import dataclasses

from torch_mlir import ir
from torch_mlir.dialects import llvm

from camlir.dialects.ca.ir_helpers import ops_matching

from .base import CAPass

_OPS = ("llvm.intr.masked.load", "llvm.intr.masked.store", "llvm.intr.masked.gather", "llvm.intr.masked.scatter")


@dataclasses.dataclass(frozen=True)
class MaskedBF16AsI16(CAPass):
    """Rewrites each masked vector load, store, gather and scatter of bf16 lanes in the LLVM
    dialect into the same intrinsic on i16 lanes, with `llvm.bitcast`s around it (the
    pass-through value of a load or gather included). Other ops are left alone.

    Before:
    ```mlir
    %v = llvm.intr.masked.load %p, %m, %pass {alignment = 2 : i32} : (!llvm.ptr, vector<8xi1>, vector<8xbf16>) -> vector<8xbf16>
    ```
    After:
    ```mlir
    %0 = llvm.bitcast %pass : vector<8xbf16> to vector<8xi16>
    %1 = llvm.intr.masked.load %p, %m, %0 {alignment = 2 : i32} : (!llvm.ptr, vector<8xi1>, vector<8xi16>) -> vector<8xi16>
    %v = llvm.bitcast %1 : vector<8xi16> to vector<8xbf16>
    ```
    """

    argument = "ca-masked-bf16-as-i16"
    summary = "Masked vector loads and stores of bf16 as i16 ones (no soft-float calls)"

    def run(self, module: ir.Operation) -> None:
        masked_bf16_as_i16(module)


def masked_bf16_as_i16(module) -> int:
    """Rewrites every masked bf16 memory intrinsic in `module`; returns how many."""
    count = 0
    for op in ops_matching(module, lambda op: op.name in _OPS):
        bf16 = op.results[0].type if op.name.endswith(("load", "gather")) else op.operands[0].type
        if not (isinstance(bf16, ir.VectorType) and isinstance(ir.VectorType(bf16).element_type, ir.BF16Type)):
            continue
        with op.context, op.location, ir.InsertionPoint(op):
            i16 = ir.VectorType.get(ir.VectorType(bf16).shape, ir.IntegerType.get_signless(16))
            alignment = op.attributes["alignment"]
            if op.name.endswith(("load", "gather")):
                source, mask = op.operands[0], op.operands[1]
                pass_thru = [llvm.bitcast(i16, v) for v in op.operands[2:]]
                if op.name.endswith("load"):
                    narrow = llvm.intr_masked_load(i16, source, mask, alignment,
                                                   pass_thru=pass_thru[0] if pass_thru else None,
                                                   nontemporal="nontemporal" in op.attributes or None)
                else:
                    narrow = llvm.intr_masked_gather(i16, source, mask, pass_thru, alignment)
                op.results[0].replace_all_uses_with(llvm.bitcast(bf16, narrow))
            else:
                value = llvm.bitcast(i16, op.operands[0])
                make = llvm.intr_masked_store if op.name.endswith("store") else llvm.intr_masked_scatter
                make(value, op.operands[1], op.operands[2], alignment)
        op.erase()
        count += 1
    return count
