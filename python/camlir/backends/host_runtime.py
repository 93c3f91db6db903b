"""The host runtime: how every backend runs the host function of a `ca` module.

A host function is straight-line code: `ca` ops (hooks, accumulations into `.grad`, sizes,
Python call-backs), torch ops kept on the host, and, in a compiled program, calls of
kernels. `compile_block` decodes a block once into a flat list of steps (a callable, input
slots, output slots); a call then only walks that list (`Runtime` is what one backward
call provides). Every backend uses it: the reference interpreter (`backends/eager.py`)
runs a whole captured module with it, and the compiled backends (`backends/cpu/program.py`,
`backends/gpu/program.py`) run their host functions with it, handing `compile_block` an
`extra(op)` that gives their own steps (kernel calls) for the ops they own.

Here, too, are the engine's rules that the compiled backends share: PyTorch's accumulation
into `.grad`, and which gradients `.grad` may take without a copy (`fresh_and_private`).
"""

import re
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch._dynamo.external_utils import call_accumulate_grad, call_backward, call_hook
from torch_mlir import ir
from torch_mlir.extras.fx_importer import TORCH_DTYPE_TO_INT, TORCH_LAYOUT_TO_INT, TORCH_MEMORY_FORMAT_TO_INT

from camlir import profiling
from camlir.capture.leaves import with_nones, without_nones
from camlir.dialects.ca.ir_helpers import defining_op

_INT_TO_DTYPE = {v: k for k, v in TORCH_DTYPE_TO_INT.items()}
_INT_TO_LAYOUT = {v: k for k, v in TORCH_LAYOUT_TO_INT.items()}
_INT_TO_MEMORY_FORMAT = {v: k for k, v in TORCH_MEMORY_FORMAT_TO_INT.items()}
_NO_OPS = ("torch.bind_symbolic_shape",)


class InterpreterError(RuntimeError):
    """An op the reference interpreter cannot run; `op_name` names it."""

    def __init__(self, op_name: str, message: str):
        self.op_name = op_name
        super().__init__(f"{op_name}: {message}")


@dataclass
class _Step:
    fn: object
    ins: tuple
    outs: tuple
    label: str = ""  # what `camlir.profile()` calls it: "kernel @k", "host aten.mm", "hook 2 (...)"
    frees: tuple = ()  # slots read for the last time here, dropped after it
    blas: object = None  # a kernel's BLAS totals (jit.blas_totals), split out by camlir.profile()


class _Program:
    """Straight-line code for one block: steps over a slot array.

    A value is dropped from the slot array after the last step that reads it, as the eager
    engine frees a node's saved tensors once the node has run: holding every intermediate
    until the end raised peak memory (a checkpointed model's recomputed activations all
    stayed alive at once)."""

    def __init__(self, n_slots, arg_slots, steps, result_slots):
        self.n_slots = n_slots
        self.arg_slots = arg_slots
        self.steps = steps = _batch_accumulations(steps)
        self.result_slots = result_slots
        last = {}
        for i, step in enumerate(steps):
            for slot in step.ins:
                last[slot] = i
            for slot in step.outs:
                last.setdefault(slot, i)  # a value nothing reads goes right after its step
        keep = set(result_slots)
        frees = [[] for _ in steps]
        for slot, i in last.items():
            if slot not in keep:
                frees[i].append(slot)
        for step, free in zip(steps, frees):
            step.frees = tuple(free)

    def run(self, args, runtime):
        env = [None] * self.n_slots
        for slot, value in zip(self.arg_slots, args):
            env[slot] = value
        if runtime.profile is not None and not runtime.profiling:
            return self._run_timed(env, runtime)
        for step in self.steps:
            outs = step.fn([env[i] for i in step.ins], runtime)
            for slot, value in zip(step.outs, outs):
                env[slot] = value
            for slot in step.frees:
                env[slot] = None
        return [env[i] for i in self.result_slots]

    def run_deferring(self, args, runtime):
        """`run` for a call with `DeferredPermute` arguments (only the cpu program makes
        them, so `run`, also every nested block's, checks for none): each becomes its view
        when a step first reads it (kept in its slot for the steps after)."""
        env = [None] * self.n_slots
        for slot, value in zip(self.arg_slots, args):
            env[slot] = value
        profile = runtime.profile if not runtime.profiling else None
        clock = time.perf_counter
        if profile is not None:  # timed as `_run_timed` times (FSDP2's resharded parameters come here)
            runtime.profiling = True
        try:
            for step in self.steps:
                ins = []
                for i in step.ins:
                    value = env[i]
                    if type(value) is DeferredPermute:
                        value = env[i] = value.view()
                    ins.append(value)
                if profile is not None:
                    blas = step.blas
                    before = tuple(blas) if blas is not None else None
                    start = clock()
                    outs = step.fn(ins, runtime)
                    profile.add_step(step.label, clock() - start)
                    if blas is not None:
                        profile.add_blas(step.label, *(a - b for a, b in zip(blas, before)))
                else:
                    outs = step.fn(ins, runtime)
                for slot, value in zip(step.outs, outs):
                    env[slot] = value
                for slot in step.frees:
                    env[slot] = None
        finally:
            if profile is not None:
                runtime.profiling = False
        return [env[i] if type(env[i]) is not DeferredPermute else env[i].view() for i in self.result_slots]

    def _run_timed(self, env, runtime):
        """`run` with every step timed into `runtime.profile` (nested blocks count in
        their parent's step)."""
        profile, clock = runtime.profile, time.perf_counter
        runtime.profiling = True
        try:
            for step in self.steps:
                blas = step.blas
                before = tuple(blas) if blas is not None else None
                start = clock()
                outs = step.fn([env[i] for i in step.ins], runtime)
                profile.add_step(step.label, clock() - start)
                if blas is not None:
                    profile.add_blas(step.label, *(a - b for a, b in zip(blas, before)))
                for slot, value in zip(step.outs, outs):
                    env[slot] = value
                for slot in step.frees:
                    env[slot] = None
        finally:
            runtime.profiling = False
        return [env[i] for i in self.result_slots]


class DeferredPermute:
    """`tensor.permute(perm)`, made when a step first reads it. An argument whose storage is
    too small for its view when the backward starts cannot be permuted then (torch checks
    the view against the storage): FSDP2 frees a resharded parameter's storage after the
    forward and all-gathers it again from a hook inside the backward, before the kernel
    that reads the parameter runs."""

    __slots__ = ("tensor", "perm")

    def __init__(self, tensor, perm):
        self.tensor, self.perm = tensor, perm

    def view(self):
        return self.tensor.permute(self.perm)


def storage_holds(t) -> bool:
    """Whether `t`'s storage is large enough for its sizes and strides right now."""
    if t.numel() == 0:
        return True
    last = t.storage_offset() + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    return t.untyped_storage().nbytes() >= (last + 1) * t.element_size()


class Runtime:
    """What one backward call provides: the hooks list, the Python call-back table and the
    packed data of saved-tensor hooks."""

    __slots__ = ("hooks", "callbacks", "packed", "profile", "profiling", "touched")

    def __init__(self, hooks, callbacks=(), packed=()):
        self.hooks = hooks
        self.callbacks = callbacks
        self.packed = packed  # what saved-tensor pack hooks returned (unpack hooks take it)
        self.profile = profiling.current()  # None unless camlir.profile() or CA_LOGS=perf
        self.profiling = False
        # Set by every step with an effect outside the program (a hook, a Python call-back,
        # an accumulation into .grad): until then a failed call can be answered another way.
        self.touched = False


ALIAS = object()  # what `extra` returns for an op whose result is its operand (a cast)


def compile_block(block: ir.Block, terminator: str, extra=None) -> _Program:
    """`extra(op)` may return a handler for ops this interpreter does not know (the cpu
    backend's kernel calls), `ALIAS` for a value-preserving cast, which costs no step,
    or None for "not mine"."""
    slots = {}

    def slot(v):
        if v not in slots:
            slots[v] = len(slots)
        return slots[v]

    arg_slots = tuple(slot(a) for a in block.arguments)
    steps, result_slots = [], ()
    for op in block.operations:
        op = op.operation
        if op.name == terminator:
            result_slots = tuple(slot(v) for v in op.operands)
            continue
        if op.name in _NO_OPS:
            continue
        fn = (extra(op) if extra is not None else None) or _handler(op, extra)
        if fn is ALIAS:
            slots[op.results[0]] = slot(op.operands[0])
            continue
        steps.append(_Step(fn, tuple(slot(v) for v in op.operands), tuple(slot(r) for r in op.results),
                           step_label(op)))
    return _Program(len(slots), arg_slots, steps, result_slots)


def step_label(op: ir.Operation) -> str:
    """How `camlir.profile()` names the step of `op`."""
    name, attrs = op.name, op.attributes
    if name == "func.call":
        return f"kernel @{ir.FlatSymbolRefAttr(attrs['callee']).value}"
    if name == "ca.hook":
        return f"hook {ir.IntegerAttr(attrs['hook_id']).value} ({ir.StringAttr(attrs['kind']).value})"
    if name == "ca.node" and "node" in attrs:
        return f"node {ir.StringAttr(attrs['node']).value}"
    if name == "torch.operator":
        return "host " + ir.StringAttr(attrs["name"]).value.removeprefix("torch.")
    if name.startswith(("torch.aten.", "torch.prims.")):
        return "host " + name.removeprefix("torch.")
    if name.startswith(("torch.constant.", "torch.prim.", "ca.size")):
        return "glue (constants, lists, sizes)"
    return name


def _handler(op: ir.Operation, extra=None):
    name = op.name
    attrs = op.attributes
    if name == "ca.node":
        body = compile_block(op.regions[0].blocks[0], terminator="ca.yield", extra=extra)
        return lambda ins, rt: body.run(ins, rt)
    if name == "ca.hook":
        return _hook_handler(op)
    if name == "ca.accumulate_grad":
        return _accumulate
    if name == "ca.size":
        if "value" in attrs:
            value = ir.IntegerAttr(attrs["value"]).value
            return lambda ins, rt: (value,)
        return lambda ins, rt: (int(ins[0]),)
    if name == "ca.call_python":
        ident = ir.IntegerAttr(attrs["id"]).value
        n_out = len(op.results)
        def call_python(ins, rt):
            rt.touched = True
            return _as_tuple(rt.callbacks[ident](*ins), n_out)
        return call_python
    if name.startswith("torch.constant."):
        value = constant_value(op)
        return lambda ins, rt: (value,)
    if name in ("torch.prim.ListConstruct", "torch.prim.TupleConstruct"):
        return lambda ins, rt: (list(ins),)
    if name in ("torch.prim.ListUnpack", "torch.prim.TupleUnpack"):
        return lambda ins, rt: tuple(ins[0])
    if name == "torch.vtensor.literal":
        tensor = literal_tensor(attrs["value"], op)
        return lambda ins, rt: (tensor,)
    if name == "torch.operator":
        return _aten_handler(op, ir.StringAttr(attrs["name"]).value.removeprefix("torch."))
    if name.startswith("torch.aten.") or name.startswith("torch.prims."):
        return _aten_handler(op, name.removeprefix("torch."))
    raise InterpreterError(name, "not supported by the reference interpreter")


def _as_tuple(out, n):
    if n == 0:
        return ()
    if n == 1:
        return (out,)
    return tuple(out)


def _hook_handler(op):
    kind = ir.StringAttr(op.attributes["kind"]).value
    ident = ir.IntegerAttr(op.attributes["hook_id"]).value
    n_results = len(op.results)
    if kind == "tensor_pre_hook":
        def tensor_pre(ins, rt):
            rt.touched = True
            out = call_hook(rt.hooks[ident], ins[0], hook_type=kind)
            _check_hook_results(rt.hooks[ident], kind, ins, (out,))
            return (out,)
        return tensor_pre
    if kind == "unpack_hook":
        return _unpack_handler(op, ident)
    if kind == "custom_backward":
        return _custom_backward_handler(op, ident)
    if kind == "cpp_tensor_pre_hook":
        run_cpp_hooks = torch._C._dynamo.compiled_autograd.call_cpp_tensor_pre_hooks
        def cpp_tensor_pre(ins, rt):
            rt.touched = True
            return (run_cpp_hooks(ident, ins[0]),)
        return cpp_tensor_pre
    none_at = [ir.IntegerAttr(a).value for a in op.attributes["none_at"]] if "none_at" in op.attributes else []
    none_at_outputs = ([ir.IntegerAttr(a).value for a in op.attributes["none_at_outputs"]]
                       if "none_at_outputs" in op.attributes else [])
    if kind == "pre_hook":
        def pre(ins, rt):
            rt.touched = True
            grads = with_nones(list(ins), none_at)
            outs = tuple(call_hook(rt.hooks[ident], grads, hook_type=kind))
            _check_hook_results(rt.hooks[ident], kind, grads, outs)
            return tuple(without_nones(outs, none_at, kind))
        return pre
    if kind == "post_hook":
        def post(ins, rt):
            rt.touched = True
            grad_inputs = with_nones(list(ins[:n_results]), none_at)
            grad_outputs = with_nones(list(ins[n_results:]), none_at_outputs)
            outs = tuple(call_hook(rt.hooks[ident], grad_inputs, grad_outputs, hook_type=kind))
            _check_hook_results(rt.hooks[ident], kind, grad_inputs, outs)
            return tuple(without_nones(outs, none_at, kind))
        return post

    def post_acc_grad(ins, rt):
        rt.touched = True
        call_hook(rt.hooks[ident], ins[0], hook_type=kind)
        return ()
    return post_acc_grad


def _unpack_handler(op, ident):
    """A saved-tensor unpack hook: called on its packed value; what it returns must be what
    the compiled code was built for (the capture saw its size and dtype), or the kernels
    would read memory wrongly. Checked on every call: a clear error, never a wrong read."""
    data_id = ir.IntegerAttr(op.attributes["data_id"]).value
    expected = str(op.results[0].type)
    m = re.match(r"!torch\.vtensor<\[([^\]]*)\],", expected)
    dims = [None if d == "?" else int(d) for d in m.group(1).split(",")] if m and m.group(1) else []

    def unpack(ins, rt):
        rt.touched = True
        out = call_hook(rt.hooks[ident], rt.packed[data_id], hook_type="unpack_hook")
        if (not isinstance(out, torch.Tensor) or out.dim() != len(dims)
                or any(d is not None and d != s for d, s in zip(dims, out.shape))):
            got = f"{type(out).__name__} {tuple(out.shape) if isinstance(out, torch.Tensor) else ''}"
            raise RuntimeError(f"camlir: saved-tensor unpack hook {ident} returned {got}, but the compiled "
                               f"backward was built for {expected} (the tensor the capture saw)")
        return (out,)
    return unpack


def _ints(op, name: str) -> list:
    return [ir.IntegerAttr(a).value for a in op.attributes[name]] if name in op.attributes else []


def _custom_backward_handler(op, ident):
    """A host call: the backward of a custom autograd.Function camlir could not trace, run
    as compiled autograd runs it (`call_backward`, with the saved tensors handed over). Its
    gradients then get the engine's checks (`validate_outputs`): one that broadcast is summed
    to the input's shape, one of another dtype is cast. One that is None where the program
    was built for a tensor (the capture's real run saw one there) cannot be given to the
    kernels that follow: a clear error, never a wrong gradient."""
    n_saved = ir.IntegerAttr(op.attributes["saved"]).value
    saved_none_at, none_at, positions = _ints(op, "saved_none_at"), _ints(op, "none_at"), _ints(op, "outputs")
    expected = [_shape_and_dtype(r.type) for r in op.results]

    def custom_backward(ins, rt):
        rt.touched = True
        ctx = rt.hooks[ident]
        saved = with_nones(list(ins[:n_saved]), saved_none_at)
        grads = with_nones(list(ins[n_saved:]), none_at)
        outs = call_backward(ctx, saved, *grads)
        name = getattr(getattr(ctx, "_forward_cls", None), "__name__", "a custom Function")
        results = []
        for position, (dims, dtype) in zip(positions, expected):
            out = outs[position] if position < len(outs) else None
            if not isinstance(out, torch.Tensor):
                raise RuntimeError(f"camlir: the backward of {name} returned {type(out).__name__} as gradient "
                                   f"#{position}, where the compiled backward was built for a tensor (the "
                                   f"capture's run returned one there)")
            if out.dim() >= len(dims) and (out.dim() > len(dims) or any(
                    d is not None and d != s for d, s in zip(dims, out.shape))):
                target = [s if d is None else d for d, s in zip(dims, out.shape[out.dim() - len(dims):])]
                if torch.Size(target).numel() and _expands_to(target, out.shape):
                    out = out.sum_to_size(target)  # the engine's rule for a gradient that broadcast
            if out.dim() != len(dims) or any(d is not None and d != s for d, s in zip(dims, out.shape)):
                raise RuntimeError(f"camlir: the backward of {name} returned a gradient #{position} of shape "
                                   f"{tuple(out.shape)}; the input has shape {tuple(dims)}")
            if dtype is not None and out.dtype != dtype:
                out = out.to(dtype)
            results.append(out)
        return tuple(results)
    return custom_backward


def _expands_to(shape, to) -> bool:
    """Whether a tensor of `shape` broadcasts to `to` (so `sum_to_size` undoes it)."""
    lead = len(to) - len(shape)
    return lead >= 0 and all(s in (1, t) for s, t in zip(shape, to[lead:]))


def _shape_and_dtype(t: ir.Type) -> tuple:
    """(dims with None for `?`, torch dtype or None) of a `!torch.vtensor` type."""
    m = re.match(r"!torch\.vtensor<\[([^\]]*)\],([a-z0-9]+)>", str(t))
    if not m:
        return [], None
    dims = [None if d == "?" else int(d) for d in m.group(1).split(",")] if m.group(1) else []
    return dims, _DTYPE_NAMES.get(m.group(2))


_DTYPE_NAMES = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "bf16": torch.bfloat16,
                "si64": torch.int64, "si32": torch.int32, "si16": torch.int16, "si8": torch.int8,
                "ui8": torch.uint8, "i1": torch.bool}


def _check_hook_results(hook, kind, grads, outs) -> None:
    """A hook must hand back gradients shaped like the ones it got, as the eager engine
    insists; otherwise broadcasting downstream could silently produce wrong gradients."""
    if len(outs) != len(grads):
        raise RuntimeError(f"{kind} {_hook_name(hook)} returned {len(outs)} gradients, expected {len(grads)}")
    for i, (g, o) in enumerate(zip(grads, outs)):
        if o is None or g is None:
            continue
        if not isinstance(o, torch.Tensor):
            raise TypeError(f"{kind} {_hook_name(hook)} returned {type(o).__name__} for gradient #{i}, "
                            f"expected a Tensor or None")
        if o.shape != g.shape or o.dtype != g.dtype:
            raise RuntimeError(f"{kind} {_hook_name(hook)} changed gradient #{i} from "
                               f"{tuple(g.shape)} {g.dtype} to {tuple(o.shape)} {o.dtype}")


def _hook_name(hook) -> str:
    name = getattr(hook, "__qualname__", None) or type(hook).__name__
    return f"'{name}'"


def _accumulate(ins, rt):
    rt.touched = True
    param, grad = ins
    # PyTorch's own accumulation: assigns (or steals) when .grad is None, else adds in place.
    call_accumulate_grad(param, param.grad, grad, False)
    return ()


def _batch_accumulations(steps: list) -> list:
    """`steps` with each run of consecutive accumulations into `.grad` made one step (a
    backward ends with one per parameter). Each step costs a turn of `_Program.run`'s loop
    (gather its inputs, store its outputs, drop its dead slots); a run of six cost 9 us of
    a 310 us backward (a residual block of six parameters), two thirds of it the loop's.
    The same rules, in the same order: only the number of steps changes."""
    out, run = [], []
    for step in steps + [None]:
        if step is not None and step.fn in _ACCUMULATIONS:
            run.append(step)
            continue
        if len(run) > 1:
            out.append(_Step(_accumulate_all(tuple(r.fn is steal_or_accumulate for r in run)),
                             tuple(slot for r in run for slot in r.ins), (),
                             f"ca.accumulate_grad x{len(run)}"))
        else:
            out.extend(run)
        run = []
        if step is not None:
            out.append(step)
    return out


def _accumulate_all(steals: tuple):
    """One step for consecutive accumulations: `steals[k]` says whether the k-th may take
    its gradient without a copy (`steal_or_accumulate`) or goes through PyTorch's helper."""
    def accumulate_all(ins, rt):
        rt.touched = True
        pairs = iter(ins)
        for steal, param, grad in zip(steals, pairs, pairs):
            if (steal and param.grad is None and grad.shape == param.shape and grad.dtype == param.dtype
                    and param.is_contiguous() and grad.is_contiguous() and not grad.requires_grad):
                param.grad = grad
            else:
                call_accumulate_grad(param, param.grad, grad, False)
        return ()
    return accumulate_all


def fresh_and_private(value: ir.Value) -> bool:
    """True when `value` is a tensor the backward just made, that nothing but this
    accumulation reads, so `.grad` may take it without a copy: a kernel result (the runtime
    allocated it), or the result of a host op whose schema says it aliases no input (a
    convolution's weight gradient). Measured on ResNet-18: copying each host-op gradient
    into `.grad` cost ~380 us per parameter, 11% of the backward."""
    if len(list(value.uses)) != 1:
        return False
    owner = defining_op(value)
    if owner is not None and owner.name == "torch_c.from_builtin_tensor":
        value = owner.operands[0]
        if len(list(value.uses)) != 1:
            return False
        owner = defining_op(value)
    if owner is None:
        return False
    if owner.name == "func.call":
        return True
    return owner.name.startswith("torch.aten.") and _returns_fresh(owner.name.removeprefix("torch.aten."))


def _returns_fresh(name: str) -> bool:
    """Whether no functional overload of `aten::<name>` returns an alias of an input (by its
    schema)."""
    packet = getattr(torch.ops.aten, name, None) if not name.endswith("_") else None
    if packet is None:
        return False
    try:  # out= overloads alias their out argument; the imported graph uses functional ones
        schemas = [getattr(packet, overload)._schema for overload in packet.overloads()
                   if overload != "out" and not overload.endswith("_out")]
    except Exception:  # noqa: BLE001 - an op we cannot inspect is not known to be fresh
        return False
    return bool(schemas) and all(r.alias_info is None for schema in schemas for r in schema.returns)


def steal_or_accumulate(ins, rt):
    """The eager engine's AccumulateGrad with `.grad` unset: it steals a gradient nobody
    else holds when its layout matches the parameter's, else it copies; with `.grad` set
    it adds in place. PyTorch's helper cannot see that our kernel output is private (the
    interpreter holds references), so it would always copy: 4 MB per 1024x1024 weight."""
    rt.touched = True
    param, grad = ins
    if (param.grad is None and param.is_contiguous() and grad.is_contiguous() and grad.dtype == param.dtype
            and grad.shape == param.shape and not grad.requires_grad):
        param.grad = grad
    else:
        call_accumulate_grad(param, param.grad, grad, False)
    return ()


_ACCUMULATIONS = (_accumulate, steal_or_accumulate)


def constant_value(op: ir.Operation):
    """The Python value of a `torch.constant.*` op (None, int, float, bool, str, device)."""
    name = op.name
    if name == "torch.constant.none":
        return None
    value = op.attributes["value"]
    if name == "torch.constant.int":
        return ir.IntegerAttr(value).value
    if name == "torch.constant.float":
        return ir.FloatAttr(value).value
    if name == "torch.constant.bool":
        return bool(ir.BoolAttr(value).value) if isinstance(value, ir.BoolAttr) else bool(ir.IntegerAttr(value).value)
    if name == "torch.constant.str":
        return ir.StringAttr(value).value
    if name == "torch.constant.device":
        return torch.device(ir.StringAttr(value).value)
    if name == "torch.constant.number":
        return ir.FloatAttr(value).value if isinstance(value, ir.FloatAttr) else ir.IntegerAttr(value).value
    raise InterpreterError(name, "unknown constant kind")


_NP_DTYPES = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "i64": np.int64, "si64": np.int64,
              "i32": np.int32, "si32": np.int32, "i1": np.bool_, "i8": np.int8, "ui8": np.uint8}


def literal_tensor(attr, op: ir.Operation) -> torch.Tensor:
    """The tensor of a `torch.vtensor.literal` op's `value` attribute (dense or resource)."""
    shaped = ir.ShapedType(attr.type)
    elem = str(shaped.element_type)
    if elem not in _NP_DTYPES:
        raise InterpreterError("torch.vtensor.literal", f"unsupported literal element type {elem}")
    if str(attr).startswith("dense_resource<"):
        data = _resource_blob(op, str(attr).split("<", 1)[1].split(">", 1)[0])
        array = np.frombuffer(data, dtype=_NP_DTYPES[elem]).reshape(shaped.shape).copy()
        return torch.from_numpy(array)
    if not isinstance(attr, ir.DenseElementsAttr):
        raise InterpreterError("torch.vtensor.literal", f"unsupported literal attribute {attr}")
    if attr.is_splat:
        value = attr.get_splat_value()
        scalar = value.value if hasattr(value, "value") else value
        array = np.full(shaped.shape, scalar, dtype=_NP_DTYPES[elem])
    else:
        array = np.array(attr, copy=True).astype(_NP_DTYPES[elem]).reshape(shaped.shape)
    return torch.from_numpy(array)


def _resource_blob(op: ir.Operation, name: str) -> bytes:
    """The bytes of a `dense_resource<name>` literal (torch-mlir's importer makes them for
    tensor constants, e.g. the indices of a rewritten `as_strided`). The Python bindings
    cannot read a resource, but the module prints it: a hex blob whose first 4 bytes are
    its alignment, then the raw little-endian data."""
    top = op
    while top.parent is not None:
        top = top.parent
    text = top.get_asm()
    for key in (f'"{name}": "0x', f"{name}: \"0x"):
        at = text.find(key, text.rfind("dialect_resources"))
        if at >= 0:
            start = at + len(key)
            return bytes.fromhex(text[start:text.index('"', start)])[4:]
    raise InterpreterError("torch.vtensor.literal", f"resource {name} not found in the module")


def resolve_op(target: str):
    """`aten.mul.Tensor` / `aten.mm` / `prims.convert_element_type` -> an OpOverload."""
    parts = target.split(".")
    namespace, name = parts[0], parts[1]
    overload = ".".join(parts[2:]) or "default"
    try:
        packet = getattr(getattr(torch.ops, namespace), name)
        return getattr(packet, overload)
    except (AttributeError, RuntimeError):
        raise InterpreterError(target, "no such PyTorch operator") from None


def _aten_handler(op: ir.Operation, target: str):
    overload = resolve_op(target)
    schema = overload._schema
    converters = []
    for arg in schema.arguments:
        t = str(arg.type)
        conv = None
        if "ScalarType" in t:
            conv = _INT_TO_DTYPE
        elif "MemoryFormat" in t:
            conv = _INT_TO_MEMORY_FORMAT
        elif "Layout" in t:
            conv = _INT_TO_LAYOUT
        converters.append((arg.name, arg.kwarg_only, conv))
    n_operands = len(op.operands)
    if n_operands > len(converters):
        raise InterpreterError(target, f"{n_operands} operands for a schema with {len(converters)} arguments")
    converters = converters[:n_operands]
    n_results = len(op.results)
    n_returns = len(schema.returns)
    mutated = [i for i, arg in enumerate(schema.arguments[:n_operands])
               if arg.alias_info is not None and arg.alias_info.is_write]
    # An op that writes into some of its arguments, imported in functional form: torch-mlir
    # imports `auto_functionalized(op, ...)` (a custom mutating op in an AOT backward, e.g.
    # recomputed under selective checkpointing) as the op itself with results
    # (*its results, *the new values of the arguments it writes). Calling the op as is would
    # write into values other ops still read, and bind its one result to the wrong names.
    functional = bool(mutated) and n_results == n_returns + len(mutated)

    def run(ins, rt):
        args, kwargs = [], {}
        written = []
        for i, (value, (name, kwarg_only, conv)) in enumerate(zip(ins, converters)):
            if conv is not None and isinstance(value, int):
                value = conv[value]
            if functional and i in mutated:
                value = _clone_keeping_strides(value)  # as auto_functionalized does
                written.append(value)
            if kwarg_only:
                kwargs[name] = value
            else:
                args.append(value)
        out = overload(*args, **kwargs)
        if functional:
            return _as_tuple(out, n_returns) + tuple(written)
        return _as_tuple(out, n_results)

    return run


def _clone_keeping_strides(value):
    if not isinstance(value, torch.Tensor):
        return value
    from torch._prims_common import clone_preserve_strides  # what auto_functionalized uses

    return clone_preserve_strides(value)
