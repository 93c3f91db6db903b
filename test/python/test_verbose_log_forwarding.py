"""PyTorch's compiled-autograd verbose log (`TORCH_LOGS=compiled_autograd_verbose`) still
shows compiled autograd's cache misses when camlir runs the backward: camlir's own reason
collector replaces PyTorch's verbose logger during a capture and passes the messages on.
(PyTorch's test_verbose_logs_cpp counted 0 "Cache miss ... GraphRoot" lines under camlir.)"""

import logging

import torch
from torch._dynamo import compiled_autograd as ca_mod

import camlir


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _train(sizes):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4))
    with camlir.enable(backend="eager"):
        for n in sizes:
            model.zero_grad()
            model(torch.randn(n, 4)).sum().backward()


def test_cache_misses_reach_pytorchs_verbose_log_when_it_is_on():
    lines = _Lines()
    ca_mod.verbose_log.addHandler(lines)
    torch._logging.set_logs(compiled_autograd_verbose=True)
    try:
        _train([10, 11, 12])
    finally:
        torch._logging.set_logs()
        ca_mod.verbose_log.removeHandler(lines)
    misses = [line for line in lines.lines if line.startswith("Cache miss") and "GraphRoot" in line]
    assert len(misses) == 1, lines.lines
    assert camlir.counters["captures"] >= 1
    # camlir still hears the reasons itself (the size change that made a second capture)
    assert any("changed" in e.reason or "Cache miss" in e.reason or "size" in e.reason
               for e in camlir.explain(kind="capture")[1:]), [e.reason for e in camlir.explain(kind="capture")]


def test_nothing_reaches_it_when_it_is_off():
    lines = _Lines()
    ca_mod.verbose_log.addHandler(lines)
    try:
        _train([10, 11])
    finally:
        ca_mod.verbose_log.removeHandler(lines)
    assert not [line for line in lines.lines if line.startswith("Cache miss")]
