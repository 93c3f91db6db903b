"""Differential testing of camlir against two more of PyTorch's own test databases: every
nn.Module of `common_modules.module_db` (ModuleInfo) and every custom `autograd.Function`
of `autograd_function_db`.

    python test/python/moduleinfo_diff.py                         # both databases
    python test/python/moduleinfo_diff.py --keys nn.Linear,nn.LSTM --samples 2
    python test/python/moduleinfo_diff.py --json out.json --backends cpu
    python test/python/moduleinfo_diff.py --repro nn.GRU:train:1  # one sample, in process, verbose

Modules (key `nn.Name`): for each ModuleInfo with float32 on the CPU, the first `--samples`
ModuleInputs of `module_inputs_func(..., requires_grad=True, training=...)` are run in
train mode, and in eval mode too when the ModuleInfo says the two differ
(`train_and_eval_differ`: batch and instance norm, dropout inside transformers and RNNs).
Every run builds the module from the same seed (`torch.manual_seed` before the constructor
and before the forward, so lazy modules' initialization and dropout masks are the same in
every run), takes fresh clones of the forward inputs, reduces every differentiable float
output to `sum((out * w).sum())` with fixed random weights `w`, and runs the backward:
twice with PyTorch's engine (eager must be reproducible), then under
`camlir.enable(backend=B)` for each backend of `--backends` (default `cpu,eager`: the JIT
and camlir's reference interpreter). Compared with `assert_close(rtol=1e-4, atol=1e-5)`:
the gradient of every parameter, of every input leaf, and the module's floating buffers
after the run (batch norm's running statistics).

autograd.Functions (key `autograd_function.Name`): the OpInfos of `autograd_function_db`,
the same comparison as test/python/opinfo_diff.py (its sample handling is reused).

Each sample gets one route per backend, worst first:
- WRONG: a gradient or buffer differs from eager (`tolerance_only` when it passes at 10x the
  tolerance), or one side has a gradient where the other has none;
- HANG: a sample ran past `--timeout` seconds (the worker is killed and replaced);
- CRASH: the backward raised through camlir, or the worker process died;
- fallback: camlir gave the graph back to PyTorch (`counters["fallbacks"]`, or no capture);
- eager-route: camlir sent the backward to PyTorch's eager engine (`counters["eager_runs"]`,
  `camlir.explain(kind="choice")`);
- interpreted: the cpu backend could not compile the graph and ran the reference interpreter;
- host-op: compiled, some aten ops run through torch from the host function;
- native: compiled, every aten op inside native kernels (on backend "eager", every sample
  that matches is "interpreted-ok": the interpreter has no native kernels).
A sample is `invalid` (not counted) when eager itself fails, computes no gradient, or is not
reproducible.

Modules run in worker subprocesses (opinfo_diff's workers: one key at a time, restarted
after a crash or a hang).
"""

import argparse
import copy
import datetime
import json
import logging
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import opinfo_diff  # noqa: E402
from opinfo_diff import RTOL, ATOL, SEED  # noqa: E402

ROUTES = ("native", "host-op", "interpreted", "interpreted-ok", "eager-route", "fallback", "CRASH", "HANG", "WRONG")
SEVERITY = {r: i for i, r in enumerate(ROUTES)}
FUNCTION_PREFIX = "autograd_function."
BACKENDS = ("cpu", "eager")


# --------------------------------------------------------------------------- the databases

def load_module_db() -> list:
    opinfo_diff._install_expecttest_stub()
    from torch.testing._internal.common_modules import module_db
    return module_db


def load_function_db() -> list:
    """`autograd_function_db` (OpInfos of custom autograd.Functions); empty when this torch
    does not ship it."""
    opinfo_diff._install_expecttest_stub()
    try:
        from torch.testing._internal.autograd_function_db import autograd_function_db
    except ImportError:
        return []
    return list(autograd_function_db)


def module_eligible(info) -> bool:
    import torch
    return torch.float32 in info.supported_dtypes("cpu")


def all_keys(which=("modules", "functions")) -> list:
    keys = []
    if "modules" in which:
        keys += [info.name for info in load_module_db() if module_eligible(info)]
    if "functions" in which:
        keys += [FUNCTION_PREFIX + opinfo_diff.op_key(op) for op in load_function_db() if opinfo_diff.eligible(op)]
    return keys


def _lookup():
    table = {info.name: ("module", info) for info in load_module_db()}
    table.update({FUNCTION_PREFIX + opinfo_diff.op_key(op): ("function", op) for op in load_function_db()})
    return table


# --------------------------------------------------------------------------- one module sample

def _modes(info) -> list:
    return ["train", "eval"] if info.train_and_eval_differ else ["train"]


def module_samples(info, mode: str, n: int) -> list:
    """The first `n` ModuleInputs of `info` for `mode`, as (index, ModuleInput)."""
    import torch
    torch.manual_seed(SEED)
    inputs = info.module_inputs_func(info, device="cpu", dtype=torch.float32, requires_grad=True,
                                     training=(mode == "train"))
    return list(enumerate(inputs))[:n]


def describe_module_input(minput) -> str:
    c, f = minput.constructor_input, minput.forward_input
    ctor = ", ".join([_short(a) for a in c.args] + [f"{k}={_short(v)}" for k, v in c.kwargs.items()])
    fwd = "" if f is None else ", ".join([_short(a) for a in f.args] + [f"{k}={_short(v)}" for k, v in f.kwargs.items()])
    text = f"({ctor}) on ({fwd})"
    return (f"{minput.desc}: " if minput.desc else "") + text


def _short(v) -> str:
    import torch
    from torch.utils import _pytree as pytree
    if isinstance(v, torch.Tensor):
        shape = "x".join(str(d) for d in v.shape) or "scalar"
        dtype = "" if v.dtype == torch.float32 else " " + str(v.dtype).removeprefix("torch.")
        return f"T[{shape}{dtype}{' grad' if v.requires_grad else ''}]"
    if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in pytree.tree_leaves(v)):
        return "(" + ", ".join(_short(x) for x in v) + ")"
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _fresh_inputs(forward_input):
    """(args, kwargs, leaves): the forward inputs with every tensor detached and cloned
    (aliases stay aliases), those that required grad as fresh leaves."""
    from torch.utils import _pytree as pytree
    if forward_input is None:
        return (), {}, []
    flat, spec = pytree.tree_flatten((forward_input.args, forward_input.kwargs))
    out, leaves = opinfo_diff.fresh_leaves(flat)
    args, kwargs = pytree.tree_unflatten(out, spec)
    return args, kwargs, leaves


def build_module(info, minput, mode: str):
    """The module of `minput`, built from the seed: every call gives the same parameters."""
    import torch
    c = minput.constructor_input
    args, kwargs = copy.deepcopy(c.args), copy.deepcopy(c.kwargs)
    torch.manual_seed(SEED)
    m = info.module_cls(*args, **kwargs)
    m.to(torch.float32)
    m.train(mode == "train")
    return m


def module_grads(info, minput, mode: str, weights=None, backend=None):
    """Builds the module, runs forward and backward; returns ((names, values), weights):
    the gradient of every parameter and input leaf and each floating buffer afterwards, or
    (None, None) when no output is differentiable. With `backend`, the backward runs
    through camlir."""
    import torch
    m = build_module(info, minput, mode)
    args, kwargs, leaves = _fresh_inputs(minput.forward_input)
    torch.manual_seed(SEED)
    out = m(*args, **kwargs)
    outs = opinfo_diff._differentiable(out)
    if not outs:
        return (None, None), None
    weights = opinfo_diff.weighted_backward(outs, weights, backend)
    names, values = [], []
    for name, p in m.named_parameters():  # lazy modules have parameters only after the forward
        names.append(f"param {name}")
        values.append(None if p.grad is None else p.grad.detach().clone())
    for i, leaf in enumerate(leaves):
        names.append(f"input {i}")
        values.append(None if leaf.grad is None else leaf.grad.detach().clone())
    for name, b in m.named_buffers():
        if b.is_floating_point():
            names.append(f"buffer {name}")
            values.append(b.detach().clone())
    return (names, values), weights


def function_grads(op, sample, weights=None, backend=None):
    """The same for an OpInfo sample of autograd_function_db (opinfo_diff's fresh leaves,
    outputs and weights). The autograd.Function is called directly: this database's
    `gradcheck_wrapper`s are output selectors (`lambda y, ind: y`), not input wrappers."""
    import torch
    inp, args, kwargs, leaves = opinfo_diff._fresh(sample)
    torch.manual_seed(SEED)
    outs = opinfo_diff._differentiable(sample.output_process_fn_grad(op.op(inp, *args, **kwargs)))
    if not outs:
        return (None, None), None
    weights = opinfo_diff.weighted_backward(outs, weights, backend)
    grads = [None if t.grad is None else t.grad.detach().clone() for t in leaves]
    return ([f"input {i}" for i in range(len(grads))], grads), weights


def compare_named(names, expected, actual, rtol=RTOL, atol=ATOL):
    """None when every value matches within tolerance, else the first difference, by name."""
    if len(expected) != len(actual):
        return f"{len(expected)} values in eager, {len(actual)} through camlir"
    for name, e, a in zip(names, expected, actual):
        why = opinfo_diff._compare([e], [a], rtol, atol)
        if why is not None:
            return f"{name}: " + why.removeprefix("leaf 0").lstrip(": ").lstrip()
    return None


# --------------------------------------------------------------------------- judging one sample

def judge(grads, backends=BACKENDS) -> dict:
    """`grads(weights, backend)` -> ((names, values), weights) runs the sample once (backend
    None: PyTorch's engine). Eager runs twice; each backend of `backends` once, with its
    route. Returns {"routes": {backend: route}, ...} or {"route": "invalid", "reason": ...}."""
    try:
        (names, expected), weights = grads(None, None)
    except Exception as exc:  # noqa: BLE001
        return {"route": "invalid", "reason": f"eager fails: {type(exc).__name__}: {opinfo_diff._first_line(exc)}"}
    if expected is None:
        return {"route": "invalid", "reason": "no differentiable output"}
    if not any(e is not None for n, e in zip(names, expected) if not n.startswith("buffer ")):
        return {"route": "invalid", "reason": "eager computes no gradient"}
    try:
        (_, again), _ = grads(weights, None)
    except Exception as exc:  # noqa: BLE001
        return {"route": "invalid", "reason": f"eager fails on a second run: {type(exc).__name__}"}
    if compare_named(names, expected, again) is not None:
        return {"route": "invalid", "reason": "eager is not reproducible: " + compare_named(names, expected, again)}
    result = {"values": len(names)}
    for backend in backends:
        result[backend] = _through_camlir(grads, weights, names, expected, backend)
    result["route"] = result[backends[0]]["route"]
    if result[backends[0]].get("reason"):
        result["reason"] = result[backends[0]]["reason"]
    return result


def _through_camlir(grads, weights, names, expected, backend) -> dict:
    import camlir
    from camlir import counters
    camlir.reset()
    handler = opinfo_diff._Warnings()
    log = logging.getLogger("camlir")
    log.addHandler(handler)
    start = time.perf_counter()
    try:
        (_, actual), _ = grads(weights, backend)
        error = None
    except Exception as exc:  # noqa: BLE001
        actual, error = None, exc
    finally:
        log.removeHandler(handler)
    out = {"seconds": round(time.perf_counter() - start, 3)}
    for name in ("captures", "fallbacks", "interpreted", "eager_runs"):
        out[name] = counters[name]
    warnings = handler.messages
    if warnings:
        out["warnings"] = [w[:500] for w in warnings]
    choices = [str(e) for e in camlir.explain(kind="choice")]
    host = opinfo_diff._host_ops(camlir.compiled_programs()) if backend == "cpu" else []
    if host:
        out["host_ops"] = host
    camlir.reset()

    if error is not None:
        return {**out, "route": "CRASH", "reason": f"{type(error).__name__}: {opinfo_diff._first_line(error)}",
                "traceback": traceback.format_exception(error)[-6:]}
    mismatch = compare_named(names, expected, actual)
    if mismatch is not None:
        out["max_abs_error"] = opinfo_diff._max_error(expected, actual)
        out["tolerance_only"] = compare_named(names, expected, actual, 10 * RTOL, 10 * ATOL) is None
        return {**out, "route": "WRONG", "reason": mismatch}
    if out["fallbacks"]:
        return {**out, "route": "fallback", "reason": opinfo_diff._reason(warnings, "falling back to PyTorch")}
    if out["eager_runs"]:
        return {**out, "route": "eager-route", "reason": "; ".join(choices) or opinfo_diff._reason(warnings, "")}
    if out["captures"] == 0:
        return {**out, "route": "fallback", "reason": "camlir captured no graph (PyTorch's engine ran it)"}
    if out["interpreted"]:
        return {**out, "route": "interpreted", "reason": opinfo_diff._reason(warnings, "cannot compile")}
    if backend == "eager":
        return {**out, "route": "interpreted-ok"}
    if host:
        return {**out, "route": "host-op", "reason": ", ".join(host)}
    return {**out, "route": "native"}


# --------------------------------------------------------------------------- one key

def run_key(kind, entry, key, samples, backends=BACKENDS, on_sample=None) -> dict:
    """Every picked sample of one module or autograd.Function; the key's route is its worst
    sample's (first backend)."""
    import camlir
    start = time.perf_counter()
    out = {"op": key, "samples": []}
    picked = []
    try:
        if kind == "module":
            for mode in _modes(entry):
                for index, minput in module_samples(entry, mode, samples):
                    picked.append((f"{mode}:{index}", describe_module_input(minput),
                                   lambda w, b, mi=minput, md=mode: module_grads(entry, mi, md, w, b)))
        else:
            chosen, _ = opinfo_diff._samples(entry, samples)
            for index, sample in chosen:
                picked.append((str(index), opinfo_diff._describe(sample),
                               lambda w, b, s=sample: function_grads(entry, s, w, b)))
    except Exception as exc:  # noqa: BLE001
        out.update(route="invalid", reason=f"sample inputs fail: {type(exc).__name__}: {opinfo_diff._first_line(exc)}",
                   seconds=round(time.perf_counter() - start, 3))
        return out
    for index, text, grads in picked:
        if on_sample:
            on_sample(index, text)
        r = judge(grads, backends)
        out["samples"].append({"index": index, "sample": text, **r})
    camlir.reset()
    _roll_up(out)
    out["seconds"] = round(time.perf_counter() - start, 3)
    return out


def _roll_up(out):
    tested = [s for s in out["samples"] if s["route"] != "invalid"]
    if tested:
        worst = max(tested, key=lambda s: SEVERITY[s["route"]])
        out["route"] = worst["route"]
        if worst.get("reason"):
            out["reason"] = worst["reason"]
    else:
        out["route"] = "invalid"
        reasons = [s["reason"] for s in out["samples"] if s.get("reason")]
        out["reason"] = reasons[0] if reasons else "no sample inputs"


# --------------------------------------------------------------------------- workers

def _worker(backends, samples) -> int:
    """opinfo_diff's worker protocol: keys on stdin, progress and one result line each on
    the original stdout."""
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    import torch
    torch.set_num_threads(1)
    import camlir  # noqa: F401
    table = _lookup()
    proto.write("ready\n")
    proto.flush()
    for line in sys.stdin:
        key = line.strip()
        if not key:
            continue
        if key not in table:
            result = {"op": key, "route": "invalid", "reason": "in neither database", "samples": []}
        else:
            def on_sample(index, text):
                proto.write(json.dumps({"progress": index, "sample": text}) + "\n")
                proto.flush()
            kind, entry = table[key]
            try:
                result = run_key(kind, entry, key, samples, backends, on_sample)
            except Exception as exc:  # noqa: BLE001 - the harness's own failure
                result = {"op": key, "route": "invalid", "samples": [],
                          "reason": f"harness error: {type(exc).__name__}: {opinfo_diff._first_line(exc)}"}
        proto.write(json.dumps(result) + "\n")
        proto.flush()
    return 0


def run_all(keys, backends=BACKENDS, samples=2, timeout=180, restart_every=30, progress=None, timeouts=None) -> list:
    """Runs `keys` in opinfo_diff's worker processes (running this file's worker); a sample
    past `timeout` seconds is a HANG, a dead worker a CRASH."""
    def relabel(n, total, r):
        _hang(r)
        if progress:
            progress(n, total, r)
    results = opinfo_diff.run_all(keys, ",".join(backends), samples, timeout, restart_every, relabel, timeouts,
                                  script=os.path.abspath(__file__))
    for r in results:
        _hang(r)
    return results


def _hang(r):
    if r["route"] == "CRASH" and r.get("reason", "").startswith("timed out"):
        r["route"] = "HANG"
        for s in r.get("samples", []):
            if s["route"] == "CRASH":
                s["route"] = "HANG"


# --------------------------------------------------------------------------- summaries

def summarize(results, backends=BACKENDS) -> dict:
    """Counts per route: samples per backend, and keys (modules / functions) by their worst
    sample on the first backend; native share = native samples / tested samples (cpu)."""
    per_backend = {b: {r: 0 for r in ROUTES} for b in backends}
    keys = {r: 0 for r in ROUTES}
    keys["invalid"] = 0
    invalid = 0
    for res in results:
        keys[res["route"]] += 1
        if res["route"] in ("CRASH", "HANG") and not res["samples"]:
            per_backend[backends[0]][res["route"]] += 1
        for s in res["samples"]:
            if s["route"] == "invalid":
                invalid += 1
            elif s["route"] in ("CRASH", "HANG") and backends[0] not in s:
                per_backend[backends[0]][s["route"]] += 1  # the worker died in this sample
            else:
                for b in backends:
                    if b in s:
                        per_backend[b][s[b]["route"]] += 1
    first = per_backend[backends[0]]
    tested = sum(first.values())
    return {
        "samples": per_backend, "keys": keys, "tested_samples": tested, "invalid_samples": invalid,
        "native_share": round(first["native"] / tested, 4) if tested else 0.0,
        "compiled_share": round((first["native"] + first["host-op"]) / tested, 4) if tested else 0.0,
    }


def _repro(spec: str, backends) -> int:
    """One key's sample(s) in this process with camlir's logs on. SPEC: KEY, KEY:INDEX
    (functions) or KEY:MODE:INDEX (modules)."""
    import torch
    torch.set_num_threads(1)
    import camlir
    camlir.set_logs("recompiles")
    key, _, which = spec.partition(":")
    kind, entry = _lookup()[key]
    result = run_key(kind, entry, key, 50, backends, on_sample=lambda i, t: print(f"--- {key} {i}: {t}", flush=True))
    for s in result["samples"]:
        if not which or s["index"] == which:
            print(json.dumps(s, indent=1))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", help="comma-separated keys (nn.Name, autograd_function.Name); default: all")
    p.add_argument("--only", choices=("modules", "functions"), help="one database only")
    p.add_argument("--backends", default="cpu,eager", help="camlir backends, the first decides the route")
    p.add_argument("--samples", type=int, default=2, help="samples per module and mode (default 2)")
    p.add_argument("--timeout", type=int, default=180, help="seconds per sample before it counts as a HANG")
    p.add_argument("--restart-every", type=int, default=30, help="keys per worker process")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--repro", metavar="KEY[:MODE:INDEX]", help="run one key in this process, verbosely")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--backend", help=argparse.SUPPRESS)  # the worker's (opinfo_diff's protocol)
    args = p.parse_args(argv)
    backends = tuple((args.backend or args.backends).split(","))
    if args.worker:
        return _worker(backends, args.samples)
    if args.repro:
        return _repro(args.repro, backends)
    keys = args.keys.split(",") if args.keys else all_keys((args.only,) if args.only else ("modules", "functions"))
    started = time.time()
    commit = opinfo_diff._git_commit()

    def progress(n, total, r):
        extra = r.get("reason", "") if r["route"] != "native" else ""
        print(f"[{n + 1}/{total}] {r['op']}: {r['route']} ({r.get('seconds', 0):.1f} s) {extra[:150]}", flush=True)

    results = run_all(keys, backends, args.samples, args.timeout, args.restart_every, progress)
    summary = summarize(results, backends)
    import torch
    report = {
        "command": "python test/python/moduleinfo_diff.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit, "commit_end": opinfo_diff._git_commit(), "torch": torch.__version__,
        "backends": list(backends), "samples_per_mode": args.samples, "rtol": RTOL, "atol": ATOL,
        "wall_seconds": round(time.time() - started, 1), "summary": summary, "results": results,
    }
    opinfo_diff.write_report(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
