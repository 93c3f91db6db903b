"""Making a context accept the `ca` dialect."""

from torch_mlir import ir


def load_into(context: ir.Context) -> None:
    """`ca` ops are unregistered ops (see ops.py), so the context must accept those;
    `camlir.dialects.ca.verify` then checks them and rejects any other unknown op."""
    context.allow_unregistered_dialects = True
