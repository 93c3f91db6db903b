"""The textual pipeline: camlir passes and upstream passes in one string."""

import contextlib
import dataclasses

import pytest
from torch_mlir import ir

from camlir.dialects import ca
from camlir.passes import PipelineError, parse_pipeline, run_pipeline
from camlir.passes.flatten_nodes import FlattenNodes
from camlir.passes.base import CAPass, OptionError

NODE_IR = """
func.func @f(%g: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %r = "ca.node"(%g) ({
  ^bb0(%a: !torch.vtensor<[4],f32>):
    %n = torch.aten.neg %a : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
    %m = torch.aten.neg %n : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
    "ca.yield"(%m) : (!torch.vtensor<[4],f32>) -> ()
  }) {node = "NegBackward0", index = 3 : i64} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %r : !torch.vtensor<[4],f32>
}
"""


def test_parse_nested_pipeline():
    elems = parse_pipeline("builtin.module(ca-flatten-nodes{keep-provenance=false}, func.func(cse, canonicalize))")
    assert [e.name for e in elems] == ["ca-flatten-nodes", "func.func"]
    assert elems[0].options == "keep-provenance=false"
    assert [e.name for e in elems[1].nested] == ["cse", "canonicalize"]
    assert elems[1].text == "func.func(cse, canonicalize)"


@pytest.mark.parametrize("text,column,fragment", [
    ("builtin.module(cse", 19, "missing ')'"),
    ("cse,,canonicalize", 5, "expected a pass name"),
    ("cse{max=1", 4, "missing '}'"),
    ("cse) x", 4, "unexpected ')'"),
])
def test_pipeline_syntax_errors_point_at_the_column(text, column, fragment):
    with pytest.raises(PipelineError) as info:
        parse_pipeline(text)
    assert fragment in str(info.value)
    assert info.value.column == column


def test_run_mixed_pipeline(ctx):
    module = ir.Module.parse(NODE_IR)
    run_pipeline(module, "builtin.module(ca-flatten-nodes, canonicalize, cse)")
    text = str(module)
    assert "ca.node" not in text
    # canonicalize folds neg(neg(x)) only if torch knows how; either way both ops carry provenance
    assert 'ca.provenance = "NegBackward0#3"' in text


def test_unknown_pass_suggests(ctx):
    module = ir.Module.parse(NODE_IR)
    with pytest.raises(PipelineError, match="did you mean 'ca-flatten-nodes'"):
        run_pipeline(module, "ca-flaten-nodes")


def test_pass_options():
    assert FlattenNodes.from_options("keep-provenance=false") == FlattenNodes(keep_provenance=False)
    assert FlattenNodes.from_options("keep-provenance") == FlattenNodes(keep_provenance=True)
    with pytest.raises(OptionError, match="no option 'colour'"):
        FlattenNodes.from_options("colour=red")
    with pytest.raises(OptionError, match="expects a bool"):
        FlattenNodes.from_options("keep-provenance=perhaps")
    assert FlattenNodes().option_text() == "{keep-provenance=true}"


@contextlib.contextmanager
def registered(cls):
    """Makes a test-only pass known to the pipeline for the duration of a test."""
    from camlir.passes import registry

    registry._BY_NAME[cls.argument] = cls
    try:
        yield
    finally:
        del registry._BY_NAME[cls.argument]


def test_pass_that_breaks_ir_is_caught(ctx):
    """The ca verifier runs after each camlir pass: a pass leaving bad IR fails loudly."""
    @dataclasses.dataclass(frozen=True)
    class BreakHooks(CAPass):
        """Test-only: renames every ca.hook kind to nonsense."""

        argument = "test-break-hooks"
        summary = "test"

        def run(self, module):
            def visit(op):
                if op.operation.name == "ca.hook":
                    op.operation.attributes["kind"] = ir.StringAttr.get("nonsense")
                return ir.WalkResult.ADVANCE

            module.walk(visit)

    with registered(BreakHooks):
        module = ir.Module.parse("""
func.func @f(%g: tensor<4xf32>) -> tensor<4xf32> {
  %r = "ca.hook"(%g) {kind = "tensor_pre_hook", hook_id = 0 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}""")
        with pytest.raises(ir.MLIRError) as info:
            run_pipeline(module, "test-break-hooks")
        messages = [d.message for d in info.value.error_diagnostics]
        assert any("unknown hook kind 'nonsense'" in m and "after pass 'test-break-hooks'" in m
                   for m in messages)


def test_pass_crash_becomes_a_diagnostic(ctx):
    @dataclasses.dataclass(frozen=True)
    class Crash(CAPass):
        """Test-only: raises."""

        argument = "test-crash"
        summary = "test"

        def run(self, module):
            raise ZeroDivisionError("boom")

    with registered(Crash):
        module = ir.Module.parse("func.func @f() { return }")
        with pytest.raises(ir.MLIRError) as info:
            run_pipeline(module, "test-crash")
        assert "test-crash: internal error: ZeroDivisionError('boom')" in info.value.error_diagnostics[0].message
    assert ca.verify(module.operation) == []
