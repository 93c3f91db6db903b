"""Custom Function backwards that write outside themselves: found from their bytecode, before
the re-trace runs them.

The re-trace runs a custom `autograd.Function`'s backward once, on fake tensors, and keeps
the aten ops it records; the compiled program never runs the Python again. A backward that
also changes something outside itself would do that once, at trace time, with fake tensors,
and never on the calls that follow. PyTorch's own test suite has two (docs/pytorch-suite.md):
`nonlocal x; (x,) = ctx.saved_tensors` left a FakeTensor in the test's variable
(test_checkpointing_without_reentrant_saved_object_identity), and `order.append(...)` ran at
trace time, not when the backward ran (test_reentrant_priority).

`outside_writes(fn)` names the first such write it finds in `fn`'s bytecode, or returns
None. The re-trace then refuses the node (`BackwardWritesOutside`): the backward falls back
to PyTorch, which runs the Python for real, or fails under `fullgraph=True`. Found:

- a store to a global (`global n; n += 1`) or to an enclosing function's variable
  (`nonlocal x; x = ...`), or their deletion;
- a store to an attribute or item of a value read from a global or a closure cell
  (`state.calls += 1`, `cache[k] = g`);
- a call of a mutating method on such a value (`order.append(...)`, `seen.add(...)`,
  `log.update(...)`);
- `print(...)`.

Code the backward calls (a helper function, a method of the Function) is not followed: this
finds what the backward itself writes, not everything it could reach. Writes to `ctx` and to
the backward's own locals are allowed: both belong to this one backward call.
"""

from __future__ import annotations

import dis
import types
from typing import Callable, Optional

__all__ = ["BackwardWritesOutside", "outside_writes"]

_MUTATING_METHODS = frozenset({
    "append", "extend", "insert", "pop", "popitem", "remove", "clear", "update", "add", "discard",
    "setdefault", "sort", "reverse", "write", "writelines", "put", "put_nowait", "__setitem__",
    "__delitem__", "increment",
})
_OUTSIDE_LOADS = ("LOAD_GLOBAL", "LOAD_DEREF", "LOAD_NAME", "LOAD_CLASSDEREF")


class BackwardWritesOutside(RuntimeError):
    """A custom Function's backward writes outside itself; the message says what."""


def outside_writes(fn: Callable) -> Optional[str]:
    """What `fn` (a custom Function's backward; wrappers followed through `__wrapped__`) writes
    outside itself, in words, or None."""
    seen = set()
    while fn is not None and id(fn) not in seen:
        seen.add(id(fn))
        code = getattr(getattr(fn, "__func__", fn), "__code__", None)
        if isinstance(code, types.CodeType):
            found = _in_code(code, set(code.co_freevars))
            if found is not None:
                return found
        fn = getattr(fn, "__wrapped__", None)
    return None


def _in_code(code: types.CodeType, free: set) -> Optional[str]:
    """The first outside write in `code`; `free` are its closure variables that live outside
    the backward (a function defined inside the backward shares the backward's own cells,
    which are not outside)."""
    instructions = [i for i in dis.get_instructions(code) if i.opname not in ("CACHE", "EXTENDED_ARG")]
    for k, ins in enumerate(instructions):
        op, name = ins.opname, ins.argval
        if op in ("STORE_GLOBAL", "DELETE_GLOBAL"):
            return f"writes the global {name!r}"
        if op in ("STORE_DEREF", "DELETE_DEREF") and name in free:
            return f"writes {name!r} of an enclosing function (nonlocal)"
        if op in ("STORE_ATTR", "DELETE_ATTR"):
            owner = _outside_value(instructions, _attr_owner(instructions, k, name), free)
            if owner is not None:
                return f"writes the attribute {name!r} of {owner}"
        if op in ("STORE_SUBSCR", "DELETE_SUBSCR"):
            owner = next((o for o in (_outside_value(instructions, j, free) for j in range(k - 3, k)) if o), None)
            if owner is not None:
                return f"writes an item of {owner}"
        if op in ("LOAD_ATTR", "LOAD_METHOD") and _method_name(name) in _MUTATING_METHODS:
            owner = _outside_value(instructions, k - 1, free)
            if owner is not None:
                return f"calls {owner}.{_method_name(name)}()"
        if op in ("LOAD_GLOBAL", "LOAD_NAME") and _method_name(name) == "print":
            return "calls print()"
    for const in code.co_consts:  # functions and lambdas defined inside the backward
        if isinstance(const, types.CodeType):
            found = _in_code(const, free & set(const.co_freevars))
            if found is not None:
                return found
    return None


def _attr_owner(instructions: list, k: int, name: str) -> int:
    """The index of the instruction that loaded the object `instructions[k]` stores the
    attribute `name` of: the one right before, or for `obj.name += v` (load obj, COPY,
    LOAD_ATTR name, ..., SWAP, STORE_ATTR name) the one before the COPY."""
    if k >= 1 and instructions[k - 1].opname == "SWAP":
        for j in range(k - 2, 0, -1):
            ins = instructions[j]
            if ins.opname == "LOAD_ATTR" and _method_name(ins.argval) == name and instructions[j - 1].opname == "COPY":
                return j - 2
    return k - 1


def _method_name(argval) -> str:
    # Python 3.12+ folds a method load's flag into LOAD_ATTR's argument repr.
    return str(argval).split(" ")[0].removeprefix("NULL|self + ").removeprefix("NULL + ")


def _outside_value(instructions: list, k: int, free: set) -> Optional[str]:
    """How instruction `k` loads a value that lives outside the backward ("the global
    'order'"), or None."""
    if k < 0:
        return None
    ins = instructions[k]
    name = _method_name(ins.argval)
    if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
        return f"the global {name!r}"
    if ins.opname in ("LOAD_DEREF", "LOAD_CLASSDEREF") and name in free:
        return f"{name!r} of an enclosing function"
    return None
