"""The cpu backend: native kernels, strided inputs, accumulation, the cache, memory."""

import gc
import resource

import pytest
import torch
import torch.nn as nn

import camlir
from camlir.lowering import layouts
from helpers import assert_grads_equal, camlir_logs, eager_and_camlir


@pytest.fixture(autouse=True)
def fresh():
    camlir.reset()
    yield
    camlir.reset()


def _compiled_natively():
    assert camlir.counters["interpreted"] == 0
    assert camlir.counters["fallbacks"] == 0
    assert camlir.counters["compiles"] >= 1


def _mlp():
    return nn.Sequential(nn.Linear(12, 24), nn.GELU(), nn.Linear(24, 24), nn.GELU(), nn.Linear(24, 3))


def test_mlp_runs_native_kernels_and_hits_the_cache():
    with camlir_logs("verbose") as messages:
        eager, ours = eager_and_camlir(_mlp, lambda: [torch.randn(6, 12)],
                                       lambda m, x: m(x).pow(2).mean(), steps=4, backend="cpu")
    assert_grads_equal(eager, ours)
    _compiled_natively()
    assert camlir.counters["cache_hits"] == 3
    assert any("after stage 'blas'" in m and "camlir_gemm_f32" in m for m in messages)
    assert any("after stage 'linalg'" in m and "linalg" in m for m in messages)


def test_transposed_and_sliced_inputs_are_read_with_their_strides():
    # The e2e probe got silently wrong gradients from `W.t()` saved tensors at a boundary
    # that ignored strides. Here the saved tensors are transposes, a slice and an expand.
    class Strided(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(7, 5))

        def forward(self, x):
            a = x.t() @ self.w.t()          # saves x.t() and w.t() (both transposed views)
            b = x[:, ::2].sum() * self.w[:, :3].exp().sum()  # a strided slice
            return a.tanh().sum() + b

    eager, ours = eager_and_camlir(Strided, lambda: [torch.randn(5, 4).requires_grad_()],
                                   lambda m, x: m(x), steps=2, backend="cpu")
    assert_grads_equal(eager, ours)
    _compiled_natively()


def test_dense_permutation():
    t = torch.randn(3, 4, 5).permute(2, 0, 1)
    p = layouts.dense_permutation(t)
    assert t.permute(p).is_contiguous()
    assert layouts.dense_permutation(torch.randn(4, 6)[:, ::2]) is None
    assert layouts.dense_permutation(torch.randn(4, 4)) is None


def test_float64():
    eager, ours = eager_and_camlir(lambda: nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 2)).double(),
                                   lambda: [torch.randn(3, 5, dtype=torch.float64)], lambda m, x: m(x).sum(),
                                   steps=2, backend="cpu")
    assert_grads_equal(eager, ours)
    assert ours[0][0].dtype == torch.float64
    _compiled_natively()


def test_accumulates_into_existing_grad_in_place():
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    twin = nn.Linear(4, 3)
    twin.load_state_dict(model.state_dict())
    x = torch.randn(5, 4)
    for m in (model, twin):
        m.weight.grad = torch.ones_like(m.weight)
    before = twin.weight.grad
    model(x).sum().backward()
    with camlir.enable(backend="cpu"):
        twin(x).sum().backward()
    assert twin.weight.grad is before  # the same tensor, added to in place, as eager does
    torch.testing.assert_close(twin.weight.grad, model.weight.grad)
    torch.testing.assert_close(twin.bias.grad, model.bias.grad)
    _compiled_natively()


def test_hooks_that_stay_python_calls_run_between_kernels():
    seen = []

    def spy(g):
        seen.append(g.clone())
        return g * 2

    def run(use_camlir):
        torch.manual_seed(0)
        model = _mlp()
        model[2].weight.register_hook(spy)
        model[1].register_full_backward_hook(lambda mod, gi, go: (gi[0] + 1,))
        x = torch.randn(6, 12)
        if use_camlir:
            with camlir.enable(backend="cpu"):
                model(x).sum().backward()
        else:
            model(x).sum().backward()
        return [p.grad for p in model.parameters()]

    eager = run(False)
    ours = run(True)
    for e, o in zip(eager, ours):
        torch.testing.assert_close(o, e)
    torch.testing.assert_close(seen[1], seen[0])  # the hook saw the same gradient
    _compiled_natively()


def test_memory_does_not_grow_over_cached_calls():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 1,050 steps: keep them quick on a busy 2-core machine
    try:
        _memory_does_not_grow()
    finally:
        torch.set_num_threads(threads)


def _memory_does_not_grow():
    model = _mlp()
    x = torch.randn(6, 12)

    def step():
        model.zero_grad(set_to_none=True)
        with camlir.enable(backend="cpu"):
            model(x).sum().backward()

    for _ in range(50):  # compile, warm every allocator pool
        step()
    gc.collect()
    start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(1000):
        step()
    gc.collect()
    grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start
    assert grown_kb < 20 * 1024, f"peak RSS grew by {grown_kb} kB over 1000 cached backward calls"
    assert camlir.counters["compiles"] == 1
    assert camlir.counters["cache_hits"] >= 1049


def test_symbolic_sizes_run_correctly():
    # Batch sizes that change make PyTorch lift them; every size must give right gradients.
    eager_model = nn.Linear(4, 2)
    ours_model = nn.Linear(4, 2)
    ours_model.load_state_dict(eager_model.state_dict())
    for batch in (10, 100, 10, 37):
        x = torch.randn(batch, 4)
        for m in (eager_model, ours_model):
            m.zero_grad(set_to_none=True)
        eager_model(x).sum().backward()
        with camlir.enable(backend="cpu"):
            ours_model(x).sum().backward()
        torch.testing.assert_close(ours_model.weight.grad, eager_model.weight.grad)
        torch.testing.assert_close(ours_model.bias.grad, eager_model.bias.grad)
    assert camlir.counters["fallbacks"] == 0
    assert camlir.counters["interpreted"] == 0  # every size set got native code


def test_traceable_hooks_are_inlined_and_guarded_by_identity():
    torch.manual_seed(0)
    model = _mlp()
    twin = _mlp()
    twin.load_state_dict(model.state_dict())
    handles = [p.register_hook(lambda g: g * 0.5) for p in twin.parameters()]
    for p in model.parameters():
        p.register_hook(lambda g: g * 0.5)
    x = torch.randn(6, 12)
    model(x).sum().backward()
    with camlir.enable(backend="cpu"):
        twin(x).sum().backward()
    for e, o in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(o.grad, e.grad)
    _compiled_natively()
    [(capture, artifact)] = camlir.compiled._compiled
    assert "ca.hook" not in artifact.program.lowered_text  # every hook became kernel code

    # A different hook in the same place must not reuse the inlined `* 0.5`.
    for h in handles:
        h.remove()
    for p in twin.parameters():
        p.register_hook(lambda g: g * 3.0)
    for m in (model, twin):
        m.zero_grad(set_to_none=True)
    for p in model.parameters():
        p._backward_hooks.clear()
        p.register_hook(lambda g: g * 3.0)
    model(x).sum().backward()
    with camlir_logs("recompiles") as messages:
        with camlir.enable(backend="cpu"):
            twin(x).sum().backward()
    for e, o in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(o.grad, e.grad)
    assert any("is not the traced hook" in m for m in messages)


_MATH_KERNEL = """
#id = affine_map<(d0) -> (d0)>
func.func @k(%x: tensor<4001xf32>) -> (tensor<4001xf32>, tensor<4001xf32>, tensor<4001xf32>) attributes {ca.kernel} {
  %e = tensor.empty() : tensor<4001xf32>
  %0:3 = linalg.generic {indexing_maps = [#id, #id, #id, #id], iterator_types = ["parallel"]}
      ins(%x : tensor<4001xf32>) outs(%e, %e, %e : tensor<4001xf32>, tensor<4001xf32>, tensor<4001xf32>) {
  ^bb0(%in: f32, %o1: f32, %o2: f32, %o3: f32):
    %a = math.exp %in : f32
    %b = math.erf %in : f32
    %c = math.tanh %in : f32
    linalg.yield %a, %b, %c : f32, f32, f32
  } -> (tensor<4001xf32>, tensor<4001xf32>, tensor<4001xf32>)
  return %0#0, %0#1, %0#2 : tensor<4001xf32>, tensor<4001xf32>, tensor<4001xf32>
}
"""


def test_vectorizable_exp_and_erf_are_accurate():
    from torch_mlir import ir
    from camlir.backends.cpu import abi
    from camlir.backends.cpu.compiler import make_native
    from camlir.stages import Dump

    with ir.Context():
        module = ir.Module.parse(_MATH_KERNEL)
        engine = make_native(module, Dump("test kernel"))
    spec = abi.TensorSpec((4001,), torch.float32)
    kernel = abi.Kernel(engine, "k", [spec], [spec, spec, spec])
    x = torch.linspace(-100, 100, 4001)
    x[:2001] = torch.linspace(-10, 10, 2001)  # dense where both functions change
    exp, erf, tanh = kernel([x])
    x64 = x.double()
    torch.testing.assert_close(exp.double(), x64.exp().float().double(), rtol=3e-7, atol=0)
    torch.testing.assert_close(erf.double(), torch.erf(x64), rtol=0, atol=3e-7)
    torch.testing.assert_close(tanh.double(), torch.tanh(x64), rtol=3e-7, atol=1e-30)
    assert tanh[x > 9.1].eq(1).all() and tanh[x < -9.1].eq(-1).all()  # saturates exactly, as f32 must
    assert exp[x < -87.4].eq(0).all() and exp[x > 88.8].isinf().all()


def test_ops_without_lowering_run_on_the_host_between_kernels():
    # avg_pool2d_backward has no lowering; cumsum's backward leaves a tm_tensor.scan the
    # lowering cannot take. Both move to the host instead of the graph being interpreted.
    class Pooled(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x):
            y = torch.nn.functional.avg_pool2d(self.fc(x).view(2, 1, 4, 16), 2)
            return y.cumsum(-1).sum()

    with camlir_logs("recompiles") as messages:
        eager, ours = eager_and_camlir(Pooled, lambda: [torch.randn(8, 16)], lambda m, x: m(x),
                                       steps=2, backend="cpu")
    assert_grads_equal(eager, ours)
    _compiled_natively()
    assert any("aten.avg_pool2d_backward cannot be lowered" in m for m in messages)
    assert any("aten.cumsum cannot be lowered" in m for m in messages)


def test_a_kernel_refuses_an_argument_of_another_shape_or_dtype():
    # A kernel reads its arguments with the sizes it was compiled for: anything else is a
    # camlir bug, and must be an error naming it, never a wrong read.
    import camlir

    camlir.reset()
    lin = torch.nn.Linear(4, 3)
    with camlir.enable(backend="cpu"):
        lin(torch.randn(5, 4)).tanh().sum().backward()
    program = camlir.compiled_programs()[-1][2]
    name, kernel = next(iter(program.kernels.items()))
    native = getattr(kernel, "native", kernel)
    good = [torch.zeros(s.shape, dtype=s.dtype) for s in native.inputs]
    native(good)  # the compiled shapes run
    i = next(i for i, t in enumerate(good) if t.dim() > 0)
    bad_shape = list(good)
    bad_shape[i] = torch.zeros(tuple(d + 1 for d in good[i].shape), dtype=good[i].dtype)
    with pytest.raises(RuntimeError, match=f"kernel {name} argument {i} is"):
        native(bad_shape)
    bad_dtype = list(good)
    bad_dtype[i] = good[i].double()
    with pytest.raises(RuntimeError, match="compiled for"):
        native(bad_dtype)
    camlir.reset()


@pytest.mark.parametrize("width", [8, 16])
def test_both_vector_widths_give_eagers_gradients(width, monkeypatch):
    # The loops stage's width is chosen by the CPU (16 lanes with AVX-512); both widths must
    # compile natively and agree with eager, with ragged rows (masked last vectors) and a
    # reduction. 16 lanes need AVX-512 to run here.
    from camlir.backends.cpu import jit

    if width == 16 and "avx512f" not in jit._cpu_flags():
        pytest.skip("no AVX-512 on this CPU")
    monkeypatch.setenv("CAMLIR_VECTOR_WIDTH", str(width))
    monkeypatch.setenv("CAMLIR_DISK_CACHE", "0")
    camlir.reset()
    torch.manual_seed(0)
    w = torch.randn(5, 37, requires_grad=True)
    x = torch.randn(5, 37)
    loss = lambda: (torch.nn.functional.gelu(x * w).sum(dim=1) * torch.tanh(w).mean(dim=1)).sum()  # noqa: E731
    loss().backward()
    expected = w.grad.clone()
    w.grad = None
    camlir.compile_backward(loss())
    torch.testing.assert_close(w.grad, expected)
    assert camlir.counters["interpreted"] == 0
    (_, _, program), = camlir.compiled_programs()
    assert program.kernels
    camlir.reset()


def test_a_bad_vector_width_is_refused(monkeypatch):
    from camlir.backends.cpu import jit

    monkeypatch.setenv("CAMLIR_VECTOR_WIDTH", "12")
    with pytest.raises(ValueError, match="CAMLIR_VECTOR_WIDTH must be 8 or 16, got 12"):
        jit.vector_width()
