"""`linalg`: MLIR's linalg dialect bindings, imported when a pass first uses them.

`torch_mlir.dialects.linalg` builds its named ops from a YAML description when imported:
20 MB of the training process's memory and ~80 ms (measured: RSS and wall time around the
import, after torch and MLIR's core). The passes that build linalg ops run in the compile
worker; the training process imports the pass registry only for the stages it runs itself
(ca-specialize-shapes, ca-specialize-layouts), so it should not pay for linalg.
"""

import importlib


class _Lazy:
    """A module proxy: the first attribute read imports the module."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr):
        return getattr(importlib.import_module(self._name), attr)


linalg = _Lazy("torch_mlir.dialects.linalg")
