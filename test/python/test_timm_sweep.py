"""The timm sweep's machinery on one small model (test/python/timm_sweep.py, docs/model-sweep.md).

timm is not a dependency: these tests skip unless it imports, either as installed or from
the directories in CAMLIR_TIMM_PATH (os.pathsep-separated; what timm_sweep.py takes as
--extra-path). The model runs in a subprocess, as in the sweep, so this process's sys.path
and modules stay as they were (no torchvision stand-in leaks into other tests).
"""

import importlib.util
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import model_sweep  # noqa: E402

TIMM_PATH = os.environ.get("CAMLIR_TIMM_PATH", "")


def _timm_found():
    saved = list(sys.path)
    try:
        sys.path[:0] = [os.path.abspath(d) for d in TIMM_PATH.split(os.pathsep) if d]
        return importlib.util.find_spec("timm") is not None
    finally:
        sys.path[:] = saved


pytestmark = pytest.mark.skipif(not _timm_found(), reason="timm is not installed (the timm "
                                "sweep's setup: docs/model-sweep.md; CAMLIR_TIMM_PATH)")


def test_timm_model_in_a_subprocess_matches_eager():
    # mobilenetv3_small_050: batch norm, squeeze-excite, hard-swish, dropout in the head.
    (record,) = model_sweep.sweep(
        ["mobilenetv3_small_050"], timeout=240, log=lambda line: None,
        script=os.path.join(HERE, "timm_sweep.py"),
        child_args=["--extra-path", TIMM_PATH, "--shim", "auto"])
    assert record["result"] == "ok", (record["result"], record.get("mismatches"),
                                      record.get("error"))
    assert model_sweep.native(record), (record["counters"], record.get("explain"))
    assert record["timm_model"] == "mobilenetv3_small_050"
