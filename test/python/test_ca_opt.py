"""ca-opt as a user runs it: exit statuses and diagnostics, never a traceback."""

import os
import subprocess

import pytest

from conftest import REPO

INPUTS = os.path.join(REPO, "test", "Tools", "Inputs")


def run(cmd, *args, stdin=None):
    return subprocess.run(cmd + list(args), input=stdin, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args,expected", [
    (["does-not-exist.mlir"], "does-not-exist.mlir:0:0: error: could not open input file"),
    (["malformed.mlir"], "malformed.mlir:3:12: error: expected ':'"),
    (["binary.mlir"], "binary.mlir:0:0: error: input is not UTF-8 text"),
    (["unknown-ca-op.mlir"], "unknown-ca-op.mlir:2:3: error: unknown operation 'ca.frobnicate'"),
    (["unknown-dialect.mlir"], "unknown-dialect.mlir:2:8: error: Dialect `foo' not found"),
    (["unregistered-generic.mlir"], "unregistered-generic.mlir:2:3: error: unregistered operation 'foo.bar'"),
    (["bad-hook-kind.mlir"], "bad-hook-kind.mlir:2:8: error: 'ca.hook' op unknown hook kind 'sideways_hook'"),
    (["valid.mlir", "--ca-flaten-nodes"], "did you mean 'ca-flatten-nodes'?"),
    (["valid.mlir", "--pass-pipeline=builtin.module(canonicalise)"], "<pass-pipeline>:1:16: error:"),
    (["valid.mlir", "--ca-flatten-nodes=keep-provenance=maybe"], "expects a bool, got 'maybe'"),
    (["valid.mlir", "-o"], "ca-opt: error: argument -o: expected one argument"),
])
def test_bad_input_exits_1_with_a_diagnostic(ca_opt_cmd, args, expected):
    args = [os.path.join(INPUTS, args[0])] + args[1:]
    result = run(ca_opt_cmd, *args)
    assert result.returncode == 1, result.stderr
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_valid_input_round_trips(ca_opt_cmd):
    first = run(ca_opt_cmd, os.path.join(REPO, "test", "Dialect", "node.mlir"))
    assert first.returncode == 0, first.stderr
    second = run(ca_opt_cmd, "-", stdin=first.stdout)
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout


def test_verify_diagnostics_passes_and_fails(ca_opt_cmd, tmp_path):
    ok = run(ca_opt_cmd, os.path.join(REPO, "test", "Dialect", "invalid.mlir"),
             "--split-input-file", "--verify-diagnostics")
    assert ok.returncode == 0, ok.stderr
    wrong = tmp_path / "wrong.mlir"
    wrong.write_text(
        "func.func @f(%g: tensor<4xf32>) -> tensor<4xf32> {\n"
        "  // expected-error@+1 {{a message that will not come}}\n"
        '  %r = "ca.hook"(%g) {kind = "nope", hook_id = 0 : i64} : (tensor<4xf32>) -> tensor<4xf32>\n'
        "  return %r : tensor<4xf32>\n}\n")
    bad = run(ca_opt_cmd, str(wrong), "--verify-diagnostics")
    assert bad.returncode == 1
    assert "unexpected error: 'ca.hook' op unknown hook kind 'nope'" in bad.stderr
    assert 'expected error "a message that will not come" on line 3 was not produced' in bad.stderr


def test_output_file(ca_opt_cmd, tmp_path):
    out = tmp_path / "out.mlir"
    result = run(ca_opt_cmd, os.path.join(INPUTS, "valid.mlir"), "-o", str(out))
    assert result.returncode == 0
    assert "func.func @f" in out.read_text()
