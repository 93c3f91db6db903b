"""Errors camlir raises to users."""

import re

# What PyTorch appends to an error raised while an FX graph runs (torch/fx/interpreter.py):
# the FX node ("While executing %call_backward ..."), compiled autograd's own frame, and a
# hint at tlparse. camlir re-traces compiled autograd's graph through FX, so the node and
# frame are camlir's machinery, not the user's code (the message already names the autograd
# node), and camlir writes no tlparse artifacts, so the hint led nowhere.
_FX_APPENDIX = re.compile(r"\s*While executing %.*?Use tlparse to see full graph\.\s*(\(https?://[^)]*\))?",
                          re.DOTALL)
_TLPARSE_HINT = re.compile(r"\s*Use tlparse to see full graph\.\s*(\(https?://[^)]*\))?")


def without_pytorch_hints(text: str) -> str:
    """`text` (an error message) without what PyTorch appends that does not apply to camlir
    ("While executing %node ... Use tlparse to see full graph. (https://...)")."""
    return _TLPARSE_HINT.sub("", _FX_APPENDIX.sub("", text))


class ProgramRefused(RuntimeError):
    """A compiled program refused a call before it had any effect (no hook ran, nothing was
    accumulated): another program of the same graph may answer it (the driver then
    specializes the sizes of a program with runtime sizes). Not raised to users."""


class UnsupportedError(RuntimeError):
    """Raised under `fullgraph=True` when part of a backward would not be compiled.

    The message names the autograd node or op that could not be handled. Without
    `fullgraph`, the same situation falls back to PyTorch (logged, counted in
    `camlir.counters["fallbacks"]`) and gradients stay correct.

        try:
            camlir.compile_backward(loss, fullgraph=True)
        except camlir.UnsupportedError as error:
            print(error)                # names the node, op or hook
    """

    def __init__(self, *args):
        super().__init__(*(without_pytorch_hints(a) if isinstance(a, str) else a for a in args))
