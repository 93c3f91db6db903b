"""Runs compile work in a thread of its own, so that what it leaves in memory is not in the
malloc arena that the training loop's tensors come from.

glibc's malloc gives each thread an arena; `loss.backward()` and the forward allocate their
tensors from the calling thread's. A compile allocates and frees a few hundred MB of MLIR
and LLVM objects, and what stays behind is scattered through that arena: the eager engine's
later backwards then ran slower in the process, and so did camlir's own programs. Measured
with the bench (`python -m bench.run --workloads MobileNetV3,W2 --threads 1 --variants
eager,eager_after_camlir --seconds 10 --untimed 1`, 1 thread, interleaved processes), the
eager engine in a process where camlir had compiled the workload, against a fresh process:

| compile work | MobileNetV3 | W2 |
|---|---|---|
| all in the calling thread | 1.04-1.10x | 1.05x |
| cpu stages from layouts on in a thread of their own (this) | 0.99x, 0.99x | 1.01x, 1.02x |
| only LLVM and the stages just before it in a thread | 1.07x | - |

And main-arena fragmentation alone reproduces the cost: 225 MB of scattered live buffers
allocated by the main thread made MobileNetV3's eager backward 1.11-1.14x; the same buffers
allocated by another thread, 1.01x.

What needs the caller's thread stays there: PyTorch's capture and camlir's re-trace (they
run under the backward's thread-local state: grad mode, autocast, modes) and the tracing of
Python hooks (user code). A thread that has exited leaves its arena free for the next one,
so later compiles reuse it.
"""

import contextvars
import threading


def run_apart(fn, *args, **kwargs):
    """`fn(*args, **kwargs)` in a new thread (with this thread's context variables) while
    this one waits; returns its result or raises its exception here."""
    context = contextvars.copy_context()
    outcome = {}

    def target():
        try:
            outcome["value"] = context.run(fn, *args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="camlir-compile", daemon=True)
    thread.start()
    thread.join()  # interruptible: Ctrl-C still reaches the caller
    if "error" in outcome:
        raise outcome.pop("error")
    return outcome["value"]
