"""The disk cache: a second process compiles nothing, and no entry is ever trusted blindly.

In-process tests stand for "another process" with `camlir.reset()` (which forgets every
compiled program and PyTorch's compiled-autograd cache) between runs; two tests use real
second processes.
"""

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import camlir
from camlir import disk_cache



@pytest.fixture
def disk(tmp_path, monkeypatch):
    """The disk cache switched on, in a directory of this test's own."""
    monkeypatch.setenv("CAMLIR_DISK_CACHE", "1")
    monkeypatch.setenv("CAMLIR_CACHE_DIR", str(tmp_path / "cache"))
    camlir.reset()
    yield tmp_path / "cache"
    disk_cache.flush()
    camlir.reset()


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                               torch.nn.Linear(16, 3))


def _step(model, n, **enable):
    """One backward through camlir at batch `n`, checked against eager."""
    torch.manual_seed(n)
    x = torch.randn(n, 12)
    target = torch.arange(n) % 3
    model.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), target).backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    with camlir.enable(**enable):
        torch.nn.functional.cross_entropy(model(x), target).backward()
    for p, e in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, e)


def _run(model, sizes=(8, 16, 8, 20)):
    for n in sizes:
        _step(model, n)
    disk_cache.flush()
    return dict(camlir.counters)


def _entries(directory):
    return sorted(os.listdir(directory / "entries")) if (directory / "entries").exists() else []


def test_second_run_loads_everything_from_disk(disk):
    model = _mlp()
    first = _run(model)
    assert first["compiles"] == 2 and first["disk_cache_hits"] == 0
    # the static capture, the symbolic capture's module, its dynamic-size program
    assert len(_entries(disk)) == 3
    camlir.reset()
    second = _run(model)
    assert second["compiles"] == 0, camlir.explain_text()
    assert second["disk_cache_hits"] == 3
    assert second["cache_hits"] == 4  # nothing compiled for any call
    kinds = [e.kind for e in camlir.explain()]
    assert kinds.count("disk_hit") == 3 and "compile" not in kinds


def test_specialised_size_sets_are_entries_too(disk):
    model = _mlp()
    for n in (8, 16, 24):
        _step(model, n, dynamic=False)
    disk_cache.flush()
    assert camlir.counters["compiles"] == 3
    camlir.reset()
    for n in (8, 16, 24, 32):
        _step(model, n, dynamic=False)
    assert camlir.counters["compiles"] == 1  # only 32 is new
    assert camlir.counters["disk_cache_hits"] == 4  # static, the symbolic module, 16, 24


def test_corrupt_entry_is_logged_removed_and_recompiled(disk, caplog):
    model = _mlp()
    _run(model, sizes=(8,))
    [key] = _entries(disk)
    library = disk / "entries" / key / "kernels.so"
    blob = bytearray(library.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    library.write_bytes(bytes(blob))
    camlir.reset()
    with caplog.at_level(logging.WARNING, logger="camlir"):
        counts = _run(model, sizes=(8,))
    assert counts["compiles"] == 1 and counts["disk_cache_hits"] == 0
    assert key[:12] in caplog.text and "sha256" in caplog.text
    camlir.reset()
    assert _run(model, sizes=(8,))["disk_cache_hits"] == 1  # stored again, fine again


def test_truncated_and_garbage_entries_never_crash(disk, caplog):
    model = _mlp()
    _run(model, sizes=(8,))
    [key] = _entries(disk)
    entry = disk / "entries" / key
    for name in ("host.mlir", "manifest.json"):
        camlir.reset()
        path = entry / name
        if path.exists():
            path.write_bytes(path.read_bytes()[:20])
        with caplog.at_level(logging.WARNING, logger="camlir"):
            assert _run(model, sizes=(8,))["compiles"] == 1
        [key] = _entries(disk)
        entry = disk / "entries" / key


def test_a_stored_entry_that_does_not_load_is_a_miss(disk, caplog, monkeypatch):
    """An entry that verifies but cannot be rebuilt (here: the host IR no longer parses,
    as after a change of the ca dialect under the same key) is a logged miss."""
    model = _mlp()
    _run(model, sizes=(8,))
    camlir.reset()
    monkeypatch.setattr(disk_cache, "guards_from_meta", lambda meta: (_ for _ in ()).throw(KeyError("guards")))
    with caplog.at_level(logging.WARNING, logger="camlir"):
        counts = _run(model, sizes=(8,))
    assert counts["compiles"] == 1 and "could not be used" in caplog.text


def test_key_covers_the_environment(disk, monkeypatch):
    model = _mlp()
    _run(model, sizes=(8,))
    camlir.reset()
    monkeypatch.setattr(disk_cache, "_environment", ["another camlir, torch or CPU"])
    assert _run(model, sizes=(8,))["compiles"] == 1


class _Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x * scale

    @staticmethod
    def backward(ctx, g):
        return g * ctx.scale, None


def _function_step(fn, scale):
    x = torch.linspace(-1, 1, 7, requires_grad=True)
    with camlir.enable():
        fn.apply(x, scale).sin().sum().backward()
    expected = (torch.linspace(-1, 1, 7) * scale).cos() * scale
    torch.testing.assert_close(x.grad, expected)


def test_ctx_values_are_checked_when_loading(disk):
    _function_step(_Double, 2.0)
    disk_cache.flush()
    camlir.reset()
    _function_step(_Double, 2.0)
    assert camlir.counters["disk_cache_hits"] == 1 and camlir.counters["compiles"] == 0
    camlir.reset()
    _function_step(_Double, 3.0)  # the stored program baked ctx.scale == 2.0
    assert camlir.counters["compiles"] == 1


def test_inlined_hooks_are_not_stored(disk):
    model = _mlp()
    for p in model.parameters():
        p.register_hook(lambda g: g * 0.5)
    x = torch.randn(4, 12)
    with camlir.enable():
        model(x).sum().backward()
    disk_cache.flush()
    assert _entries(disk) == []
    assert camlir.counters["compiles"] == 1


def test_clear_disk_cache(disk):
    _run(_mlp(), sizes=(8,))
    assert len(_entries(disk)) == 1
    assert camlir.clear_disk_cache() == 1
    assert _entries(disk) == []


_SCRIPT = textwrap.dedent("""
    import json, sys, torch, camlir

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * SCALE_IN_CODE

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    for n in (5, 9, 5, 13):
        x = torch.randn(n, 6)
        for use in (False, True):
            model.zero_grad(set_to_none=True)
            loss = F.apply(model(x)).pow(2).sum()
            if use:
                with camlir.enable():
                    loss.backward()
                for p, e in zip(model.parameters(), expected):
                    torch.testing.assert_close(p.grad, e)
            else:
                loss.backward()
                expected = [p.grad.clone() for p in model.parameters()]
    print(json.dumps(dict(camlir.counters)))
""")


def _env(tmp_path):
    return dict(os.environ, CAMLIR_DISK_CACHE="1", CAMLIR_CACHE_DIR=str(tmp_path / "cache"))


def _process(tmp_path, scale):
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT.replace("SCALE_IN_CODE", repr(scale)))
    done = subprocess.run([sys.executable, str(script)], env=_env(tmp_path), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_two_processes_and_an_edited_custom_function(tmp_path):
    first = _process(tmp_path, 3.0)
    assert first["compiles"] == 2 and first["disk_cache_hits"] == 0
    second = _process(tmp_path, 3.0)
    assert second["compiles"] == 0 and second["disk_cache_hits"] == 3, second
    # The same script with the custom Function's backward edited: its code is in the key,
    # so nothing stale is loaded (the gradients are checked inside).
    edited = _process(tmp_path, 5.0)
    assert edited["compiles"] == 2 and edited["disk_cache_hits"] == 0, edited


def test_processes_sharing_the_directory_at_once(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT.replace("SCALE_IN_CODE", "4.0"))
    procs = [subprocess.Popen([sys.executable, str(script)], env=_env(tmp_path), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    errors = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        errors.append(err[-1500:])
    again = _process(tmp_path, 4.0)
    entries = sorted(os.listdir(tmp_path / "cache")) if (tmp_path / "cache").exists() else []
    assert again["compiles"] == 0, (again, entries, errors)


def test_the_vector_width_is_part_of_the_key(tmp_path, monkeypatch):
    # A program stored with 8-lane loops is not loaded where 16 lanes are asked for.
    from camlir.backends.cpu import jit

    if "avx512f" not in jit._cpu_flags():
        pytest.skip("no AVX-512 on this CPU")
    monkeypatch.setenv("CAMLIR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CAMLIR_DISK_CACHE", "1")
    w = torch.randn(4, 3, requires_grad=True)
    for width, hits in (("8", 0), ("8", 1), ("16", 0), ("16", 1)):
        monkeypatch.setenv("CAMLIR_VECTOR_WIDTH", width)
        camlir.reset()
        w.grad = None
        camlir.compile_backward((w.sin() * 2).sum())
        torch.testing.assert_close(w.grad, w.detach().cos() * 2)
        disk_cache.flush()  # the store runs on a background thread
        assert camlir.counters["disk_cache_hits"] == hits, (width, dict(camlir.counters))
    camlir.reset()


def test_debugging_switches_work_on_a_disk_hit(tmp_path):
    # issue 31, point 1: on a second process CAMLIR_LOGS=graph printed no module and
    # CAMLIR_DUMP_DIR wrote nothing when the program came from the disk cache.
    script = textwrap.dedent("""
        import torch, camlir
        torch.manual_seed(0)
        w = torch.randn(4, 3, requires_grad=True)
        camlir.compile_backward((w.sin() * 2).sum())
        camlir.disk_cache.flush()
        print("disk hits", camlir.counters["disk_cache_hits"])
    """)
    env = dict(os.environ, CAMLIR_DISK_CACHE="1", CAMLIR_CACHE_DIR=str(tmp_path / "cache"), CAMLIR_LOGS="graph")
    runs = []
    for i in range(2):
        env["CAMLIR_DUMP_DIR"] = str(tmp_path / f"dump{i}")
        runs.append(subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                                   check=True))
    first, second = runs
    assert "disk hits 0" in first.stdout and "disk hits 1" in second.stdout, second.stdout + second.stderr
    assert "captured backward graph 1" in second.stderr and "ca.node" in second.stderr
    dumped = sorted(p.name for p in (tmp_path / "dump1" / "graph1").iterdir())
    assert dumped == ["00-import.mlir", "01-from-disk-cache.txt"], dumped
    assert "CAMLIR_DISK_CACHE=0" in (tmp_path / "dump1" / "graph1" / "01-from-disk-cache.txt").read_text()
