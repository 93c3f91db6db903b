"""Standalone repros of captured backwards: `camlir.save_repro(dir)` and `CAMLIR_REPRO_DIR`.

A repro is a folder that replays one captured backward without the model that made it:

    repro.py      the script: `python dir/repro.py` parses the module, rebuilds the call's
                  arguments, runs them through the cpu backend and through the reference
                  interpreter (the "eager" backend: every op run by torch, the ground truth
                  for the captured graph; both built by `pipeline.compile`), compares results and
                  `.grad`s with `torch.testing.assert_close`, prints one line, and exits 0
                  (equal), 1 (different) or 2 (one side failed to build or run)
    module.mlir   the captured `ca` module (`artifact.module`)
    inputs.pt     the call's arguments (`torch.save`): tensors detached and cloned to the
                  cpu; parameters with their `.grad` as it was before the backward, so that
                  each run accumulates into fresh leaf copies
    meta.json     graph id, why the repro was written, sizes, hooks, versions

What is kept: the arguments the autograd engine passed on the graph's first call (inputs,
then the lifted sizes of a symbolic capture). Keeping them costs a copy of every tensor a
backward reads (parameters and saved activations), so it happens only when asked for:
`camlir.repro.keep_inputs = True`, or the environment variable `CAMLIR_REPRO=1` (or
`CAMLIR_REPRO_DIR`) set when camlir is imported.

This module hangs off the driver: it listens to the driver's "first_call", "interpreted",
"fallback" and "forget" news (`events.listen`) once imported (`camlir.repro`,
`camlir.save_repro`, or at `import camlir.api` when a CAMLIR_REPRO variable is set), and
the driver never imports it. A failing graph needs nothing kept: with
`CAMLIR_REPRO_DIR=dir`, a graph whose compile fails (runs interpreted) or that falls back
to PyTorch is written at once, from the live arguments, to `dir/graph<N>/` (one per graph).

What cannot be replayed: Python hooks (`ca.hook` ops) are arbitrary code. `save_repro`
refuses a graph with any (`ReproError` naming them) unless `hooks="identity"`, which
replaces each by a hook that returns None ("unchanged") and says so loudly in the script's
output; the automatic repro on failure uses "identity" (a failing compile is worth a repro
even with its hooks neutralized). C++ hooks (`cpp_tensor_pre_hook`) and saved-tensor unpack
hooks (activation checkpointing: their packed data is whatever the forward stored) are always
refused, and so are host calls (`custom_backward`: the node's `ctx` is a live object of the
backward that made it). Strided inputs are saved as clones: an expanded (stride-0) input comes back dense.
"""

import json
import os
import shutil

import torch

from . import __version__, environment, events, logs, pipeline
from .capture.retrace import plain_sizes
from .context import make_context
from .stages import Dump

ALWAYS_REFUSED = ("cpp_tensor_pre_hook", "unpack_hook", "custom_backward")


def _env_keep() -> bool:
    return bool(environment.flag("CAMLIR_REPRO") or environment.text("CAMLIR_REPRO_DIR"))


keep_inputs = _env_keep()  # keep each graph's first-call arguments for save_repro (a copy of them)

_kept = {}        # capture id -> _Call, newest last; cleared by camlir.reset()
_written = set()  # capture ids written under CAMLIR_REPRO_DIR in this process


class ReproError(RuntimeError):
    """A repro cannot be written: nothing kept for the graph, or it calls Python/C++ hooks."""


class _Call:
    """One call of a captured graph, as a repro needs it (CPU clones, module text)."""

    def __init__(self, capture_id, module_text, args, n_inputs, sizes, symbolic, hooks, reason=""):
        self.capture_id = capture_id
        self.module_text = module_text
        self.entries = [_entry(a) for a in args]
        self.n_inputs = n_inputs
        self.sizes = [int(s) for s in sizes]
        self.symbolic = symbolic
        self.hook_names = [_hook_name(h) for h in hooks]
        self.reason = reason


def _entry(value) -> dict:
    if not isinstance(value, torch.Tensor):
        return {"kind": "value", "value": value, "grad": None}
    kind = ("param" if isinstance(value, torch.nn.Parameter)
            else "leaf" if value.requires_grad and value.is_leaf else "tensor")
    grad = value.grad if kind != "tensor" else None
    return {"kind": kind, "value": value.detach().to("cpu", copy=True),
            "grad": None if grad is None else grad.detach().to("cpu", copy=True)}


def _hook_name(hook) -> str:
    return getattr(hook, "__qualname__", None) or type(hook).__name__


def forget() -> None:
    """Drops every kept call (part of `camlir.reset()`)."""
    _kept.clear()
    _written.clear()


def remember(capture_id: int, module, args, n_inputs: int, sizes, symbolic: bool, hooks) -> None:
    """Keeps graph `capture_id`'s first call when `keep_inputs` is on (the driver's
    "first_call" news, before its first program runs)."""
    if not keep_inputs or capture_id in _kept:
        return
    _kept[capture_id] = _Call(capture_id, str(module), list(args), n_inputs, sizes, symbolic, hooks)


def save_repro(directory: str, graph=None, hooks: str = "refuse") -> str:
    """Writes a standalone repro of captured backward `graph` (a capture id; default the most
    recent one kept) into `directory`: `repro.py`, `module.mlir`, `inputs.pt`, `meta.json`.
    `python directory/repro.py` replays it through the cpu backend and the reference
    interpreter and compares them. Needs the graph's first-call arguments, kept only while
    `camlir.repro.keep_inputs` is True (`CAMLIR_REPRO=1`). A graph with Python hooks is
    refused (`ReproError`) unless `hooks="identity"` (each replaced by a no-op hook, with a
    warning). Returns the path of `repro.py`.

        camlir.repro.keep_inputs = True
        camlir.compile_backward(model(x).sum())
        camlir.save_repro("repro_dir")          # then: python repro_dir/repro.py
    """
    if hooks not in ("refuse", "identity"):
        raise ValueError(f"hooks must be 'refuse' or 'identity', not {hooks!r}")
    if not _kept:
        raise ReproError("no captured backward was kept for a repro: set camlir.repro.keep_inputs = True "
                         "(or CAMLIR_REPRO=1) before the backward you want to replay")
    capture_id = max(_kept) if graph is None else graph
    if capture_id not in _kept:
        raise ReproError(f"graph {capture_id} was not kept for a repro (kept: {sorted(_kept)}); "
                         f"camlir.repro.keep_inputs must be True during its first backward")
    return _write(directory, _kept[capture_id], hooks)


def _write(directory: str, call: _Call, hooks: str) -> str:
    module = None
    if call.module_text:
        context = make_context()
        from torch_mlir import ir

        module = ir.Module.parse(call.module_text, context)
    hook_ops = _hook_ops(module) if module is not None else []
    refused = [h for h in hook_ops if h["kind"] in ALWAYS_REFUSED]
    if refused:
        raise ReproError(f"graph {call.capture_id} cannot be replayed without its model: it calls "
                         + ", ".join(f"hook {h['id']} ({h['kind']})" for h in refused))
    if hook_ops and hooks == "refuse":
        names = ", ".join(f"hook {h['id']} ({h['kind']}: {_name_of(call, h['id'])})" for h in hook_ops)
        raise ReproError(f"graph {call.capture_id} calls Python hooks, which a repro cannot save: {names}. "
                         f"save_repro(..., hooks='identity') replaces them by hooks that change nothing")
    os.makedirs(directory, exist_ok=True)
    for h in hook_ops:
        h["callable"] = _name_of(call, h["id"])
    meta = {
        "graph": call.capture_id, "reason": call.reason or "saved by camlir.save_repro",
        "symbolic": call.symbolic, "n_inputs": call.n_inputs, "sizes": call.sizes,
        "hooks": hook_ops, "hooks_replaced_by_identity": bool(hook_ops),
        "inputs": [_describe(e) for e in call.entries],
        "camlir": __version__, "torch": torch.__version__,
    }
    if module is not None:
        with open(os.path.join(directory, "module.mlir"), "w") as f:
            f.write(call.module_text)
        torch.save(call.entries, os.path.join(directory, "inputs.pt"))
    with open(os.path.join(directory, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1, default=repr)
    path = os.path.join(directory, "repro.py")
    with open(path, "w") as f:
        f.write(_SCRIPT.replace("GRAPH_ID", str(call.capture_id)))
    return path


def _name_of(call: _Call, hook_id: int) -> str:
    return call.hook_names[hook_id] if hook_id < len(call.hook_names) else "?"


def _hook_ops(module) -> list:
    from torch_mlir import ir

    from .dialects.ca.ir_helpers import ops_named

    return [{"id": ir.IntegerAttr(op.attributes["hook_id"]).value, "kind": ir.StringAttr(op.attributes["kind"]).value}
            for op in ops_named(module, "ca.hook")]


def _describe(entry) -> str:
    v = entry["value"]
    if not isinstance(v, torch.Tensor):
        return f"{entry['kind']} {v!r}"
    grad = "" if entry["kind"] == "tensor" else f" grad={'None' if entry['grad'] is None else 'kept'}"
    return f"{entry['kind']} {tuple(v.shape)} {v.dtype} stride={v.stride()}{grad}"


# --------------------------------------------------------------------------- on failure

def _failure_dir(capture_id: int):
    """`CAMLIR_REPRO_DIR/graph<N>` when the variable is set and graph N was not written yet."""
    root = environment.text("CAMLIR_REPRO_DIR")
    if not root or capture_id in _written:
        return None
    _written.add(capture_id)
    return os.path.join(root, f"graph{capture_id}")


def on_compile_failure(capture_id: int, reason: str, module, args, hooks, sizes=None) -> None:
    """Under `CAMLIR_REPRO_DIR`: writes graph `capture_id`'s repro when the cpu backend cannot
    compile `module` (the driver then interprets it). Never raises."""
    directory = _failure_dir(capture_id)
    if directory is None:
        return
    n_inputs = len(args) - (len(sizes) if sizes else 0)
    _write_failure(directory, lambda: _Call(capture_id, str(module), args, n_inputs, sizes or [],
                                            sizes is not None, hooks, reason))


def on_fallback(capture_id: int, reason: str, gm, inputs, sizes, scalars, hooks, packed_data, unpacked=None) -> None:
    """Under `CAMLIR_REPRO_DIR`: writes graph `capture_id`'s repro when it falls back to
    PyTorch. The `ca` module is rebuilt from the captured graph (re-trace and import); when
    that is what failed, the repro holds the captured graph's code and the error, and its
    script says it cannot replay. Never raises."""
    directory = _failure_dir(capture_id)
    if directory is None:
        return

    def call():
        plain = [int(s) for s in plain_sizes(sizes)]
        dump = Dump(f"graph {capture_id}, repro")
        try:
            retraced = pipeline.make_aten(gm, inputs, sizes, scalars, hooks, packed_data, dump, unpacked)
            module = pipeline.make_ca(retraced, dump)
        except Exception as exc:  # noqa: BLE001 - the failure this repro is about
            os.makedirs(directory, exist_ok=True)
            with open(os.path.join(directory, "captured_graph.py"), "w") as f:
                f.write(gm.code)
            return _Call(capture_id, "", [], len(inputs), plain, bool(plain), hooks,
                         f"{reason} (the ca module could not be rebuilt: {type(exc).__name__}: {exc})")
        args = list(inputs) + (plain if retraced.symbolic else [])
        return _Call(capture_id, str(module), args, len(inputs), plain if retraced.symbolic else [],
                     retraced.symbolic, hooks, reason)

    _write_failure(directory, call)


def _write_failure(directory: str, make_call) -> None:
    try:
        call = make_call()
        if os.path.isdir(directory):
            for name in ("module.mlir", "inputs.pt"):  # left by an earlier process
                if os.path.exists(os.path.join(directory, name)):
                    os.remove(os.path.join(directory, name))
        _write(directory, call, "identity")
        logs.log.warning("wrote a repro of graph %d to %s (run: python %s)", call.capture_id,
                         directory, os.path.join(directory, "repro.py"))
    except Exception as exc:  # noqa: BLE001 - a repro must never break the backward
        logs.log.warning("could not write a repro to %s: %s: %s", directory, type(exc).__name__, exc)
        if os.path.isdir(directory) and not os.listdir(directory):
            shutil.rmtree(directory, ignore_errors=True)


# --------------------------------------------------------------------------- the script

_SCRIPT = r'''"""A camlir repro of captured backward graph GRAPH_ID (written by camlir; see meta.json).

    python repro.py [--rtol R] [--atol A]

Replays the captured `ca` module with the call's saved arguments through camlir's cpu
backend and through its reference interpreter (every op run by torch), compares results
and accumulated `.grad`s with torch.testing.assert_close, and prints one line. Needs
camlir and torch, not the model. Exit status: 0 equal, 1 different, 2 could not run.
`CA_DUMP_DIR=d python repro.py` also writes every compile stage's IR to d.
"""

import argparse
import json
import os
import sys
import traceback

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def fresh_args(saved):
    """New copies of the saved arguments; parameters and leaves as new leaf tensors with
    requires_grad and their `.grad` as it was before the backward."""
    args, leaves = [], []
    for entry in saved:
        value = entry["value"]
        if entry["kind"] in ("param", "leaf"):
            t = value.clone()
            t = torch.nn.Parameter(t) if entry["kind"] == "param" else t.requires_grad_(True)
            t.grad = None if entry["grad"] is None else entry["grad"].clone()
            args.append(t)
            leaves.append(t)
        else:
            args.append(value.clone() if isinstance(value, torch.Tensor) else value)
    return args, leaves


def register_accumulate_grad():
    """camlir accumulates into `.grad` through PyTorch's compiled-autograd op
    `AccumulateGrad`, which PyTorch registers on its first capture: a fresh process runs one
    tiny backward under compiled autograd (identity compiler) to get it."""
    from torch._dynamo import compiled_autograd

    if hasattr(compiled_autograd.ops, "AccumulateGrad"):
        return
    p = torch.nn.Parameter(torch.ones(1))
    with compiled_autograd._enable(lambda gm: gm):
        (p * 2).sum().backward()


def replay(meta, text, saved, hooks, backend):
    """Builds the program for `backend` ("cpu" or "eager") and runs it once on fresh
    arguments; returns (results, the leaves' .grad)."""
    from torch_mlir import ir

    from camlir import pipeline
    from camlir import backend_registry as registry
    from camlir.context import make_context
    from camlir.stages import Dump
    from camlir.variant import STATIC, Variant

    module = ir.Module.parse(text, make_context())
    args, leaves = fresh_args(saved)
    variant = STATIC
    if meta["symbolic"] and backend != "eager":
        variant = Variant.specialized(meta["sizes"], pipeline.dynamic_shapes(module, args, meta["n_inputs"]))
    program, _ = pipeline.compile(registry.get(backend), module, args, hooks, Dump.for_graph(meta["graph"], "repro"),
                                  variant)
    with torch.no_grad():
        results = list(program(args, hooks))
    return results, [t.grad for t in leaves]


def max_diff(a, b):
    worst = 0.0
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape and x.numel():
            worst = max(worst, (x.double() - y.double()).abs().max().item())
    return worst


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rtol", type=float, default=None)
    parser.add_argument("--atol", type=float, default=None)
    opts = parser.parse_args(argv)
    if (opts.rtol is None) != (opts.atol is None):  # assert_close takes both or neither
        opts.rtol, opts.atol = opts.rtol or 0.0, opts.atol or 0.0
    with open(os.path.join(HERE, "meta.json")) as f:
        meta = json.load(f)
    graph = meta["graph"]
    print(f"camlir repro, graph {graph}: {meta['reason']}")
    if not os.path.exists(os.path.join(HERE, "module.mlir")):
        print(f"camlir repro, graph {graph}: CANNOT REPLAY: no ca module was built before the failure; "
              f"the captured graph's code is in captured_graph.py")
        return 2
    with open(os.path.join(HERE, "module.mlir")) as f:
        text = f.read()
    saved = torch.load(os.path.join(HERE, "inputs.pt"), weights_only=True)
    hooks = []
    if meta["hooks"]:
        print("*" * 78)
        print(f"WARNING: graph {graph}'s Python hooks could not be saved; each is replaced by a hook that "
              f"changes nothing:")
        for h in meta["hooks"]:
            print(f"  hook {h['id']} ({h['kind']}), was {h['callable']}")
        print("*" * 78)
        hooks = [lambda *a: None] * (1 + max(h["id"] for h in meta["hooks"]))
    register_accumulate_grad()
    runs = {}
    for backend in ("eager", "cpu"):
        try:
            runs[backend] = replay(meta, text, saved, hooks, backend)
        except Exception:  # noqa: BLE001 - the failure is the repro's finding
            traceback.print_exc()
            which = "reference interpreter" if backend == "eager" else "cpu backend"
            print(f"camlir repro, graph {graph}: FAILED: the {which} could not build or run the graph")
            return 2
    (ref_results, ref_grads), (cpu_results, cpu_grads) = runs["eager"], runs["cpu"]
    try:
        torch.testing.assert_close(cpu_results, ref_results, rtol=opts.rtol, atol=opts.atol)
        torch.testing.assert_close(cpu_grads, ref_grads, rtol=opts.rtol, atol=opts.atol)
    except AssertionError as exc:
        print(exc)
        print(f"camlir repro, graph {graph}: MISMATCH between the cpu backend and the reference interpreter")
        return 1
    worst = max(max_diff(cpu_results, ref_results), max_diff(cpu_grads, ref_grads))
    print(f"camlir repro, graph {graph}: the cpu backend matches the reference interpreter "
          f"({len(cpu_grads)} gradients, {len(cpu_results)} results; max abs difference {worst:.2e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


events.listen("first_call", remember)
events.listen("interpreted", on_compile_failure)
events.listen("fallback", on_fallback)
events.listen("forget", forget)
