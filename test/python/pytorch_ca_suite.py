"""PyTorch's own compiled-autograd tests, run with camlir as the compiler (a long run, not CI).

    .venv/bin/python test/python/pytorch_ca_suite.py PATH/test/inductor/test_compiled_autograd.py
    PYTORCH_CA_TEST_FILE=PATH .venv/bin/python test/python/pytorch_ca_suite.py --backend eager

PyTorch's file is not part of this repository: get it from a PyTorch checkout (any version
near the installed torch) and pass its path. It needs `expecttest` importable
(`pip install --target DIR expecttest`, then `--extra-path DIR`). Its wrapped suites
(`test/test_autograd.py` etc., loaded relative to the file) run too when they are there;
when they are not, the statements that load them are skipped and reported. The file wraps
them in compiled autograd only on a CUDA+Triton machine; the runner wraps them on every
machine. The tests the file itself lists as failing under compiled autograd (replaced by
`unittest.expectedFailure`) or leaves unwrapped are SKIP, with the reason, and not run.

How camlir is put in place of Inductor: every `torch._dynamo.compiled_autograd._enable(fn)`
the tests open (directly, through `check_output_and_recompiles`, or through
`config.compiled_autograd=True` + `torch.compile`) is replaced by a camlir scope
(`camlir.enable(backend=..., wait=True)`: each new graph's backward waits for its program,
so the tests' counters and results are camlir's compiled code, not the eager engine's while
a worker compiles), what a user writes: each backward inside runs under
PyTorch's compiled autograd with camlir's compiler function, so every graph captured goes
through `compiled.CompiledBackward`, and what camlir leaves to PyTorch (create_graph=True)
runs eagerly. The scope keeps the test's `dynamic` (PyTorch's default, True). The test's
compiler function (and any check it does on the graph) is not called; each program camlir
builds counts as a compile in `counters["compiled_autograd"]["compiles"]`, where that
function would have counted Inductor's, so the tests' capture and compile counts compare
camlir with PyTorch. The speed choice is off (`CAMLIR_GRAPH_CHOICE=0`). `_disable()` scopes
are honoured.

Each test runs in its own subprocess with a timeout (`--timeout`, default 300 s), at most
`--jobs` (default 2) at a time, with one thread each. A test that fails with camlir other than
on an assertion about counters, logs or graph text is run again with PyTorch's own compiler
(stock Inductor, nothing patched), and each test is put in one class:

| class | meaning |
|---|---|
| PASS | passes with camlir |
| SKIP | skipped by the test itself (GPU only, ...) |
| SAME_AS_STOCK | fails with camlir and fails with stock PyTorch too |
| INDUCTOR_SPECIFIC | with camlir an assertion about counters, logs or graph text fails (in `check_output_and_recompiles` the outputs were compared equal before the counters), or the compiler function's own check never ran; not rerun with stock |
| WRONG | passes with stock PyTorch; with camlir a value differs (tensors not close/equal, a gradient check in the test) |
| CRASH | the child died (signal, abort) or an exception came out of camlir's own code |
| HANG | ran past the timeout |
| OTHER | passes with stock PyTorch, fails with camlir in some other way: to triage |

The report (`--json FILE`, and a table on stdout) lists, per test, the class, camlir's
counters in that child (captures, compiles, fallbacks, interpreted), the failing line and
the message. `-k SUBSTR` runs only tests whose id contains SUBSTR; `--no-stock` skips the
stock reruns. Documented in docs/pytorch-suite.md.
"""

import argparse
import ast
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
import types
import unittest
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
RESULT_MARK = "@@PYTORCH_CA_SUITE_RESULT@@"


# ---------------------------------------------------------------------------------------
# The child: load PyTorch's test file, install camlir (or not), run one test.

def _install_camlir(backend):
    """Replaces compiled autograd's `_enable` so that each scope a test opens compiles with
    camlir (see the module docstring)."""
    import torch
    from torch._dynamo import compiled_autograd as ca

    import camlir
    from camlir.capture import engine

    original = ca._enable

    @contextlib.contextmanager
    def camlir_enable(compiler_fn, dynamic=True, ignore_active_disable_ctx=True):
        if compiler_fn is engine._compiler_fn:  # camlir's own scope, opened per backward
            with original(compiler_fn, dynamic=dynamic,
                          ignore_active_disable_ctx=ignore_active_disable_ctx):
                yield
            return
        if not ignore_active_disable_ctx and ca.active_disable_ctx:
            yield  # inside `_disable()`: compiled autograd stays off, as PyTorch does
            return
        # Only camlir's own scope: each backward then runs the way camlir.enable() runs it
        # for users (what camlir leaves to PyTorch, e.g. create_graph=True, runs eagerly).
        # The test's `dynamic` is kept: its capture counts assume it (PyTorch's default is
        # dynamic=True, camlir's is sizes as constants first).
        with camlir.enable(backend=backend, dynamic=bool(dynamic), wait=True):
            yield

    ca._enable = camlir_enable
    torch._dynamo.compiled_autograd._enable = camlir_enable
    _mirror_compiles(camlir)
    return camlir


def _mirror_compiles(camlir):
    """The tests count compiles in `counters["compiled_autograd"]["compiles"]`, which their
    own compiler function increments for each graph Inductor compiles; under camlir that
    function is never called. Each program camlir builds (`camlir.counters["compiles"]`: a
    run of its pipeline for a captured graph) adds one there instead, so the tests' compile
    counts compare camlir with PyTorch: a graph camlir leaves to PyTorch or to the eager
    engine adds nothing, one PyTorch compiles twice (a recompile) adds two only if camlir
    also built two programs."""
    from torch._dynamo.utils import counters as torch_counters

    class Mirrored(type(camlir.counters)):
        def __setitem__(self, key, value):
            if key == "compiles":
                grown = value - self.get(key, 0)
                if grown > 0:
                    torch_counters["compiled_autograd"]["compiles"] += grown
            super().__setitem__(key, value)

    camlir.counters.__class__ = Mirrored


def _load_module(path):
    """Executes PyTorch's test file statement by statement, as module `test_compiled_autograd`
    (so tracebacks keep its line numbers); a top-level statement that fails (the loads of
    sibling suites that are not there) is skipped and reported."""
    with open(path) as f:
        source = f.read()
    tree = ast.parse(source, path)
    module = types.ModuleType("test_compiled_autograd")
    module.__file__ = os.path.abspath(path)
    sys.modules[module.__name__] = module
    skipped = []
    for stmt in tree.body:
        if (isinstance(stmt, ast.If) and isinstance(stmt.test, ast.Compare)
                and isinstance(stmt.test.left, ast.Name) and stmt.test.left.id == "__name__"):
            continue  # `if __name__ == "__main__": run_tests()`
        code = compile(ast.Module(body=[stmt], type_ignores=[]), path, "exec")
        try:
            exec(code, module.__dict__)
        except Exception as exc:  # noqa: BLE001 - reported, and the rest still loads
            skipped.append(f"line {stmt.lineno}: {type(exc).__name__}: {exc}"[:300])
        _wrap_on_every_machine(module)
    return module, skipped


def _wrap_on_every_machine(module):
    """PyTorch's `wrap_test_class` (the wrapped test_autograd suites) leaves the tests whose
    backend is Inductor unwrapped unless CUDA and Triton are there: on a CPU machine they
    would run without compiled autograd at all. While it wraps, it sees
    HAS_CUDA_AND_TRITON = True, so that every test runs under compiled autograd: with camlir,
    and in the stock rerun with Inductor's CPU backend."""
    wrap = module.__dict__.get("wrap_test_class")
    if wrap is None or getattr(wrap, "_on_every_machine", False):
        return

    def wrap_test_class(orig_cls):
        had, old = "HAS_CUDA_AND_TRITON" in module.__dict__, module.__dict__.get(
            "HAS_CUDA_AND_TRITON")
        module.HAS_CUDA_AND_TRITON = True
        try:
            return wrap(orig_cls)
        finally:
            if had:
                module.HAS_CUDA_AND_TRITON = old
            else:
                del module.HAS_CUDA_AND_TRITON

    wrap_test_class._on_every_machine = True
    module.wrap_test_class = wrap_test_class


def _not_run_reason(cls, test_name):
    """Why a test of a wrapped suite is not run under compiled autograd, or None: the test
    file replaced it by `unittest.expectedFailure` itself (its xfail lists: it then passes
    without running), or left it unwrapped (its skipped_tests)."""
    fn = cls.__dict__.get(test_name)
    if getattr(cls, "__file__", None) is None or fn is None:
        return None
    if fn is unittest.expectedFailure:
        return "listed by the test file as failing under compiled autograd: not run"
    if any(base.__dict__.get(test_name) is fn for base in cls.__mro__[1:]):
        return "not wrapped by the test file (skipped_tests): would run without compiled autograd"
    return None


def _test_ids(module):
    ids = []
    loader = unittest.TestLoader()
    for name, obj in sorted(vars(module).items()):
        # A wrapped suite keeps its source module's name but is marked with our __file__.
        if (isinstance(obj, type) and issubclass(obj, unittest.TestCase)
                and (obj.__module__ == module.__name__
                     or getattr(obj, "__file__", None) == module.__file__)):
            ids += [f"{name}.{test}" for test in loader.getTestCaseNames(obj)]
    return ids


class _Result(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.outcome = None

    def _failed(self, kind, test, err):
        exc_type, exc, tb = err
        frames = traceback.extract_tb(tb)
        self.outcome = {
            "status": kind,
            "exc_type": exc_type.__name__,
            "message": str(exc)[:2000],
            "traceback": "".join(traceback.format_exception(exc_type, exc, tb))[-6000:],
            "frames": [(f.filename, f.lineno, f.name, f.line) for f in frames],
        }

    def addError(self, test, err):
        self._failed("error", test, err)

    def addFailure(self, test, err):
        self._failed("failure", test, err)

    def addSuccess(self, test):
        self.outcome = self.outcome or {"status": "pass"}

    def addSkip(self, test, reason):
        self.outcome = {"status": "skip", "message": str(reason)}

    def addExpectedFailure(self, test, err):
        self.outcome = {"status": "pass", "message": "expected failure"}

    def addUnexpectedSuccess(self, test):
        self.outcome = {"status": "failure", "exc_type": "UnexpectedSuccess",
                        "message": "unexpected success", "frames": []}


def child_main(args):
    for extra in args.extra_path:
        sys.path.insert(0, extra)
    camlir = _install_camlir(args.backend) if args.mode == "camlir" else None
    module, skipped = _load_module(args.path)
    if args.list:
        ids = _test_ids(module)
        not_run = {}
        for test_id in ids:
            cls_name, test_name = test_id.split(".", 1)
            reason = _not_run_reason(getattr(module, cls_name), test_name)
            if reason:
                not_run[test_id] = reason
        print(RESULT_MARK + json.dumps({"ids": ids, "skipped_statements": skipped,
                                        "not_run": not_run}))
        return
    cls_name, test_name = args.test.split(".", 1)
    cls = getattr(module, cls_name)
    test = cls(test_name)
    result = _Result()
    start = time.perf_counter()
    not_run = _not_run_reason(cls, test_name)
    if not_run:
        result.outcome = {"status": "skip", "message": not_run}
    else:
        test.run(result)
    outcome = result.outcome or {"status": "error", "exc_type": "NoOutcome", "message": "",
                                 "frames": []}
    outcome["seconds"] = round(time.perf_counter() - start, 2)
    if camlir is not None:
        outcome["camlir"] = {key: camlir.counters[key] for key in
                             ("captures", "compiles", "fallbacks", "interpreted", "cache_hits")}
        outcome["fallback_reasons"] = sorted({e.reason[:300] for e in camlir.explain()
                                              if e.kind == "fallback"})
    sys.stdout.flush()
    print(RESULT_MARK + json.dumps(outcome, default=str))


# ---------------------------------------------------------------------------------------
# The parent: list the tests, run each in a child, classify.

def _run_child(args, mode, test=None, list_only=False, timeout=None):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--mode", mode,
           "--backend", args.backend, args.path]
    for extra in args.extra_path:
        cmd += ["--extra-path", extra]
    cmd += ["--list"] if list_only else ["--test", test]
    env = dict(os.environ)
    # CAMLIR_GRAPH_CHOICE=0: no backward is sent to the eager engine for speed, so what
    # the tests check is camlir's compiled code and their capture counts stay PyTorch's.
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", CAMLIR_DISK_CACHE="0",
               CAMLIR_GRAPH_CHOICE="0",
               TORCHINDUCTOR_CACHE_DIR=os.path.join(args.workdir, "inductor-cache"),
               TORCHINDUCTOR_COMPILE_THREADS="1")
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=args.workdir)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stdout or b"")[-2000:]
        return {"status": "hang", "seconds": round(time.perf_counter() - start, 1),
                "message": f"no result after {timeout} s",
                "output_tail": tail.decode(errors="replace") if isinstance(tail, bytes) else tail}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK):])
    return {"status": "died", "returncode": proc.returncode,
            "seconds": round(time.perf_counter() - start, 1),
            "message": f"child exited with {proc.returncode} and no result",
            "output_tail": (proc.stdout + proc.stderr)[-3000:]}


_INDUCTOR_SPECIFIC_LINE = re.compile(
    r"counters|compiles|captures|unique_graphs|logs|assertExpectedInline|graph_code|"
    r"expected_logs|cudagraph|\bgm\b|graphs\[|post_grad|op_set|called_funcs")
_VALUE_MESSAGE = re.compile(r"Tensor-likes are not (close|equal)|Booleans mismatch|"
                            r"Scalars are not (close|equal)|grad", re.I)


def _in_camlir(frame_file):
    return f"{os.sep}camlir{os.sep}" in frame_file and "pytorch_ca_suite" not in frame_file


def _failing_test_line(outcome, path):
    """The last traceback line inside PyTorch's test directory (the test file, or a suite it
    wraps, e.g. test/test_autograd.py): the statement that failed. Returns (file, line
    number, text)."""
    test_dir = os.path.dirname(os.path.dirname(os.path.abspath(path)))
    for filename, lineno, _name, line in reversed(outcome.get("frames", [])):
        filename = os.path.abspath(filename)
        if filename.startswith(test_dir + os.sep):
            line = line or ""
            if line.rstrip().endswith("("):  # a call spread over lines: read its arguments
                with open(filename) as f:
                    line += " ".join(s.strip() for s in f.read().splitlines()[lineno:lineno + 3])
            return os.path.relpath(filename, test_dir), lineno, line
    return None, None, ""


def classify(camlir_outcome, stock_outcome, path):
    status = camlir_outcome["status"]
    if status == "pass":
        return "PASS"
    if status == "skip":
        return "SKIP"
    if status == "hang":
        return "HANG"
    if status == "died":
        return "CRASH"
    frames = camlir_outcome.get("frames", [])
    if (status == "error" and frames and _in_camlir(frames[-1][0])
            and camlir_outcome.get("exc_type") != "AssertionError"):
        return "CRASH"
    if stock_outcome is not None and stock_outcome["status"] not in ("pass", "skip"):
        return "SAME_AS_STOCK"
    _, _, line = _failing_test_line(camlir_outcome, path)
    message = camlir_outcome.get("message", "")
    if _INDUCTOR_SPECIFIC_LINE.search(line):
        return "INDUCTOR_SPECIFIC"
    if camlir_outcome.get("exc_type") == "AssertionError" and _VALUE_MESSAGE.search(message + line):
        return "WRONG"
    return "OTHER"


def parent_main(args):
    if not args.path:
        sys.exit("give the path of PyTorch's test/inductor/test_compiled_autograd.py "
                 "(argument or PYTORCH_CA_TEST_FILE)")
    args.path = os.path.abspath(args.path)
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="pytorch-ca-suite-")
    os.makedirs(args.workdir, exist_ok=True)
    listing = _run_child(args, "camlir", list_only=True, timeout=600)
    if "ids" not in listing:
        sys.exit(f"could not list the tests: {json.dumps(listing)[:3000]}")
    ids = [t for t in listing["ids"] if not args.k or any(k in t for k in args.k)]
    print(f"{len(ids)} tests from {args.path} (backend {args.backend}, {args.jobs} jobs, "
          f"timeout {args.timeout} s)", flush=True)
    for note in listing["skipped_statements"]:
        print(f"  not loaded: {note}", flush=True)

    def one(test_id):
        if test_id in listing.get("not_run", {}):  # no child needed: SKIP, with the reason
            outcome = {"status": "skip", "message": listing["not_run"][test_id]}
        else:
            outcome = _run_child(args, "camlir", test_id, timeout=args.timeout)
        stock = None
        verdict = classify(outcome, None, args.path)
        # An assertion about counters, logs or graph text says nothing about camlir's
        # gradients: only the other failures are checked against stock PyTorch.
        if verdict not in ("PASS", "SKIP", "INDUCTOR_SPECIFIC") and not args.no_stock:
            stock = _run_child(args, "stock", test_id, timeout=args.timeout)
            verdict = classify(outcome, stock, args.path)
        filename, lineno, line = _failing_test_line(outcome, args.path)
        record = {"test": test_id, "class": verdict, "camlir": outcome,
                  "stock_status": None if stock is None else stock["status"],
                  "stock_message": None if stock is None else stock.get("message", "")[:500],
                  "file": filename, "line": lineno, "line_text": line}
        counts = outcome.get("camlir", {})
        print(f"{verdict:17s} {test_id}  [{outcome.get('seconds', '?')} s; "
              f"compiles {counts.get('compiles', '-')}, fallbacks {counts.get('fallbacks', '-')}]"
              + ("" if verdict in ("PASS", "SKIP") else
                 f"\n      {outcome.get('exc_type', outcome['status'])}: "
                 f"{outcome.get('message', '')[:200]!r} ({filename}:{lineno}: {line.strip()[:100]})"),
              flush=True)
        return record

    start = time.time()
    with ThreadPoolExecutor(max_workers=max(1, min(args.jobs, 2))) as pool:
        records = list(pool.map(one, ids))
    totals = {}
    for record in records:
        totals[record["class"]] = totals.get(record["class"], 0) + 1
    print(f"\n{len(records)} tests in {time.time() - start:.0f} s: "
          + ", ".join(f"{k} {v}" for k, v in sorted(totals.items())))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"path": args.path, "backend": args.backend, "totals": totals,
                       "skipped_statements": listing["skipped_statements"],
                       "tests": records}, f, indent=1, default=str)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("path", nargs="?", default=os.environ.get("PYTORCH_CA_TEST_FILE"),
                        help="PyTorch's test/inductor/test_compiled_autograd.py")
    parser.add_argument("--backend", default="cpu", choices=("cpu", "eager"))
    parser.add_argument("--jobs", type=int, default=2, help="at most 2")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per test")
    parser.add_argument("-k", action="append", default=[], help="only test ids containing this")
    parser.add_argument("--json", help="write the full report here")
    parser.add_argument("--no-stock", action="store_true",
                        help="do not rerun failures with stock PyTorch")
    parser.add_argument("--extra-path", action="append", default=[],
                        help="a directory to put on sys.path (e.g. where expecttest is)")
    parser.add_argument("--workdir", help="where caches go (default: a new temp dir)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=("camlir", "stock"), default="camlir",
                        help=argparse.SUPPRESS)
    parser.add_argument("--list", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--test", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child_main(args)
    return parent_main(args)


if __name__ == "__main__":
    sys.exit(main())
