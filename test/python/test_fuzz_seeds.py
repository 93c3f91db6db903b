"""The program fuzzer's fixed seed set, run in CI (fuzz_programs.py, docs/fuzzing.md).

Each seed's program runs eagerly and through camlir on both backends ("cpu" and "eager"),
for 2-3 steps with changing values; every gradient and every hook call must match eager's.
A WRONG gradient or a CRASH fails the test. The seeds cover every feature the generator has
(hooks of every kind, custom Functions with ctx values, in-place updates through views,
torch.compile'd regions with graph breaks, retain_grad, ...), plus the seeds of the bugs
the long runs found. Seeds of bugs camlir still has are marked xfail(strict=True): the day
the bug is fixed, the test says so, and the mark comes off.

Below the seeds, each bug the fuzzer found as a minimal program, compared with eager.
"""

import pytest
import torch
import torch.nn.functional as F

import camlir
import fuzz_programs

# Programs with a module whose inputs need no gradient make PyTorch warn, rightly; not news here.
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning")

# Chosen from the long run (docs/fuzzing.md): together they use every feature the generator
# has, in little time.
COVERAGE = [100, 108, 118, 424, 428, 438, 504, 536, 560, 576, 580, 606, 617, 618, 635, 643, 731, 744,
            755, 764, 790, 815, 819, 851, 860, 935]

# The seeds of the bugs the long run found (docs/fuzzing.md lists every seed of each).
FOUND = [
    5, 96,                # leaky_relu backward lowered as the forward's formula (fixed in ad95445)
    137, 992, 1051,       # bool masks read as packed bits by vectorized kernels (fixed in ad95445)
    937,                  # not camlir's: the hook branched on a sum that is 0 up to rounding (the generator)
    54, 1761,             # in-place update through a view of a result with transposed strides
    482, 1094,            # bfloat16 sums accumulated in bfloat16
    762, 1449,            # compiled step: StopIteration in PyTorch's compiled autograd capture,
                          # now a fallback to the eager engine (capture/engine.py: _capture_failed);
                          # the capture's compile context left open made a later torch.compile
                          # fail now and then ("compile_context is not set", when the collector
                          # ran): closed at once since (engine._close_failed_capture)
]

# seed -> the camlir bug it still hits (the reason of its strict xfail)
OPEN_BUGS = {}

SEEDS = COVERAGE + FOUND


def _param(seed):
    if seed in OPEN_BUGS:
        return pytest.param(seed, marks=pytest.mark.xfail(strict=True, reason=f"camlir bug: {OPEN_BUGS[seed]}"))
    return seed


# Through the compile service as a training loop gets it by default (mode camlir_async: the
# first step runs eagerly while a worker compiles, then camlir.wait(), then compiled steps).
# 154: backward(retain_graph=True) of a torch.compile'd region while its program compiled
# went to the eager engine, which refused it (donated buffers); such a backward is captured now.
THROUGH_THE_SERVICE = [154, 100, 424, 606, 764]


@pytest.mark.parametrize("seed", THROUGH_THE_SERVICE)
def test_fuzz_seed_through_the_compile_service(seed, monkeypatch):
    monkeypatch.setenv("CAMLIR_COMPILE_WORKERS", "1")
    result = fuzz_programs.check(seed, modes=("camlir_async",))
    bad = {mode: f"{r['class']}: {r['detail']}" for mode, r in result["modes"].items()
           if r["class"] in ("WRONG", "CRASH")}
    assert not bad, f"seed {seed} ({result['description']}): {bad}"
    camlir.wait(120)


@pytest.mark.parametrize("seed", [_param(s) for s in SEEDS])
def test_fuzz_seed(seed):
    """Each seed's program gives eager's gradients through camlir, natively or by a fallback."""
    result = fuzz_programs.check(seed)
    assert result["class"] != "invalid", f"the generator made a program eager rejects: {result['detail']}"
    bad = {mode: f"{r['class']}: {r['detail']}" for mode, r in result["modes"].items()
           if r["class"] in ("WRONG", "CRASH")}
    assert not bad, f"seed {seed} ({result['description']}): {bad}"


# bfloat16 programs with a bf16 constant global (a memref.global of zeros), which
# ca-bf16-as-i16's first version refused, so that their graphs were interpreted (native
# before that pass and after its fix). "ok" would hide that, so the class must be native.
NATIVE_BF16 = [165, 168, 451]


@pytest.mark.parametrize("seed", NATIVE_BF16)
def test_bf16_seed_compiles_natively(seed):
    result = fuzz_programs.check(seed, modes=("camlir_cpu",))
    assert fuzz_programs.generate(seed).dtype == "bfloat16"
    mode = result["modes"]["camlir_cpu"]
    assert mode["class"] == "ok-native", f"seed {seed}: {mode['class']}: {mode['detail']}"


# --------------------------------------------------------------------------------------
# The bugs the fuzzer found, each as a few lines (docs/fuzzing.md has the story of each).
# --------------------------------------------------------------------------------------


def _eager_and_camlir(fn, make_inputs, backend):
    """Gradients of `fn(*inputs)` weighted by a fixed random tensor, eagerly and through
    camlir, on fresh copies of the same inputs."""
    out = []
    for enabled in (False, True):
        torch.manual_seed(0)
        inputs = make_inputs()
        result = fn(*inputs)
        weight = torch.randn(result.shape, generator=torch.Generator().manual_seed(1))
        if enabled:
            with camlir.enable(backend=backend):
                (result * weight).sum().backward()
        else:
            (result * weight).sum().backward()
        out.append([t.grad for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad])
    camlir.reset()
    return out


def _assert_same(eager, ours):
    for e, o in zip(eager, ours):
        assert o is not None
        torch.testing.assert_close(o, e, rtol=1e-4, atol=1e-5)


def backends(open_bug=None):
    """Both backends; the cpu one marked xfail(strict=True) while `open_bug` is open there."""
    if open_bug is None:
        return ["eager", "cpu"]
    return ["eager", pytest.param("cpu", marks=pytest.mark.xfail(strict=True, reason=f"camlir bug: {open_bug}"))]


@pytest.mark.parametrize("backend", backends())
def test_bool_mask_saved_for_backward(backend):
    """`torch.where(c > 0, p, q)` and `p * (c > 0)` save a bool mask the backward reads.
    (Fuzz seed 137.) The cpu backend's vectorized kernels read the mask's bytes as packed
    bits: wrong gradients for some sizes (8 to 16 elements at 943a353)."""
    for n in (6, 8, 9, 16, 17, 33, 64, 100):
        def make_inputs():
            return [torch.randn(n, requires_grad=True), torch.randn(n, requires_grad=True), torch.randn(n)]
        _assert_same(*_eager_and_camlir(lambda p, q, c: torch.where(c > 0, p, q * 2), make_inputs, backend))
        _assert_same(*_eager_and_camlir(lambda p, q, c: p * (c > 0) + q, make_inputs, backend))


@pytest.mark.parametrize("backend", backends())
def test_leaky_relu_backward(backend):
    """LeakyReluBackward0 (fuzz seeds 5, 51, 63, 96, ...: the most frequent WRONG): torch-mlir
    lowered `leaky_relu_backward` as `max(grad, 0) + slope * min(x, 0)` instead of
    `grad * (x > 0 ? 1 : slope)`."""
    _assert_same(*_eager_and_camlir(lambda x: F.leaky_relu(x, 0.2),
                                    lambda: [torch.randn(5, 3, requires_grad=True)], backend))


@pytest.mark.parametrize("backend", backends())
def test_inplace_through_a_view_of_a_transposed_result(backend):
    """(Fuzz seed 54.) `p.t() * 2` keeps the transposed strides of `p.t()` in eager; an
    in-place update through a view of it (CopySlices) must scatter the gradient by those
    strides, not by a contiguous layout."""
    def fn(p):
        v = p.t() * 2
        v[0].mul_(3.0)
        return v
    _assert_same(*_eager_and_camlir(fn, lambda: [torch.randn(5, 3, requires_grad=True)], backend))

    def fn2(p, q):
        v = p.t() + p.t()
        v.narrow(1, 1, 4).add_(q, alpha=0.5)
        return v
    _assert_same(*_eager_and_camlir(fn2, lambda: [torch.randn(5, 3, requires_grad=True),
                                                 torch.randn(3, 4, requires_grad=True)], backend))


@pytest.mark.parametrize("backend", backends())
def test_bfloat16_reduction_accuracy(backend):
    """(Fuzz seed 482.) The gradient of a broadcast bf16 parameter is a sum over the batch;
    eager accumulates it in float32, so must camlir: its error against float64 stays within
    4x eager's."""
    torch.manual_seed(0)
    x = torch.randn(2000, 2, dtype=torch.bfloat16)
    c = torch.randn(2000, 2, dtype=torch.bfloat16)
    ref = (x.double() * c.double()).sum(0)
    grads = []
    for enabled in (False, True):
        w = torch.randn(2, dtype=torch.bfloat16, requires_grad=True)
        if enabled:
            with camlir.enable(backend=backend):
                (x * w * c).sum().backward()
        else:
            (x * w * c).sum().backward()
        grads.append((w.grad.double() - ref).abs().max().item())
    camlir.reset()
    eager_err, camlir_err = grads
    assert camlir_err <= 4 * eager_err + 1e-3, f"camlir's bf16 error {camlir_err}, eager's {eager_err}"
