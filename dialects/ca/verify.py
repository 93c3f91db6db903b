"""The `ca` verifier: runs every `ca` op's checks over a module.

MLIR does not know the `ca` ops (see ops.py for why), so nothing else verifies them. The
tools run this after parsing and the pass pipeline runs it after every pass, so a pass that
breaks an invariant is caught right where it did.

It also rejects ops of other unregistered dialects, which the context must accept for the
`ca` ops to parse, unless the caller allows them (`--allow-unregistered-dialect`).
"""

from dataclasses import dataclass
from typing import Optional

from torch_mlir import ir

from .ops import OPS_BY_NAME


@dataclass
class Problem:
    """One failed check: the op and why, e.g. `'ca.yield' op must not have results`;
    `location` is the op's, where the tools report it."""

    op: ir.Operation
    message: str

    @property
    def location(self) -> ir.Location:
        return self.op.location


class VerificationError(ValueError):
    """Raised by `verify_or_raise`; `problems` lists each failing op and why."""

    def __init__(self, problems):
        self.problems = problems
        super().__init__("\n".join(f"{p.location}: {p.message}" for p in problems))


def verify(root: ir.Operation, allow_unregistered: bool = False) -> list:
    """Returns the problems found under `root` (an empty list when it is valid)."""
    problems = []
    context = root.context
    registered = set()  # other dialects' registered op names, looked up once per call: the
    # pass pipeline verifies after every pass (MobileNetV3's loops-stage module: 12 -> 9 ms
    # a walk)

    def visit(op):
        op = op.operation
        name = op.name
        if name in registered:
            return ir.WalkResult.ADVANCE
        cls = OPS_BY_NAME.get(name)
        if cls is not None:
            message = _check(cls, op)
            if message:
                problems.append(Problem(op, f"'{name}' op {message}"))
        elif name.startswith("ca."):
            known = ", ".join(sorted(OPS_BY_NAME))
            problems.append(Problem(op, f"unknown operation '{name}' in dialect 'ca' (known: {known})"))
        elif context.is_registered_operation(name):
            registered.add(name)
        elif not allow_unregistered:
            problems.append(Problem(op, f"unregistered operation '{name}' (use "
                                        f"--allow-unregistered-dialect to accept it)"))
        return ir.WalkResult.ADVANCE

    root.walk(visit, ir.WalkOrder.PRE_ORDER)
    return problems


def _check(cls, op) -> Optional[str]:
    if len(op.regions) != cls.regions:
        return f"expects {cls.regions} region(s), got {len(op.regions)}"
    try:
        return cls.check(op)
    except Exception as exc:  # a bug in a verifier must still read as a diagnostic
        return f"internal verifier error: {exc!r}"


def verify_or_raise(root: ir.Operation, allow_unregistered: bool = False) -> None:
    """Like `verify`, but raises `VerificationError` listing every problem instead of
    returning them; returns None when `root` is valid."""
    problems = verify(root, allow_unregistered)
    if problems:
        raise VerificationError(problems)
