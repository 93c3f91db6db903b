"""Differential testing of camlir against PyTorch's own op database (OpInfo).

    python test/python/opinfo_diff.py                       # every eligible op, cpu backend
    python test/python/opinfo_diff.py --ops exp,mm --samples 3 --backend eager
    python test/python/opinfo_diff.py --limit 50 --json out.json
    python test/python/opinfo_diff.py --repro nn.functional.gelu:1   # one sample, in process, verbose

For each OpInfo of `torch.testing._internal.common_methods_invocations.op_db` that supports
autograd in float32 on the CPU, the first few usable sample inputs
(`op.sample_inputs("cpu", torch.float32, requires_grad=True)`) are run twice from fresh
leaf clones: once with PyTorch's engine, once with `camlir.enable(backend=...)`. The loss is
`sum((out * w).sum())` over the differentiable outputs (complex ones through
`view_as_real`), with fixed random weights `w`; the `.grad` of every leaf is compared with
`torch.testing.assert_close(rtol=1e-4, atol=1e-5)`.

Each (op, sample) gets one route, worst first:
- WRONG: a gradient differs from eager (`tolerance_only` when it passes at 10x the
  tolerance), or one side has a gradient where the other has none;
- CRASH: the backward raised through camlir (not a documented fallback), the worker process
  died (a segfault, an abort from compiled code) or the sample ran past the timeout;
- fallback: camlir gave the graph back to PyTorch (`counters["fallbacks"]`; the reason is
  the warning on the `camlir` logger);
- interpreted: the cpu backend could not compile the graph and ran it on the reference
  interpreter (`counters["interpreted"]`; the reason is the warning);
- host-op: compiled, but some aten ops stayed in the host function, run through torch
  (found in each cpu program's `lowered_text`: aten ops in `@backward`, `ca.host_ops`);
- native: compiled, every aten op inside native kernels.
Samples are skipped (not counted) when no tensor requires grad, no output is
differentiable, the forward or the eager backward fails, or eager is not reproducible.

Ops run in worker subprocesses (one op at a time, restarted after a crash and every
`--restart-every` ops) so a crash in compiled code cannot stop the run.
"""

import argparse
import datetime
import json
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import types
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

RTOL, ATOL = 1e-4, 1e-5
SEED = 1234
ROUTES = ("native", "host-op", "fallback", "interpreted", "WRONG", "CRASH")
SEVERITY = {r: i for i, r in enumerate(("native", "host-op", "interpreted", "fallback", "CRASH", "WRONG"))}


# --------------------------------------------------------------------------- op_db

def _install_expecttest_stub() -> None:
    """`common_utils` imports `expecttest` (a test-only package not in the project's pinned
    dependencies) for `assertExpectedInline`, which nothing here uses."""
    try:
        import expecttest  # noqa: F401
    except ImportError:
        stub = types.ModuleType("expecttest")
        stub.TestCase = unittest.TestCase
        stub.ACCEPT = False
        sys.modules["expecttest"] = stub


def load_op_db() -> list:
    _install_expecttest_stub()
    from torch.testing._internal.common_methods_invocations import op_db
    return op_db


def op_key(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def eligible(op) -> bool:
    import torch
    return bool(op.supports_autograd) and torch.float32 in op.supported_dtypes("cpu") \
        and torch.float32 in op.supported_backward_dtypes("cpu")


def eligible_ops() -> list:
    """The keys (`name` or `name.variant`) of every OpInfo with float32 autograd on the CPU."""
    return [op_key(op) for op in load_op_db() if eligible(op)]


# --------------------------------------------------------------------------- one op, in process

def _tree(sample):
    from torch.utils import _pytree as pytree
    return pytree.tree_flatten((sample.input, sample.args, sample.kwargs))


def fresh_leaves(flat) -> tuple:
    """(values, leaves): every tensor of the flat list `flat` detached and cloned (aliases
    stay aliases), those that required grad as fresh leaves (moduleinfo_diff.py uses it too)."""
    import torch
    memo, leaves, out = {}, [], []
    for v in flat:
        if isinstance(v, torch.Tensor):
            if id(v) not in memo:
                c = v.detach().clone()
                if v.requires_grad:
                    c.requires_grad_(True)
                    leaves.append(c)
                memo[id(v)] = c
            v = memo[id(v)]
        out.append(v)
    return out, leaves


def _fresh(sample):
    """(input, args, kwargs, leaves): every tensor of `sample` detached and cloned (aliases
    stay aliases), those that required grad as fresh leaves."""
    from torch.utils import _pytree as pytree
    flat, spec = _tree(sample)
    out, leaves = fresh_leaves(flat)
    inp, args, kwargs = pytree.tree_unflatten(out, spec)
    return inp, args, kwargs, leaves


def _differentiable(output) -> list:
    import torch
    from torch.utils import _pytree as pytree
    outs = []
    for v in pytree.tree_leaves(output):
        if isinstance(v, torch.Tensor) and v.requires_grad and (v.is_floating_point() or v.is_complex()):
            outs.append(torch.view_as_real(v.resolve_conj()) if v.is_complex() else v)
    return outs


def _weights(outs) -> list:
    import torch
    g = torch.Generator().manual_seed(SEED)
    return [torch.randn(o.shape, generator=g, dtype=o.dtype) for o in outs]



def weighted_backward(outs, weights=None, backend=None):
    """Backpropagates `sum((o * w).sum())` over `outs` (fixed random `weights`, made from
    the outputs when None) eagerly, or through camlir with `backend`; returns the weights,
    so that a second run uses the same ones."""
    import camlir

    if weights is None:
        weights = _weights(outs)
    loss = sum((o * w).sum() for o, w in zip(outs, weights))
    if backend is None:
        loss.backward()
    else:
        with camlir.enable(backend=backend, wait=True):
            loss.backward()
    return weights


def _forward(op, sample, inp, args, kwargs):
    import torch
    torch.manual_seed(SEED)  # random ops (dropout, rrelu, ...) draw the same numbers each run
    return sample.output_process_fn_grad(op.gradcheck_wrapper(op.get_op(), inp, *args, **kwargs))


def _grads(op, sample, weights=None, backend=None):
    """Runs forward and backward on fresh leaves; returns (grads, weights). With `backend`,
    the backward runs through camlir."""
    inp, args, kwargs, leaves = _fresh(sample)
    outs = _differentiable(_forward(op, sample, inp, args, kwargs))
    if not outs:
        return None, None
    weights = weighted_backward(outs, weights, backend)
    return [None if t.grad is None else t.grad.detach().clone() for t in leaves], weights


def _compare(expected, actual, rtol=RTOL, atol=ATOL):
    """None when equal within tolerance, else a one-line reason."""
    import torch
    if len(expected) != len(actual):
        return f"{len(expected)} gradients in eager, {len(actual)} through camlir"
    for i, (e, a) in enumerate(zip(expected, actual)):
        if e is None and a is None:
            continue
        if e is None or a is None:
            return f"leaf {i}: gradient is {'None' if a is None else 'set'} through camlir, " \
                   f"{'None' if e is None else 'set'} in eager"
        try:
            torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True)
        except AssertionError as exc:
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
            return f"leaf {i} {tuple(e.shape)}: " + "; ".join(lines[:4])
    return None


def _max_error(expected, actual):
    import torch
    worst = 0.0
    for e, a in zip(expected, actual):
        if e is not None and a is not None and e.shape == a.shape:
            d = (a.double() - e.double()).abs()
            d = d[~(torch.isnan(a) & torch.isnan(e))] if d.numel() else d
            if d.numel():
                worst = max(worst, float(d.max()))
    return worst


def _host_ops(programs) -> list:
    """Aten ops the compiled cpu programs run through torch: aten ops left in the host
    function `@backward` of each program's module after the linalg stage."""
    import re
    found = set()
    for _id, backend, program in programs:
        text = getattr(program, "lowered_text", "")
        if not text:
            continue
        m = re.search(r"ca\.host_ops = \[([^\]]*)\]", text)
        if m:
            found.update(re.findall(r'"([^"]+)"', m.group(1)))
        host = _function_text(text, "backward")
        found.update(n.removesuffix(".default") for n in re.findall(r"\btorch\.(aten\.[\w.]+)", host))
    return sorted(found)


def _function_text(module_text: str, name: str) -> str:
    lines, out, inside = module_text.splitlines(), [], False
    for line in lines:
        if line.startswith("  func.func"):
            inside = f"@{name}(" in line
        if inside:
            out.append(line)
    return "\n".join(out)


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _describe(sample) -> str:
    import torch
    from torch.utils import _pytree as pytree

    def one(v):
        if isinstance(v, torch.Tensor):
            s = "x".join(str(d) for d in v.shape) or "scalar"
            layout = "" if v.layout == torch.strided else f" {str(v.layout).removeprefix('torch.')}"
            contiguous = v.layout != torch.strided or v.is_contiguous()
            flags = layout + ("" if contiguous else " noncontig") + (" grad" if v.requires_grad else "")
            return f"T[{s}{'' if v.dtype == torch.float32 else ' ' + str(v.dtype).removeprefix('torch.')}{flags}]"
        text = repr(v)
        return text if len(text) <= 40 else text[:37] + "..."

    parts = [one(v) for v in pytree.tree_leaves(sample.input)]
    parts += [one(v) for v in pytree.tree_leaves(list(sample.args))]
    parts += [f"{k}={one(v)}" if not isinstance(v, (list, tuple)) else f"{k}=({', '.join(one(x) for x in v)})"
              for k, v in sample.kwargs.items()]
    return ", ".join(parts)


def _samples(op, n):
    """The first `n` usable samples of `op` as (index, sample), plus why others were skipped."""
    import torch
    torch.manual_seed(SEED)
    picked, skipped = [], []
    for index, sample in enumerate(op.sample_inputs("cpu", torch.float32, requires_grad=True)):
        flat, _ = _tree(sample)
        if not any(isinstance(v, torch.Tensor) and v.requires_grad for v in flat):
            skipped.append("no tensor requires grad")
            continue
        picked.append((index, sample))
        if len(picked) >= n or index >= 50:
            break
    return picked, skipped


def _no_machine_paths(text: str) -> str:
    """A traceback line with this checkout's and the interpreter's directories left out:
    the report is committed (docs/opinfo-run.json), machine paths are not."""
    import sysconfig

    for root, name in ((sysconfig.get_paths()["purelib"], "<site-packages>"),
                       (os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "<repo>")):
        text = text.replace(root, name)
    return text


def run_sample(op, sample, backend: str) -> dict:
    """One (op, sample): eager twice (to check it is reproducible), then through camlir."""
    import camlir
    from camlir import counters
    result = {"sample": _describe(sample)}
    try:
        expected, weights = _grads(op, sample)
    except Exception as exc:  # noqa: BLE001
        return {**result, "route": "skipped", "reason": f"eager fails: {type(exc).__name__}: {_first_line(exc)}"}
    if expected is None:
        return {**result, "route": "skipped", "reason": "no differentiable output"}
    if all(g is None for g in expected):
        return {**result, "route": "skipped", "reason": "eager computes no gradient"}
    again, _ = _grads(op, sample, weights)
    if _compare(expected, again) is not None:
        return {**result, "route": "skipped", "reason": "eager is not reproducible"}

    camlir.reset()
    handler = _Warnings()
    log = logging.getLogger("camlir")
    log.addHandler(handler)
    start = time.perf_counter()
    try:
        actual, _ = _grads(op, sample, weights, backend=backend)
        error = None
    except Exception as exc:  # noqa: BLE001
        actual, error = None, exc
    finally:
        log.removeHandler(handler)
    result["seconds"] = round(time.perf_counter() - start, 3)
    for name in ("captures", "fallbacks", "interpreted"):
        result[name] = counters[name]
    warnings = handler.messages
    if warnings:
        result["warnings"] = [w[:500] for w in warnings]
    host = _host_ops(camlir.compiled_programs()) if backend == "cpu" else []
    if host:
        result["host_ops"] = host
    camlir.reset()

    if error is not None:
        return {**result, "route": "CRASH", "reason": f"{type(error).__name__}: {_first_line(error)}",
                "traceback": [_no_machine_paths(line) for line in traceback.format_exception(error)[-6:]]}
    mismatch = _compare(expected, actual)
    if mismatch is not None:
        result["max_abs_error"] = _max_error(expected, actual)
        result["tolerance_only"] = _compare(expected, actual, rtol=10 * RTOL, atol=10 * ATOL) is None
        return {**result, "route": "WRONG", "reason": mismatch}
    if result["captures"] == 0:
        return {**result, "route": "fallback", "reason": "camlir captured no graph (PyTorch's engine ran it)"}
    if result["fallbacks"]:
        return {**result, "route": "fallback", "reason": _reason(warnings, "falling back to PyTorch")}
    if result["interpreted"]:
        return {**result, "route": "interpreted", "reason": _reason(warnings, "cannot compile")}
    if host:
        return {**result, "route": "host-op", "reason": ", ".join(host)}
    return {**result, "route": "native"}


def _reason(warnings, marker) -> str:
    """The warning the `camlir` logger gave for a fallback or an interpreted graph."""
    for w in warnings:
        if marker in w:
            return w.split(": ", 1)[1] if w.startswith("camlir: ") else w
    return warnings[0] if warnings else "(no warning logged)"


def _first_line(exc) -> str:
    text = str(exc).strip()
    return (text.splitlines() or [""])[0][:400]


def run_op(op, backend: str, samples: int, on_sample=None) -> dict:
    """Every picked sample of `op`; the op's route is its worst sample's (and its reason)."""
    import camlir
    start = time.perf_counter()
    out = {"op": op_key(op), "samples": []}
    try:
        picked, skipped = _samples(op, samples)
    except Exception as exc:  # noqa: BLE001
        picked, skipped = [], [f"sample_inputs fails: {type(exc).__name__}: {_first_line(exc)}"]
    for index, sample in picked:
        if on_sample:
            on_sample(index, sample)
        r = run_sample(op, sample, backend)
        r["index"] = index
        out["samples"].append(r)
    camlir.reset()
    tested = [s for s in out["samples"] if s["route"] != "skipped"]
    if tested:
        worst = max(tested, key=lambda s: SEVERITY[s["route"]])
        out["route"] = worst["route"]
        if worst.get("reason"):
            out["reason"] = worst["reason"]
    else:
        out["route"] = "skipped"
        reasons = [s["reason"] for s in out["samples"]] + skipped
        out["reason"] = reasons[0] if reasons else "no sample inputs"
    out["seconds"] = round(time.perf_counter() - start, 3)
    return out


# --------------------------------------------------------------------------- workers

def _worker(backend: str, samples: int) -> int:
    """Reads op keys on stdin, one a line; answers each with one JSON line on the original
    stdout (everything the ops print goes to stderr)."""
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    import torch
    torch.set_num_threads(1)
    import camlir  # noqa: F401
    ops = {op_key(op): op for op in load_op_db()}
    proto.write("ready\n")
    proto.flush()
    for line in sys.stdin:
        key = line.strip()
        if not key:
            continue
        if key not in ops:
            result = {"op": key, "route": "skipped", "reason": "not in op_db", "samples": []}
        else:
            def on_sample(index, sample):
                proto.write(json.dumps({"progress": index, "sample": _describe(sample)}) + "\n")
                proto.flush()
            try:
                result = run_op(ops[key], backend, samples, on_sample)
            except Exception as exc:  # noqa: BLE001 - the harness's own failure, not camlir's
                result = {"op": key, "route": "skipped", "samples": [],
                          "reason": f"harness error: {type(exc).__name__}: {_first_line(exc)}"}
        proto.write(json.dumps(result) + "\n")
        proto.flush()
    return 0


class _Worker:
    """A worker process: `script --worker --backend B --samples N` (this file by default;
    another harness with the same worker protocol may pass its own `script`)."""

    def __init__(self, backend, samples, script=None):
        self.log = tempfile.NamedTemporaryFile("w+b", prefix="opinfo-worker-", suffix=".log", delete=False)
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        # Every program is compiled in the run: one loaded from the disk cache has no
        # `lowered_text`, so its host ops could not be seen (it would count as native).
        env.setdefault("CAMLIR_DISK_CACHE", "0")
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(script or __file__), "--worker",
                                      "--backend", backend, "--samples", str(samples)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env,
                                     cwd=REPO, start_new_session=True)
        self.buffer = b""
        self.done = 0
        if self.readline(300) != "ready":
            raise RuntimeError(f"opinfo worker did not start:\n{self.stderr_tail()}")

    def readline(self, timeout):
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
                if not chunk:
                    return None  # the worker died
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()

    def ask(self, key, timeout):
        """The op's result; None when the worker died or a sample ran past `timeout`
        seconds (`self.current` then says which sample it was running)."""
        self.proc.stdin.write((key + "\n").encode())
        self.proc.stdin.flush()
        self.done += 1
        self.current = None
        while True:
            line = self.readline(timeout)  # the clock restarts with every sample
            if not line:
                return None
            message = json.loads(line)
            if "progress" not in message:
                return message
            self.current = message

    def stderr_tail(self, n=15) -> str:
        self.log.flush()
        with open(self.log.name, "rb") as f:
            lines = f.read().decode(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def stop(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(5)
            except Exception:  # noqa: BLE001
                pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)


def run_all(keys, backend="cpu", samples=2, timeout=120, restart_every=40, progress=None, timeouts=None,
            script=None) -> list:
    """Runs `keys` in worker processes (of `script`, by default this file); returns one result
    per key, in order. A worker that dies or a sample that runs past `timeout` seconds
    (`timeouts`: per-key overrides) is recorded as a CRASH of the op it was running, and the
    worker is replaced."""
    results, worker = [], None
    try:
        for n, key in enumerate(keys):
            if worker is None:
                worker = _Worker(backend, samples, script)
            t0 = time.perf_counter()
            limit = (timeouts or {}).get(key, timeout)
            result = worker.ask(key, limit)
            if result is None:
                try:
                    code = worker.proc.wait(2)  # reaped, when it died rather than timed out
                except subprocess.TimeoutExpired:
                    code = None
                if code is None:
                    why = f"timed out after {limit} s"
                elif code < 0:
                    why = f"worker died with signal {signal.Signals(-code).name}"
                else:
                    why = f"worker exited with status {code}"
                tail = worker.stderr_tail()
                worker_current = worker.current
                worker.stop()
                worker = None
                result = {"op": key, "route": "CRASH", "reason": why, "stderr_tail": tail[-3000:],
                          "seconds": round(time.perf_counter() - t0, 3), "samples": []}
                if worker_current:
                    result["samples"] = [{"index": worker_current["progress"], "sample": worker_current["sample"],
                                          "route": "CRASH", "reason": why}]
            elif worker.done >= restart_every:
                worker.stop()
                worker = None
            results.append(result)
            if progress:
                progress(n, len(keys), result)
    finally:
        if worker is not None:
            worker.stop()
    return results


# --------------------------------------------------------------------------- summaries

def summarize(results) -> dict:
    """Counts per route for samples and for ops, and the native share (native samples over
    tested samples; an op's route is its worst sample's)."""
    samples = {r: 0 for r in ROUTES}
    ops = {r: 0 for r in ROUTES}
    ops["skipped"] = 0
    skipped_samples = 0
    for res in results:
        ops[res["route"]] += 1
        if res["route"] == "CRASH" and not res["samples"]:
            samples["CRASH"] += 1  # the worker died outside a sample: one crashed sample
        for s in res["samples"]:
            if s["route"] == "skipped":
                skipped_samples += 1
            else:
                samples[s["route"]] += 1
    tested = sum(samples.values())
    tested_ops = sum(v for k, v in ops.items() if k != "skipped")
    return {
        "samples": samples, "ops": ops, "tested_samples": tested, "skipped_samples": skipped_samples,
        "tested_ops": tested_ops,
        "native_share": round(samples["native"] / tested, 4) if tested else 0.0,
        "compiled_share": round((samples["native"] + samples["host-op"]) / tested, 4) if tested else 0.0,
        "native_share_ops": round(ops["native"] / tested_ops, 4) if tested_ops else 0.0,
    }


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "python", "passes",
                                "dialects"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        return out.stdout.strip() + (" (core files modified in the work tree)" if dirty else "")
    except OSError:
        return "unknown"


def _repro(spec: str, backend: str) -> int:
    """Runs one sample in this process with camlir's verbose logs."""
    key, _, index = spec.partition(":")
    import torch
    torch.set_num_threads(1)
    import camlir
    camlir.set_logs("recompiles")
    ops = {op_key(op): op for op in load_op_db()}
    op = ops[key]
    picked, _ = _samples(op, 50)
    for i, sample in picked:
        if index and int(index) != i:
            continue
        print(f"--- {key} sample {i}: {_describe(sample)}")
        print(sample)
        print(json.dumps(run_sample(op, sample, backend), indent=1))
        if not index:
            break
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", help="comma-separated op keys (name or name.variant); default: every eligible op")
    p.add_argument("--limit", type=int, help="only the first N ops")
    p.add_argument("--backend", default="cpu", choices=("cpu", "eager"))
    p.add_argument("--samples", type=int, default=2, help="samples per op (default 2)")
    p.add_argument("--timeout", type=int, default=120, help="seconds per sample before it counts as a CRASH")
    p.add_argument("--restart-every", type=int, default=40, help="ops per worker process")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--repro", metavar="OP[:INDEX]", help="run one op's sample in this process, verbosely")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return _worker(args.backend, args.samples)
    if args.repro:
        return _repro(args.repro, args.backend)
    keys = args.ops.split(",") if args.ops else eligible_ops()
    if args.limit:
        keys = keys[:args.limit]
    started = time.time()
    commit = _git_commit()  # other work may land during a long run: the end's is kept too

    def progress(n, total, r):
        extra = r.get("reason", "") if r["route"] not in ("native",) else ""
        print(f"[{n + 1}/{total}] {r['op']}: {r['route']} ({r.get('seconds', 0):.1f} s) {extra[:150]}", flush=True)

    results = run_all(keys, args.backend, args.samples, args.timeout, args.restart_every, progress)
    summary = summarize(results)
    import torch
    report = {
        "command": "python test/python/opinfo_diff.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit, "commit_end": _git_commit(), "torch": torch.__version__, "backend": args.backend,
        "samples_per_op": args.samples, "rtol": RTOL, "atol": ATOL,
        "wall_seconds": round(time.time() - started, 1), "summary": summary, "results": results,
    }
    write_report(report, args.json)
    return 0


def write_report(report: dict, path) -> None:
    """Prints a run's wall time and summary; writes the whole report as JSON to `path`, if given
    (moduleinfo_diff.py writes its reports the same way)."""
    print(json.dumps({k: report[k] for k in ("wall_seconds", "summary")}, indent=1))
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
