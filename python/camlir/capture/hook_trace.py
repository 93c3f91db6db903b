"""Tracing Python hooks at compile time, so that `ca-inline-hooks` can inline them.

A captured backward calls its hooks through `ca.hook` ops; the Python callable of each is
found at run time as `hooks[hook_id]` in the list the autograd engine hands over. For each
`ca.hook` whose callable is safe to trace, `trace_hooks` traces the callable with `make_fx`
on fake tensors shaped like the hook's operands (the hook never sees real data), imports
the aten graph with torch-mlir's `FxImporter` as a private `func.func @hook_<id>` of the
same module, and points the op's `body` attribute at it. The pass `ca-inline-hooks` then
replaces the call by that body. A hook that is not traced stays a call into Python at run
time, in its place in the graph, so it still sees exactly the gradient it would see eagerly.

Safe to trace means: tracing records everything the hook does. Fake tensors catch what
depends on data (`.item()`, `if g.sum() > 0`, NumPy conversions raise), but a `print`, an
append to an outside list or a write to a global would run once, at trace time, and then be
lost. So before tracing, the hook's bytecode is checked conservatively (`_check_code`), and
after tracing, the graph must hold only functional, deterministic aten/prims ops.

Which kinds are traced:
- `tensor_pre_hook`: `hook(grad)` returns a tensor, or None for "unchanged";
- `pre_hook`: `hook([grads])` returns a sequence of tensors, or None;
- `post_hook` (module/node post hooks see grad_inputs and grad_outputs as tuples and are
  nearly always closures over modules) and `post_acc_grad_hook` (which exists for its side
  effect on `param.grad`) are never traced.

What the trace assumed is returned as a `HookGuard`: per inlined hook, which callable was
traced (for a Python function: its code object and globals, so that the same `lambda`
created again on the next forward still matches; for anything else: the object) and every
value read from outside that was baked into the body (numbers and strings of globals,
closure cells and default arguments; the identity of the torch/math functions and modules
read from globals). `HookGuard.holds(hooks)` checks them on each call.
"""

from __future__ import annotations

import dis
import operator
import os
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch import fx
from torch_mlir import ir

from camlir import logs
from camlir.dialects.ca.types import tensor_sig

__all__ = ["HookGuard", "trace_hooks", "TRACED_KINDS"]

TRACED_KINDS = ("tensor_pre_hook", "pre_hook")

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


class _Refused(Exception):
    """Why a hook is not traced; becomes the log message and `HookGuard.refused[id]`."""


def describe_hook(hook) -> str:
    """`<lambda at file.py:12>` for logs and guard messages."""
    code = getattr(hook, "__code__", None)
    name = getattr(hook, "__qualname__", None) or getattr(hook, "__name__", None) or type(hook).__name__
    name = name.replace("<lambda>", "lambda").replace("<locals>", "locals")
    if code is not None:
        return f"<{name} at {os.path.basename(code.co_filename)}:{code.co_firstlineno}>"
    return f"<{name}>"


# --------------------------------------------------------------------------- the guard

@dataclass
class _Read:
    """One value from outside the hook that the trace baked in, and how to read it again
    from a hook with the same code (`read(hook)`)."""

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


@dataclass
class _Inlined:
    """A traced hook: what must be found in its slot for the traced body to be right.

    A plain function matches when it runs the same code object with the same globals and
    every baked value reads the same through it: the traced function itself, or the same
    `lambda` created anew (activation hooks are registered again on every forward). Anything
    else (a builtin torch function) must be the very object that was traced.
    """

    hook_id: int
    label: str
    hook: Any = None  # held only when it has no code (builtins); functions match by code
    code: Any = None
    globals: Any = None
    reads: list = field(default_factory=list)

    def matches(self, h) -> bool:
        if self.code is None:
            return h is self.hook
        return type(h) is types.FunctionType and h.__code__ is self.code and h.__globals__ is self.globals

    def first_change(self, h) -> Optional[_Read]:
        for r in self.reads:
            if not r.holds(h):
                return r
        return None


def _entry(hook_id: int, hook, reads: list) -> _Inlined:
    if isinstance(hook, types.FunctionType):
        return _Inlined(hook_id, describe_hook(hook), code=hook.__code__, globals=hook.__globals__, reads=reads)
    return _Inlined(hook_id, describe_hook(hook), hook=hook, reads=reads)


class HookGuard:
    """What a module with traced hook bodies assumes about the hooks list.

    `inlined` maps each traced hook id to its body symbol, `refused` each hook id that was
    left as a call to the reason (both for logs and tests). `holds(hooks)` is the cheap check
    to run on every backward call: each traced slot holds the traced hook (a function with
    the same code object and globals, see `_Inlined`), and every value the trace baked in
    reads the same. `reason(hooks)` says what changed.
    """

    def __init__(self):
        self.inlined: dict = {}
        self.refused: dict = {}
        self._entries: list = []

    def _add(self, entry: _Inlined, symbol: str) -> None:
        self._entries.append(entry)
        self.inlined[entry.hook_id] = symbol

    def holds(self, hooks) -> bool:
        n = len(hooks)
        for e in self._entries:
            if e.hook_id >= n:
                return False
            h = hooks[e.hook_id]
            if not e.matches(h):
                return False
            for r in e.reads:
                if not r.holds(h):
                    return False
        return True

    def reason(self, hooks) -> str:
        """Why `holds(hooks)` is False ("" when it holds), for the recompile log."""
        for e in self._entries:
            if e.hook_id >= len(hooks):
                return f"hook {e.hook_id} changed: the backward passes only {len(hooks)} hooks"
            h = hooks[e.hook_id]
            if not e.matches(h):
                return f"hook {e.hook_id} changed: {describe_hook(h)} is not the traced hook {e.label}"
            changed = e.first_change(h)
            if changed is not None:
                return f"hook {e.hook_id} {e.label}: {changed.change(h)}"
        return ""

    def __repr__(self) -> str:
        return f"HookGuard(inlined={self.inlined}, refused={self.refused})"


# --------------------------------------------------------------------------- bytecode check

def _value_rule(obj) -> tuple:
    """(admissible, by_value, why-not) for a value a hook reads from outside itself."""
    if obj is None or type(obj) in (bool, int, float, complex, str):
        return True, True, ""
    if isinstance(obj, (torch.dtype, torch.device)):
        return True, True, ""
    if type(obj) is tuple:
        if all(_value_rule(x)[:2] == (True, True) for x in obj):
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
    """Checks a plain Python hook; returns the outside reads to guard, or raises _Refused."""
    reads = []
    code = fn.__code__
    for i, (name, cell) in enumerate(zip(code.co_freevars, fn.__closure__ or ())):
        try:
            value = cell.cell_contents
        except ValueError:
            raise _Refused(f"closure variable '{name}' is not set yet") from None
        ok, by_value, why = _value_rule(value)
        if not ok:
            raise _Refused(f"reads closure variable '{name}', {why}")
        reads.append(_Read(f"closure variable '{name}'", (lambda f, i=i: f.__closure__[i].cell_contents),
                           value, by_value))
    for what, defaults in (("default arguments", fn.__defaults__), ("keyword defaults", fn.__kwdefaults__)):
        if defaults:
            values = tuple(defaults.values()) if isinstance(defaults, dict) else tuple(defaults)
            for v in values:
                ok, by_value, why = _value_rule(v)
                if not ok or not by_value:
                    raise _Refused(f"has a default argument that is {why or 'not a plain value'}")
            attr = "__defaults__" if what == "default arguments" else "__kwdefaults__"
            reads.append(_Read(what, (lambda f, a=attr: getattr(f, a)), defaults, True))
    seen_globals = set()
    _check_code(code, fn, set(code.co_freevars), reads, seen_globals)
    return reads


def _check_code(code: types.CodeType, fn, outside: set, reads: list, seen_globals: set) -> None:
    globals_, builtins_ = fn.__globals__, fn.__builtins__
    for ins in dis.get_instructions(code):
        op = ins.opname
        if op not in _SAFE_OPCODES:
            raise _Refused(_WHY_OPCODE.get(op, f"uses bytecode {op}, which is not known to be pure")
                           + f" (line {ins.positions.lineno if ins.positions else '?'})")
        if op == "STORE_DEREF" and ins.argval in outside:
            raise _Refused(f"assigns closure variable '{ins.argval}' of an enclosing function")
        if op in ("LOAD_ATTR", "LOAD_METHOD") and _denied_name(ins.argval):
            raise _Refused(_why_attr(ins.argval))
        if op == "LOAD_GLOBAL" and ins.argval not in seen_globals:
            seen_globals.add(ins.argval)
            reads.append(_check_global(ins.argval, globals_, builtins_))
    if code.co_exceptiontable:
        raise _Refused("catches exceptions (it could swallow what fake tracing raises)")
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


def _check_global(name: str, globals_: dict, builtins_: dict) -> _Read:
    if name in globals_:
        value = globals_[name]
        ok, by_value, why = _value_rule(value)
        if not ok:
            raise _Refused(f"reads global '{name}', {why}")
        return _Read(f"global '{name}'", (lambda f: f.__globals__[name]), value, by_value)
    if name in builtins_:
        if name not in _PURE_BUILTINS:
            return_why = "prints" if name == "print" else "is not in the pure allow-list"
            raise _Refused(f"calls builtin '{name}', which {return_why}")
        value = builtins_[name]
        # Guarded by identity through the globals: a global defined later would shadow it.
        return _Read(f"builtin '{name}'", (lambda f: f.__globals__.get(name, f.__builtins__.get(name))),
                     value, False)
    raise _Refused(f"reads global '{name}', which is not defined")


def _check_hook(hook) -> list:
    if isinstance(hook, (types.FunctionType, types.BuiltinFunctionType)):
        ok, _, why = _value_rule(hook)
        if ok:  # a torch/math function registered directly, e.g. register_hook(torch.neg)
            return []
        if isinstance(hook, types.BuiltinFunctionType):
            raise _Refused(f"is {why}")
        return _check_function(hook)
    if isinstance(hook, types.MethodType):
        raise _Refused("is a bound method: the object it is bound to may hold state")
    raise _Refused(f"is a {type(hook).__name__}, not a plain function: its state cannot be proven pure")


# --------------------------------------------------------------------------- tracing

_DTYPES = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "bf16": torch.bfloat16,
           "i64": torch.int64, "i32": torch.int32, "i16": torch.int16, "i8": torch.int8,
           "ui8": torch.uint8, "i1": torch.bool}


def _fake_spec(t: ir.Type) -> tuple:
    if not str(t).startswith("!torch.vtensor<"):
        raise _Refused(f"operand type {t} is not a torch value tensor")
    sig = tensor_sig(t)
    if sig is None or sig.shape is None:
        raise _Refused(f"operand type {t} has no known rank")
    if any(d is None for d in sig.shape):
        raise _Refused(f"operand type {t} has symbolic sizes")
    if sig.dtype not in _DTYPES:
        raise _Refused(f"operand type {t} has an element type camlir does not trace")
    return tuple(sig.shape), _DTYPES[sig.dtype]


def _traced_function(hook, kind: str) -> Callable:
    """The function handed to make_fx: the hook with `call_hook`'s None handling."""
    if kind == "tensor_pre_hook":
        def body(grad):
            out = hook(grad)
            return (grad if out is None else out,)
        return body

    def body(*grads):
        out = hook(list(grads))
        if out is None:
            return tuple(grads)
        if not isinstance(out, (tuple, list)):
            raise _Refused(f"returned a {type(out).__name__}, expected a sequence of gradients")
        return tuple(out)
    return body


def _trace(hook, kind: str, specs: list, device: str) -> fx.GraphModule:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from torch._dynamo import compiled_autograd as ca_mod

    mode = FakeTensorMode()
    with mode:
        fakes = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in specs]
    try:
        with torch.no_grad(), ca_mod._disable():
            gm = make_fx(_traced_function(hook, kind), tracing_mode="fake")(*fakes)
    except _Refused:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever tracing raises, the hook stays a call
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise _Refused(f"tracing on fake tensors failed ({type(exc).__name__}: {first}); it depends "
                       f"on tensor data or on something fake tensors cannot do") from None
    _check_graph(gm, specs)
    return gm


def _check_graph(gm: fx.GraphModule, specs: list) -> None:
    outputs = None
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            raise _Refused("creates a tensor constant (e.g. torch.tensor(...)), which camlir does not inline")
        if n.op == "call_function":
            target = n.target
            if target is operator.getitem:
                continue
            if not isinstance(target, torch._ops.OpOverload) or target.namespace not in ("aten", "prims"):
                raise _Refused(f"calls {target}, which is not an aten/prims op")
            if target._schema.is_mutable:
                raise _Refused(f"calls {target}, which mutates a tensor in place")
            if torch.Tag.nondeterministic_seeded in target.tags:
                raise _Refused(f"calls {target}, which draws random numbers")
        if n.op == "output":
            outputs = n.args[0]
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    if len(outputs) != len(specs):
        raise _Refused(f"returned {len(outputs)} gradients, expected {len(specs)}")
    for i, (out, (shape, dtype)) in enumerate(zip(outputs, specs)):
        val = out.meta.get("val") if isinstance(out, fx.Node) else None
        if not isinstance(val, torch.Tensor):
            raise _Refused(f"returned {type(val).__name__} for gradient #{i}, expected a tensor")
        if tuple(val.shape) != shape or val.dtype != dtype:
            raise _Refused(f"changes gradient #{i} from {shape} {dtype} to {tuple(val.shape)} {val.dtype} "
                           f"(left to run time, which reports it)")


def _import_body(module: ir.Module, gm: fx.GraphModule, hook_id: int, types_in, types_out) -> str:
    from torch_mlir.extras.fx_importer import FxImporter

    for n in gm.graph.nodes:  # locations read loc("hook":<id>:0), like a node's provenance
        n.meta["stack_trace"] = f'  File "hook", line {hook_id}, in ca\n'
    importer = FxImporter(module=module)
    try:
        fn = importer.import_stateless_graph(gm.graph, func_name=f"hook_{hook_id}", func_visibility="private")
    except Exception as exc:  # noqa: BLE001
        raise _Refused(f"its traced graph could not be imported into MLIR: {type(exc).__name__}: {exc}") from None
    fn = fn.operation
    ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
    if list(ftype.inputs) != list(types_in) or list(ftype.results) != list(types_out):
        fn.erase()
        raise _Refused(f"its traced body has type {ftype}, not the hook's "
                       f"({', '.join(map(str, types_in))}) -> ({', '.join(map(str, types_out))})")
    return ir.StringAttr(fn.attributes["sym_name"]).value


# --------------------------------------------------------------------------- driver

def _hook_ops(module: ir.Module, func_name: str) -> list:
    fn = None
    for op in module.body.operations:
        op = op.operation
        if op.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == func_name:
            fn = op
    if fn is None:
        raise ValueError(f"no function @{func_name} in the module")
    found = []

    def visit(op):
        if op.operation.name == "ca.hook":
            found.append(op.operation)
        return ir.WalkResult.ADVANCE

    fn.walk(visit, ir.WalkOrder.PRE_ORDER)
    return found


def _log(message: str, *args) -> None:
    if logs.enabled("verbose"):
        logs.log.info(message, *args)


def trace_hooks(module: ir.Module, hooks, func_name: str = "backward", device: str = "cpu") -> HookGuard:
    """Traces every safely traceable hook of `func_name` into a body function of `module`.

    `hooks` is the list the autograd engine passes with the backward (`hooks[hook_id]`).
    Hooks are only ever called on fake tensors on `device`. Each traced `ca.hook` gets
    `body = @hook_<id>`; run `ca-inline-hooks` to inline the bodies. Returns the guard the
    compiled artifact must check on every call (`HookGuard.holds(hooks)`).
    """
    guard = HookGuard()
    done = {}  # (hook_id, operand types) -> symbol, for a hook called more than once
    with module.context, ir.Location.unknown():
        for op in _hook_ops(module, func_name):
            attrs = op.attributes
            kind = ir.StringAttr(attrs["kind"]).value
            hook_id = ir.IntegerAttr(attrs["hook_id"]).value
            if "body" in attrs:
                continue
            hook = hooks[hook_id] if 0 <= hook_id < len(hooks) else None
            label = describe_hook(hook) if hook is not None else "<missing>"
            types_in = [v.type for v in op.operands]
            types_out = [r.type for r in op.results]
            key = (hook_id, tuple(str(t) for t in types_in))
            if key in done:
                op.attributes["body"] = ir.FlatSymbolRefAttr.get(done[key])
                continue
            try:
                if hook is None:
                    raise _Refused(f"the backward passes no hook with id {hook_id}")
                if kind not in TRACED_KINDS:
                    raise _Refused(f"{kind} hooks are always called at run time")
                specs = [_fake_spec(t) for t in types_in]
                reads = _check_hook(hook)
                gm = _trace(hook, kind, specs, device)
                symbol = _import_body(module, gm, hook_id, types_in, types_out)
            except _Refused as why:
                guard.refused[hook_id] = str(why)
                _log("hook %d (%s %s): not inlined, it runs in Python at run time: %s",
                     hook_id, kind, label, why)
                continue
            op.attributes["body"] = ir.FlatSymbolRefAttr.get(symbol)
            done[key] = symbol
            guard._add(_entry(hook_id, hook, reads), symbol)
            baked = [f"{r.what}={r.value!r}" for r in reads if r.by_value]
            _log("hook %d (%s %s): traced into @%s%s", hook_id, kind, label, symbol,
                 f" (baked in: {', '.join(baked)})" if baked else "")
    return guard

