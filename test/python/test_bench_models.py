"""The benchmark's real-model workloads (bench/workloads.py, bench/vision_models.py).

The vision models need nothing beyond torch; the Hugging Face ones skip without transformers
(the `bench` extra). Only ResNet18 is compiled (about 10 s); the others are checked in eager.
"""

import os
import sys

import pytest
import torch

import camlir

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


@pytest.mark.parametrize("name", ["GPT2", "Llama", "BERT", "T5", "GPT2-bf16"])
def test_hugging_face_workloads_build(name):
    pytest.importorskip("transformers")
    a, b = workloads.build(name), workloads.build(name)
    loss = a.forward(a.model, a.inputs)
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert torch.equal(loss, b.forward(b.model, b.inputs))  # same seeds, same loss
    loss.backward()
    assert all(p.grad is not None for p in a.model.parameters() if p.requires_grad)


def test_gpt2_bf16_runs_its_forward_under_autocast_and_compiles_natively():
    """The mixed-precision row: bf16 activations, f32 parameters; camlir's program (no
    interpreted graph: its bf16 moves once went through `__truncsfbf2`) within bf16's
    tolerance of eager's gradients, as bench.run checks them (workloads.TOLERANCE)."""
    pytest.importorskip("transformers")
    camlir.reset()
    w, reference = workloads.build("GPT2-bf16"), workloads.build("GPT2-bf16")
    reference.forward(reference.model, reference.inputs).backward()
    loss = w.forward(w.model, w.inputs)
    assert loss.dtype == torch.float32
    with camlir.enable(backend="cpu"):
        loss.backward()
    assert camlir.counters["fallbacks"] == 0 and camlir.counters["interpreted"] == 0
    rtol, atol, of_max = workloads.TOLERANCE["GPT2-bf16"]
    expected = dict(reference.model.named_parameters())
    for name, p in w.model.named_parameters():
        e = expected[name].grad
        torch.testing.assert_close(p.grad, e, rtol=rtol, atol=max(atol, of_max * e.abs().max().item()), msg=name)
