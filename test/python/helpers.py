"""Shared helpers for the gradient tests: run a step eagerly and through camlir, compare."""

import contextlib
import copy
import logging

import torch

import camlir


def grads_of(params):
    return [None if p.grad is None else p.grad.detach().clone() for p in params]


_BACKEND = ["eager"]


def use_backend(name: str) -> None:
    """The backend `eager_and_camlir` uses when the test does not name one."""
    _BACKEND[0] = name


def eager_and_camlir(make_model, make_inputs, loss_fn, steps=1, backend=None, **enable_kwargs):
    """Runs `steps` backward passes on two identical copies of a model: one with PyTorch's
    engine, one through camlir. Returns (eager grads, camlir grads) per step."""
    torch.manual_seed(0)
    model = make_model()
    twin = copy.deepcopy(model)
    eager, ours = [], []
    for step in range(steps):
        torch.manual_seed(100 + step)
        inputs = make_inputs()
        twin_inputs = [i.detach().clone().requires_grad_(i.requires_grad) if isinstance(i, torch.Tensor) else i
                       for i in inputs]
        for m in (model, twin):
            m.zero_grad(set_to_none=True)
        torch.manual_seed(7)
        loss_fn(model, *inputs).backward()
        eager.append(grads_of(list(model.parameters()) + [i for i in inputs if isinstance(i, torch.Tensor) and i.requires_grad]))
        torch.manual_seed(7)
        # wait=True: every backward runs camlir's program, also where the compile service is
        # on (outside pytest, whose conftest compiles in-process)
        with camlir.enable(backend=backend or _BACKEND[0], **dict({"wait": True}, **enable_kwargs)):
            loss_fn(twin, *twin_inputs).backward()
        ours.append(grads_of(list(twin.parameters()) + [i for i in twin_inputs if isinstance(i, torch.Tensor) and i.requires_grad]))
    return eager, ours


def assert_grads_equal(eager, ours, **tol):
    assert len(eager) == len(ours)
    for step_e, step_o in zip(eager, ours):
        assert len(step_e) == len(step_o)
        for e, o in zip(step_e, step_o):
            if e is None:
                assert o is None
            else:
                assert o is not None, "camlir produced no gradient where eager did"
                torch.testing.assert_close(o, e, **tol)


@contextlib.contextmanager
def camlir_logs(kinds):
    """Switches the given CAMLIR_LOGS kinds on and collects what the `camlir` logger says."""
    messages = []

    class Collect(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    handler = Collect(logging.INFO)
    logger = logging.getLogger("camlir")
    logger.addHandler(handler)
    camlir.set_logs(kinds)
    try:
        yield messages
    finally:
        camlir.set_logs("")
        logger.removeHandler(handler)
