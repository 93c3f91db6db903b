"""What a Python hook reads and does, checked from its bytecode before it is traced.

`camlir.capture.hook_trace` traces a hook on fake tensors so that its body can be inlined.
Tracing on fake tensors is safe only if it records everything the hook does. Fake tensors
catch what depends on data (`.item()`, `if g.sum() > 0`, NumPy conversions raise), but a
`print`, an append to an outside list or a write to a global would run once, at trace time,
and then be lost. So before tracing, the hook's bytecode is checked conservatively here
(`check_hook`); after tracing, `hook_trace` checks that the graph holds only functional,
deterministic aten/prims ops.

`check_hook` also returns every value read from outside the hook that the trace will bake
into the body (numbers and strings of globals, closure cells and default arguments; the
identity of the torch/math functions and modules read from globals), as `Read`s that the
guard (`camlir.cache.HookGuard`) reads again on every call.
"""

from __future__ import annotations

import dis
import types
from dataclasses import dataclass
from typing import Any, Callable

import torch

__all__ = ["Refused", "Read", "check_hook", "value_rule"]

# Builtins a hook may call: pure functions of their arguments (on fake tensors, those that
# would read tensor data, like float(g), raise at trace time).
_PURE_BUILTINS = frozenset({
    "abs", "all", "any", "bool", "divmod", "enumerate", "float", "int", "isinstance", "len",
    "list", "map", "max", "min", "pow", "range", "reversed", "round", "slice", "sorted", "sum",
    "tuple", "zip", "dict", "AssertionError", "ValueError", "RuntimeError", "TypeError",
    "True", "False", "None",
})

# Modules a hook may read from globals or closure cells.
_PURE_MODULES = frozenset({"torch", "math", "torch.nn.functional", "torch.special", "torch.linalg",
                           "torch.fft"})
# `__module__` of the functions a hook may hold in a global or closure cell.
_PURE_FUNCTION_MODULES = frozenset({"torch", "torch.functional", "torch.nn.functional", "torch._C._nn",
                                    "torch._C._linalg", "torch._C._special", "torch._C._fft",
                                    "torch.special", "torch.linalg", "torch.fft", "math"})

# Attribute names a hook may not read (on anything: statically we cannot tell a tensor from
# a module). In-place methods end with "_"; private and dunder names start with it.
_DENIED_ATTRS = frozenset({
    "item", "tolist", "numpy", "backward", "retain_grad", "save", "load", "seed", "distributed",
    "cuda", "mps", "xpu", "hub", "jit", "library", "autograd", "compile", "utils", "backends",
    "profiler", "multiprocessing", "testing", "onnx", "export", "fx", "ops", "storage",
    "untyped_storage", "data_ptr", "random", "serialization", "record_stream", "share_memory",
    "pin_memory", "manual_seed", "print", "grad", "grad_fn", "apply",
})
_DENIED_PREFIXES = ("_", "set_", "get_", "register_", "use_")

# Opcodes that only move values between the stack and locals, compute, branch or call.
# Anything else (stores to globals, attributes, subscripts or outside closure cells,
# imports, `with`, try/except, generators, class bodies) refuses the hook.
_SAFE_OPCODES = frozenset({
    "NOP", "RESUME", "CACHE", "EXTENDED_ARG", "POP_TOP", "COPY", "SWAP", "PUSH_NULL",
    "LOAD_CONST", "LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR", "LOAD_FAST_LOAD_FAST",
    "STORE_FAST", "STORE_FAST_LOAD_FAST", "STORE_FAST_STORE_FAST", "DELETE_FAST",
    "LOAD_GLOBAL", "LOAD_ATTR", "LOAD_METHOD", "LOAD_DEREF", "LOAD_CLOSURE", "MAKE_CELL",
    "COPY_FREE_VARS", "STORE_DEREF", "MAKE_FUNCTION", "SET_FUNCTION_ATTRIBUTE",
    "PRECALL", "CALL", "KW_NAMES", "CALL_FUNCTION_EX", "CALL_KW",
    "BINARY_OP", "BINARY_SUBSCR", "BINARY_SLICE", "BUILD_SLICE", "UNARY_NEGATIVE", "UNARY_NOT",
    "UNARY_INVERT", "UNARY_POSITIVE", "COMPARE_OP", "IS_OP", "CONTAINS_OP", "TO_BOOL",
    "BUILD_TUPLE", "BUILD_LIST", "BUILD_MAP", "BUILD_CONST_KEY_MAP", "BUILD_SET", "BUILD_STRING",
    "FORMAT_VALUE", "FORMAT_SIMPLE", "FORMAT_WITH_SPEC", "CONVERT_VALUE",
    "LIST_APPEND", "LIST_EXTEND", "LIST_TO_TUPLE", "SET_ADD", "SET_UPDATE", "MAP_ADD",
    "DICT_UPDATE", "DICT_MERGE", "UNPACK_SEQUENCE", "UNPACK_EX", "GET_ITER", "FOR_ITER",
    "END_FOR", "RETURN_VALUE", "RETURN_CONST", "LOAD_ASSERTION_ERROR", "RAISE_VARARGS",
    "JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP", "JUMP_NO_INTERRUPT",
    "POP_JUMP_IF_FALSE", "POP_JUMP_IF_TRUE", "POP_JUMP_IF_NONE", "POP_JUMP_IF_NOT_NONE",
    "POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_FORWARD_IF_NONE",
    "POP_JUMP_FORWARD_IF_NOT_NONE", "POP_JUMP_BACKWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_TRUE",
    "POP_JUMP_BACKWARD_IF_NONE", "POP_JUMP_BACKWARD_IF_NOT_NONE", "JUMP_IF_FALSE_OR_POP",
    "JUMP_IF_TRUE_OR_POP",
})
_WHY_OPCODE = {
    "STORE_GLOBAL": "assigns a global", "DELETE_GLOBAL": "deletes a global",
    "STORE_ATTR": "assigns an attribute", "DELETE_ATTR": "deletes an attribute",
    "STORE_SUBSCR": "assigns to a subscript (item assignment)", "DELETE_SUBSCR": "deletes a subscript",
    "DELETE_DEREF": "deletes a closure variable", "IMPORT_NAME": "imports a module",
    "IMPORT_FROM": "imports a module", "IMPORT_STAR": "imports a module",
    "BEFORE_WITH": "uses a `with` block", "SETUP_WITH": "uses a `with` block",
    "PUSH_EXC_INFO": "catches exceptions (it could swallow what fake tracing raises)",
    "YIELD_VALUE": "uses a generator", "RETURN_GENERATOR": "uses a generator or coroutine",
    "LOAD_NAME": "reads a name dynamically", "STORE_NAME": "assigns a name dynamically",
    "LOAD_BUILD_CLASS": "defines a class", "PRINT_EXPR": "prints",
}


class Refused(Exception):
    """Why a hook is not traced; becomes the log message and `HookGuard.refused[id]`.

    Raised by `check_hook` here and by the tracing steps of `hook_trace`."""


@dataclass
class Read:
    """One value from outside the hook that the trace baked in, and how to read it again
    from a hook with the same code (`read(hook)`). The guard checks `holds(hook)` on every
    call and reports `change(hook)` when it fails."""

    what: str
    read: Callable[[Any], Any]
    value: Any
    by_value: bool  # numbers and strings compare by value, modules and functions by identity

    def holds(self, hook) -> bool:
        try:
            now = self.read(hook)
        except Exception:  # noqa: BLE001 - a cell emptied, a global deleted: changed
            return False
        if not self.by_value:
            return now is self.value
        return type(now) is type(self.value) and (now == self.value or (now != now and self.value != self.value))

    def change(self, hook) -> str:
        try:
            shown = repr(self.read(hook))
        except Exception:  # noqa: BLE001
            shown = "<missing>"
        return f"{self.what} changed from {self.value!r} to {shown}"


# --------------------------------------------------------------------------- bytecode check

def value_rule(obj) -> tuple:
    """(admissible, by_value, why-not) for a value a hook reads from outside itself."""
    if obj is None or type(obj) in (bool, int, float, complex, str):
        return True, True, ""
    if isinstance(obj, (torch.dtype, torch.device)):
        return True, True, ""
    if type(obj) is tuple:
        if all(value_rule(x)[:2] == (True, True) for x in obj):
            return True, True, ""
        return False, False, "a tuple holding mutable or unknown objects"
    if isinstance(obj, types.ModuleType):
        if obj.__name__ in _PURE_MODULES:
            return True, False, ""
        return False, False, f"module {obj.__name__}, which is not torch or math"
    if isinstance(obj, (types.BuiltinFunctionType, types.FunctionType)):
        module = getattr(obj, "__module__", None) or ""
        name = getattr(obj, "__name__", "")
        if module in _PURE_FUNCTION_MODULES and not _denied_name(name):
            return True, False, ""
        return False, False, f"function {module}.{name}, which is not a known pure torch/math function"
    if isinstance(obj, torch.Tensor):
        return False, False, "a tensor (its values would be baked in without a guard)"
    return False, False, f"a {type(obj).__name__} (mutable or unknown state)"


def _denied_name(name: str) -> bool:
    return name in _DENIED_ATTRS or name.startswith(_DENIED_PREFIXES) or name.endswith("_")


def _check_function(fn: types.FunctionType) -> list:
    """Checks a plain Python hook; returns the outside reads to guard, or raises Refused."""
    reads = []
    code = fn.__code__
    for i, (name, cell) in enumerate(zip(code.co_freevars, fn.__closure__ or ())):
        try:
            value = cell.cell_contents
        except ValueError:
            raise Refused(f"closure variable '{name}' is not set yet") from None
        ok, by_value, why = value_rule(value)
        if not ok:
            raise Refused(f"reads closure variable '{name}', {why}")
        reads.append(Read(f"closure variable '{name}'", (lambda f, i=i: f.__closure__[i].cell_contents),
                          value, by_value))
    for what, defaults in (("default arguments", fn.__defaults__), ("keyword defaults", fn.__kwdefaults__)):
        if defaults:
            values = tuple(defaults.values()) if isinstance(defaults, dict) else tuple(defaults)
            for v in values:
                ok, by_value, why = value_rule(v)
                if not ok or not by_value:
                    raise Refused(f"has a default argument that is {why or 'not a plain value'}")
            attr = "__defaults__" if what == "default arguments" else "__kwdefaults__"
            reads.append(Read(what, (lambda f, a=attr: getattr(f, a)), defaults, True))
    seen_globals = set()
    _check_code(code, fn, set(code.co_freevars), reads, seen_globals)
    return reads


def _check_code(code: types.CodeType, fn, outside: set, reads: list, seen_globals: set) -> None:
    globals_, builtins_ = fn.__globals__, fn.__builtins__
    for ins in dis.get_instructions(code):
        op = ins.opname
        if op not in _SAFE_OPCODES:
            raise Refused(_WHY_OPCODE.get(op, f"uses bytecode {op}, which is not known to be pure")
                          + f" (line {ins.positions.lineno if ins.positions else '?'})")
        if op == "STORE_DEREF" and ins.argval in outside:
            raise Refused(f"assigns closure variable '{ins.argval}' of an enclosing function")
        if op in ("LOAD_ATTR", "LOAD_METHOD") and _denied_name(ins.argval):
            raise Refused(_why_attr(ins.argval))
        if op == "LOAD_GLOBAL" and ins.argval not in seen_globals:
            seen_globals.add(ins.argval)
            reads.append(_check_global(ins.argval, globals_, builtins_))
    if code.co_exceptiontable:
        raise Refused("catches exceptions (it could swallow what fake tracing raises)")
    for const in code.co_consts:
        if isinstance(const, types.CodeType):  # nested functions and comprehensions
            inner_outside = {n for n in const.co_freevars if n in outside}
            _check_code(const, fn, inner_outside, reads, seen_globals)


def _why_attr(name: str) -> str:
    if name == "item":
        return "calls .item(), which reads tensor data"
    if name in ("numpy", "tolist"):
        return f"calls .{name}(), which leaves torch"
    if name.endswith("_") and not name.startswith("_"):
        return f"calls .{name}(), which works in place"
    return f"uses attribute '{name}', which is not known to be pure"


def _check_global(name: str, globals_: dict, builtins_: dict) -> Read:
    if name in globals_:
        value = globals_[name]
        ok, by_value, why = value_rule(value)
        if not ok:
            raise Refused(f"reads global '{name}', {why}")
        return Read(f"global '{name}'", (lambda f: f.__globals__[name]), value, by_value)
    if name in builtins_:
        if name not in _PURE_BUILTINS:
            return_why = "prints" if name == "print" else "is not in the pure allow-list"
            raise Refused(f"calls builtin '{name}', which {return_why}")
        value = builtins_[name]
        # Guarded by identity through the globals: a global defined later would shadow it.
        return Read(f"builtin '{name}'", (lambda f: f.__globals__.get(name, f.__builtins__.get(name))),
                    value, False)
    raise Refused(f"reads global '{name}', which is not defined")


def check_hook(hook) -> list:
    """Checks that tracing `hook` records everything it does; returns the `Read`s of the
    values from outside it that the trace bakes in (to guard), or raises `Refused`."""
    if isinstance(hook, (types.FunctionType, types.BuiltinFunctionType)):
        ok, _, why = value_rule(hook)
        if ok:  # a torch/math function registered directly, e.g. register_hook(torch.neg)
            return []
        if isinstance(hook, types.BuiltinFunctionType):
            raise Refused(f"is {why}")
        return _check_function(hook)
    if isinstance(hook, types.MethodType):
        raise Refused("is a bound method: the object it is bound to may hold state")
    raise Refused(f"is a {type(hook).__name__}, not a plain function: its state cannot be proven pure")
