"""A fast subset of the Hugging Face model sweep (test/python/model_sweep.py, docs/model-sweep.md).

Needs `transformers` (the `bench` extra: pip install -e '.[bench]'); tools/test.sh installs only
the `test` extra, so without it these tests skip and say why.
"""

import os
import sys

import pytest

pytest.importorskip("transformers", reason="the model sweep needs transformers "
                    "(pip install -e '.[bench]'); tools/test.sh does not install it")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import model_sweep  # noqa: E402

# A decoder LM, a vision transformer, and Falcon (multi-query attention: negative indices in
# an index backward, the sweep's first bug): together under a minute here, mostly compiling.
FAST = ["GPT-2", "ViT", "Falcon"]


@pytest.mark.parametrize("name", FAST)
def test_model_gradients_match_eager(name):
    record = model_sweep.run_model(name, backend="cpu", steps=2, train_step=True,
                                    timing_calls=0)
    assert record["result"] == "ok", (record["result"], record["mismatches"], record["error"])
    assert model_sweep.native(record), (record["counters"], record.get("explain"))


def test_sweep_reports_a_wrong_gradient(monkeypatch):
    # The comparison must be able to fail: a gradient changed after camlir's backward.
    import torch

    real = model_sweep._compare

    def tampered(eager_model, camlir_model):
        p = next(camlir_model.parameters())
        with torch.no_grad():
            p.grad.add_(1e-2)
        return real(eager_model, camlir_model)

    monkeypatch.setattr(model_sweep, "_compare", tampered)
    record = model_sweep.run_model("GPT-2", backend="eager", steps=1, train_step=False,
                                    timing_calls=0)
    assert record["result"] == "WRONG" and record["max_err"] >= 1e-2
