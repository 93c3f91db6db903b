"""How the model sweep (test/python/model_sweep.py) judges a gradient that fails its fixed
tolerance: a float64 rerun of the step tells float32 rounding (accepted, noted in
`record["rounding"]`) from a wrong value (WRONG), with the fuzzer's 4x rule
(docs/model-sweep.md). No `transformers`: a tiny module stands in for a model, and camlir's
gradients are changed after its backward, before the comparison.

The module has a scalar parameter `w` whose gradient is the float32 sum of 4096 terms of
magnitude 1e4 that nearly cancel: eager's own float32 error in it (~0.04) is far beyond
rtol=1e-4, atol=1e-5 of the gradient (~30), so a camlir gradient that is as close to the
float64 one as eager's, but on the other side, fails the fixed tolerance.
"""

import itertools
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import model_sweep  # noqa: E402

_CALLS = itertools.count()


class _Out:
    def __init__(self, loss):
        self.loss = loss


class Tiny(torch.nn.Module):
    """`rng`: what the float64 forward does to the random generator before the dropout:
    "same" nothing; "reseed" re-seeds it (other masks unless the sweep replays the float32
    ones); "extra" draws once more (the draws cannot be matched). `loss_drift`: every
    forward call adds a different constant to the loss (eager and camlir losses differ)."""

    def __init__(self, p=0.0, rng="same", loss_drift=False):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 8)
        self.w = torch.nn.Parameter(torch.ones(()))
        self.drop = torch.nn.Dropout(p)
        self.rng, self.loss_drift = rng, loss_drift

    def forward(self, x, big):
        if x.dtype == torch.float64 and self.rng == "reseed":
            torch.manual_seed(12345)
        if x.dtype == torch.float64 and self.rng == "extra":
            torch.rand(1)
        self.last_big = big
        h = self.drop(torch.tanh(self.lin(x)))
        loss = h.square().mean() + (self.w * big).sum()
        if self.loss_drift:
            loss = loss + 1e-3 * next(_CALLS)
        return _Out(loss)


def inputs(step):
    g = torch.Generator().manual_seed(100 + step)
    v = torch.randn(2048, generator=g) * 1e4
    big = torch.cat([v, -v + torch.randn(2048, generator=g)])[torch.randperm(4096, generator=g)]
    return dict(x=torch.randn(4, 8, generator=g), big=big)


def _tamper(monkeypatch, change):
    """`change(eager_model, camlir_model)` runs on camlir's gradients before each comparison."""
    real = model_sweep._compare

    def tampered(eager_model, camlir_model):
        with torch.no_grad():
            change(eager_model, camlir_model)
        return real(eager_model, camlir_model)

    monkeypatch.setattr(model_sweep, "_compare", tampered)


def _w_error(times):
    """camlir's w gradient := eager's + times * (eager's - float64's): (1 + times)x as far
    from the float64 gradient as eager's (the float64 one is the sum of the float32 terms)."""
    def change(eager_model, camlir_model):
        exact = camlir_model.last_big.double().sum()
        e = eager_model.w.grad.double()
        camlir_model.w.grad.copy_(e + times * (e - exact))
    return change


def _count_float64_checks(monkeypatch):
    calls = []
    real = model_sweep._float64_check

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(model_sweep, "_float64_check", counted)
    return calls


def _run(model, steps=2, train_step=False):
    return model_sweep.run_built("tiny", model, inputs, backend="eager", steps=steps,
                                 train_step=train_step, timing_calls=0)


def test_untouched_gradients_match():
    record = _run(Tiny())
    assert record["result"] == "ok", record
    assert record["mismatches"] == [] and record["rounding"] == []


def test_rounding_sized_difference_is_accepted(monkeypatch):
    _tamper(monkeypatch, _w_error(2.0))  # 3x eager's own distance from float64
    checks = _count_float64_checks(monkeypatch)
    record = _run(Tiny())
    assert record["result"] == "ok", record
    assert record["mismatches"] == []
    # it failed the fixed tolerance (so the float64 rerun ran), every step
    assert record["max_err"] > 1e-2 and len(checks) == 2
    assert len(record["rounding"]) == 2 and all(": float32 rounding: w (" in r
                                                 for r in record["rounding"]), record["rounding"]


def test_beyond_four_times_eager_is_wrong(monkeypatch):
    _tamper(monkeypatch, _w_error(5.0))  # 6x eager's own distance from float64
    record = _run(Tiny())
    assert record["result"] == "WRONG", record
    assert record["rounding"] == []
    assert len(record["mismatches"]) == 2
    assert all(" w: " in m and "not float32 rounding" in m for m in record["mismatches"])


def test_relative_error_is_wrong(monkeypatch):
    def change(eager_model, camlir_model):
        camlir_model.lin.weight.grad.mul_(1 + 1e-2)
    _tamper(monkeypatch, change)
    record = _run(Tiny())
    assert record["result"] == "WRONG", record
    assert record["rounding"] == []
    assert all("lin.weight" in m and "not float32 rounding" in m for m in record["mismatches"])


def test_missing_gradient_is_wrong_without_float64_check(monkeypatch):
    def change(eager_model, camlir_model):
        camlir_model.lin.bias.grad = None
    _tamper(monkeypatch, change)
    checks = _count_float64_checks(monkeypatch)
    record = _run(Tiny(), steps=1)
    assert record["result"] == "WRONG", record
    assert "lin.bias: grad is None on camlir only" in record["mismatches"][0]
    assert checks == []


def test_forward_loss_difference_is_wrong_without_float64_check(monkeypatch):
    _tamper(monkeypatch, _w_error(2.0))  # would be accepted with equal losses
    checks = _count_float64_checks(monkeypatch)
    record = _run(Tiny(loss_drift=True), steps=1)
    assert record["result"] == "WRONG", record
    assert "forward losses differ" in record["mismatches"][0]
    assert any(" w: " in m for m in record["mismatches"][1:]), record["mismatches"]
    assert checks == [] and record["rounding"] == []


def test_dropout_masks_are_replayed_in_float64(monkeypatch):
    # The float64 forward re-seeds the generator: only replaying the float32 masks gives the
    # right reference. With other masks, lin.weight's 1% error would be within 4x of eager's
    # distance from that reference, and accepted.
    def change(eager_model, camlir_model):
        if camlir_model.training:
            _w_error(2.0)(eager_model, camlir_model)
            camlir_model.lin.weight.grad.mul_(1 + 1e-2)
    _tamper(monkeypatch, change)
    record = _run(Tiny(p=0.5, rng="reseed"), steps=1, train_step=True)
    assert record["result"] == "WRONG", record
    assert len(record["rounding"]) == 1, record["rounding"]
    assert record["rounding"][0].startswith("step 1 (train): float32 rounding: w ("), record
    assert len(record["mismatches"]) == 1, record["mismatches"]
    assert "lin.weight" in record["mismatches"][0]
    assert "not float32 rounding" in record["mismatches"][0]


def test_unmatched_random_draws_stay_wrong(monkeypatch):
    # The float64 forward draws once more than the float32 one: its masks cannot be matched,
    # so a difference that would be accepted stays WRONG, and the record says why.
    def change(eager_model, camlir_model):
        if camlir_model.training:
            _w_error(2.0)(eager_model, camlir_model)
    _tamper(monkeypatch, change)
    record = _run(Tiny(p=0.5, rng="extra"), steps=1, train_step=True)
    assert record["result"] == "WRONG", record
    assert record["rounding"] == []
    assert len(record["mismatches"]) == 1
    assert "step 1 (train)" in record["mismatches"][0]
    assert "dropout masks cannot be matched" in record["mismatches"][0]


@pytest.mark.parametrize("p", [0.0, 0.5])
def test_float64_rerun_reproduces_the_step(p):
    # The rerun's float32 copy gives eager's loss and gradients of the step exactly, and the
    # float64 copy's gradients are within float32 rounding of them.
    model = Tiny(p=p)
    kwargs = inputs(0)
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    model.train(True)
    torch.manual_seed(7)
    loss = model(**kwargs).loss
    loss.backward()
    accepted, rejected = model_sweep._float64_check(model, buffers, kwargs, 7, True, loss,
                                                    ["lin.weight", "w"], model)
    assert rejected == {} and set(accepted) == {"lin.weight", "w"}, (accepted, rejected)
