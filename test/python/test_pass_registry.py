"""The pass registry is a table of names that imports a pass's module when it is looked up."""

import subprocess
import sys

import pytest

from camlir import passes
from camlir.passes import registry


def test_every_entry_names_its_class():
    for name, module, cls in registry._TABLE:
        found = registry.lookup(name)
        assert found.__name__ == cls and found.__module__ == f"camlir.passes.{module}"
        assert found.argument == name, f"{cls}.argument is {found.argument!r}, the table says {name!r}"
    assert len(set(registry.names())) == len(registry._TABLE)


def test_passes_tuple_and_package_names():
    assert [p.argument for p in passes.PASSES] == list(registry.names())
    assert passes.lookup("ca-flatten-nodes") is registry.lookup("ca-flatten-nodes")
    assert passes.lookup("canonicalize") is None
    assert callable(passes.parse_pipeline) and issubclass(passes.PassFailure, Exception)
    with pytest.raises(AttributeError):
        passes.no_such_name  # noqa: B018


def test_a_pipeline_imports_only_its_passes():
    code = ("import sys; from camlir.passes import build_pass_manager, parse_pipeline; "
            "from camlir.context import make_context; "
            "build_pass_manager(parse_pipeline('builtin.module(ca-flatten-nodes,canonicalize)'), make_context()); "
            "print(sorted(m for m in sys.modules if m.startswith('camlir.passes.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = eval(out.stdout.strip())  # noqa: S307 - our own list literal
    assert "camlir.passes.flatten_nodes" in loaded
    assert "camlir.passes.fuse_elementwise" not in loaded and "camlir.passes.matmul_to_blas" not in loaded
