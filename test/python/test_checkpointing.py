"""Activation checkpointing through the compiled backward: non-reentrant `checkpoint` and
selective activation checkpointing compile natively (the recomputation runs inside the
compiled backward, as Python unpack hooks), gradients equal eager's, and peak memory stays
at eager-with-checkpointing's level."""

import functools
import weakref

import pytest
import torch
from torch._subclasses.fake_tensor import is_fake
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

import camlir


@pytest.fixture(autouse=True)
def _fresh():
    camlir.reset()
    yield
    camlir.reset()


class _Blocks(torch.nn.Module):
    def __init__(self, width=16, depth=3, selective=False):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.LayerNorm(width))
            for _ in range(depth))
        self.selective = selective

    def forward(self, x):
        for block in self.blocks:
            if self.selective:
                x = checkpoint(block, x, use_reentrant=False,
                               context_fn=functools.partial(create_selective_checkpoint_contexts, _save_matmuls))
            else:
                x = checkpoint(block, x, use_reentrant=False)
        return x


def _save_matmuls(ctx, op, *args, **kwargs):
    if op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _steps(make, steps=3, batch=8, width=16):
    torch.manual_seed(0)
    model, twin = make(), make()
    twin.load_state_dict(model.state_dict())
    for step in range(steps):
        torch.manual_seed(step)
        x = torch.randn(batch, width, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        model(x).pow(2).mean().backward()
        with camlir.enable():
            twin(x2).pow(2).mean().backward()
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(q.grad, p.grad)
        torch.testing.assert_close(x2.grad, x.grad)


@pytest.mark.parametrize("selective", [False, True], ids=["checkpoint", "selective"])
def test_checkpointed_backward_compiles_natively(selective):
    _steps(lambda: _Blocks(selective=selective))
    assert camlir.counters["fallbacks"] == 0 and camlir.counters["interpreted"] == 0
    assert camlir.counters["compiles"] >= 1
    assert any("unpack hooks" in e.what for e in camlir.explain(kind="fallback"))  # the first call only
    programs = [p for _, backend, p in camlir.compiled_programs() if backend == "cpu"]
    assert programs and all(not p.not_native for p in programs)
    assert any('kind = "unpack_hook"' in p.lowered_text for p in programs)


def test_a_wrong_unpack_result_is_an_error_not_a_wrong_read():
    from camlir.backends.host_runtime import Runtime, compile_block
    from camlir.context import make_context
    from torch_mlir import ir

    text = """
    func.func @backward() -> !torch.vtensor<[4],f32> {
      %0 = "ca.hook"() {kind = "unpack_hook", hook_id = 0 : i64, data_id = 0 : i64} : () -> !torch.vtensor<[4],f32>
      return %0 : !torch.vtensor<[4],f32>
    }"""
    with make_context():
        module = ir.Module.parse(text)
        program = compile_block(module.body.operations[0].regions[0].blocks[0], terminator="func.return")
    ok = program.run([], Runtime([lambda packed: packed], (), [torch.ones(4)]))
    torch.testing.assert_close(ok[0], torch.ones(4))
    with pytest.raises(RuntimeError, match="unpack hook 0 returned Tensor \\(5,\\)"):
        program.run([], Runtime([lambda packed: packed], (), [torch.ones(5)]))


class _PeakBytes(TorchDispatchMode):
    """Peak bytes of tensor storage alive at once, counting what ops create (approximate:
    storage is released when the tensor that created it dies)."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._seen = set()

    def _release(self, ptr, nbytes):
        self._seen.discard(ptr)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu" and not is_fake(t):
                storage = t.untyped_storage()
                ptr, nbytes = storage.data_ptr(), storage.nbytes()
                if ptr and ptr not in self._seen:
                    self._seen.add(ptr)
                    self.live += nbytes
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(t, self._release, ptr, nbytes)
        return out


def _step_peak(model, x, compiled: bool) -> int:
    """Peak tensor bytes of one training step, forward and backward (what checkpointing is for)."""
    with _PeakBytes() as meter:
        loss = model(x).pow(2).mean()
        if compiled:
            with camlir.enable():
                loss.backward()
        else:
            loss.backward()
    return meter.peak


def _plain_forward(blocks):
    def forward(x):
        for block in blocks.blocks:
            x = block(x)
        return x
    return forward


def test_peak_memory_stays_at_eager_with_checkpointing():
    torch.manual_seed(0)
    width, batch = 256, 512
    model = _Blocks(width=width, depth=6)
    x = torch.randn(batch, width)
    for _ in range(3):  # compile (the first call learns the unpack hooks' results)
        model.zero_grad(set_to_none=True)
        with camlir.enable():
            model(x).pow(2).mean().backward()
    peaks = {}
    for name, compiled in (("eager", False), ("camlir", True)):
        model.zero_grad(set_to_none=True)
        peaks[name] = _step_peak(model, x, compiled)
    model.zero_grad(set_to_none=True)
    plain = _Blocks(width=width, depth=6)
    plain.load_state_dict(model.state_dict())
    plain.forward = _plain_forward(plain)
    peaks["eager, no checkpointing"] = _step_peak(plain, x, compiled=False)
    activation = batch * width * 4
    ratio = {k: round(v / activation, 2) for k, v in peaks.items()}
    assert camlir.counters["fallbacks"] == 0
    # camlir's step peaks within 20% of eager-with-checkpointing's (measured: 11.5 against
    # 10.0 activations), far below the step without checkpointing (24.5).
    assert peaks["camlir"] <= 1.2 * peaks["eager"], ratio
    assert peaks["camlir"] < peaks["eager, no checkpointing"], ratio
