"""The `ca` dialect: the ops a captured PyTorch backward needs, and their verifiers.

Defined in Python, without C++. Each op is a class below whose docstring is its
documentation (first line: summary; the rest: description with an example) and whose
`check` is its verifier. `docs/ca-dialect.md` is generated from these classes
(`python -m camlir.tools.gen_docs`), so docs and code cannot drift.

Why not IRDL: IRDL (and the bindings' DSL on top of it) binds a constraint variable to the
first type it sees, and a variadic operand list is checked element by element against one
variable, so every value of a variadic must have the same type (measured with the pinned
wheel: `"t.v"(%a, %b) : (i32, f32) -> ()` fails with "expected 'i32' but got 'f32'").
A backward node takes and returns tensors of many shapes, so `ca.node`, `ca.yield`,
`ca.hook` and `ca.call_python` cannot be IRDL ops. The `ca` ops are therefore ops of a
dialect that MLIR does not register (the context allows unregistered dialects), checked by
`camlir.dialects.ca.verify`, which the tools and the pipeline run after parsing and after
every pass. MLIR treats unregistered ops conservatively: unknown side effects (never
deleted, merged or moved across each other) and no IsolatedFromAbove (checked here).
Ops print in MLIR's generic form: `"ca.node"(%a) ({...}) {...} : (...) -> ...`.
"""

from typing import Optional, Sequence

from torch_mlir import ir

from .types import is_integer_like, is_tensor, tensor_sig, types_compatible

HOOK_KINDS = ("tensor_pre_hook", "pre_hook", "post_hook", "post_acc_grad_hook", "cpp_tensor_pre_hook",
              "unpack_hook", "custom_backward")


class CAOp:
    """Base of the op definitions: `name`, `regions`, and a `check(op)` verifier."""

    name = ""
    regions = 0

    @classmethod
    def summary(cls) -> str:
        return (cls.__doc__ or "").strip().splitlines()[0]

    @staticmethod
    def check(op: ir.Operation) -> Optional[str]:
        return None


def _attr(op: ir.Operation, name: str):
    attrs = op.attributes
    return attrs[name] if name in attrs else None


def _int_attr(op: ir.Operation, name: str, required: bool = True, minimum: int = 0):
    """(value, error) for an integer attribute that must be >= `minimum`."""
    a = _attr(op, name)
    if a is None:
        return None, (f"requires integer attribute '{name}'" if required else None)
    if not isinstance(a, ir.IntegerAttr):
        return None, f"attribute '{name}' must be an integer, got {a}"
    value = ir.IntegerAttr(a).value
    if value < minimum:
        return None, f"attribute '{name}' must be >= {minimum}, got {value}"
    return value, None


def _str_attr(op: ir.Operation, name: str):
    """(value, error) for a required, non-empty string attribute."""
    a = _attr(op, name)
    if a is None:
        return None, f"requires string attribute '{name}'"
    if not isinstance(a, ir.StringAttr):
        return None, f"attribute '{name}' must be a string, got {a}"
    value = ir.StringAttr(a).value
    if not value:
        return None, f"attribute '{name}' must not be empty"
    return value, None


def _compare_types(what: str, got: Sequence[ir.Type], want: Sequence[ir.Type]) -> Optional[str]:
    if len(got) != len(want):
        return f"{what}: expected {len(want)} values, got {len(got)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if not types_compatible(g, w):
            return f"{what}: type mismatch at #{i}: {g} vs {w}"
    return None


def _types(values) -> list:
    return [v.type for v in values]


def _first_error(*checks) -> Optional[str]:
    for c in checks:
        if c:
            return c
    return None


class NodeOp(CAOp):
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

    Verified: one region with one block; block arguments match the operands in number and
    type; the body uses no value defined outside it; the block ends with `ca.yield`, whose
    operands match the results in number and type.

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

    name = "ca.node"
    regions = 1

    @staticmethod
    def check(op):
        _, err = _str_attr(op, "node")
        if err:
            return err
        _, err = _int_attr(op, "index")
        if err:
            return err
        _, err = _int_attr(op, "aot", required=False)
        if err:
            return err
        blocks = list(op.regions[0].blocks)
        if len(blocks) != 1:
            return f"body must have exactly one block, has {len(blocks)}"
        block = blocks[0]
        err = _compare_types("body arguments vs operands", _types(block.arguments), _types(op.operands))
        if err:
            return err
        ops = list(block.operations)
        if not ops or ops[-1].operation.name != "ca.yield":
            return "body must end with 'ca.yield'"
        err = _uses_from_above(op)
        if err:
            return err
        return _compare_types("'ca.yield' operands vs node results",
                              _types(ops[-1].operands), _types(op.results))


def _uses_from_above(node: ir.Operation) -> Optional[str]:
    """The body must be isolated from above: every operand is defined inside the node."""
    inside = set()
    problem = []

    def visit(inner):
        inner = inner.operation
        for region in inner.regions:
            for block in region.blocks:
                for arg in block.arguments:
                    inside.add(arg)
        for result in inner.results:
            inside.add(result)
        return ir.WalkResult.ADVANCE

    node.walk(visit, ir.WalkOrder.PRE_ORDER)

    def check(inner):
        inner = inner.operation
        if inner == node:
            return ir.WalkResult.ADVANCE
        for v in inner.operands:
            if v not in inside:
                problem.append(f"body uses a value defined outside the node (operand of "
                               f"'{inner.name}'); pass it in as an operand")
                return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    node.walk(check, ir.WalkOrder.PRE_ORDER)
    return problem[0] if problem else None


class YieldOp(CAOp):
    """Terminates the body of a `ca.node` and returns the node's results.

    The operands become the results of the enclosing `ca.node`, in order.

    Verified: the parent is a `ca.node` and this is the last op of its block.

    Example:
    ```mlir
    "ca.yield"(%ga, %gb) : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> ()
    ```
    """

    name = "ca.yield"

    @staticmethod
    def check(op):
        parent = op.parent
        if parent is None or parent.name != "ca.node":
            return "must be nested directly in a 'ca.node'"
        if list(op.results):
            return "must not have results"
        ops = list(op.block.operations)
        if ops[-1].operation != op:
            return "must be the last op of the 'ca.node' body"
        return None


class HookOp(CAOp):
    """A call to a user's autograd hook, recorded at capture and run (or inlined) later.

    Attributes:
    - `kind` (string): one of `tensor_pre_hook`, `pre_hook`, `post_hook`, `post_acc_grad_hook`,
      the four places PyTorch's autograd engine calls Python hooks, `cpp_tensor_pre_hook`,
      the engine's own C++ hooks on a gradient (`retain_grad()` is one), or `unpack_hook`,
      a saved-tensor hook giving back a tensor a node saved (`torch.autograd.graph.
      saved_tensors_hooks`; non-reentrant activation checkpointing recomputes there), or
      `custom_backward`, the backward of a custom `torch.autograd.Function` that camlir
      cannot trace (it prints, keeps mutable state in `ctx`, runs a nested backward as a
      reentrant checkpoint does): a host call, run in Python at its place in the program;
    - `hook_id` (integer >= 0): the hook's position in the backward's hook list. The runtime
      looks the Python callable up by this id, and compiled artifacts are guarded on the
      identity of the callable found there. For `cpp_tensor_pre_hook` it is the position in
      the running backward's table of C++ hooks, which the runtime calls through PyTorch;
      for `custom_backward` the position of the node's `ctx` (its `BackwardCFunction`);
    - `body` (symbol, optional): a `func.func` holding the hook's traced body, when the hook
      could be traced. Its signature must equal the hook's operand and result types;
    - `data_id` (integer >= 0, `unpack_hook` only): the position, in the backward's packed
      data, of what the pack hook returned; the runtime hands it to the unpack hook;
    - `none_at`, `none_at_outputs` (arrays of integers, optional; `pre_hook` and
      `post_hook`): where the hook's gradient list (the grad_outputs of a pre hook, the
      grad_inputs of a post hook) and a post hook's grad_outputs hold None. Operands and
      results are the present gradients only; the runtime puts the Nones back before the
      call, and a hook must leave them None. On `custom_backward`, `none_at` is over its
      grad_outputs;
    - `saved` (integer >= 0), `saved_none_at` (array, optional), `outputs` (array of
      integers; `custom_backward` only): the first `saved` operands are the node's saved
      tensors (None at `saved_none_at`), the rest its grad_outputs; result i is entry
      `outputs[i]` of the tuple the backward returns, after the engine's checks (summed to
      the input's shape when it broadcast, cast to its dtype). Entries not listed are
      None or gradients of inputs that need none.

    Arity by kind:
    - `tensor_pre_hook`, `cpp_tensor_pre_hook`: one gradient in, one gradient of the same
      type out;
    - `pre_hook`: a node's N grad_outputs in, N of the same types out;
    - `post_hook`: a node's M grad_inputs followed by its grad_outputs in, M grad_inputs out
      (types equal to the first M operands);
    - `post_acc_grad_hook`: the parameter in, nothing out (the hook acts on `param.grad`);
    - `unpack_hook`: nothing in, the unpacked tensor out (its type is what the capture saw);
    - `custom_backward`: saved tensors then grad_outputs in, one tensor per entry of
      `outputs` out.

    A hook may touch anything in Python: it is never removed as dead code nor moved across
    `ca.accumulate_grad` or another hook.

    Example:
    ```mlir
    %g2 = "ca.hook"(%g) {kind = "tensor_pre_hook", hook_id = 0 : i64, body = @hook_0}
      : (!torch.vtensor<[10],f32>) -> !torch.vtensor<[10],f32>
    %gx, %gw = "ca.hook"(%x, %w, %g) {kind = "custom_backward", hook_id = 1 : i64, saved = 2 : i64,
        outputs = [0, 1]} : (!torch.vtensor<[4,3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[4,3],f32>)
      -> (!torch.vtensor<[4,3],f32>, !torch.vtensor<[3],f32>)
    ```
    """

    name = "ca.hook"

    @staticmethod
    def check(op):
        kind, err = _str_attr(op, "kind")
        if err:
            return err
        if kind not in HOOK_KINDS:
            return f"unknown hook kind '{kind}'; expected one of {', '.join(HOOK_KINDS)}"
        _, err = _int_attr(op, "hook_id")
        if err:
            return err
        ins, outs = _types(op.operands), _types(op.results)
        data_id, err = _int_attr(op, "data_id", required=kind == "unpack_hook")
        if err:
            return err
        if data_id is not None and kind != "unpack_hook":
            return "'data_id' is only meaningful on unpack_hook"
        return _first_error(_hook_arity(kind, ins, outs), _check_hook_body(op, ins, outs),
                            _check_none_positions(op, kind), _check_custom_backward(op, kind, ins, outs))


def _hook_arity(kind: str, ins, outs) -> Optional[str]:
    n_in, n_out = len(ins), len(outs)
    if kind in ("tensor_pre_hook", "cpp_tensor_pre_hook"):
        if n_in != 1 or n_out != 1:
            return f"kind '{kind}' takes 1 operand and returns 1 result, got {n_in} -> {n_out}"
        return _compare_types(f"{kind} result vs operand", outs, ins)
    if kind == "pre_hook":
        if n_in != n_out:
            return f"kind 'pre_hook' returns as many results as operands, got {n_in} -> {n_out}"
        return _compare_types("pre_hook results vs operands", outs, ins)
    if kind == "post_hook":
        if n_out > n_in:
            return (f"kind 'post_hook' takes grad_inputs then grad_outputs and returns the "
                    f"grad_inputs, so it cannot return more values than it takes ({n_in} -> {n_out})")
        return _compare_types("post_hook results vs leading operands", outs, ins[:n_out])
    if kind == "unpack_hook":
        if n_in != 0 or n_out != 1 or not is_tensor(outs[0]):
            return f"kind 'unpack_hook' takes nothing and returns 1 tensor, got {n_in} -> {n_out}"
        return None
    if kind == "custom_backward":
        return None  # checked with its attributes (_check_custom_backward)
    # post_acc_grad_hook
    if n_in != 1 or n_out != 0:
        return f"kind 'post_acc_grad_hook' takes the parameter and returns nothing, got {n_in} -> {n_out}"
    if not is_tensor(ins[0]):
        return f"kind 'post_acc_grad_hook' operand must be a tensor, got {ins[0]}"
    return None


_NONE_ATTR_KINDS = {"none_at": ("pre_hook", "post_hook", "custom_backward"), "none_at_outputs": ("post_hook",),
                   "saved_none_at": ("custom_backward",), "outputs": ("custom_backward",)}


def _int_array(attr) -> Optional[list]:
    """The values of an array of non-negative integers, or None when `attr` is not one."""
    if not isinstance(attr, ir.ArrayAttr) or not all(
            isinstance(a, ir.IntegerAttr) and ir.IntegerAttr(a).value >= 0 for a in attr):
        return None
    return [ir.IntegerAttr(a).value for a in attr]


def _check_none_positions(op, kind: str) -> Optional[str]:
    for name, kinds in _NONE_ATTR_KINDS.items():
        attr = _attr(op, name)
        if attr is None:
            continue
        if kind not in kinds:
            return f"'{name}' is only meaningful on {' and '.join(kinds)}"
        if _int_array(attr) is None:
            return f"'{name}' must be an array of non-negative integers, got {attr}"
    return None


def _check_custom_backward(op, kind: str, ins, outs) -> Optional[str]:
    saved = _attr(op, "saved")
    if kind != "custom_backward":
        return "'saved' is only meaningful on custom_backward" if saved is not None else None
    n_saved, err = _int_attr(op, "saved")
    if err:
        return err
    if n_saved > len(ins):
        return f"kind 'custom_backward' has 'saved' = {n_saved} but only {len(ins)} operands"
    outputs = _attr(op, "outputs")
    if outputs is None:
        return "kind 'custom_backward' requires array attribute 'outputs'"
    positions = _int_array(outputs)
    if positions is None:
        return f"'outputs' must be an array of non-negative integers, got {outputs}"
    if len(positions) != len(outs):
        return f"kind 'custom_backward' has {len(outs)} results but 'outputs' lists {len(positions)} positions"
    if positions != sorted(set(positions)):
        return f"'outputs' must be strictly increasing, got {positions}"
    if not all(is_tensor(t) for t in list(ins) + list(outs)):
        return "kind 'custom_backward' takes and returns tensors only"
    return None


def _check_hook_body(op, ins, outs) -> Optional[str]:
    body = _attr(op, "body")
    if body is None:
        return None
    if not isinstance(body, ir.FlatSymbolRefAttr):
        return f"'body' must be a flat symbol reference, got {body}"
    name = ir.FlatSymbolRefAttr(body).value
    fn = _lookup_symbol(op, name)
    if fn is None:
        return f"'body' refers to unknown symbol @{name}"
    if fn.name != "func.func":
        return f"'body' @{name} must be a func.func, is '{fn.name}'"
    ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
    return _first_error(
        _compare_types(f"hook body @{name} inputs", list(ftype.inputs), ins),
        _compare_types(f"hook body @{name} results", list(ftype.results), outs))


def _lookup_symbol(op: ir.Operation, name: str):
    """Finds `name` in the nearest enclosing module."""
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


class AccumulateGradOp(CAOp):
    """Accumulates a gradient into a parameter's `.grad`, as the autograd engine does.

    Semantics: if `param.grad` is None it becomes `grad` (or a copy, when `grad` must not be
    aliased); otherwise `param.grad += grad` in place. This is a side effect on the
    parameter: the op is never dead-code eliminated and never moved across a `ca.hook`
    (a `post_acc_grad_hook` reads the accumulated `.grad`).

    Verified: two tensor operands with equal element types and compatible shapes, no results.
    The optional integer attribute `param_index` names the parameter's position among the
    backward's inputs, for logs.

    Example:
    ```mlir
    "ca.accumulate_grad"(%w, %gw) : (!torch.vtensor<[10,10],f32>, !torch.vtensor<[10,10],f32>) -> ()
    ```
    """

    name = "ca.accumulate_grad"

    @staticmethod
    def check(op):
        operands = list(op.operands)
        if len(operands) != 2 or list(op.results):
            return (f"takes 2 operands (param, grad) and returns nothing, got "
                    f"{len(operands)} -> {len(list(op.results))}")
        p, g = operands[0].type, operands[1].type
        sp, sg = tensor_sig(p), tensor_sig(g)
        if sp is None or sg is None:
            return f"operands must be tensors, got {p} and {g}"
        if not sp.compatible(sg):
            return f"gradient type {g} does not match parameter type {p}"
        _, err = _int_attr(op, "param_index", required=False)
        return err


class SizeOp(CAOp):
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

    name = "ca.size"

    @staticmethod
    def check(op):
        _, err = _int_attr(op, "index")
        if err:
            return err
        value, err = _int_attr(op, "value", required=False)
        if err:
            return err
        operands, results = list(op.operands), list(op.results)
        if len(operands) > 1 or len(results) != 1:
            return f"takes at most 1 operand and returns 1 result, got {len(operands)} -> {len(results)}"
        if (value is None) == (not operands):
            return "must have exactly one of a source operand (symbolic) and a 'value' attribute (static)"
        if operands and not is_integer_like(operands[0].type):
            return f"source must be integer-like (!torch.int, index, iN), got {operands[0].type}"
        if not is_integer_like(results[0].type):
            return f"result must be integer-like (!torch.int, index, iN), got {results[0].type}"
        return None


class CallPythonOp(CAOp):
    """An opaque call back into Python, for whatever cannot be compiled.

    The runtime calls the Python callable registered under `id` with the operands and binds
    its return values to the results. `callee` says what is called (an aten op such as
    `aten::_scaled_dot_product_flash_attention_for_cpu_backward`, or an untraceable hook) for
    logs and error messages. The call may do anything: it is never removed or reordered.

    Verified: non-empty `callee`, `id >= 0`.

    Example:
    ```mlir
    %r = "ca.call_python"(%g) {callee = "aten::my_op", id = 0 : i64}
      : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
    ```
    """

    name = "ca.call_python"

    @staticmethod
    def check(op):
        _, err = _str_attr(op, "callee")
        if err:
            return err
        _, err = _int_attr(op, "id")
        return err


OPS = (NodeOp, YieldOp, HookOp, AccumulateGradOp, SizeOp, CallPythonOp)
OPS_BY_NAME = {cls.name: cls for cls in OPS}
