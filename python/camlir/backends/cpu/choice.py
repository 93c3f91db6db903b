"""No compiled kernel slower than what it replaces: the native kernel or its ops through torch,
chosen per kernel by measurement.

Every kernel the cpu backend compiles replaces a run of aten ops that PyTorch would run one
by one. Usually the fused, vectorized kernel wins; sometimes it does not (a batch-norm
backward whose reductions our loops run scalar took 3.9 ms where PyTorch's ops take under
1 ms on the bench CNN). So each kernel keeps its torch-dialect original
(`ca-lower-to-linalg{twins=true}`), run by the reference interpreter through torch, and
`KernelChoice` measures both on the program's own calls: the first call of each is a
warm-up, then they alternate until each has `SAMPLES` timings for the same input shapes.
The twin is kept when its median is below `MARGIN` times the kernel's (ties and noise keep
native code); from then on, the chosen one runs alone. Both compute the same values, so
which one runs on a given call never changes a gradient beyond rounding.

The decision is logged (`camlir: graph 3, kernel @backward_kernel_1: runs through torch:
0.61 ms per call against 3.94 ms native`) and kept in the program's `choices` (`name ->
KernelChoice`), which `camlir.compiled_programs()` shows. `CAMLIR_KERNEL_CHOICE=0` turns
the measurement off (native code always).
"""

import statistics
import time

import torch

from camlir import environment, logs

SAMPLES = 5     # timings of each candidate before deciding
MARGIN = 0.9    # the twin must be at least 10% faster to replace native code


def enabled() -> bool:
    """Whether kernels are chosen by measurement (`CAMLIR_KERNEL_CHOICE`, default on)."""
    return environment.flag("CAMLIR_KERNEL_CHOICE")


class KernelChoice:
    """A kernel step of the host program: `choice(ins, runtime) -> outputs`.

    `native(ins)` is the compiled kernel, `twin` the reference interpreter's program of its
    torch original (`program.torch_twins`).
    `chosen` is None while measuring, then "native" or "torch"; `native_s`/`torch_s` are the
    medians it decided on.
    """

    def __init__(self, name: str, native, twin, label: str = ""):
        self.name = name
        self.native = native
        self.twin = twin
        self.label = label
        self.chosen = None
        self.native_s = self.torch_s = None
        self._calls = 0
        self._samples: dict = {}  # input shapes -> ([native seconds], [torch seconds])
        self._run = self._measure
        self.step = None  # the host program's step that calls this (set by CpuProgram)
        self.kernel = native  # what camlir.profile() reads the BLAS totals of

    def __call__(self, ins, rt):
        return self._run(ins, rt)

    def _torch(self, ins, rt):
        # The kernel's ABI: contiguous inputs (its IR's views assume them, as the native
        # kernel's descriptors do).
        ins = [t.contiguous() if isinstance(t, torch.Tensor) else t for t in ins]
        return _fresh(self.twin.run(ins, rt), ins)

    def _native(self, ins, rt):
        return self.native(ins)

    def _measure(self, ins, rt):
        n = self._calls
        self._calls = n + 1
        use_torch = n % 2 == 1
        start = time.perf_counter()
        outs = self._torch(ins, rt) if use_torch else self._native(ins, rt)
        seconds = time.perf_counter() - start
        if n >= 2:  # calls 0 and 1 warm each up
            key = tuple(tuple(t.shape) for t in ins if isinstance(t, torch.Tensor))
            native, twin = self._samples.setdefault(key, ([], []))
            (twin if use_torch else native).append(seconds)
            if len(native) >= SAMPLES and len(twin) >= SAMPLES:
                self._decide(statistics.median(native), statistics.median(twin))
        return outs

    def _decide(self, native_s: float, torch_s: float) -> None:
        self.native_s, self.torch_s = native_s, torch_s
        if torch_s < MARGIN * native_s:
            self.chosen, self._run = "torch", self._torch
            logs.log.info("%skernel @%s runs through torch: %.3f ms per call against %.3f ms native",
                          f"{self.label}, " if self.label else "", self.name, 1e3 * torch_s, 1e3 * native_s)
        else:
            self.chosen, self._run = "native", self._native
        self._samples.clear()
        if self.step is not None:
            # Decided: the step calls the pick directly (each Python call level cost ~1 us
            # on every backward of a tiny model).
            native = self.native
            self.step.fn = self._torch if self.chosen == "torch" else (lambda ins, rt: native(ins))

    def __repr__(self) -> str:
        if self.chosen is None:
            return f"KernelChoice(@{self.name}: measuring)"
        return (f"KernelChoice(@{self.name}: {self.chosen}, native {1e3 * self.native_s:.3f} ms, "
                f"torch {1e3 * self.torch_s:.3f} ms)")


def _fresh(outs, ins) -> list:
    """A twin's results as the runtime expects a kernel's: contiguous tensors of their own.
    Torch ops may return views (a transpose, a reshape, a slice of a temporary) or an input
    itself; such a result could be stolen into `.grad` or share memory with another result
    that is accumulated into in place later. Those are copied; results that own their
    memory, alone, pass as they are."""
    seen = {t.untyped_storage().data_ptr() for t in ins if isinstance(t, torch.Tensor)}
    fresh = []
    for out in outs:
        if isinstance(out, torch.Tensor):
            storage = out.untyped_storage().data_ptr()
            if out._base is not None or not out.is_contiguous() or storage in seen:
                out = out.clone(memory_format=torch.contiguous_format)
                storage = out.untyped_storage().data_ptr()
            seen.add(storage)
        fresh.append(out)
    return fresh
