"""Errors camlir raises to users."""


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
