"""The compile pipeline (camlir/pipeline.py): its stages run in order, each is dumped the same
way, every dump that says which ca-opt command made it is reproduced by that command, and
hooks of symbolic captures are traced after specialization."""

import pathlib
import re

import pytest
import torch

import camlir
from camlir.cache import SizeVariants
from camlir.tools import ca_opt

from helpers import camlir_logs

_MADE_BY = re.compile(r"made by: ca-opt (\S+) --pass-pipeline='(.*)'$")


@pytest.fixture(autouse=True)
def fresh():
    camlir.reset()
    yield
    camlir.reset()


def _strided_model_loss():
    # `x @ w.t()` saves the transposed weight: a strided input, so the layouts stage runs.
    torch.manual_seed(0)
    w = torch.randn(6, 3, requires_grad=True)
    b = torch.randn(6, requires_grad=True)
    x = torch.randn(5, 3, requires_grad=True)
    loss = lambda: (torch.nn.functional.gelu(x @ w.t() + b) * 0.5).sum()  # noqa: E731
    return [w, b, x], loss


def test_every_stage_is_dumped_in_order_and_replays_with_ca_opt(tmp_path, monkeypatch):
    monkeypatch.setenv("CA_DUMP_DIR", str(tmp_path / "dump"))
    params, loss = _strided_model_loss()
    loss().backward()
    expected = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    camlir.compile_backward(loss(), fullgraph=True)
    for p, e in zip(params, expected):
        torch.testing.assert_close(p.grad, e)

    files = sorted((tmp_path / "dump" / "graph1").glob("*.mlir"))
    stages = [f.stem.split("-", 1)[1] for f in files]
    order = ["retrace", "import", "trace-hooks", "layouts", "kernels", "linalg", "split", "math",
             "bufferize", "blas", "loops", "llvm"]
    assert [s for s in stages if s in order] == order, stages

    replayed = 0
    for f in files:
        first, _, body = f.read_text().partition("\n")
        assert first.startswith(("// graph 1, stage", "# graph 1, stage")), first
        made_by = _MADE_BY.search(first)
        if made_by is None:
            continue
        source, pipeline = made_by.groups()
        out = tmp_path / f"replay-{f.name}"
        assert ca_opt.run([str(f.parent / source), f"--pass-pipeline={pipeline}", "-o", str(out)]) == 0
        assert out.read_text().strip() == body.strip(), f"{f.name} differs when replayed"
        replayed += 1
    assert replayed >= 8  # every pass stage: layouts .. llvm


def test_verbose_logs_name_each_stage_once_per_compile():
    params, loss = _strided_model_loss()
    with camlir_logs("verbose") as messages:
        camlir.compile_backward(loss())
    after = [m.split("after stage '", 1)[1].split("'", 1)[0] for m in messages if "after stage '" in m]
    assert after[:6] == ["retrace", "import", "trace-hooks", "layouts", "kernels", "linalg"], after
    assert after[-1] == "llvm"


@pytest.mark.parametrize("dynamic", [False, None])
def test_hooks_of_a_symbolic_capture_are_inlined_and_guarded(dynamic):
    # Sizes change, so the second capture is symbolic; its hook is traced for each size set
    # after specialization (dynamic=False), or once into the program with dynamic sizes (the
    # default: the hook's operand, the weight's gradient, has a static shape), so it becomes
    # kernel code instead of a Python call.
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    twin = torch.nn.Linear(4, 3)
    twin.load_state_dict(model.state_dict())
    scale = [2.0]

    def run(m, x, hooked):
        m.zero_grad(set_to_none=True)
        s = scale[0]
        handle = m.weight.register_hook(lambda g: g * s)
        try:
            if hooked:
                with camlir.enable(backend="cpu", dynamic=dynamic):
                    m(x).tanh().sum().backward()
            else:
                m(x).tanh().sum().backward()
        finally:
            handle.remove()
        return [m.weight.grad.clone(), m.bias.grad.clone()]

    for batch, s in ((8, 2.0), (16, 2.0), (9, 2.0), (9, 3.0), (16, 3.0)):
        scale[0] = s
        x = torch.randn(batch, 4)
        for got, want in zip(run(model, x, True), run(twin, x, False)):
            torch.testing.assert_close(got, want)

    assert camlir.counters["interpreted"] == 0 and camlir.counters["fallbacks"] == 0
    symbolic = [p for _, backend, p in camlir.compiled_programs() if isinstance(p, SizeVariants)]
    assert len(symbolic) == 1
    assert "ca.hook" not in symbolic[0].lowered_text  # the hook became kernel code
    if dynamic is False:
        # 16, 9 and the changed scale at 9 and 16 each compiled a variant: the hook guard saw 3.0.
        assert len(symbolic[0].variants) == 2
    else:
        # One program for every size, compiled again when the hook guard saw 3.0.
        assert symbolic[0].runtime_sized is not None and not symbolic[0].variants
