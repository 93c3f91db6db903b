"""camlir's passes over the `ca` dialect (mapped into the package as `camlir.passes`).

Its names load on first use (PEP 562), so that importing one pass module
(`camlir.passes.specialize_layouts`) does not import the pipeline parser and, through the
registry, every pass (registry.py says what that cost)."""

import importlib

_EXPORTS = {
    "CAPass": "base", "PassFailure": "base",
    "PipelineError": "pipeline", "build_pass_manager": "pipeline", "parse_pipeline": "pipeline",
    "run_pipeline": "pipeline",
    "PASSES": "registry", "lookup": "registry", "names": "registry",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    if name != "PASSES":  # a tuple of every class, built when asked for: not kept
        globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
