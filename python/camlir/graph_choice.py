"""No compiled backward slower than PyTorch's own: the choice, per program, by measurement.

A compiled program replaces the graph that PyTorch's compiled autograd captured, whose
nodes run PyTorch's own backward formulas (hand-tuned kernels such as oneDNN's batch-norm
backward). Where camlir's program is slower than that graph (on the bench CNN, the
decomposed batch-norm backward measured 3.6 ms in our loops against 2.2 ms for eager's
whole backward), the graph should run instead. `GraphChoice` decides per program: after
`START` calls (the kernel-level choices of `backends/cpu/choice.py` settle first), calls
alternate between the program and the captured graph until each has `SAMPLES` timings for
the same sizes; the graph is kept when its median is below `MARGIN` times the program's
(at least 15% faster).
Both are exact, so the choice never changes a gradient beyond rounding. `fullgraph=True`
always runs the program. `CAMLIR_GRAPH_CHOICE=0` turns the measurement off.
"""

import os
import statistics

START = 16
# Conservative: a wrong switch costs every later call. With 5 samples and a 10% margin, W2
# at 2 threads switched to the graph on noise (10.6 vs 11.8 ms measured) and then ran at
# 12.5 ms per backward against 9.8 ms for the program.
SAMPLES = 9
MARGIN = 0.85


def enabled() -> bool:
    """Whether programs are checked against PyTorch's graph (`CAMLIR_GRAPH_CHOICE`, default on)."""
    return os.environ.get("CAMLIR_GRAPH_CHOICE", "1") not in ("0", "false", "off")


class GraphChoice:
    """`pick()` says which to run next ("program" or "pytorch"); `record(key, which,
    seconds)` adds a timing for this call's sizes (`key`); `decided` is then set, and
    `program_s`/`pytorch_s` hold the medians it decided on."""

    def __init__(self):
        self.calls = 0
        self.decided = None
        self.program_s = self.pytorch_s = None
        self._samples: dict = {}

    def pick(self) -> str:
        if self.decided is not None:
            return self.decided
        n = self.calls
        self.calls += 1
        if n < START:
            return "program"
        return "pytorch" if (n - START) % 2 else "program"

    def measuring(self) -> bool:
        return self.decided is None and self.calls > START

    def record(self, key, which: str, seconds: float) -> bool:
        """Adds a timing; returns True when this one decided."""
        program, pytorch = self._samples.setdefault(key, ([], []))
        (pytorch if which == "pytorch" else program).append(seconds)
        if len(program) < SAMPLES or len(pytorch) < SAMPLES:
            return False
        self.program_s, self.pytorch_s = statistics.median(program), statistics.median(pytorch)
        self.decided = "pytorch" if self.pytorch_s < MARGIN * self.program_s else "program"
        self._samples.clear()
        return True
