"""Backward-pass benchmark: variants side by side, interleaved, medians, ratios to eager.

    python -m bench.run                       # everything, 1 and 2 threads
    python -m bench.run --quick --workloads W1,W2 --threads 1 --variants eager,camlir_cpu
    python -m bench.run --out docs/benchmarks.md --json results.json

For each (workload, threads) pair, one worker process per variant (`bench/worker.py` says why)
builds the same seeded model and inputs, runs its first backward (compile time, and the
gradients for the correctness check), warms up, then the driver asks the workers for one timed
backward each, round robin with a rotating start order, until every variant has at least
`min_iters` samples and about `min_time` seconds, or a cap is reached.
"""

import argparse
import datetime
import hashlib
import importlib.metadata
import json
import os
import platform
import select
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):  # `python bench/run.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import workloads  # noqa: E402
from bench.worker import HEADER, write_frame  # noqa: E402  (no torch import)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_VARIANTS = ("eager", "ca_inductor", "camlir_cpu")
RTOL, ATOL = 1e-4, 1e-5
SPIN_GAP_S = 0.01  # idle time before each timed backward with 2+ threads (see run_group)


class Settings:
    def __init__(self, quick: bool):
        if quick:
            self.min_iters, self.min_time, self.max_iters, self.max_time, self.warmup = 5, 0.1, 10, 20, 1
        else:
            self.min_iters, self.min_time, self.max_iters, self.max_time, self.warmup = 20, 2.0, 3000, 90, 3
        self.untimed = 0  # untimed steps before each timed one, in a variant's turn
        self.start_timeout = 300   # importing torch and friends
        self.prepare_timeout = 1200  # start-up, cold compile of the first backward, warm-up
        self.step_timeout = 300


class WorkerError(Exception):
    pass


_STAGED = {}  # git revision -> folder holding that revision's `camlir` package (--baseline)


def stage_revision(rev: str) -> str:
    """Lays out camlir as committed at `rev` the way it is installed (python/camlir with
    dialects/ and passes/ inside), in a temporary folder; returns the folder for PYTHONPATH.
    A worker with it first on its path imports that camlir, not the checkout's."""
    if rev not in _STAGED:
        root = tempfile.mkdtemp(prefix=f"camlir-bench-{rev}-")
        archive = subprocess.run(["git", "archive", rev, "python/camlir", "dialects", "passes"], cwd=REPO,
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", root], input=archive, check=True)
        package = os.path.join(root, "pkg", "camlir")
        os.makedirs(os.path.dirname(package))
        os.rename(os.path.join(root, "python", "camlir"), package)
        for part in ("dialects", "passes"):
            os.rename(os.path.join(root, part), os.path.join(package, part))
        _STAGED[rev] = os.path.join(root, "pkg")
    return _STAGED[rev]


class WorkerProcess:
    def __init__(self, variant: str, scratch: str):
        self.variant = variant
        self.error = None
        name, _, rev = variant.partition("@")  # camlir_cpu@REV: camlir as committed at REV
        self.stderr_path = os.path.join(scratch, f"{variant.replace('@', '-')}.stderr")
        env = dict(os.environ)
        paths = ([stage_revision(rev)] if rev else []) + [REPO] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        env["PYTHONPATH"] = os.pathsep.join(paths)
        # A cold, private Inductor cache: "first backward" is a real compile in every run, and
        # no compile-worker pool competes with the timed processes for the cores.
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(scratch, f"inductor-{variant.replace('@', '-')}")
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
        self.stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.worker", name], cwd=REPO, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr)

    def _read_exact(self, size: int, deadline: float) -> bytes:
        fd = self.proc.stdout.fileno()
        chunks, missing = [], size
        while missing:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.proc.kill()  # stuck: it would not answer "finish" either
                raise WorkerError("timed out")
            chunk = os.read(fd, missing)
            if not chunk:
                self.proc.wait(timeout=10)
                raise WorkerError(f"worker exited with status {self.proc.returncode}"
                                  f"{self._stderr_tail()}")
            chunks.append(chunk)
            missing -= len(chunk)
        return b"".join(chunks)

    def _stderr_tail(self) -> str:
        try:
            with open(self.stderr_path, "rb") as f:
                lines = [line for line in f.read().decode(errors="replace").splitlines() if line.strip()]
        except OSError:
            return ""
        return f": {lines[-1].strip()}" if lines else ""

    def receive(self, timeout: float) -> dict:
        import io
        import pickle

        deadline = time.monotonic() + timeout
        (size,) = HEADER.unpack(self._read_exact(HEADER.size, deadline))
        reply = pickle.load(io.BytesIO(self._read_exact(size, deadline)))
        if "error" in reply:
            raise WorkerError(reply["error"])
        return reply

    def request(self, message: dict, timeout: float) -> dict:
        try:
            write_frame(self.proc.stdin, message)
        except (BrokenPipeError, OSError) as exc:
            raise WorkerError(f"worker is gone ({exc}){self._stderr_tail()}") from exc
        return self.receive(timeout)

    def close(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


def run_group(workload: str, threads: int, variants: list, settings: Settings, log) -> list:
    """All variants of one workload at one thread count. Returns one row (dict) per variant."""
    rows = {v: {"workload": workload, "threads": threads, "variant": v, "error": None,
                "notes": [], "times_ns": []} for v in variants}
    scratch = tempfile.mkdtemp(prefix="camlir-bench-")
    workers = {}
    try:
        for v in variants:
            workers[v] = WorkerProcess(v, scratch)
        alive = []
        for v in variants:
            try:
                workers[v].receive(settings.start_timeout)
                alive.append(v)
            except WorkerError as exc:
                rows[v]["error"] = f"start: {exc}"
        grads = {}
        for v in list(alive):  # one at a time: a compile has the machine to itself
            log(f"  {workload} threads={threads} {v}: first backward ...")
            try:
                reply = workers[v].request({"cmd": "prepare", "workload": workload, "variant": v,
                                            "threads": threads, "warmup": settings.warmup},
                                           settings.prepare_timeout)
            except WorkerError as exc:
                rows[v]["error"] = str(exc)
                log(f"    failed: {exc}")
                alive.remove(v)
                continue
            grads[v] = reply["grads"]  # pickled by the worker; the driver never imports torch
            rows[v]["startup_s"] = reply["startup_s"]
            rows[v]["first_s"] = reply["first_s"]
            log(f"    start-up {reply['startup_s']:.1f} s, first backward {reply['first_s']:.2f} s")
        for v in list(alive):
            if "eager" not in grads:
                rows[v]["correct"] = "n/a (no eager)"
                continue
            try:
                rows[v]["correct"] = workers[v].request(
                    {"cmd": "check", "reference": grads["eager"],
                     **dict(zip(("rtol", "atol", "atol_of_max"), workloads.TOLERANCE.get(workload, (RTOL, ATOL, 0.0))))},
                    settings.step_timeout)["correct"]
            except WorkerError as exc:
                rows[v]["error"] = f"correctness check: {exc}"
                alive.remove(v)
        rounds, start = 0, time.monotonic()
        while alive:
            k = rounds % len(alive)
            for v in alive[k:] + alive[:k]:
                if threads > 1:
                    # The previous worker's OpenMP threads spin for a while after its backward
                    # and hold a core: without this pause the 2-thread times were bimodal for
                    # every variant (CNN: p25 ~2 ms, p75 ~6 ms), the median falling on either.
                    time.sleep(SPIN_GAP_S)
                try:
                    for _ in range(settings.untimed):  # see --untimed
                        workers[v].request({"cmd": "step"}, settings.step_timeout)
                    rows[v]["times_ns"].append(workers[v].request({"cmd": "step"}, settings.step_timeout)["ns"])
                except WorkerError as exc:
                    rows[v]["error"] = f"timed backward {rounds + 1}: {exc}"
            alive = [v for v in alive if rows[v]["error"] is None]
            rounds += 1
            elapsed = time.monotonic() - start
            if rounds >= settings.max_iters or elapsed >= settings.max_time:
                break
            if rounds >= settings.min_iters and elapsed >= settings.min_time * max(1, len(alive)):
                break
        log(f"  {workload} threads={threads}: {rounds} interleaved rounds in {time.monotonic() - start:.1f} s")
        for v in variants:
            if workers[v].proc.poll() is None:  # also after a Python error: notes, memory
                try:
                    reply = workers[v].request({"cmd": "finish"}, 60)
                    rows[v]["maxrss_mb"] = reply.get("maxrss_mb")
                    rows[v]["counters"] = reply.get("counters", {})
                    rows[v]["notes"] = reply.get("notes", [])
                    rows[v]["ran"] = reply.get("ran", "-")
                    for key, label in (("interpreted", "INTERPRETED"), ("fallbacks", "FELL BACK")):
                        if rows[v]["counters"].get(key):
                            rows[v]["notes"].insert(0, f"{label}: camlir.counters[{key!r}] = "
                                                       f"{rows[v]['counters'][key]}")
                except WorkerError as exc:
                    rows[v]["notes"].append(f"finish: {exc}")
    finally:
        for w in workers.values():
            w.close()
        shutil.rmtree(scratch, ignore_errors=True)
    result = []
    for v in variants:
        row = rows[v]
        times = row.pop("times_ns")
        row["iters"] = len(times)
        if times and row["error"] is None:
            ms = sorted(t / 1e6 for t in times)
            row["median_ms"] = statistics.median(ms)
            row["p25_ms"], row["p75_ms"] = ms[len(ms) // 4], ms[(3 * len(ms)) // 4]
        result.append(row)
    eager = rows.get("eager", {}).get("median_ms")
    for row in result:
        if eager and row.get("median_ms") is not None:
            row["ratio"] = row["median_ms"] / eager
    return result


def machine() -> dict:
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "?"
    return {"cpu": cpu, "cores": os.cpu_count(), "usable_cores": usable, "torch": torch_version,
            "python": platform.python_version(), "camlir_commit": camlir_commit()}


def camlir_commit() -> str:
    """The checkout's commit, and whether camlir's sources differ from it."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)

    commit = git("rev-parse", "--short", "HEAD").stdout.strip() or "unknown"
    paths = ("--", "python", "dialects", "passes")
    changes = git("diff", "HEAD", *paths).stdout + git("status", "--porcelain", *paths).stdout
    if changes.strip():
        digest = hashlib.sha1(changes.encode()).hexdigest()[:8]
        commit += f" (with uncommitted changes to camlir, diff {digest})"
    return commit


def _cell(row, key, fmt):
    value = row.get(key)
    return "-" if value is None else format(value, fmt)


def table(rows: list) -> str:
    lines = ["| workload | threads | variant | ran | median backward ms | ratio to eager | "
             "first backward s | peak RSS MB | correct | iters | notes |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        notes = list(row.get("notes") or [])
        if row.get("error"):
            notes.insert(0, "ERROR: " + row["error"])
        note = "; ".join(notes).replace("|", "\\|").replace("\n", " ")
        if len(note) > 300:
            note = note[:297] + "..."
        ratio = "-" if row.get("ratio") is None else f"{row['ratio']:.2f}x"
        lines.append(f"| {row['workload']} | {row['threads']} | {row['variant']} | {row.get('ran', '-')} | "
                     f"{_cell(row, 'median_ms', '.3f')} | {ratio} | {_cell(row, 'first_s', '.2f')} | "
                     f"{_cell(row, 'maxrss_mb', '.0f')} | {row.get('correct', '-')} | "
                     f"{row.get('iters', 0)} | {note} |")
    return "\n".join(lines)


def report(rows: list, info: dict, command: str, quick: bool, started: str, minutes: float) -> str:
    out = ["# Backward-pass benchmark", ""]
    if quick:
        out += ["**Quick run (`--quick`): only a few iterations per variant; the numbers are a smoke "
                "check, not a measurement.**", ""]
    out += [f"- date: {started} (took {minutes:.1f} min)",
            f"- command: `{command}`",
            f"- machine: {info['cpu']}, {info['cores']} cores ({info['usable_cores']} usable), "
            f"Python {info['python']}, torch {info['torch']}, camlir commit {info['camlir_commit']}",
            f"- W5's forward is `torch.compile(backend=\"{workloads.FORWARD_BACKEND}\")` for every "
            "variant; all other forwards are eager. Only the backward call is timed.",
            f"- ratio = median(variant) / median(eager) of the same workload and thread count; "
            f"correct = gradients of the first step match eager's (rtol={RTOL}, atol={ATOL}; "
            "GPT2-bf16 at bf16's: rtol 1.6e-2, atol 2% of each gradient's largest entry).",
            "- first backward s: the first backward on this workload (capture and compile), after "
            "a one-time start-up on an unrelated graph; Inductor's cache is cold.",
            "- peak RSS: `ru_maxrss` of the process that ran only that variant (start-up included)."]
    if any(row["threads"] >= info["usable_cores"] for row in rows):
        out.append(f"- rows with {info['usable_cores']} threads use every core of the machine: any other "
                   "load on it slows them down, so compare them with care.")
    out += ["", table(rows), ""]
    return "\n".join(out)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default=",".join(workloads.DEFAULT),
                        help=f"comma-separated, from {','.join(workloads.NAMES)}; 'real' stands for "
                             f"{','.join(workloads.REAL_MODELS)}, 'all' for every workload "
                             f"(default: {','.join(workloads.DEFAULT)})")
    parser.add_argument("--threads", default="1,2", help="torch.set_num_threads values (default 1,2)")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                        help="eager, eager_tuned (eager with camlir's malloc tuning), eager_after_camlir (eager in a process "
                             "where camlir compiled the workload once), eager_after_ca (the same after PyTorch's compiled autograd captured it, with no compiler), ca_eager (PyTorch's compiled autograd replaying its graph op by op), ca_inductor, camlir_<backend> "
                        "(default: %(default)s)")
    parser.add_argument("--baseline", help="a git revision: adds camlir_cpu@REV, camlir as committed at REV, "
                        "run side by side with the checkout (for before/after measurements)")
    parser.add_argument("--quick", action="store_true", help="a few iterations only (smoke check)")
    parser.add_argument("--seconds", type=float,
                        help="time each variant for about this long per workload and thread count "
                             "(default 2; longer for rows within noise)")
    parser.add_argument("--out", help="write the markdown report here (e.g. docs/benchmarks.md)")
    parser.add_argument("--json", help="write the raw results here")
    parser.add_argument("--untimed", type=int, default=0,
                        help="untimed steps a variant runs before each timed one, in its turn (default 0: "
                             "one timed step per turn; a step then starts with the caches holding another "
                             "process's data)")
    args = parser.parse_args(argv)
    groups = {"all": workloads.NAMES, "real": workloads.REAL_MODELS}
    args.workloads = [name for w in args.workloads.split(",") if w.strip()
                      for name in groups.get(w.strip(), (w.strip(),))]
    unknown = [w for w in args.workloads if w not in workloads.NAMES]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; known: {', '.join(workloads.NAMES)}")
    args.threads = [int(t) for t in args.threads.split(",") if t.strip()]
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if args.baseline:
        args.variants.append(f"camlir_cpu@{args.baseline}")
    bad = [v for v in args.variants
           if v not in ("eager", "eager_tuned", "eager_after_camlir", "eager_after_ca", "ca_eager", "ca_inductor")
           and not v.startswith("camlir_")]
    if bad:
        parser.error(f"unknown variant(s) {bad}; use eager, eager_tuned, eager_after_camlir, eager_after_ca, ca_eager, "
                     f"ca_inductor, "
                     f"camlir_<backend>")
    return args


def main(argv=None) -> list:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    started = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    t0 = time.monotonic()
    settings = Settings(args.quick)
    if args.seconds:
        settings.min_time = args.seconds
    settings.untimed = args.untimed
    info = machine()
    rows = []
    for workload in args.workloads:
        reason = workloads.missing(workload)  # e.g. GPT2 without transformers: skipped, not fatal
        if reason:
            log(f"  skipping {workload}: {reason}")
        for threads in args.threads:
            if reason:
                rows.append({"workload": workload, "threads": threads, "variant": ",".join(args.variants),
                             "error": None, "skipped": reason, "notes": [f"SKIPPED: {reason}"],
                             "iters": 0})
                continue
            rows += run_group(workload, threads, args.variants, settings, log)
    minutes = (time.monotonic() - t0) / 60
    command = "python -m bench.run" + "".join(" " + shlex.quote(a) for a in argv)
    end_commit = camlir_commit()
    if end_commit != info["camlir_commit"]:
        info["camlir_commit"] += f" at the start, {end_commit} at the end (camlir changed during the run)"
    text = report(rows, info, command, args.quick, started, minutes)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
