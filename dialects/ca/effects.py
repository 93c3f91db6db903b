"""Memory effects of the `ca` ops, attached as MLIR interfaces from Python.

Why: MLIR's DCE, CSE and canonicalization decide what they may delete or move from these
effects. Accumulation into `.grad`, hooks and Python call-backs act on state outside the IR,
so they must read as side effects; sizes are pure values and may be folded or merged.
"""

from torch_mlir import ir


class _ReadsAndWrites(ir.MemoryEffectsOpInterface):
    @staticmethod
    def get_effects(op, effects):
        effects.append(ir.MemoryEffect.Read)
        effects.append(ir.MemoryEffect.Write)


class _NoEffects(ir.MemoryEffectsOpInterface):
    @staticmethod
    def get_effects(op, effects):
        pass


class _Speculatable(ir.ConditionallySpeculatable):
    @staticmethod
    def get_speculatability(op):
        return ir.Speculatability.Speculatable


SIDE_EFFECTING = ("ca.accumulate_grad", "ca.hook", "ca.call_python")
PURE = ("ca.size",)


def attach_effects(context: ir.Context) -> None:
    for name in SIDE_EFFECTING:
        _ReadsAndWrites.attach(name, context=context)
    for name in PURE:
        _NoEffects.attach(name, context=context)
        _Speculatable.attach(name, context=context)
