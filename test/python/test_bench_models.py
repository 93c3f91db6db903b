"""The benchmark's real-model workloads (bench/workloads.py, bench/vision_models.py).

The vision models need nothing beyond torch; the Hugging Face ones skip without transformers
(the `bench` extra). Only ResNet18 is compiled (about 10 s); the others are checked in eager.
"""

import os
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench import vision_models, workloads  # noqa: E402


def test_vision_models_have_the_published_sizes():
    # The parameter counts of the reference ResNet-18 and MobileNetV3-small (1000 classes).
    assert sum(p.numel() for p in vision_models.ResNet18(1000).parameters()) == 11_689_512
    assert sum(p.numel() for p in vision_models.MobileNetV3Small(1000).parameters()) == 2_542_856


@pytest.mark.parametrize("name", ["ResNet18", "MobileNetV3"])
def test_vision_workload_is_seeded(name):
    a, b = workloads.build(name), workloads.build(name)
    assert torch.equal(a.forward(a.model, a.inputs), b.forward(b.model, b.inputs))


def test_resnet18_camlir_backward_matches_eager():
    import camlir

    reference = workloads.build("ResNet18")
    reference.forward(reference.model, reference.inputs).backward()
    w = workloads.build("ResNet18")
    loss = w.forward(w.model, w.inputs)
    camlir.reset()
    with camlir.enable(backend="cpu"):
        loss.backward()
    assert camlir.counters["compiles"] + camlir.counters["disk_cache_hits"] == 1
    assert camlir.counters["fallbacks"] == 0 and camlir.counters["interpreted"] == 0
    expected = dict(reference.model.named_parameters())
    for name, p in w.model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name].grad, rtol=1e-4, atol=1e-5, msg=name)


def test_missing_package_is_reported(monkeypatch):
    monkeypatch.setitem(workloads.REQUIRES, "ResNet18", "no_such_package_for_camlir_bench")
    assert "no_such_package_for_camlir_bench" in workloads.missing("ResNet18")
    with pytest.raises(ModuleNotFoundError):
        workloads.build("ResNet18")
    assert workloads.missing("W1") is None


@pytest.mark.parametrize("name", ["GPT2", "Llama", "BERT", "T5"])
def test_hugging_face_workloads_build(name):
    pytest.importorskip("transformers")
    a, b = workloads.build(name), workloads.build(name)
    loss = a.forward(a.model, a.inputs)
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert torch.equal(loss, b.forward(b.model, b.inputs))  # same seeds, same loss
    loss.backward()
    assert all(p.grad is not None for p in a.model.parameters() if p.requires_grad)
