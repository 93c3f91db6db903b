import os
import sys

import pytest

# Tests count compiles: programs left on disk by an earlier test or run must not turn them
# into disk hits. The disk-cache tests switch it on, each with a directory of its own.
os.environ.setdefault("CAMLIR_DISK_CACHE", "0")
# Tests check camlir's compiled backward: a structure measured faster on the eager engine
# would stop running it after 34 calls (graph_choice.py). test_speed_guarantees switches
# the measurement back on; routing after a fallback is on either way.
os.environ.setdefault("CAMLIR_GRAPH_CHOICE", "0")
# Tests count compiles and read programs right after the backward that made them: compiles
# run in this process, blocking, as with `camlir.config.compile_workers = 0`. The compile
# service's own tests (test_compile_service.py) switch the workers on.
os.environ.setdefault("CAMLIR_COMPILE_WORKERS", "0")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def ctx():
    from torch_mlir import ir

    from camlir import make_context

    context = make_context()
    with context, ir.Location.unknown():
        yield context


@pytest.fixture
def ca_opt_cmd():
    """How to run the installed ca-opt console script."""
    exe = os.path.join(os.path.dirname(sys.executable), "ca-opt")
    return [exe] if os.path.exists(exe) else [sys.executable, "-m", "camlir.tools.ca_opt"]


@pytest.fixture(params=["eager", "cpu"])
def each_backend(request):
    """Runs a test once per backend: `eager_and_camlir` uses it unless told otherwise."""
    import camlir
    import helpers

    camlir.reset()
    helpers.use_backend(request.param)
    yield request.param
    helpers.use_backend("eager")
    camlir.reset()
