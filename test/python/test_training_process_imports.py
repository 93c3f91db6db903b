"""What the training process imports when graphs compile in workers: the pass registry (the
stages it runs itself, specialize and layouts, look their passes up there) without MLIR's
linalg bindings, which cost 20 MB and ~80 ms to import (passes/lazy_dialects.py)."""

import subprocess
import sys
import textwrap


def test_pass_registry_does_not_import_linalg():
    code = textwrap.dedent("""
        import sys
        import passes, camlir.pipeline
        from passes import registry
        assert registry.lookup("ca-fuse-elementwise") is not None
        print("torch_mlir.dialects.linalg" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", "importing the pass registry loaded torch_mlir.dialects.linalg"


def test_a_pass_that_builds_linalg_ops_still_runs():
    code = textwrap.dedent("""
        from camlir.context import make_context
        from torch_mlir import ir
        import passes
        text = '''
        func.func @f(%a: memref<4x4xf32, strided<[1, 4]>>, %b: memref<4x4xf32>) {
          memref.copy %a, %b : memref<4x4xf32, strided<[1, 4]>> to memref<4x4xf32>
          return
        }'''
        with make_context():
            module = ir.Module.parse(text)
            passes.run_pipeline(module, "ca-copies-to-linalg")
            assert "linalg.copy" in str(module), str(module)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
