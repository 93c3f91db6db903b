"""The invariant that keeps side effects from being lost: every accumulation into `.grad`
and every hook of a captured backward is in the program that runs, exactly once.

Compilers delete what looks dead. An accumulation or a hook has no result anything reads
(its effect is on `.grad` or in Python), so one pass that takes it for pure drops a
gradient without any error: torch-mlir's importer did exactly that for every backward
holding an `as_strided`. So the effects are counted where the backward is captured and
checked after every stage that could lose one; a mismatch is an `UnsupportedError` naming
what was lost (a fallback with its reason, or the error under `fullgraph=True`), never a
silently wrong gradient.

    expected = effects.in_captured_graph(gm)        # Counter({"accumulate_grad": 2, ...})
    effects.check(expected, effects.in_module(module), "graph 3, stage 'import'")
"""

from collections import Counter

from torch_mlir import ir

from camlir.dialects.ca.ir_helpers import ops_named, require_func
from camlir.errors import UnsupportedError

ACCUMULATE = "accumulate_grad"


def in_captured_graph(gm, host_calls: int = 0, none_accumulations: int = 0) -> Counter:
    """Accumulations and hooks (by kind) in the graph compiled autograd handed over, plus
    the `host_calls` custom Function backwards the re-trace left as host calls (each one
    `ca.hook` of kind `custom_backward`: it runs Python, so it must stay exactly once), less
    the `none_accumulations` that receive None from one (the engine adds nothing there)."""
    import torch  # here: a compile worker checks modules (`in_module`, `check`) without torch
    from torch._dynamo.external_utils import call_accumulate_grad, call_hook

    found = Counter()
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        if n.target is call_accumulate_grad:
            found[ACCUMULATE] += 1
        elif n.target is call_hook:
            found[n.kwargs.get("hook_type", "?")] += 1
        elif n.target is torch._C._dynamo.compiled_autograd.call_cpp_tensor_pre_hooks:
            found["cpp_tensor_pre_hook"] += 1
    if host_calls:
        found["custom_backward"] = host_calls
    found[ACCUMULATE] -= none_accumulations
    return +found


def in_module(module: ir.Module, func_name: str = "backward", python_hooks_only: bool = False) -> Counter:
    """`ca.accumulate_grad` ops and `ca.hook` ops (by kind) in `@func_name`, nested ones
    included; with `python_hooks_only`, hooks with a traced `body` are left out (they are
    inlined by ca-inline-hooks and run as kernel code)."""
    fn = require_func(module, func_name)
    found = Counter()
    for op in ops_named(fn, "ca.accumulate_grad", "ca.hook"):
        if op.name == "ca.accumulate_grad":
            found[ACCUMULATE] += 1
        elif not (python_hooks_only and "body" in op.attributes):
            found[ir.StringAttr(op.attributes["kind"]).value] += 1
    return found


def check(expected: Counter, found: Counter, where: str) -> None:
    """Raises UnsupportedError when `found` differs from `expected`, naming each difference."""
    if found == expected:
        return
    problems = []
    for kind in sorted(set(expected) | set(found)):
        want, got = expected[kind], found[kind]
        if want != got:
            what = "accumulations into .grad" if kind == ACCUMULATE else f"{kind} hooks"
            problems.append(f"{what}: {want} captured, {got} in the program")
    raise UnsupportedError(f"{where}: side effects lost or duplicated ({'; '.join(problems)}); "
                           f"refusing to run a program that would silently change gradients")
