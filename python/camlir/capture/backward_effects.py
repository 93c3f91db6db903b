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
None. The re-trace then refuses the node (`BackwardWritesOutside`): the node becomes a host
call, whose backward runs in Python on every call, or `fullgraph=True` fails. Found:

- a store to a global (`global n; n += 1`) or to an enclosing function's variable
  (`nonlocal x; x = ...`), or their deletion;
- a store to an attribute or item of a value read from a global or a closure cell, or of
  a part of one (`state.calls += 1`, `cache[k] = g`, `Fn.calls[0] += 1`), also through a
  local bound to it (`calls = Fn.calls; calls[0] = 1`); the object written is followed
  back through the bytecode, and one it cannot follow counts as outside;
- a call of a mutating method on such a value (`order.append(...)`, `seen.add(...)`,
  `log.update(...)`);
- `print(...)`.

Code the backward calls (a helper function, a method of the Function) is not followed: this
finds what the backward itself writes, not everything it could reach. Writes to `ctx` and to
the backward's own locals are allowed: both belong to this one backward call.
"""

from __future__ import annotations

import dis
import sys
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
    aliases = set()  # locals bound to an outside value or a part of one (`calls = Fn.calls`)

    def outside(k: int, depth: int) -> Optional[str]:
        """How the object at stack `depth` before instruction `k` comes from outside the
        backward, "" when it is the backward's own, None when it cannot be followed."""
        j = _root(instructions, _producer(instructions, k, depth))
        if j is None:
            return None
        ins = instructions[j]
        if ins.opname in ("LOAD_FAST", "LOAD_FAST_CHECK") and ins.argval in aliases:
            return f"{ins.argval!r} (bound to a value from outside the backward)"
        return _outside_value(instructions, j, free) or ""

    def refused(what: str, owner: Optional[str]) -> Optional[str]:
        if owner is None:
            return f"{what} of a value camlir cannot follow in the bytecode"
        return f"{what} of {owner}" if owner else None

    for k, ins in enumerate(instructions):
        op, name = ins.opname, ins.argval
        if op in ("STORE_GLOBAL", "DELETE_GLOBAL"):
            return f"writes the global {name!r}"
        if op in ("STORE_DEREF", "DELETE_DEREF") and name in free:
            return f"writes {name!r} of an enclosing function (nonlocal)"
        if op == "STORE_FAST":
            if outside(k, 0):
                aliases.add(name)
            else:
                aliases.discard(name)
        found = None
        if op in ("STORE_ATTR", "DELETE_ATTR"):
            found = refused(f"writes the attribute {name!r}", outside(k, 0))
        elif op in ("STORE_SUBSCR", "DELETE_SUBSCR"):
            found = refused("writes an item", outside(k, 1))
        elif op in ("LOAD_ATTR", "LOAD_METHOD") and _method_name(name) in _MUTATING_METHODS:
            owner = outside(k, 0)
            found = f"calls {owner}.{_method_name(name)}()" if owner else None
        elif op in ("LOAD_GLOBAL", "LOAD_NAME") and _method_name(name) == "print":
            found = "calls print()"
        if found is not None:
            return found
    for const in code.co_consts:  # functions and lambdas defined inside the backward
        if isinstance(const, types.CodeType):
            found = _in_code(const, free & set(const.co_freevars))
            if found is not None:
                return found
    return None


# (values popped, values pushed) of the instructions `_producer` walks back over; anything
# else (a jump, an unknown opcode) ends the walk, and the write is taken as an outside one.
_SIMPLE = {"LOAD_FAST": (0, 1), "LOAD_FAST_CHECK": (0, 1), "LOAD_CONST": (0, 1), "LOAD_DEREF": (0, 1),
           "LOAD_CLASSDEREF": (0, 1), "LOAD_NAME": (0, 1), "LOAD_CLOSURE": (0, 1), "PUSH_NULL": (0, 1),
           "LOAD_METHOD": (1, 2), "BINARY_OP": (2, 1), "BINARY_SUBSCR": (2, 1), "COMPARE_OP": (2, 1),
           "IS_OP": (2, 1), "CONTAINS_OP": (2, 1), "UNARY_NEGATIVE": (1, 1), "UNARY_NOT": (1, 1),
           "UNARY_INVERT": (1, 1), "PRECALL": (0, 0), "KW_NAMES": (0, 0), "NOP": (0, 0), "RESUME": (0, 0),
           "GET_ITER": (1, 1), "LOAD_ASSERTION_ERROR": (0, 1)}


def _effect(ins) -> Optional[tuple]:
    op, arg = ins.opname, ins.arg or 0
    if op == "LOAD_GLOBAL":  # Python 3.11+: the low bit also pushes a NULL before it
        return (0, 2 if arg & 1 else 1)
    if op == "LOAD_ATTR":  # Python 3.12+: the low bit makes it a method load (NULL/self + attr)
        return (1, 2 if sys.version_info >= (3, 12) and arg & 1 else 1)
    if op == "CALL":
        return (arg + 2, 1)
    if op in ("BUILD_LIST", "BUILD_TUPLE", "BUILD_SET", "BUILD_STRING"):
        return (arg, 1)
    if op == "BUILD_MAP":
        return (2 * arg, 1)
    return _SIMPLE.get(op)


def _producer(instructions: list, k: int, depth: int) -> Optional[int]:
    """The index of the instruction that pushed the value found at stack `depth` (0: the
    top) just before instruction `k`, walking back over straight-line code; None when
    the walk meets something it does not model."""
    for j in range(k - 1, -1, -1):
        ins = instructions[j]
        if ins.opname == "COPY":
            if depth == 0:
                return _producer(instructions, j, ins.arg - 1)
            depth -= 1
        elif ins.opname == "SWAP":
            depth = ins.arg - 1 if depth == 0 else 0 if depth == ins.arg - 1 else depth
        else:
            effect = _effect(ins)
            if effect is None:
                return None
            pops, pushes = effect
            if depth < pushes:
                return j
            depth += pops - pushes
        if ins.is_jump_target:
            return None
    return None


def _root(instructions: list, j: Optional[int]) -> Optional[int]:
    """Follows an attribute or item load (`a.b[0].c`) back to the load of its base object."""
    while j is not None and instructions[j].opname in ("LOAD_ATTR", "BINARY_SUBSCR", "LOAD_METHOD"):
        j = _producer(instructions, j, 1 if instructions[j].opname == "BINARY_SUBSCR" else 0)
    return j


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
