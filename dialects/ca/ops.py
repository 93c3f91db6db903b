"""The `ca` dialect: the ops a captured PyTorch backward needs.

Defined without C++: the op classes below use the Python dialect DSL bundled with torch-mlir
(`torch_mlir.dialects.ext`), which turns them into IRDL and loads them into a context.
IRDL checks operand/result/attribute kinds; everything else (arity rules, hook kinds, type
agreement, symbol references) is checked by each op's `verify_invariants`, which MLIR calls
from its verifier, so errors come out as ordinary diagnostics at the op's location.

Dynamic (IRDL) ops print in MLIR's generic form: `"ca.node"(%a) ({...}) {...} : (...) -> ...`.

The docstring of every op class is its documentation: the first line is the summary, the
rest the description with an example. `docs/ca-dialect.md` is generated from them
(`python -m camlir.tools.gen_docs`), so docs and code cannot drift.
"""


from typing import Any, Sequence

from torch_mlir import ir
from torch_mlir.dialects import ext
from torch_mlir.dialects.ext import Operand, Region, Result

from .types import is_integer_like, is_tensor, tensor_sig, types_compatible

HOOK_KINDS = ("tensor_pre_hook", "pre_hook", "post_hook", "post_acc_grad_hook")


class CA(ext.Dialect, name="ca"):
    """Compiled autograd: one captured backward pass."""


def _verify(op) -> bool:
    """Runs the op's `check()` and turns its finding (or a crash in it) into a diagnostic.

    A verifier must never raise into MLIR (it would escape as a Python traceback from the
    middle of a parse), so each `check` returns an error message or None.
    """
    try:
        message = op.check()
    except Exception as exc:  # a bug in a verifier must still read as a diagnostic
        message = f"internal verifier error: {exc!r}"
    if message:
        op.location.emit_error(f"'{op.operation.name}' op {message}")
        return False
    return True


def _attr(op, name: str):
    attrs = op.operation.attributes
    return attrs[name] if name in attrs else None


def _int_attr(op, name: str, required: bool = True) -> tuple[int | None, str | None]:
    a = _attr(op, name)
    if a is None:
        return None, (f"requires integer attribute '{name}'" if required else None)
    if not isinstance(a, ir.IntegerAttr):
        return None, f"attribute '{name}' must be an integer, got {a}"
    return ir.IntegerAttr(a).value, None


def _terminator(region: ir.Region):
    blocks = list(region.blocks)
    if len(blocks) != 1:
        return None, f"body must have exactly one block, has {len(blocks)}"
    ops = list(blocks[0].operations)
    if not ops or ops[-1].operation.name != "ca.yield":
        return None, "body must end with 'ca.yield'"
    return ops[-1], None


def _compare_types(what: str, got: Sequence[ir.Type], want: Sequence[ir.Type]) -> str | None:
    if len(got) != len(want):
        return f"{what}: expected {len(want)} values, got {len(got)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if not types_compatible(g, w):
            return f"{what}: type mismatch at #{i}: {g} vs {w}"
    return None


class NodeOp(CA.Operation, name="node", traits=[ir.IsIsolatedFromAboveTrait]):
    """The body of one autograd node, with its provenance.

    A `ca.node` wraps the ops that compute one autograd node's backward (its grad_inputs
    from its grad_outputs and saved values). The body is isolated from above: everything it
    reads comes in as an operand and appears as a block argument of the same type, and its
    results leave through `ca.yield`. The body may hold ops of any dialect: torch-dialect ops
    as imported from FX, later linalg on builtin tensors.

    Attributes:
    - `node` (string): the autograd node's name, e.g. `AddmmBackward0`;
    - `index` (integer >= 0): its position in the captured backward (execution order);
    - `aot` (integer >= 0, optional): present when the node is the backward of a region that
      was compiled ahead of time by torch.compile (PyTorch's `aot<N>_` prefix).

    Verified: one block; block arguments match the operands in number and type; the
    terminator is `ca.yield` and its operands match the results in number and type.

    Example:
    ```mlir
    %gx = "ca.node"(%g, %w) ({
    ^bb0(%go: !torch.vtensor<[4,8],f32>, %w0: !torch.vtensor<[8,8],f32>):
      %r = torch.aten.mm %go, %w0 : !torch.vtensor<[4,8],f32>, !torch.vtensor<[8,8],f32> -> !torch.vtensor<[4,8],f32>
      "ca.yield"(%r) : (!torch.vtensor<[4,8],f32>) -> ()
    }) {node = "MmBackward0", index = 1 : i64}
      : (!torch.vtensor<[4,8],f32>, !torch.vtensor<[8,8],f32>) -> !torch.vtensor<[4,8],f32>
    ```
    """

    node: ir.StringAttr
    index: ir.IntegerAttr
    inputs: Sequence[Operand[Any]]
    outputs: Sequence[Result[Any]]
    body: Region

    def check(self):
        name = ir.StringAttr(_attr(self, "node")).value
        if not name:
            return "requires a non-empty 'node' name"
        index, err = _int_attr(self, "index")
        if err:
            return err
        if index < 0:
            return f"'index' must be >= 0, got {index}"
        aot, err = _int_attr(self, "aot", required=False)
        if err:
            return err
        if aot is not None and aot < 0:
            return f"'aot' must be >= 0, got {aot}"
        blocks = list(self.operation.regions[0].blocks)
        if len(blocks) != 1:
            return f"body must have exactly one block, has {len(blocks)}"
        args = [a.type for a in blocks[0].arguments]
        return _compare_types(
            "body arguments vs operands", args, [v.type for v in self.operation.operands]
        )

    def verify_region_invariants(self) -> bool:
        # Runs after the body itself verified, so the terminator is known to be well formed.
        term, err = _terminator(self.operation.regions[0])
        if not err:
            err = _compare_types(
                "'ca.yield' operands vs node results",
                [v.type for v in term.operands],
                [r.type for r in self.operation.results],
            )
        if err:
            self.location.emit_error(f"'ca.node' op {err}")
            return False
        return True


class YieldOp(CA.Operation, name="yield", traits=[ir.IsTerminatorTrait]):
    """Terminates the body of a `ca.node` and returns the node's results.

    The operands become the results of the enclosing `ca.node`, in order.

    Example:
    ```mlir
    "ca.yield"(%ga, %gb) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
    ```
    """

    values: Sequence[Operand[Any]]

    def check(self):
        parent = self.operation.parent
        if parent is None or parent.name != "ca.node":
            return "must be nested directly in a 'ca.node'"
        return None


class HookOp(CA.Operation, name="hook"):
    """A call to a user's autograd hook, recorded at capture and run (or inlined) later.

    Attributes:
    - `kind` (string): one of `tensor_pre_hook`, `pre_hook`, `post_hook`, `post_acc_grad_hook`,
      the four places PyTorch's autograd engine calls hooks;
    - `hook_id` (integer >= 0): the hook's position in the backward's hook list. The runtime
      looks the Python callable up by this id, and compiled artifacts are guarded on the
      identity of the callable found there;
    - `body` (symbol, optional): a `func.func` holding the hook's traced body, when the hook
      could be traced. Its signature must equal the hook's operand and result types.

    Arity by kind:
    - `tensor_pre_hook`: one gradient in, one gradient of the same type out;
    - `pre_hook`: a node's N grad_outputs in, N of the same types out;
    - `post_hook`: a node's M grad_inputs followed by its grad_outputs in, M grad_inputs out
      (types equal to the first M operands);
    - `post_acc_grad_hook`: the parameter in, nothing out (the hook acts on `param.grad`).

    A hook may touch anything in Python, so `ca.hook` reads and writes memory: it is never
    removed as dead code nor moved across `ca.accumulate_grad`.

    Example:
    ```mlir
    %g2 = "ca.hook"(%g) {kind = "tensor_pre_hook", hook_id = 0 : i64, body = @hook_0}
      : (!torch.vtensor<[10],f32>) -> !torch.vtensor<[10],f32>
    ```
    """

    kind: ir.StringAttr
    hook_id: ir.IntegerAttr
    args: Sequence[Operand[Any]]
    outs: Sequence[Result[Any]]

    def check(self):
        kind = ir.StringAttr(_attr(self, "kind")).value
        if kind not in HOOK_KINDS:
            return f"unknown hook kind '{kind}'; expected one of {', '.join(HOOK_KINDS)}"
        hook_id, err = _int_attr(self, "hook_id")
        if err:
            return err
        if hook_id < 0:
            return f"'hook_id' must be >= 0, got {hook_id}"
        ins = [v.type for v in self.operation.operands]
        outs = [r.type for r in self.operation.results]
        err = _hook_arity(kind, ins, outs)
        if err:
            return err
        return self._check_body(ins, outs)

    def _check_body(self, ins, outs):
        body = _attr(self, "body")
        if body is None:
            return None
        if not isinstance(body, ir.FlatSymbolRefAttr):
            return f"'body' must be a flat symbol reference, got {body}"
        name = ir.FlatSymbolRefAttr(body).value
        fn = _lookup_symbol(self.operation, name)
        if fn is None:
            return f"'body' refers to unknown symbol @{name}"
        if fn.name != "func.func":
            return f"'body' @{name} must be a func.func, is '{fn.name}'"
        ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
        err = _compare_types(f"hook body @{name} inputs", list(ftype.inputs), ins)
        return err or _compare_types(f"hook body @{name} results", list(ftype.results), outs)


def _hook_arity(kind: str, ins, outs) -> str | None:
    n_in, n_out = len(ins), len(outs)
    if kind == "tensor_pre_hook":
        if n_in != 1 or n_out != 1:
            return f"kind 'tensor_pre_hook' takes 1 operand and returns 1 result, got {n_in} -> {n_out}"
        return _compare_types("tensor_pre_hook result vs operand", outs, ins)
    if kind == "pre_hook":
        if n_in != n_out:
            return f"kind 'pre_hook' returns as many results as operands, got {n_in} -> {n_out}"
        return _compare_types("pre_hook results vs operands", outs, ins)
    if kind == "post_hook":
        if n_out > n_in:
            return (f"kind 'post_hook' takes grad_inputs then grad_outputs and returns the "
                    f"grad_inputs, so it cannot return more values than it takes ({n_in} -> {n_out})")
        return _compare_types("post_hook results vs leading operands", outs, ins[:n_out])
    # post_acc_grad_hook
    if n_in != 1 or n_out != 0:
        return f"kind 'post_acc_grad_hook' takes the parameter and returns nothing, got {n_in} -> {n_out}"
    if not is_tensor(ins[0]):
        return f"kind 'post_acc_grad_hook' operand must be a tensor, got {ins[0]}"
    return None


def _lookup_symbol(op: ir.Operation, name: str):
    """Finds `name` in the nearest enclosing symbol table (usually the module)."""
    parent = op.parent
    while parent is not None:
        if parent.name == "builtin.module":
            for child in parent.regions[0].blocks[0].operations:
                attrs = child.operation.attributes
                if "sym_name" in attrs and ir.StringAttr(attrs["sym_name"]).value == name:
                    return child.operation
            return None
        parent = parent.parent
    return None


class AccumulateGradOp(CA.Operation, name="accumulate_grad"):
    """Accumulates a gradient into a parameter's `.grad`, as the autograd engine does.

    Semantics: if `param.grad` is None it becomes `grad` (or a copy, when `grad` must not be
    aliased); otherwise `param.grad += grad` in place. This is a side effect on the
    parameter, so the op writes memory: it is never dead-code eliminated and never moved
    across a `ca.hook` (a `post_acc_grad_hook` reads the accumulated `.grad`).

    Verified: two tensor operands with equal element types and compatible shapes.
    The optional integer attribute `param_index` names the parameter's position among the
    backward's inputs, for logs.

    Example:
    ```mlir
    "ca.accumulate_grad"(%w, %gw) : (!torch.vtensor<[10,10],f32>, !torch.vtensor<[10,10],f32>) -> ()
    ```
    """

    param: Operand[Any]
    grad: Operand[Any]

    def check(self):
        p, g = self.operation.operands[0].type, self.operation.operands[1].type
        sp, sg = tensor_sig(p), tensor_sig(g)
        if sp is None or sg is None:
            return f"operands must be tensors, got {p} and {g}"
        if not sp.compatible(sg):
            return f"gradient type {g} does not match parameter type {p}"
        _, err = _int_attr(self, "param_index", required=False)
        return err


class SizeOp(CA.Operation, name="size"):
    """A lifted size: a constant, or a symbolic value read from the graph's inputs.

    PyTorch's compiled autograd passes the sizes a backward depends on as graph inputs, so
    one compiled graph can serve several shapes. `ca.size` names one of them:
    - static: `value` holds the size observed at capture, there is no operand;
    - symbolic: the operand is the size read from the graph's inputs, `value` is absent.
    Shape specialization turns symbolic sizes into static ones, except for dims the driver
    marked dynamic. `index` is the size's position in the lifted sizes list.

    Verified: exactly one of operand and `value`; an integer-like operand and result
    (`!torch.int`, `index` or an integer type); `value >= 0`.

    Example:
    ```mlir
    %n = "ca.size"(%s0) {index = 0 : i64} : (!torch.int) -> !torch.int
    %m = "ca.size"() {index = 1 : i64, value = 10 : i64} : () -> !torch.int
    ```
    """

    index: ir.IntegerAttr
    result: Result[Any]
    source: Operand[Any] | None = None

    def check(self):
        index, err = _int_attr(self, "index")
        if err:
            return err
        if index < 0:
            return f"'index' must be >= 0, got {index}"
        value, err = _int_attr(self, "value", required=False)
        if err:
            return err
        operands = list(self.operation.operands)
        if (value is None) == (not operands):
            return "must have exactly one of a source operand (symbolic) and a 'value' attribute (static)"
        if value is not None and value < 0:
            return f"'value' must be >= 0, got {value}"
        if operands and not is_integer_like(operands[0].type):
            return f"source must be integer-like (!torch.int, index, iN), got {operands[0].type}"
        rtype = self.operation.results[0].type
        if not is_integer_like(rtype):
            return f"result must be integer-like (!torch.int, index, iN), got {rtype}"
        return None


class CallPythonOp(CA.Operation, name="call_python"):
    """An opaque call back into Python, for whatever cannot be compiled.

    The runtime calls the Python callable registered under `id` with the operands and binds
    its return values to the results. `callee` says what is called (an aten op such as
    `aten::_scaled_dot_product_flash_attention_for_cpu_backward`, or an untraceable hook) for
    logs and error messages. The call may do anything, so the op reads and writes memory.

    Verified: non-empty `callee`, `id >= 0`.

    Example:
    ```mlir
    %r = "ca.call_python"(%g) {callee = "aten::my_op", id = 0 : i64}
      : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
    ```
    """

    callee: ir.StringAttr
    id: ir.IntegerAttr
    args: Sequence[Operand[Any]]
    outs: Sequence[Result[Any]]

    def check(self):
        if not ir.StringAttr(_attr(self, "callee")).value:
            return "requires a non-empty 'callee'"
        ident, err = _int_attr(self, "id")
        if err:
            return err
        if ident < 0:
            return f"'id' must be >= 0, got {ident}"
        return None


OPS = (NodeOp, YieldOp, HookOp, AccumulateGradOp, SizeOp, CallPythonOp)


# The DSL attaches `verify_invariants` when the dialect is loaded; nanobind classes take a
# single base, so the shared wrapper is installed here rather than through a mixin.
for _op in OPS:
    _op.verify_invariants = _verify
