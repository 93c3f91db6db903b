"""How one compile stage runs and is dumped: the machinery every backend's stages share.

A stage is a named step of a compile (`retrace`, `kernels`, `bufferize`, ...). Stages that
are MLIR pass pipelines run through `run_stage`, which also verifies the result and turns a
pass failure into `StageError` naming the stage; every stage ends by handing its result to
the compile's `Dump`:

- `CAMLIR_LOGS=verbose` (old name `CA_LOGS`) logs the IR after each stage ("graph 3, after
  stage 'linalg':");
- `CAMLIR_DUMP_DIR=dir` (old name `CA_DUMP_DIR`) writes it to
  `dir/graph<id>[-<variant>]/<NN>-<stage>.mlir`; each file starts with the `ca-opt` command
  that turns the previous file into it, so any stage can be replayed (a stage that is not a
  pass pipeline, such as trace-hooks or split, writes a new starting point);
- `CAMLIR_LOGS=passes` prints the IR after every pass inside a stage, as
  `ca-opt --mlir-print-ir-after-all` does (to stderr).
"""

import os
import re
from dataclasses import dataclass
from typing import Any, Optional

from torch_mlir import ir

from camlir import environment, logs
from camlir.dialects.ca import verify_or_raise
from camlir.passes import build_pass_manager, parse_pipeline


@dataclass(frozen=True)
class Stage:
    """One named step of a compile: `run(work)` changes or fills `work` (a `pipeline.Work`)."""

    name: str
    run: Any


class StageError(RuntimeError):
    """A stage failed; `stage` names it, the message says what failed in it."""

    def __init__(self, stage: str, message: str):
        self.stage = stage
        super().__init__(f"stage '{stage}' failed: {message}")


# --------------------------------------------------------------------------- dumping

@dataclass
class Dump:
    """Where the stages of one compile go: the log and, with CAMLIR_DUMP_DIR, numbered files."""

    label: str                       # "graph 3", "graph 3, sizes [10, 3]"
    directory: Optional[str] = None  # None: no files
    count: int = 0
    previous: Optional[str] = None   # the last file written

    @staticmethod
    def for_graph(capture_id: int, variant: str = "") -> "Dump":
        label = f"graph {capture_id}" + (f", {variant}" if variant else "")
        root = environment.text("CAMLIR_DUMP_DIR")
        directory = None
        if root:
            slug = re.sub(r"[^A-Za-z0-9]+", "-", variant).strip("-")
            directory = os.path.join(root, f"graph{capture_id}" + (f"-{slug}" if slug else ""))
            os.makedirs(directory, exist_ok=True)
        return Dump(label, directory)

    def __call__(self, stage: str, ir_text, pipeline: Optional[str] = None) -> None:
        if not (logs.enabled("verbose") or self.directory):
            return
        text = str(ir_text)
        if logs.enabled("verbose"):
            logs.log.info("%s, after stage '%s':\n%s", self.label, stage, text)
        if self.directory:
            path = os.path.join(self.directory, f"{self.count:02d}-{stage}.mlir")
            if pipeline and self.previous:
                how = f"ca-opt {os.path.basename(self.previous)} --pass-pipeline='{pipeline}'"
            else:
                how = "not a pass pipeline: a new starting point"
            comment = "#" if stage == "retrace" else "//"
            with open(path, "w") as f:
                f.write(f"{comment} {self.label}, stage '{stage}'; made by: {how}\n{text}")
            self.previous = path
            self.count += 1


def note(dump: Dump, name: str, text: str) -> None:
    """A sentence where the stages would have gone: logged with `CAMLIR_LOGS=verbose`, and
    written as `dump.directory/<NN>-<name>.txt` with `CAMLIR_DUMP_DIR`."""
    if logs.enabled("verbose"):
        logs.log.info("%s: %s", dump.label, text)
    if dump.directory:
        with open(os.path.join(dump.directory, f"{dump.count:02d}-{name}.txt"), "w") as f:
            f.write(f"{dump.label}: {text}\n")
        dump.count += 1


def run_stage(stage: str, module: ir.Module, passes: list, dump: Dump) -> None:
    """Runs one stage's passes (camlir's and upstream ones alike) and dumps the result."""
    text = "builtin.module(" + ",".join(passes) + ")"
    try:
        pm = build_pass_manager(parse_pipeline(text), module.context)
        if logs.enabled("passes"):
            pm.enable_ir_printing(print_after_all=True)
        pm.run(module.operation)
        verify_or_raise(module.operation)
    except (ir.MLIRError, ValueError) as exc:
        raise StageError(stage, diagnostics(exc)) from exc
    dump(stage, module, text)


def diagnostics(exc: BaseException) -> str:
    """The error diagnostics of a failed pass manager (what the pass said), else the text."""
    messages = [d.message for d in getattr(exc, "error_diagnostics", ())]
    return "; ".join(messages) if messages else str(exc).strip().splitlines()[0]
