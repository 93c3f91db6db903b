"""A backend is an object registered by name: a toy one, defined here, runs backwards.

The toy backend builds its program with the shared kernel stages (specialize .. split) and
one stage of its own, which runs the host function and each kernel through the host
runtime (each kernel as the torch ops of its twin). Nothing outside this file knows it."""

import pytest
import torch

import camlir
from camlir import pipeline
from camlir import backend_registry as registry
from camlir.backends.base import Backend
from camlir.backends.host_runtime import ALIAS, Runtime, compile_block
from camlir.passes.lower_to_linalg import TWIN_ATTR
from camlir.stages import Stage, StageError
from torch_mlir import ir


class ToyProgram:
    def __init__(self, host, twins, variant, perms):
        self.twins = twins
        self.perms = [(i, p) for i, p in enumerate(perms) if p is not None]  # the layouts stage's
        self.variant = variant
        self.calls = 0
        self.kernel_calls = 0
        self.program = compile_block(host.regions[0].blocks[0], terminator="func.return", extra=self._extra)

    def _extra(self, op):
        if op.name == "func.call":
            twin = self.twins[ir.FlatSymbolRefAttr(op.attributes["callee"]).value]

            def kernel(ins, rt):
                self.kernel_calls += 1
                return twin.run(ins, rt)
            return kernel
        if op.name.startswith("torch_c.") or (op.name == "ca.size" and "value" not in op.attributes):
            return ALIAS
        return None

    def __call__(self, args, hooks, callbacks=(), packed=()):
        self.calls += 1
        args = list(args)
        for i, p in self.perms:
            args[i] = args[i].permute(p)
        return self.program.run(args, Runtime(hooks, callbacks, packed))


def toy_program(work):
    twins = {}
    for op in work.module.body.operations:
        op = op.operation
        if op.name == "func.func" and TWIN_ATTR in op.attributes:
            twins[ir.StringAttr(op.attributes[TWIN_ATTR]).value] = compile_block(
                op.regions[0].blocks[0], terminator="func.return",
                extra=lambda o: (lambda ins, rt: (ins[0].reshape(ins[1]),)) if o.name == "torch.aten.view" else None)
    work.program = ToyProgram(work.host, twins, work.variant, work.perms)
    ToyBackend.built.append(work.program)


class ToyBackend(Backend):
    name = "toy"
    built: list = []
    fail = False

    def stages(self, variant):
        def maybe_fail(work):
            if ToyBackend.fail:
                raise StageError("toy", "the toy backend was told to fail")
        return pipeline.KERNEL_STAGES + (Stage("toy-check", maybe_fail), Stage("toy-program", toy_program))


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setenv("CAMLIR_DISK_CACHE", "0")
    camlir.reset()
    ToyBackend.built.clear()
    ToyBackend.fail = False
    registry.register(ToyBackend())
    yield
    registry.unregister("toy")
    camlir.reset()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2))


def _grads(model, x, backend=None):
    model.zero_grad(set_to_none=True)
    if backend is None:
        model(x).square().sum().backward()
    else:
        with camlir.enable(backend=backend):
            model(x).square().sum().backward()
    return [p.grad.clone() for p in model.parameters()]


def test_a_registered_backend_runs_the_backward(toy):
    model, x = _model(), torch.randn(4, 5)
    expected = _grads(model, x)
    for _ in range(3):
        torch.testing.assert_close(_grads(model, x, "toy"), expected)
    assert camlir.counters["compiles"] == 1 and camlir.counters["interpreted"] == 0
    (program,) = ToyBackend.built
    assert program.calls == 3 and program.kernel_calls >= 3  # the kernels ran, through the toy's own step
    assert [backend for _, backend, _ in camlir.compiled_programs()] == ["toy"]
    assert "toy" in registry.names()
    camlir.config.backend = "toy"  # config accepts it too
    camlir.config.backend = "cpu"


def test_a_failing_backend_falls_back_to_the_reference_interpreter(toy):
    ToyBackend.fail = True
    model, x = _model(), torch.randn(4, 5)
    expected = _grads(model, x)
    torch.testing.assert_close(_grads(model, x, "toy"), expected)
    assert camlir.counters["interpreted"] == 1 and camlir.counters["fallbacks"] == 0
    assert not ToyBackend.built
    (_, _, program), = camlir.compiled_programs()
    assert "the toy backend could not compile it" in program.not_native
    with pytest.raises(camlir.UnsupportedError, match="toy backend could not compile"):
        camlir.compile_backward(model(x).square().sum(), backend="toy", fullgraph=True)


def test_sizes_that_change_get_one_program_per_size_set(toy):
    # The toy backend says it has no runtime sizes: a symbolic capture is specialized per size.
    model = _model()
    for n in (3, 4, 6, 4):
        x = torch.randn(n, 5)
        torch.testing.assert_close(_grads(model, x, "toy"), _grads(model, x))
    variants = [p.variant for p in ToyBackend.built]
    assert any(v.sizes is not None for v in variants), variants
    assert not any(v.runtime_sizes for v in variants)
    assert camlir.counters["interpreted"] == 0


def test_an_unregistered_backend_is_refused_with_the_names():
    registry.unregister("toy")
    with pytest.raises(ValueError, match="unknown camlir backend 'toy'; available: eager, cpu, gpu"):
        camlir.enable(backend="toy")
    with pytest.raises(ValueError, match="a backend needs a name"):
        registry.register(Backend())


def test_no_backend_imports_another_backends_private_names():
    # Backends share the host runtime, the interface and the registry; the compiling ones
    # never import each other, and nothing private crosses a backend's folder.
    import ast
    import pathlib

    root = pathlib.Path(camlir.__file__).parent / "backends"
    own_names = {"eager", "cpu", "gpu"}
    crossings = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).parts
        owner = rel[0].removesuffix(".py")
        if owner not in own_names:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith("camlir.backends."):
                continue
            other = node.module.split(".")[2]
            if other not in own_names or other == owner:
                continue
            private = [a.name for a in node.names if a.name.startswith("_")]
            if private or {owner, other} == {"cpu", "gpu"}:
                crossings.append(f"{'/'.join(rel)}: from {node.module} import {[a.name for a in node.names]}")
    assert not crossings, crossings
