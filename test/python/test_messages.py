"""Messages in camlir's words (issue 31, point 7): why a graph was captured again, names of
parameters in graphs and drawings, no hint at tools camlir does not feed, and the drawing
tool's errors."""

import subprocess
import sys

import pytest
import torch

import camlir
from camlir.capture import miss_reasons
from camlir.errors import UnsupportedError


@pytest.fixture(autouse=True)
def _fresh():
    camlir.reset()
    yield
    camlir.reset()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 1))


def test_capture_reasons_say_what_changed_in_camlir_words():
    model = _model()
    with camlir.enable(wait=True):
        for n in (4, 4, 6):
            model(torch.randn(n, 8)).sum().backward()
    captures = camlir.explain(kind="capture")
    text = "\n".join(str(e) for e in captures)
    assert "Cache miss" not in text and "NodeCall" not in text and "key size" not in text, text
    assert "None ->" not in camlir.explain_text(), camlir.explain_text()
    first, second, third = captures[:3]
    assert first.reason.startswith("the first backward of a new graph"), first.reason
    # the second call: the parameters' .grad now exist, so AccumulateGrad nodes differ
    assert "autograd node" in second.reason and "AccumulateGrad" in second.reason, second.reason
    assert third.reason.startswith("sizes changed:") and "sizes[0]" in third.reason, third.reason
    assert third.what == "sizes"


def test_miss_reasons_keep_what_they_do_not_know():
    line = "Cache miss due to something PyTorch adds later"
    assert miss_reasons.explained(line) == line
    assert miss_reasons.node_name("torch::autograd::generated::AddmmBackward0") == "AddmmBackward0"
    assert miss_reasons.cause(["Cache miss due to 2 changed tensor shapes (total of 6): sizes[0], sizes[4]"]) \
        == ("sizes", [0, 4])


def test_graph_log_and_drawing_name_parameters_by_module_path(tmp_path):
    from helpers import camlir_logs

    model = _model()
    with camlir_logs("graph") as messages:
        camlir.compile_backward(model(torch.randn(4, 8)).sum())
    header = next(m for m in messages if m.startswith("captured backward graph"))
    for name in ("0.weight", "0.bias", "2.weight", "2.bias"):
        assert f" is {name}" in header.splitlines()[0], header.splitlines()[0]
    svg = open(camlir.draw(str(tmp_path / "g.svg"))).read()
    assert ".grad of 2.bias [1]" in svg and ".grad of 0.weight [8,8]" in svg, svg[:2000]
    assert ".grad of arg" not in svg


def test_a_plain_leaf_keeps_its_argument_name(tmp_path):
    w = torch.randn(3, 3, requires_grad=True)  # held by no module
    camlir.compile_backward((w * 2).sum())
    svg = open(camlir.draw(str(tmp_path / "g.svg"))).read()
    assert ".grad of arg" in svg


def test_unsupported_error_drops_pytorchs_tlparse_hint():
    message = ("re-tracing failed: boom\nWhile executing %x\nUse tlparse to see full graph. "
               "(https://github.com/pytorch/tlparse?tab=readme-ov-file#tlparse-parse-structured-pt2-logs)")
    assert str(UnsupportedError(message)) == "re-tracing failed: boom"
    alone = "boom\nUse tlparse to see full graph. (https://example.org/x)"
    assert str(UnsupportedError(alone)) == "boom"


@pytest.mark.parametrize("content,expected", [("garbage", "custom op 'garbage' is unknown"),
                                              ("module {}", "no function @backward"),
                                              (None, "cannot read")])
def test_drawing_tool_names_the_file_it_cannot_draw(tmp_path, content, expected):
    path = tmp_path / "bad.mlir"
    if content is not None:
        path.write_text(content)
    run = subprocess.run([sys.executable, "-m", "camlir.drawing", str(path), str(tmp_path / "o.svg")],
                         capture_output=True, text=True)
    assert run.returncode != 0
    assert "Traceback" not in run.stderr, run.stderr
    assert str(path) in run.stderr and expected in run.stderr, run.stderr


def test_a_long_compile_in_this_process_says_what_it_waits_for(monkeypatch, caplog):
    import logging

    from camlir import compile_progress

    monkeypatch.setenv("CAMLIR_COMPILE_WORKERS", "0")
    monkeypatch.setattr(compile_progress, "NOTICE_S", 0.01)  # every compile takes longer than that
    model = _model()
    with caplog.at_level(logging.WARNING, logger="camlir"):
        camlir.compile_backward(model(torch.randn(4, 8)).sum())
    lines = [r.getMessage() for r in caplog.records if "has been compiling for" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "graph 1" in lines[0] and "stage " in lines[0] and "this backward waits for it" in lines[0], lines


@pytest.mark.parametrize("kinds,shown", [("recompiles", False), ("graph", False), ("perf", True)])
def test_the_malloc_note_comes_only_with_the_speed_kinds(tmp_path, kinds, shown):
    # issue 31, point 6: any CAMLIR_LOGS kind printed the malloc note on every run.
    import os

    code = ("import torch, camlir\n"
            "m = torch.nn.Linear(4, 4)\n"
            "camlir.compile_backward(m(torch.randn(2, 4)).sum())\n")
    env = dict(os.environ, CAMLIR_LOGS=kinds, CAMLIR_COMPILE_WORKERS="0", CAMLIR_CACHE_DIR=str(tmp_path))
    env.pop("CAMLIR_MALLOC_TUNING", None)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert ("malloc keeps buffers" in run.stderr) == shown, run.stderr


def test_event_numbers_are_rounded():
    from camlir.events import Event

    text = str(Event(2, "choice", "runs on PyTorch's eager engine", "speed", 0.29433318, 0.120391))
    assert text == "graph 2: choice: runs on PyTorch's eager engine (0.294 -> 0.12)", text
    assert str(Event(1, "compile", "new sizes", "sizes", None, [6, 6], 0.5)) == \
        "graph 1: compile: new sizes ([6, 6]), 0.500 s"
