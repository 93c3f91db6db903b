"""Loops split over torch's OpenMP threads (passes/parallel_loops.py), against eager.

Each backward runs with 2 (and 3) intra-op threads and the native kernels forced (no torch
twin, no routing), so the split loops are what computes the gradients. Each case also checks
that its module really had a loop nest outlined (the `threads` stage's dump), so a change that
stops splitting fails here instead of passing on one thread."""

import glob
import os

import pytest
import torch

import camlir
from camlir.backends.cpu import jit

pytestmark = pytest.mark.skipif(not jit.parallel_runtime(), reason="no libgomp in this torch")


def _gelu_mlp(x, w):
    return torch.nn.functional.gelu(x @ w).sum()


def _softmax_rows(x, w):  # row reductions, odd sizes
    return (torch.softmax(x, dim=-1) * w).sum()


def _layer_norm(x, w):
    return (torch.nn.functional.layer_norm(x, x.shape[-1:], weight=w) ** 2).sum()


def _flat(x, w):  # 1-D, an extent that no block size divides
    return (torch.sin(x) * x * w).sum()


def _broadcast_bias(x, b):  # x's gradient splits by rows; b's reduces over them
    return torch.tanh(x + b).sum()


def _two_rows(x, w):  # fewer rows than threads x grain: some threads get none
    return (torch.exp(x * 0.01) * w).sum()


def _masked(x, w):  # i1 masks in the loops
    return (torch.where(x > 0, x * 2.0, x * 3.0) * w).pow(2).sum()


def _max_dim(x, w):  # its scatter builds indices with linalg.index 0 (fuzz seed 108)
    return (x.max(dim=1).values * w).sum()


def _transposed(x, w):  # the gradient is a transpose: it reads d0 at an inner position
    return (torch.sin(x.t()) * w).sum()


def _batch_norm(x, w):  # per-channel reductions over (N, H, W): split by channel, d1
    return (torch.nn.functional.batch_norm(x, None, None, weight=w, training=True) ** 2).sum()


CASES = {
    "gelu_mlp": (_gelu_mlp, (96, 512), (512, 384)),
    "softmax_rows": (_softmax_rows, (301, 257), (301, 257)),
    "layer_norm": (_layer_norm, (200, 384), (384,)),
    "flat": (_flat, (100_003,), (100_003,)),
    "broadcast_bias": (_broadcast_bias, (517, 128), (128,)),
    "two_rows": (_two_rows, (2, 40_000), (2, 40_000)),
    "masked": (_masked, (256, 257), (256, 257)),
    "max_dim": (_max_dim, (128, 8, 300), (128, 300)),
    "transposed": (_transposed, (300, 517), (517, 300)),
    "batch_norm": (_batch_norm, (8, 48, 24, 24), (48,)),
}


@pytest.fixture
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


# float32 rounding that camlir's own loops have on one thread too (batch norm's backward:
# 1.2e-5 from float64 against eager's 6.4e-6, the same bits with the threads stage off).
TOLERANCE = {("batch_norm", torch.float32): dict(rtol=1e-4, atol=5e-5)}


def _camlir_grads(fn, a, b):
    with camlir.enable(backend="cpu", fullgraph=True):
        return torch.autograd.grad(fn(a, b), (a, b))


@pytest.mark.parametrize("threads", [2, 3], indirect=True)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", sorted(CASES))
def test_split_loops_give_eager_gradients(case, dtype, threads, tmp_path, monkeypatch):
    """The split program matches eager, and gives the same bits as the program compiled
    with one thread in its loops (each output element is computed by one thread, in the
    same order)."""
    fn, shape_a, shape_b = CASES[case]
    monkeypatch.setenv("CAMLIR_KERNEL_CHOICE", "0")
    monkeypatch.setenv("CAMLIR_GRAPH_CHOICE", "0")
    monkeypatch.setenv("CAMLIR_DISK_CACHE", "0")
    monkeypatch.setenv("CA_DUMP_DIR", str(tmp_path))
    g = torch.Generator().manual_seed(sorted(CASES).index(case))
    a = torch.randn(shape_a, dtype=dtype, generator=g, requires_grad=True)
    b = torch.randn(shape_b, dtype=dtype, generator=g, requires_grad=True)
    expected = torch.autograd.grad(fn(a, b), (a, b))
    monkeypatch.setenv("CAMLIR_THREADS", "0")
    camlir.reset()
    single = _camlir_grads(fn, a, b)
    monkeypatch.setenv("CAMLIR_THREADS", "1")
    camlir.reset()
    for _ in range(2):  # the compile, then the cached program
        got = _camlir_grads(fn, a, b)
        for x, y, z in zip(got, expected, single):
            torch.testing.assert_close(x, y, **TOLERANCE.get((case, dtype), {}))
            assert torch.equal(x, z), f"{case}: the split program's bits differ from one thread's"
    assert camlir.counters["interpreted"] == 0 and camlir.counters["fallbacks"] == 0
    stages = glob.glob(os.path.join(tmp_path, "graph*", "*-threads.mlir"))
    assert stages, "no threads stage ran"
    assert any("ca.parallel_fork" in open(path).read() for path in stages), \
        f"{case}: no loop nest was outlined to run over the threads"


def test_camlir_threads_0_keeps_every_loop_in_its_kernel(monkeypatch):
    monkeypatch.setenv("CAMLIR_THREADS", "0")
    assert not jit.parallel_runtime()
    monkeypatch.setenv("CAMLIR_THREADS", "1")
    assert jit.parallel_runtime()


_FRESH_THREAD = r"""
import ctypes, os, threading
import torch
import camlir

torch.set_num_threads(1)
x = torch.randn(256, 256, requires_grad=True)
seed = torch.ones(256, 256)

def backward(y=None):  # with its own seed: no torch op runs in the thread before camlir's kernel
    with camlir.enable(backend="cpu"):
        (torch.sin(x * 2.0) if y is None else y).backward(seed)

for _ in range(3):  # compiled in the main thread, whose OpenMP count torch set to 1 (the
    backward()     # first call sets x.grad, the second accumulates, the third is a cache hit)
compiles = camlir.counters["compiles"]
seen = []
y = torch.sin(x * 2.0)  # the forward runs here: torch's ops set the OpenMP count of their thread

def in_a_new_thread():
    before = len(os.listdir("/proc/self/task"))
    backward(y)
    seen.append(len(os.listdir("/proc/self/task")) - before)

worker = threading.Thread(target=in_a_new_thread)
worker.start()
worker.join()
assert camlir.counters["compiles"] == compiles, "the thread's backward should be a cache hit"
print("threads started:", seen[0])
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or (os.cpu_count() or 1) < 2,
                    reason="counts threads in /proc; needs a default OpenMP count above 1")
def test_a_fork_uses_torchs_thread_count_in_a_thread_torch_has_not_run_in(tmp_path):
    """libgomp's default team size is per thread: in a thread where torch has run no parallel
    op yet, it is the core count, whatever `torch.set_num_threads` said. A fork must use
    torch's count (`at::get_num_threads()`), or a backward called from a new Python thread
    starts OpenMP threads the user turned off."""
    import subprocess
    import sys

    env = dict(os.environ, CAMLIR_GRAPH_CHOICE="0", CAMLIR_KERNEL_CHOICE="0", CAMLIR_DISK_CACHE="0",
               CAMLIR_THREADS_MIN_ELEMENTS="1024")
    env.pop("OMP_NUM_THREADS", None)
    done = subprocess.run([sys.executable, "-c", _FRESH_THREAD], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "threads started: 0", done.stdout
