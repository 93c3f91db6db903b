"""The README's main job runs and reports what it promises."""

import subprocess
import sys


def test_demo_trains_and_matches_eager():
    result = subprocess.run([sys.executable, "-m", "camlir.demo", "--steps", "6"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "gradients equal to PyTorch's eager engine at every step" in out
    first, last = [float(v) for v in out.split("loss went from ")[1].split()[::2][:2]]
    assert last < first
    assert "tensor_pre_hook" in out and "AddmmBackward0" in out
    assert "captures=1" in out and "fallbacks=0" in out
