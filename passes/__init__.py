"""camlir's passes over the `ca` dialect (mapped into the package as `camlir.passes`)."""

from .base import CAPass, PassFailure  # noqa: F401
from .pipeline import PipelineError, build_pass_manager, parse_pipeline, run_pipeline  # noqa: F401
from .registry import PASSES, lookup, names  # noqa: F401
