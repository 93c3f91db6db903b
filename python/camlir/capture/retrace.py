"""Re-tracing a captured backward down to aten ops, with node provenance.

PyTorch's compiled autograd hands camlir a GraphModule whose autograd nodes are opaque
calls (`ops.AddmmBackward0(...)`), plus hook calls and accumulation. Running that graph on
fake tensors under `make_fx` records the aten ops each node's backward formula executes;
hooks and accumulation are swapped for the `camlir::` leaves so they stay single, opaque
calls and never run. Every recorded op is tagged with the node it came from.

Sizes: a graph with no lifted sizes is traced with static shapes. A graph with lifted sizes
(PyTorch lifts exactly the sizes that changed between calls) is traced symbolically: those
sizes become symbols, as do the dims of every non-parameter input; parameters stay static.
Tracing can specialise (e.g. assume two symbols are equal); the guards it relied on are
kept and checked on every call (`Retraced.guards_hold`).
"""

import operator
import re
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import fx
from torch._dynamo import compiled_autograd as ca_mod
from torch._dynamo.external_utils import call_accumulate_grad, call_backward, call_hook, unwrap_maybe_dynamic_int
from torch.fx import traceback as fx_traceback
from torch.fx.experimental.proxy_tensor import make_fx

from camlir.cache import ValueGuard

from . import leaves  # noqa: F401  (registers the camlir:: ops)
from .backward_effects import BackwardWritesOutside, outside_writes
from .baked_values import RecordingCtx
from .decompositions import decomposition_table

_ORIGIN = re.compile(r"^\s*(\S[^\n]*?) \(NodeCall (\d+)\)\s*$", re.M)
_AOT_NAME = re.compile(r"^(aot\d+(?:_\d+)?)_")


class RetraceError(RuntimeError):
    """Re-tracing failed inside one autograd node; `node` names it ("MyFnBackward#3")."""

    def __init__(self, node: str, cause: BaseException):
        self.node = node
        self.cause = cause
        super().__init__(f"autograd node {node} could not be traced: {type(cause).__name__}: {cause}")


def _origin(n: fx.Node) -> Optional[tuple]:
    m = _ORIGIN.search(n.meta.get("stack_trace") or "")
    return (m.group(1), int(m.group(2))) if m else None


def annotate_provenance(gm: fx.GraphModule) -> None:
    """Stores each node's origin in `meta["custom"]`, which make_fx copies onto the aten
    ops recorded while that node runs (`preserve_node_meta`)."""
    # Nodes pasted from an AOT backward keep the forward's stack trace; their origin is the
    # `call_aot_bwd_prologue` node whose outputs are named after the same aot<N> prefix.
    aot_origin = {}
    for n in gm.graph.nodes:
        if n.op == "call_function" and getattr(n.target, "__name__", "").startswith("call_aot_bwd_prologue"):
            for user in n.users:
                m = _AOT_NAME.match(user.name)
                if m and _origin(n):
                    aot_origin[m.group(1)] = _origin(n)
    for n in gm.graph.nodes:
        m = _AOT_NAME.match(n.name)
        origin = aot_origin.get(m.group(1)) if m else _origin(n)
        custom = dict(n.meta.get("custom") or {})
        if origin is not None:
            custom["ca_node"], custom["ca_index"] = origin
        if m:
            custom["ca_aot"] = int(re.match(r"aot(\d+)", m.group(1)).group(1))
        if custom:
            n.meta["custom"] = custom


def _hook_index(n: fx.Node) -> int:
    """`call_hook`'s first argument is `hooks[i]`; returns i."""
    h = n.args[0]
    if not (isinstance(h, fx.Node) and h.op == "call_function" and h.args and
            getattr(h.args[0], "name", None) == "hooks"):
        raise RuntimeError(f"unexpected hook reference in {n.format_node()}")
    return int(h.args[1])


def _data_index(n: fx.Node) -> int:
    """An unpack hook's second argument is `packed_data[j]`; returns j."""
    d = n.args[1]
    if not (isinstance(d, fx.Node) and d.op == "call_function" and d.args and
            getattr(d.args[0], "name", None) == "packed_data"):
        raise RuntimeError(f"unexpected packed-data reference in {n.format_node()}")
    return int(d.args[1])


def has_unpack_hooks(gm: fx.GraphModule) -> bool:
    """Whether the captured graph calls saved-tensor unpack hooks (activation checkpointing)."""
    return any(n.op == "call_function" and n.target is call_hook and n.kwargs.get("hook_type") == "unpack_hook"
               for n in gm.graph.nodes)


class _Recorder(fx.Interpreter):
    def __init__(self, gm, host_nodes=()):
        super().__init__(gm)
        self.seen = {}
        self.host_nodes = set(host_nodes)
        self.host_calls = {}

    def run_node(self, n):
        out = super().run_node(n)
        if n.op == "call_function" and n.target is call_hook and n.kwargs.get("hook_type") == "unpack_hook":
            if not isinstance(out, torch.Tensor):
                raise RuntimeError(f"a saved-tensor unpack hook returned {type(out).__name__}, not a tensor")
            self.seen[n.name] = (tuple(out.shape), tuple(out.stride()), out.dtype)
        if n.name in self.host_nodes:
            self.host_calls[n.name] = frozenset(i for i, g in enumerate(out) if g is None)
        return out


def record_run(gm: fx.GraphModule, inputs, sizes, scalars, hooks, packed_data, host_nodes=()) -> tuple:
    """Runs the captured graph for real (it is the backward: gradients land in `.grad`),
    recording what each saved-tensor unpack hook returned and which entries the backwards
    of host-call nodes (FX names `host_nodes`) returned as None: (results, {node name:
    (size, stride, dtype)}, {node name: positions of None}). The re-trace needs those, and
    only running the hook (for checkpointing: the forward's recomputation) or the backward
    tells them."""
    recorder = _Recorder(gm, host_nodes)
    results = recorder.run(inputs, sizes, scalars, hooks, packed_data)
    return results, recorder.seen, recorder.host_calls


def node_label(n: fx.Node) -> str:
    """The autograd node `n` came from, as `"AddmmBackward0#2"` (name and its NodeCall
    index), or `n`'s own FX name when it has no provenance (`annotate_provenance` first)."""
    custom = n.meta.get("custom") or {}
    if "ca_node" in custom:
        return f"{custom['ca_node']}#{custom['ca_index']}"
    return n.name


def _nones(grads) -> list:
    return [i for i, g in enumerate(grads) if g is None]


def _present(grads) -> list:
    return [g for g in grads if g is not None]


class _Retracer(fx.Interpreter):
    """Runs the captured graph on fake tensors, routing hooks and accumulation to leaves;
    what custom Functions' backwards read from `ctx` goes through the lift-or-guard rule
    into `value_guard`."""

    def __init__(self, gm, value_guard: ValueGuard, unpacked: Optional[dict] = None,
                 host_calls: Optional[dict] = None):
        super().__init__(gm)
        self.value_guard = value_guard
        self.unpacked = unpacked or {}
        self.host_calls = host_calls if host_calls is not None else {}
        self.host_nodes = {}   # node label -> (its ctx's hook index, why its backward is a host call)
        self.unseen = set()    # FX names of host-call nodes whose None outputs are not known yet
        self.skipped_accumulations = 0  # accumulations of a None gradient (from a host call)

    def run_node(self, n: fx.Node) -> Any:
        self._current = n
        try:
            return super().run_node(n)
        except RetraceError:
            raise
        except Exception as exc:
            raise RetraceError(node_label(n), exc) from exc

    def call_function(self, target, args, kwargs):
        n = self._current
        if target is call_hook:
            kind = kwargs.get("hook_type")
            i = _hook_index(n)
            if kind == "tensor_pre_hook":
                return torch.ops.camlir.tensor_pre_hook(i, args[1])
            if kind == "pre_hook":
                none_at = _nones(args[1])
                out = torch.ops.camlir.pre_hook(i, _present(args[1]), none_at)
                return leaves.with_nones(out, none_at)
            if kind == "post_hook":
                none_at, none_at_outputs = _nones(args[1]), _nones(args[2])
                out = torch.ops.camlir.post_hook(i, _present(args[1]), _present(args[2]), none_at, none_at_outputs)
                return leaves.with_nones(out, none_at)
            if kind == "post_acc_grad_hook":
                torch.ops.camlir.post_acc_grad_hook(i, args[1])
                return args[1]
            if kind == "unpack_hook":
                if n.name not in self.unpacked:
                    raise NotImplementedError("a saved-tensor unpack hook whose result was not seen yet "
                                              "(record_run runs the graph once first)")
                size, stride, dtype = self.unpacked[n.name]
                return torch.ops.camlir.unpack_hook(i, _data_index(n), list(size), list(stride), dtype)
            raise NotImplementedError(f"hook kind '{kind}' is not supported")
        if target is call_backward:
            ctx, saved, *grads = args
            try:
                recording = RecordingCtx(ctx, saved, _hook_index(n), node_label(n), self.value_guard)
                backward = recording._forward_cls.backward
                writes = outside_writes(backward)
                if writes is not None:  # checked before it runs: on fake tensors, once, it would do it wrong
                    raise BackwardWritesOutside(
                        f"the backward of {recording._forward_cls.__name__} {writes}; run once at trace time "
                        f"on fake tensors, that would never happen on the calls that follow")
                grads = backward(recording, *grads)
            except Exception as exc:  # noqa: BLE001 - whatever stops the trace, the node runs itself
                return self._host_call(n, saved, grads, exc)
            return grads if isinstance(grads, tuple) else (grads,)
        if target is torch._C._dynamo.compiled_autograd.call_cpp_tensor_pre_hooks:
            return torch.ops.camlir.cpp_tensor_pre_hook(int(args[0]), args[1])  # never run at trace time
        if target is call_accumulate_grad:
            param, old_grad, grad, has_post_hooks = args
            if grad is None:  # a host call's backward returned None for it: nothing to add, as the engine does
                self.skipped_accumulations += 1
                return None
            torch.ops.camlir.accumulate_grad(param, old_grad, grad, bool(has_post_hooks))
            return None
        if getattr(target, "__name__", "") == "_exec_final_callbacks_stub":
            return None  # a marker; final callbacks run outside the graph
        return super().call_function(target, args, kwargs)


    def _host_call(self, n: fx.Node, saved, grads, exc: BaseException) -> tuple:
        """The node's backward as a host call (`camlir::custom_backward`): it runs in Python at
        its place in the program, with its saved tensors and grad_outputs handed over. Its
        results are shaped by the node's input metadata (the `validate_outputs` that follows
        it in the captured graph), so sizes may be symbols. Which entries the backward
        returns as None is known only from a real run (`record_run`); until then the
        node is in `unseen` and every entry with metadata is taken to be a tensor."""
        label = node_label(n)
        metadata = self._output_metadata(n)
        if metadata is None:
            raise RetraceError(label, exc) from exc
        if n.name not in self.host_calls:
            self.unseen.add(n.name)
        none_positions = self.host_calls.get(n.name, frozenset())
        outputs, sizes, ranks, dtypes = [], [], [], []
        for k in sorted(metadata):
            meta = metadata[k]
            if meta is None or k in none_positions:
                continue
            dtype, shape = meta[0][3], list(meta[1])
            if dtype not in leaves.DTYPES:
                raise RetraceError(label, exc) from exc
            outputs.append(k)
            sizes += shape
            ranks.append(len(shape))
            dtypes.append(dtype)
        if any(s is not None and not isinstance(s, torch.Tensor) for s in saved):
            raise RetraceError(label, exc) from exc
        self.host_nodes[label] = (_hook_index(n), f"{type(exc).__name__}: {exc}")
        present = torch.ops.camlir.custom_backward(
            _hook_index(n), _present(saved), _nones(saved), _present(grads), _nones(grads), outputs, sizes, ranks,
            dtypes)
        result = [None] * (max(metadata) + 1 if metadata else 0)
        for k, value in zip(outputs, present):
            result[k] = value
        return tuple(result)

    def _output_metadata(self, n: fx.Node) -> Optional[dict]:
        """{output position: the engine's metadata of that input (None: it needs no
        gradient)} for a `call_backward` node, read from the `validate_outputs` its results
        go through; None when the graph does not have that form."""
        metadata = {}
        for user in n.users:
            if not (user.op == "call_function" and user.target is operator.getitem and isinstance(user.args[1], int)):
                return None
            checks = [u for u in user.users if getattr(u.target, "__name__", "") == "validate_outputs"]
            if len(checks) != 1:
                return None
            check = checks[0]
            position = check.args[0].index(user)
            meta = fx.node.map_arg(check.args[1][position], lambda a: self.env[a])
            if meta is not None and not (isinstance(meta, (tuple, list)) and len(meta) >= 2 and
                                         isinstance(meta[0], (tuple, list)) and len(meta[0]) > 3):
                return None
            metadata[user.args[1]] = meta
        return metadata


@dataclass
class Retraced:
    """A captured backward re-traced to aten ops (what `retrace` returns).

    `graph` is the aten GraphModule; `symbolic` says whether the lifted sizes are symbols
    (graph arguments) or were traced as constants. A symbolic trace keeps its `shape_env`
    and the fake `placeholders` it was traced with, so that `guards_hold` can check a later
    call's inputs and sizes against the guards tracing relied on.
    """

    graph: fx.GraphModule
    symbolic: bool
    shape_env: Any = None
    placeholders: list = field(default_factory=list)
    value_guard: ValueGuard = field(default_factory=ValueGuard)
    # input index -> its traced shape, a static dim as its int and a symbolic one as None
    static_shapes: dict = field(default_factory=dict)
    # node label -> (hook index of its ctx, why its backward is a host call: `camlir::custom_backward`)
    host_nodes: dict = field(default_factory=dict)
    # FX names of host-call nodes traced without knowing which entries they return as None
    unseen: set = field(default_factory=set)
    # accumulations of the captured graph that received None from a host call (none traced)
    skipped_accumulations: int = 0

    def guards_hold(self, inputs, sizes) -> bool:
        """Whether this trace is valid for a call with `inputs` and plain int `sizes`
        (always for a static trace). Parameters were traced with static shapes, which the
        shape environment does not guard: another model with the same structure reaches the
        same capture, so their shapes are compared here."""
        if not self.symbolic:
            return True
        if not static_dims_hold(self.static_shapes, inputs):
            return False
        if not hasattr(self, "_guards"):
            self._guards = CompiledGuards(self.guards_code())
        return self._guards(list(inputs) + list(sizes))

    def guards_code(self) -> Optional[str]:
        """The shape guards as one Python expression over `L["t<i>"]` (inputs, then sizes),
        built once. The disk cache stores it."""
        if not hasattr(self, "_guards_code"):
            self._guards_code = self.shape_env.produce_guards_expression(self.placeholders)
        return self._guards_code


def static_dims(fake_inputs) -> dict:
    """Per tensor input of a symbolic trace that has a static dim, its shape with every
    static dim as its int and every symbolic one as None. Parameters are traced static; a
    dim of size 0 or 1 is static too (the shape environment specialises them, and
    `produce_guards` leaves no guard for it). Unchecked, a program traced when an index
    list had one element broadcast that element over later, longer lists (wrong gradients
    of `y[i, j]`, PyTorch's test_autograd `test_indexing`)."""
    shapes = {}
    for i, t in enumerate(fake_inputs):
        if isinstance(t, torch.Tensor):
            dims = tuple(d if isinstance(d, int) else None for d in t.shape)
            if any(d is not None for d in dims):
                shapes[i] = dims
    return shapes


def static_dims_hold(static_shapes: dict, inputs) -> bool:
    """Whether every input keeps the rank and the static dims it was traced with."""
    for i, dims in static_shapes.items():
        shape = inputs[i].shape
        if len(shape) != len(dims) or any(d is not None and d != s for d, s in zip(dims, shape)):
            return False
    return True


class CompiledGuards:
    """`guards(args) -> bool` for a guard expression from `guards_code`, compiled once:
    evaluating the text each call (what `ShapeEnv.evaluate_guards_expression` does) cost
    1.8 ms per backward on a 2-layer MLP, the compiled expression a few microseconds."""

    def __init__(self, code: Optional[str]):
        from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP

        self.scope = SYMPY_INTERP
        self.code = compile(code, "<camlir shape guards>", "eval") if code else None

    def __call__(self, args) -> bool:
        if self.code is None:
            return True
        return bool(eval(self.code, self.scope, {"L": {f"t{i}": a for i, a in enumerate(args)}}))  # noqa: S307


def plain_sizes(sizes) -> list:
    """The engine's lifted sizes as ints: it passes a size it marks dynamic as a tensor of
    shape `[0, n]`, which becomes `n`; plain ints stay."""
    return [unwrap_maybe_dynamic_int(s) for s in sizes]


def retrace(gm: fx.GraphModule, inputs, sizes, scalars, hooks, packed_data, unpacked=None,
            host_calls=None) -> Retraced:
    """Re-traces one captured graph, using one call's real inputs for shapes and strides.
    `unpacked` (`record_run`) gives the metadata of what saved-tensor unpack hooks
    return; a graph with such hooks needs it, and is traced with static sizes only.
    A custom Function's backward that cannot be traced becomes a host call; `host_calls`
    ({FX name: positions returned as None}, from `record_run`) says what such a
    node returned when it ran for real."""
    annotate_provenance(gm)
    sizes = plain_sizes(sizes)
    value_guard = ValueGuard()
    tracers = []
    if unpacked and sizes:
        raise RetraceError("saved-tensor hooks", NotImplementedError(
            "saved-tensor unpack hooks (activation checkpointing) with sizes that change between "
            "calls: the recomputed tensors' shapes are only known for the sizes seen"))

    def run(inputs, sizes, scalars):
        tracer = _Retracer(gm, value_guard, unpacked, host_calls)
        tracers.append(tracer)
        with torch.no_grad():
            return tracer.run(list(inputs), list(sizes), list(scalars), hooks, packed_data)

    def with_host_calls(retraced: Retraced) -> Retraced:
        retraced.host_nodes = dict(tracers[0].host_nodes)
        retraced.unseen = set(tracers[0].unseen)
        retraced.skipped_accumulations = tracers[0].skipped_accumulations
        return retraced

    with fx_traceback.preserve_node_meta(), ca_mod._disable():
        if not sizes:
            traced = make_fx(lambda inputs, scalars: run(inputs, [], scalars), tracing_mode="fake",
                             decomposition_table=decomposition_table())(list(inputs), list(scalars))
            if _has_mutations(traced):
                traced = make_fx(_functionalized(traced), tracing_mode="fake",
                                 decomposition_table=decomposition_table())(list(inputs), list(scalars))
            return with_host_calls(Retraced(traced, symbolic=False, value_guard=value_guard))
        retraced = _retrace_symbolic(run, inputs, sizes, scalars)
        retraced.value_guard = value_guard
        return with_host_calls(retraced)


def _has_mutations(traced: fx.GraphModule) -> bool:
    return any(isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable
               for n in traced.graph.nodes if n.op == "call_function")


def _functionalized(traced: fx.GraphModule):
    """In-place aten ops (a few backward formulas use them) rewritten functionally.

    Done as a second pass over the aten graph: functionalizing the first trace itself would
    run AOT backward regions under a functorch transform, which they refuse.
    """
    def run(*args):
        # Through an Interpreter so that preserve_node_meta copies each node's provenance.
        return fx.Interpreter(traced).run(*torch.utils._pytree.tree_flatten(args)[0])

    return torch.func.functionalize(run, remove="mutations")


def _retrace_symbolic(run, inputs, sizes, scalars) -> Retraced:
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    shape_env = ShapeEnv()
    fake_mode = FakeTensorMode(shape_env=shape_env)
    fake_inputs = []
    for i, t in enumerate(inputs):
        if not isinstance(t, torch.Tensor):
            fake_inputs.append(t)
            continue
        dim = DimDynamic.STATIC if isinstance(t, torch.nn.Parameter) else DimDynamic.DYNAMIC
        context = StatelessSymbolicContext(dynamic_sizes=[dim] * t.dim())
        fake_inputs.append(fake_mode.from_tensor(t, source=ConstantSource(f"inputs_{i}"),
                                                 symbolic_context=context))
    sym_sizes = [shape_env.create_unspecified_symint_and_symbol(v, ConstantSource(f"sizes_{i}"),
                                                                 DimDynamic.DYNAMIC)
                 for i, v in enumerate(sizes)]
    # The lifted scalars are constants of the trace, as in a static one (a new value is a new
    # program: `Artifacts.find`'s scalar guard). Handed to make_fx as arguments, symbolic
    # tracing made each int a SymInt placeholder that the program then expected and the
    # driver never passed (PyTorch's test_autograd_cpp_node_saved_int under dynamic=True).
    scalars = list(scalars)
    traced = make_fx(lambda inputs, sizes: run(inputs, sizes, scalars), tracing_mode="symbolic",
                     decomposition_table=decomposition_table())(fake_inputs, sym_sizes)
    if _has_mutations(traced):
        traced = make_fx(_functionalized(traced), tracing_mode="symbolic",
                         decomposition_table=decomposition_table())(fake_inputs, sym_sizes)
    return Retraced(traced, symbolic=True, shape_env=shape_env, placeholders=fake_inputs + sym_sizes,
                    static_shapes=static_dims(fake_inputs))
