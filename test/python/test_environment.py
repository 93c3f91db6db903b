"""Tests of camlir.environment: every environment variable camlir reads, read in one module."""

import pathlib
import re

import pytest

from camlir import environment

PACKAGE = pathlib.Path(environment.__file__).resolve().parent

# A read of the environment: `os.environ.get(`, `os.getenv(`, `os.environ[...]` not being
# assigned, `... in os.environ`, iterating it, or importing `environ`/`getenv` from os.
# Writes stay allowed: `os.environ[...] = v`, `.setdefault`, `.update`, `.pop`, and
# `dict(os.environ, ...)` / `os.environ.copy()` (a whole environment handed to a subprocess).
_READ = re.compile(
    r"os\.environ\.get\s*\("
    r"|os\.getenv\s*\("
    r"|os\.environ\s*\[[^\]]*\](?!\s*=[^=])"
    r"|\bin\s+os\.environ\b"
    r"|os\.environ\.(?:items|keys|values)\s*\("
    r"|from\s+os\s+import\s+[^\n]*\b(?:environ|getenv)\b"
)


def _sources():
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != "environment.py" or p.parent != PACKAGE)


def test_read_pattern_tells_reads_from_writes():
    reads = ['os.environ.get("X")', 'os.getenv("X", "1")', 'v = os.environ["X"]', 'if "X" in os.environ:',
             'os.environ["X"] == "1"', "from os import environ", "for k, v in os.environ.items():"]
    writes = ['os.environ["X"] = "0"', 'os.environ.setdefault("X", "0")', "os.environ.update(X='0')",
              "env = dict(os.environ, X='0')", "env = os.environ.copy()"]
    assert all(_READ.search(line) for line in reads), [line for line in reads if not _READ.search(line)]
    assert not any(_READ.search(line) for line in writes), [line for line in writes if _READ.search(line)]


def test_no_environment_reads_outside_the_module():
    """Every read of the environment in python/camlir goes through camlir.environment.

    This excludes nothing but environment.py itself. NOTE: it fails while pipeline.py
    (CA_DUMP_DIR) and repro.py (CAMLIR_REPRO, CAMLIR_REPRO_DIR) still read os.environ
    directly; they are being switched to environment.text/flag separately."""
    assert _sources(), PACKAGE
    found = []
    for path in _sources():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _READ.search(line.split("#", 1)[0]):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}")
    assert not found, "read these through camlir.environment:\n" + "\n".join(found)


def test_every_name_the_sources_use_is_in_the_table():
    """Names passed to environment.<fn>("...") and every CAMLIR_*/CA_* name the package
    mentions are in the table (as a name or an old name)."""
    known = set(environment.BY_NAME)
    known.update(old for v in environment.VARIABLES for old in v.old_names)
    call = re.compile(r"environment(?:_variables)?\.(?:text|flag|integer|raw|source|variable)\(\s*\"([A-Za-z0-9_]+)\"")
    mention = re.compile(r"\b(?:CAMLIR|CA)_[A-Z][A-Z0-9_]*\b")
    unknown = set()
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        unknown.update(n for n in call.findall(text) if n not in environment.BY_NAME)
        unknown.update(n for n in mention.findall(text) if n not in known)
    assert not unknown, sorted(unknown)


def test_old_names_work(monkeypatch):
    for var in environment.VARIABLES:
        for name in (var.name,) + var.old_names:
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CA_LOGS", "graph")
    assert environment.text("CAMLIR_LOGS") == "graph"
    assert environment.source("CAMLIR_LOGS") == "CA_LOGS"
    monkeypatch.setenv("CA_DUMP_DIR", "/tmp/dumps")
    assert environment.text("CAMLIR_DUMP_DIR") == "/tmp/dumps"
    monkeypatch.setenv("CA_OPT_TRACEBACK", "1")
    assert environment.flag("CAMLIR_OPT_TRACEBACK") is True
    assert [v.old_names for v in map(environment.variable, ("CAMLIR_LOGS", "CAMLIR_DUMP_DIR", "CAMLIR_OPT_TRACEBACK"))] \
        == [("CA_LOGS",), ("CA_DUMP_DIR",), ("CA_OPT_TRACEBACK",)]


def test_new_name_wins(monkeypatch):
    monkeypatch.setenv("CA_LOGS", "graph")
    monkeypatch.setenv("CAMLIR_LOGS", "perf")
    assert environment.text("CAMLIR_LOGS") == "perf"
    assert environment.source("CAMLIR_LOGS") == "CAMLIR_LOGS"
    monkeypatch.setenv("CAMLIR_LOGS", "")  # set, even empty, wins
    assert environment.text("CAMLIR_LOGS") == ""
    monkeypatch.setenv("CA_DUMP_DIR", "old")
    monkeypatch.setenv("CAMLIR_DUMP_DIR", "new")
    assert environment.text("CAMLIR_DUMP_DIR") == "new"


def test_defaults(monkeypatch):
    for name in ("CAMLIR_LOGS", "CA_LOGS", "CAMLIR_DUMP_DIR", "CA_DUMP_DIR", "CAMLIR_THREADS_MIN_ELEMENTS",
                 "CAMLIR_JIT_WORKERS", "CAMLIR_DISK_CACHE", "CAMLIR_REPRO", "CUDA_HOME"):
        monkeypatch.delenv(name, raising=False)
    assert environment.text("CAMLIR_LOGS") == ""  # a string default is returned
    assert environment.text("CAMLIR_DUMP_DIR") is None
    assert environment.integer("CAMLIR_THREADS_MIN_ELEMENTS") == 32768
    assert environment.integer("CAMLIR_JIT_WORKERS") is None
    assert environment.flag("CAMLIR_DISK_CACHE") is True
    assert environment.flag("CAMLIR_REPRO") is False
    assert environment.raw("CUDA_HOME") is None


@pytest.mark.parametrize("name", ["CAMLIR_KERNEL_CHOICE", "CAMLIR_GRAPH_CHOICE", "CAMLIR_MALLOC_TUNING",
                                  "CAMLIR_THREADS", "CAMLIR_DISK_CACHE"])
def test_flags_on_by_default(monkeypatch, name):
    monkeypatch.delenv(name, raising=False)
    assert environment.flag(name) is True
    for off in ("0", "off", "false"):
        monkeypatch.setenv(name, off)
        assert environment.flag(name) is False, off
    for on in ("1", "on", "true", "yes"):
        monkeypatch.setenv(name, on)
        assert environment.flag(name) is True, on
    # As before the move: only CAMLIR_DISK_CACHE counts an empty value as off.
    monkeypatch.setenv(name, "")
    assert environment.flag(name) is (name != "CAMLIR_DISK_CACHE")


def test_flags_off_by_default(monkeypatch):
    # CAMLIR_REPRO: on for any value but "" and "0" (as repro.py read it).
    monkeypatch.delenv("CAMLIR_REPRO", raising=False)
    assert environment.flag("CAMLIR_REPRO") is False
    for value, on in (("", False), ("0", False), ("1", True), ("yes", True)):
        monkeypatch.setenv("CAMLIR_REPRO", value)
        assert environment.flag("CAMLIR_REPRO") is on, value
    # CAMLIR_OPT_TRACEBACK: any non-empty value (as ca_opt.py read CA_OPT_TRACEBACK).
    monkeypatch.delenv("CA_OPT_TRACEBACK", raising=False)
    monkeypatch.delenv("CAMLIR_OPT_TRACEBACK", raising=False)
    assert environment.flag("CAMLIR_OPT_TRACEBACK") is False
    monkeypatch.setenv("CAMLIR_OPT_TRACEBACK", "")
    assert environment.flag("CAMLIR_OPT_TRACEBACK") is False
    monkeypatch.setenv("CAMLIR_OPT_TRACEBACK", "1")
    assert environment.flag("CAMLIR_OPT_TRACEBACK") is True


def test_integers(monkeypatch):
    monkeypatch.setenv("CAMLIR_JIT_WORKERS", "3")
    assert environment.integer("CAMLIR_JIT_WORKERS") == 3
    for bad in ("lots", "", "1.5"):
        monkeypatch.setenv("CAMLIR_JIT_WORKERS", bad)
        with pytest.raises(ValueError, match="CAMLIR_JIT_WORKERS must be a whole number"):
            environment.integer("CAMLIR_JIT_WORKERS")


def test_call_sites_read_at_call_time(monkeypatch):
    from camlir import disk_store, graph_choice

    monkeypatch.setenv("CAMLIR_GRAPH_CHOICE", "0")
    assert graph_choice.enabled() is False
    monkeypatch.setenv("CAMLIR_GRAPH_CHOICE", "1")
    assert graph_choice.enabled() is True
    assert disk_store.ENV_DIR == "CAMLIR_CACHE_DIR" and disk_store.ENV_MAX_BYTES == "CAMLIR_CACHE_MAX_BYTES"
    monkeypatch.setenv("CAMLIR_CACHE_DIR", "/somewhere/cache")
    assert disk_store.default_directory() == "/somewhere/cache"


def test_unknown_names_and_wrong_kinds():
    with pytest.raises(KeyError, match="CAMLIR_NO_SUCH"):
        environment.text("CAMLIR_NO_SUCH")
    with pytest.raises(KeyError):
        environment.raw("HOME")
    with pytest.raises(TypeError):
        environment.flag("CAMLIR_LOGS")
    with pytest.raises(TypeError):
        environment.integer("CAMLIR_DISK_CACHE")
    with pytest.raises(TypeError):
        environment.text("CUDA_HOME")  # external: raw()


def test_table():
    kinds = {v.kind for v in environment.VARIABLES}
    assert kinds <= set(environment.KINDS)
    for var in environment.VARIABLES:
        assert var.doc.strip(), var.name
        if var.kind == "external":
            assert not var.name.startswith(("CAMLIR_", "CA_")) and not var.old_names, var.name
        else:
            assert var.name.startswith("CAMLIR_"), var.name
        if var.kind == "flag":
            assert isinstance(var.default, bool), var.name
    for name in ("CAMLIR_DUMP_DIR", "CAMLIR_REPRO", "CAMLIR_REPRO_DIR", "GLIBC_TUNABLES", "CUDA_PATH",
                 "XDG_CACHE_HOME", "MALLOC_TRIM_THRESHOLD_"):
        assert name in environment.BY_NAME, name
    assert environment.variable("CAMLIR_REPRO").kind == "flag"
    assert environment.variable("CAMLIR_REPRO_DIR").kind == "text"


def test_markdown_table_lists_every_variable():
    table = environment.markdown_table()
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == [v.name for v in environment.VARIABLES]
    for var in environment.VARIABLES:
        for old in var.old_names:
            assert f"`{old}`" in table, old


def test_docs_page_is_generated_from_the_table():
    from camlir.tools import gen_docs

    assert "environment.md" in gen_docs.FILES
    text = gen_docs.environment_md()
    assert text.startswith(gen_docs._HEADER)
    assert environment.markdown_table() in text
    page = PACKAGE.parent.parent / "docs" / "environment.md"
    assert page.read_text(encoding="utf-8") == text, "run python -m camlir.tools.gen_docs"


def test_an_unknown_log_kind_is_skipped_and_the_others_apply():
    # issue 31, point 6: one bad kind (`grpah`) discarded the whole setting.
    import os
    import subprocess
    import sys

    script = "import camlir.logs as l; print(sorted(l._enabled))"
    env = dict(os.environ, CAMLIR_LOGS="grpah,recompiles")
    env.pop("CA_LOGS", None)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "['recompiles']", done.stdout + done.stderr
    assert "skipping unknown kind(s) 'grpah' (did you mean 'graph'?)" in done.stderr, done.stderr


@pytest.mark.parametrize("setup, expected", [
    ("", "camlir: graph 7 runs uncompiled from now on: why\n"),                   # nothing configured
    ("import logging; logging.basicConfig()\n", "WARNING:camlir:graph 7 runs uncompiled from now on: why\n"),
])
def test_a_warning_says_camlir_once(setup, expected):
    # issue 31, point 6: "WARNING:camlir:camlir: ..." under logging.basicConfig().
    import os
    import subprocess
    import sys

    script = setup + "from camlir import logs; logs.log.warning('graph %d runs uncompiled from now on: %s', 7, 'why')"
    env = dict(os.environ)
    env.pop("CAMLIR_LOGS", None)
    env.pop("CA_LOGS", None)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert done.stderr == expected, done.stderr


def test_torch_logs_camlir_prints_each_line_once():
    # issue 31, point 6: with TORCH_LOGS=camlir every line came out twice (PyTorch's handler
    # on camlir's logger, and the root logger's once something had set one).
    import os
    import subprocess
    import sys

    script = ("import logging, torch, camlir.api; logging.basicConfig(); "
              "from camlir import logs; logs.log.warning('graph %d: once', 3)")
    env = dict(os.environ, TORCH_LOGS="camlir")
    env.pop("CAMLIR_LOGS", None)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    lines = [line for line in done.stderr.splitlines() if "graph 3: once" in line]
    assert len(lines) == 1, done.stderr
