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
depends on data, but not side effects, which would run once at trace time and then be lost.
So before tracing, the hook's bytecode is checked conservatively (`hook_purity.check_hook`,
whose docstring says what it allows), and after tracing, the graph must hold only
functional, deterministic aten/prims ops (`_check_graph`).

Which kinds are traced:
- `tensor_pre_hook`: `hook(grad)` returns a tensor, or None for "unchanged";
- `pre_hook`: `hook([grads])` returns a sequence of tensors, or None;
- `post_hook` (module/node post hooks see grad_inputs and grad_outputs as tuples and are
  nearly always closures over modules) and `post_acc_grad_hook` (which exists for its side
  effect on `param.grad`) are never traced.

What the trace assumed is returned as a `camlir.cache.HookGuard` (which callable was traced
and every value from outside baked into the body); `HookGuard.holds(hooks)` checks it on
each call.
"""

from __future__ import annotations

import operator
from typing import Callable

import torch
from torch import fx
from torch_mlir import ir

from camlir import logs
from camlir.cache import HookGuard, describe_hook
from camlir.capture.hook_purity import Refused, check_hook
from camlir.dialects.ca.ir_helpers import ops_named, require_func
from camlir.dialects.ca.types import tensor_sig

__all__ = ["trace_hooks", "TRACED_KINDS"]

TRACED_KINDS = ("tensor_pre_hook", "pre_hook")


# --------------------------------------------------------------------------- tracing

_DTYPES = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "bf16": torch.bfloat16,
           "i64": torch.int64, "i32": torch.int32, "i16": torch.int16, "i8": torch.int8,
           "ui8": torch.uint8, "i1": torch.bool}


def _fake_spec(t: ir.Type) -> tuple:
    if not str(t).startswith("!torch.vtensor<"):
        raise Refused(f"operand type {t} is not a torch value tensor")
    sig = tensor_sig(t)
    if sig is None or sig.shape is None:
        raise Refused(f"operand type {t} has no known rank")
    if any(d is None for d in sig.shape):
        raise Refused(f"operand type {t} has symbolic sizes")
    if sig.dtype not in _DTYPES:
        raise Refused(f"operand type {t} has an element type camlir does not trace")
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
            raise Refused(f"returned a {type(out).__name__}, expected a sequence of gradients")
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
    except Refused:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever tracing raises, the hook stays a call
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise Refused(f"tracing on fake tensors failed ({type(exc).__name__}: {first}); it depends "
                      f"on tensor data or on something fake tensors cannot do") from None
    _check_graph(gm, specs)
    return gm


def _check_graph(gm: fx.GraphModule, specs: list) -> None:
    outputs = None
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            raise Refused("creates a tensor constant (e.g. torch.tensor(...)), which camlir does not inline")
        if n.op == "call_function":
            target = n.target
            if target is operator.getitem:
                continue
            if not isinstance(target, torch._ops.OpOverload) or target.namespace not in ("aten", "prims"):
                raise Refused(f"calls {target}, which is not an aten/prims op")
            if target._schema.is_mutable:
                raise Refused(f"calls {target}, which mutates a tensor in place")
            if torch.Tag.nondeterministic_seeded in target.tags:
                raise Refused(f"calls {target}, which draws random numbers")
        if n.op == "output":
            outputs = n.args[0]
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    if len(outputs) != len(specs):
        raise Refused(f"returned {len(outputs)} gradients, expected {len(specs)}")
    for i, (out, (shape, dtype)) in enumerate(zip(outputs, specs)):
        val = out.meta.get("val") if isinstance(out, fx.Node) else None
        if not isinstance(val, torch.Tensor):
            raise Refused(f"returned {type(val).__name__} for gradient #{i}, expected a tensor")
        if tuple(val.shape) != shape or val.dtype != dtype:
            raise Refused(f"changes gradient #{i} from {shape} {dtype} to {tuple(val.shape)} {val.dtype} "
                          f"(left to run time, which reports it)")


def _import_body(module: ir.Module, gm: fx.GraphModule, hook_id: int, types_in, types_out) -> str:
    from torch_mlir.extras.fx_importer import FxImporter

    for n in gm.graph.nodes:  # locations read loc("hook":<id>:0), like a node's provenance
        n.meta["stack_trace"] = f'  File "hook", line {hook_id}, in ca\n'
    importer = FxImporter(module=module)
    try:
        fn = importer.import_stateless_graph(gm.graph, func_name=f"hook_{hook_id}", func_visibility="private")
    except Exception as exc:  # noqa: BLE001
        raise Refused(f"its traced graph could not be imported into MLIR: {type(exc).__name__}: {exc}") from None
    fn = fn.operation
    ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
    if list(ftype.inputs) != list(types_in) or list(ftype.results) != list(types_out):
        fn.erase()
        raise Refused(f"its traced body has type {ftype}, not the hook's "
                      f"({', '.join(map(str, types_in))}) -> ({', '.join(map(str, types_out))})")
    return ir.StringAttr(fn.attributes["sym_name"]).value


# --------------------------------------------------------------------------- driver

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
        for op in ops_named(require_func(module, func_name), "ca.hook"):
            attrs = op.attributes
            kind = ir.StringAttr(attrs["kind"]).value
            hook_id = ir.IntegerAttr(attrs["hook_id"]).value
            if "body" in attrs or kind == "cpp_tensor_pre_hook":
                continue  # traced already; the engine's own C++ hooks (retain_grad) are not user code
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
                    raise Refused(f"the backward passes no hook with id {hook_id}")
                if kind not in TRACED_KINDS:
                    raise Refused(f"{kind} hooks are always called at run time")
                if "none_at" in attrs:
                    raise Refused("some of its gradients are None, which a traced body cannot express")
                specs = [_fake_spec(t) for t in types_in]
                reads = check_hook(hook)
                gm = _trace(hook, kind, specs, device)
                symbol = _import_body(module, gm, hook_id, types_in, types_out)
            except Refused as why:
                guard.refused[hook_id] = str(why)
                _log("hook %d (%s %s): not inlined, it runs in Python at run time: %s",
                     hook_id, kind, label, why)
                continue
            op.attributes["body"] = ir.FlatSymbolRefAttr.get(symbol)
            done[key] = symbol
            guard.add_inlined(hook_id, hook, reads, symbol)
            baked = [f"{r.what}={r.value!r}" for r in reads if r.by_value]
            _log("hook %d (%s %s): traced into @%s%s", hook_id, kind, label, symbol,
                 f" (baked in: {', '.join(baked)})" if baked else "")
    return guard

