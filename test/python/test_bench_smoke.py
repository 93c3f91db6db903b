"""Smoke tests of the benchmark harness (bench/) on W1: bench.run --quick (eager, eager_tuned,
eager_after_camlir, ca_eager, camlir_cpu), compile time, memory, page faults."""

import math
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_bench_quick_w1(tmp_path):
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    from bench import run

    out = tmp_path / "bench.md"
    rows = run.main(["--workloads", "W1", "--threads", "1", "--quick",
                     "--variants", "eager,eager_tuned,eager_after_camlir,ca_eager,camlir_cpu", "--out", str(out)])
    by_variant = {row["variant"]: row for row in rows}
    assert set(by_variant) == {"eager", "eager_tuned", "eager_after_camlir", "ca_eager", "camlir_cpu"}
    for variant, row in by_variant.items():
        assert row["error"] is None, (variant, row["error"])
        assert row["correct"] == "ok", (variant, row["correct"])
        assert row["iters"] >= 5
        for key in ("median_ms", "ratio", "first_s", "maxrss_mb"):
            assert math.isfinite(row[key]) and row[key] > 0, (variant, key, row[key])
        assert row["counters"].get("fallbacks", 0) == 0
    assert by_variant["eager"]["ratio"] == 1.0
    # eager_after_camlir compiled its first backward with camlir (a compile takes time and
    # memory), then timed the plain engine.
    assert by_variant["eager_after_camlir"]["first_s"] > 10 * by_variant["eager"]["first_s"]
    # What ran camlir's timed backwards: with --quick no choice has decided, so its program.
    assert by_variant["camlir_cpu"]["ran"] == "compiled" and by_variant["eager"]["ran"] == "-"
    text = out.read_text()
    assert "| W1 | 1 | camlir_cpu | compiled |" in text and "python -m bench.run" in text


def test_compile_time_w1():
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    from bench import compile_time

    rows = compile_time.main(["--workloads", "W1", "--rounds", "1", "--modes", "inprocess,service",
                              "--max-seconds", "60"])
    assert set(rows) == {("W1", "inprocess"), ("W1", "service")}
    for (_, mode), (result,) in rows.items():
        assert 0 < result["first"] < 120
        assert result["serves"] is not None and result["serves"] >= result["first"]  # a program ran
        assert result["counters"]["compiles"] == 1 and result["counters"]["fallbacks"] == 0
    assert rows[("W1", "inprocess")][0]["counters"]["while_compiling"] == 0
    assert rows[("W1", "inprocess")][0]["children_mb"] == 0 < rows[("W1", "service")][0]["children_mb"]


def test_memory_w1():
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    from bench import memory

    table = memory.main(["--workload", "W1"])
    rows = [line.split("|")[1:-1] for line in table.splitlines()[2:]]
    assert [r[0].strip() for r in rows][-2:] == ["camlir's first backward", "three more"]
    peaks = [float(r[2]) for r in rows]
    assert all(b >= a for a, b in zip(peaks, peaks[1:]))  # a peak never goes down


def test_page_faults_w1():
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    from bench import page_faults

    rows = page_faults.main(["--workloads", "W1", "--warmup", "2", "--steps", "3"])
    assert [r[1] for r in rows] == ["eager", "eager tuned", "camlir untuned", "camlir"]
    for _, variant, ms, faults in rows:
        assert 0 < ms < 1000 and faults >= 0, (variant, ms, faults)
