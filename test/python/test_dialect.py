"""The `ca` dialect from Python: building ops, verifying, printing, re-parsing."""

import pytest
from torch_mlir import ir
from torch_mlir.dialects import func

from camlir.dialects import ca
from camlir.dialects.ca import build


def _vt(shape, dtype="f32"):
    return ir.Type.parse(f"!torch.vtensor<[{','.join(map(str, shape))}],{dtype}>")


def _backward_module():
    """A small backward: one node, a hook with a traced body, accumulation, sizes, a call."""
    module = ir.Module.create()
    g_t, w_t = _vt([4, 8]), _vt([8, 8])
    with ir.InsertionPoint(module.body):
        hook_fn = func.FuncOp("hook_0", ir.FunctionType.get([g_t], [g_t]))
        with ir.InsertionPoint(hook_fn.add_entry_block()):
            func.ReturnOp([hook_fn.arguments[0]])
        fn = func.FuncOp("backward", ir.FunctionType.get([g_t, w_t, w_t, ir.Type.parse("!torch.int")], []))
        with ir.InsertionPoint(fn.add_entry_block()):
            g, w, param, s0 = fn.arguments
            node, body = build.node("MmBackward0", 0, [g, w], [w_t], aot=1)
            with ir.InsertionPoint(body):
                a, b = body.arguments
                mm = ir.Operation.create("torch.aten.mm", results=[w_t], operands=[b, b])
                build.yield_([mm.result])
            hooked = build.hook("tensor_pre_hook", 0, [g], [g_t], body="hook_0")
            build.accumulate_grad(param, node.results[0], param_index=2)
            build.hook("post_acc_grad_hook", 1, [param], [])
            build.size(0, ir.Type.parse("!torch.int"), source=s0)
            build.size(1, ir.Type.parse("!torch.int"), value=10)
            build.call_python("aten::foo", 0, [hooked.result], [g_t])
            func.ReturnOp([])
    return module


def test_build_verify_print_reparse(ctx):
    module = _backward_module()
    assert module.operation.verify()
    assert ca.verify(module.operation) == []
    text = str(module)
    for expected in ['"ca.node"', 'node = "MmBackward0"', "aot = 1 : i64", '"ca.hook"',
                     'kind = "tensor_pre_hook"', "body = @hook_0", '"ca.accumulate_grad"',
                     "param_index = 2", '"ca.size"', "value = 10", '"ca.call_python"',
                     'callee = "aten::foo"', '"ca.yield"']:
        assert expected in text
    reparsed = ir.Module.parse(text)
    assert ca.verify(reparsed.operation) == []
    assert str(reparsed) == text


def test_verifier_reports_each_problem_at_its_op(ctx):
    module = _backward_module()
    # Break two ops: an unknown hook kind and a mismatched accumulation.
    for op in module.body.operations[1].regions[0].blocks[0].operations:
        if op.operation.name == "ca.hook" and "body" in op.operation.attributes:
            op.operation.attributes["kind"] = ir.StringAttr.get("bogus_hook")
    problems = ca.verify(module.operation)
    assert len(problems) == 1
    assert problems[0].op.name == "ca.hook"
    assert "unknown hook kind 'bogus_hook'" in problems[0].message
    with pytest.raises(ca.VerificationError, match="bogus_hook"):
        ca.verify_or_raise(module.operation)


def test_accumulate_type_mismatch_from_python(ctx):
    module = ir.Module.create()
    with ir.InsertionPoint(module.body):
        fn = func.FuncOp("f", ir.FunctionType.get([_vt([3]), _vt([3], "f64")], []))
        with ir.InsertionPoint(fn.add_entry_block()):
            build.accumulate_grad(*fn.arguments)
            func.ReturnOp([])
    (problem,) = ca.verify(module.operation)
    assert "does not match parameter type" in problem.message


def test_size_needs_exactly_one_source(ctx):
    module = ir.Module.create()
    int_t = ir.Type.parse("!torch.int")
    with ir.InsertionPoint(module.body):
        fn = func.FuncOp("f", ir.FunctionType.get([int_t], []))
        with ir.InsertionPoint(fn.add_entry_block()):
            build.size(0, int_t)  # neither
            build.size(1, int_t, value=3, source=fn.arguments[0])  # both
            build.size(2, int_t, value=3)  # fine
            func.ReturnOp([])
    problems = ca.verify(module.operation)
    assert len(problems) == 2
    assert all("exactly one of" in p.message for p in problems)


def test_node_must_be_isolated(ctx):
    module = ir.Module.create()
    t = ir.Type.parse("tensor<4xf32>")
    with ir.InsertionPoint(module.body):
        fn = func.FuncOp("f", ir.FunctionType.get([t], []))
        with ir.InsertionPoint(fn.add_entry_block()):
            node, body = build.node("NegBackward0", 0, [], [])
            with ir.InsertionPoint(body):
                # Uses the function argument directly instead of a block argument.
                ir.Operation.create("arith.negf", results=[t], operands=[fn.arguments[0]])
                build.yield_([])
            func.ReturnOp([])
    (problem,) = ca.verify(module.operation)
    assert "defined outside the node" in problem.message


def test_tensor_types_compare_across_levels(ctx):
    from camlir.dialects.ca.types import tensor_sig, types_compatible

    assert tensor_sig(ir.Type.parse("!torch.vtensor<[2,?],f32>")).shape == (2, None)
    assert tensor_sig(ir.Type.parse("tensor<2x?xf32>")).shape == (2, None)
    assert tensor_sig(ir.Type.parse("!torch.vtensor")).shape is None
    assert tensor_sig(ir.Type.parse("i32")) is None
    assert types_compatible(ir.Type.parse("!torch.vtensor<[2,?],f32>"), ir.Type.parse("!torch.vtensor<[2,5],f32>"))
    assert not types_compatible(ir.Type.parse("!torch.vtensor<[2,3],f32>"), ir.Type.parse("!torch.vtensor<[2,5],f32>"))
    assert not types_compatible(ir.Type.parse("tensor<2xf32>"), ir.Type.parse("tensor<2xf64>"))
    assert not types_compatible(ir.Type.parse("tensor<2xf32>"), ir.Type.parse("tensor<2x1xf32>"))


def test_docs_are_generated_from_the_code():
    from camlir.tools import gen_docs

    from conftest import REPO

    assert gen_docs.main(["--check", f"{REPO}/docs"]) == 0, "run python -m camlir.tools.gen_docs"
    text = gen_docs.dialect_md()
    for cls in ca.OPS:
        assert f"### `{cls.name}`" in text
        assert "Example:" in (cls.__doc__ or ""), f"{cls.name} has no example"
