"""A host program run with deferred views (FSDP2's resharded parameters: `run_deferring`)
is timed step by step under `camlir.profile()`, as `run` is. Before, its table was empty:
`bench/fsdp.py --profile` showed nothing of the compiled program with
`reshard_after_forward=True`. Also checks that batched accumulations keep the engine's
rules (steal when `.grad` is None, add in place otherwise)."""

import torch

from camlir.backends import host_runtime
from camlir.backends.host_runtime import DeferredPermute, Runtime, _Program, _Step


class _Recorder:
    def __init__(self):
        self.steps = []

    def add_step(self, label, seconds):
        assert seconds >= 0
        self.steps.append(label)


def _program():
    # slot 0: a weight passed permuted (deferred), slot 1: a gradient; step 1 doubles the
    # permuted weight into slot 2, step 2 adds slot 1 into slot 3.
    steps = [_Step(lambda ins, rt: (ins[0] * 2,), (0,), (2,), "kernel @double"),
             _Step(lambda ins, rt: (ins[0] + ins[1],), (2, 1), (3,), "kernel @add")]
    return _Program(4, (0, 1), steps, (3,))


def test_run_deferring_is_profiled_and_gives_runs_answer():
    w = torch.arange(6.0).reshape(2, 3)
    g = torch.ones(3, 2)
    program = _program()
    runtime = Runtime(hooks=[])
    runtime.profile = _Recorder()
    (got,) = program.run_deferring([DeferredPermute(w, (1, 0)), g], runtime)
    torch.testing.assert_close(got, w.t() * 2 + 1)
    assert runtime.profile.steps == ["kernel @double", "kernel @add"]
    assert not runtime.profiling
    plain = Runtime(hooks=[])
    plain.profile = None
    (again,) = program.run_deferring([DeferredPermute(w, (1, 0)), g], plain)
    torch.testing.assert_close(again, got)


def test_consecutive_accumulations_are_one_step_with_the_engines_rules():
    import camlir

    x = torch.ones(2, requires_grad=True)
    with camlir.enable(backend="eager"):  # registers compiled autograd's ops, as any capture does
        (x * 3).sum().backward()
    a, b, c = (torch.zeros(3, requires_grad=True) for _ in range(3))
    b.grad = torch.full((3,), 10.0)
    ga, gb, gc = torch.ones(3), torch.full((3,), 2.0), torch.full((3,), 3.0)
    steps = [_Step(host_runtime.steal_or_accumulate, (0, 1), ()),
             _Step(host_runtime.steal_or_accumulate, (2, 3), ()),
             _Step(host_runtime._accumulate, (4, 5), ())]
    program = _Program(6, (0, 1, 2, 3, 4, 5), steps, ())
    assert [s.label for s in program.steps] == ["ca.accumulate_grad x3"]
    runtime = Runtime(hooks=[])
    runtime.profile = None
    program.run([a, ga, b, gb, c, gc], runtime)
    assert runtime.touched
    assert a.grad is ga  # stolen: .grad was None and the layouts match
    torch.testing.assert_close(b.grad, torch.full((3,), 12.0))  # added in place
    torch.testing.assert_close(c.grad, gc)
    assert c.grad is not gc  # PyTorch's helper copies a gradient it cannot prove private
