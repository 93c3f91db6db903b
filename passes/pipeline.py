"""One textual pipeline for camlir's Python passes and every upstream MLIR pass.

MLIR's pipeline parser only knows passes registered in C++, and Python passes cannot be
registered there, so the text is parsed here: our passes become Python callables added to
the `PassManager`, everything else is handed to MLIR's own parser element by element, in
order. Grammar (MLIR's): `builtin.module(a, b{opt=1}, func.func(c, d))`; the anchor may be
left out at the top.

Errors carry the column of the offending element so the tool can point at it.
"""

import difflib
from dataclasses import dataclass, field
from typing import Optional

from torch_mlir import ir
from torch_mlir.passmanager import PassManager

from camlir.dialects.ca import verify as verify_ca
from camlir.dialects.ca import verify_or_raise

from . import registry
from .base import OptionError, PassFailure


class PipelineError(ValueError):
    """A pipeline that does not parse, names an unknown pass or has bad options; `column`
    (1-based) points at the offending element of the pipeline text."""

    def __init__(self, message: str, column: int = 1):
        super().__init__(message)
        self.column = column


@dataclass
class Element:
    """One parsed pipeline element: a pass (`cse`, `ca-flatten-nodes{keep-provenance=false}`)
    or an op anchor with a nested list (`func.func(canonicalize)`, then `is_anchor`)."""

    name: str
    column: int  # 1-based column of the name in the pipeline text
    options: Optional[str] = None  # text inside {...}
    nested: Optional[list] = None  # elements inside (...) for an op anchor
    text: str = ""  # the element exactly as written

    @property
    def is_anchor(self) -> bool:
        return self.nested is not None


@dataclass
class _Parser:
    text: str
    pos: int = 0
    elements: list = field(default_factory=list)

    def parse(self) -> list:
        items = self._list(top=True)
        self._skip_ws()
        if self.pos != len(self.text):
            raise PipelineError(f"unexpected '{self.text[self.pos]}' in pass pipeline", self.pos + 1)
        if len(items) == 1 and items[0].is_anchor and items[0].name == "builtin.module":
            return items[0].nested
        for item in items:
            if item.is_anchor and item.name == "builtin.module":
                raise PipelineError("'builtin.module(...)' may only wrap the whole pipeline", item.column)
        return items

    def _skip_ws(self):
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def _list(self, top=False) -> list:
        items = []
        while True:
            self._skip_ws()
            if self.pos >= len(self.text) or self.text[self.pos] == ")":
                if items or top:
                    return items
                raise PipelineError("empty nested pipeline", self.pos + 1)
            items.append(self._element())
            self._skip_ws()
            if self.pos < len(self.text) and self.text[self.pos] == ",":
                self.pos += 1
                continue
            return items

    def _element(self) -> Element:
        start = self.pos
        while self.pos < len(self.text) and (self.text[self.pos].isalnum() or self.text[self.pos] in "-_."):
            self.pos += 1
        name = self.text[start:self.pos]
        if not name:
            raise PipelineError("expected a pass name", start + 1)
        elem = Element(name, start + 1)
        if self.pos < len(self.text) and self.text[self.pos] == "{":
            close = self._matching(self.pos, "{", "}")
            elem.options = self.text[self.pos + 1:close].strip()
            self.pos = close + 1
        elif self.pos < len(self.text) and self.text[self.pos] == "(":
            self.pos += 1
            elem.nested = self._list()
            if self.pos >= len(self.text) or self.text[self.pos] != ")":
                raise PipelineError(f"missing ')' after the nested pipeline of '{name}'", self.pos + 1)
            self.pos += 1
        elem.text = self.text[start:self.pos]
        return elem

    def _matching(self, at: int, open_: str, close: str) -> int:
        depth = 0
        for i in range(at, len(self.text)):
            if self.text[i] == open_:
                depth += 1
            elif self.text[i] == close:
                depth -= 1
                if depth == 0:
                    return i
        raise PipelineError(f"missing '{close}'", at + 1)


def parse_pipeline(text: str) -> list:
    """Parses pipeline text into a list of `Element`s, dropping a `builtin.module(...)`
    anchor around the whole pipeline.

    `parse_pipeline("builtin.module(cse,func.func(canonicalize))")` gives (columns and texts
    left out) `[Element("cse"), Element("func.func", nested=[Element("canonicalize")])]`.
    Only the syntax is checked here; `build_pass_manager` checks names and options.
    Raises PipelineError.
    """
    return _Parser(text).parse()


# Upstream names offered in "did you mean" hints (MLIR cannot list its passes from Python).
_COMMON_UPSTREAM = (
    "canonicalize", "cse", "inline", "symbol-dce", "sccp", "loop-invariant-code-motion",
    "linalg-fuse-elementwise-ops", "one-shot-bufferize", "convert-linalg-to-loops",
    "convert-scf-to-cf", "convert-to-llvm", "reconcile-unrealized-casts",
    "torch-backend-to-linalg-on-tensors-backend-pipeline",
    "torch-function-to-torch-backend-pipeline",
)


def _unknown_pass(elem: Element) -> PipelineError:
    candidates = list(registry.names()) + list(_COMMON_UPSTREAM)
    close = difflib.get_close_matches(elem.name, candidates, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else " (see ca-opt --list-passes)"
    return PipelineError(f"'{elem.name}' does not refer to a registered pass or pass pipeline{hint}",
                         elem.column)


def _check_upstream(elem: Element, context: ir.Context) -> None:
    """Asks MLIR whether it knows this element, on a scratch pass manager."""
    with context:
        scratch = PassManager("builtin.module")
        try:
            scratch.add(elem.text)
        except ValueError as exc:
            message = str(exc)
            if "does not refer to a registered pass" in message:
                raise _unknown_pass(elem) from None
            first = message.strip().splitlines()[0] if message.strip() else "invalid pass"
            first = first.replace("MLIR Textual PassPipeline Parser:1:1: error: ", "")
            if "no such option" in message or "failed to add" in message:
                first = f"invalid options for pass '{elem.name}': {message.strip().splitlines()[0]}"
            raise PipelineError(first, elem.column) from None


def _our_passes_inside(elem: Element):
    for inner in elem.nested or ():
        if inner.is_anchor:
            yield from _our_passes_inside(inner)
        elif registry.lookup(inner.name):
            yield inner


def build_pass_manager(elements: list, context: ir.Context,
                       allow_unregistered: bool = False) -> PassManager:
    """A PassManager on `builtin.module` running `elements` in order.

    Each camlir pass is followed by the `ca` verifier (MLIR's verify-each does not know the
    `ca` ops), inside the same pass so that IR dumps show one entry per pass. Callers verify
    once more after the whole pipeline (`run_pipeline` does), which covers upstream passes.
    """
    with context:
        pm = PassManager("builtin.module")
    for elem in elements:
        _add_element(pm, elem, context, allow_unregistered)
    return pm


def _add_element(pm: PassManager, elem: Element, context: ir.Context,
                 allow_unregistered: bool) -> None:
    if elem.is_anchor:
        for inner in _our_passes_inside(elem):
            raise PipelineError(f"camlir pass '{inner.name}' runs on the whole module; "
                                f"put it at the top level of the pipeline, not inside "
                                f"'{elem.name}(...)'", inner.column)
    cls = None if elem.is_anchor else registry.lookup(elem.name)
    if cls is None:
        _check_upstream(elem, context)
        with context:
            pm.add(elem.text)
        return
    try:
        instance = cls.from_options(elem.options or "")
    except OptionError as exc:
        raise PipelineError(str(exc), elem.column) from None
    pm.add(_as_mlir_pass(instance, allow_unregistered), name=type(instance).__name__,
           argument=cls.argument, description=cls.summary)


def _as_mlir_pass(instance, allow_unregistered: bool):
    """Wraps a camlir pass: failures become diagnostics (never Python tracebacks), and the
    `ca` verifier checks what the pass left behind."""

    def run(op, mlir_pass):
        try:
            instance.run(op)
            problems = verify_ca(op, allow_unregistered)
            for p in problems:
                p.location.emit_error(f"{p.message} (after pass '{instance.argument}')")
            if problems:
                mlir_pass.signal_pass_failure()
        except PassFailure as exc:
            target = exc.op if exc.op is not None else op
            target.location.emit_error(f"{instance.argument}: {exc}")
            mlir_pass.signal_pass_failure()
        except Exception as exc:  # a bug in a pass must still come out as a diagnostic
            op.location.emit_error(f"{instance.argument}: internal error: {exc!r}")
            mlir_pass.signal_pass_failure()

    run.__name__ = type(instance).__name__
    return run


def run_pipeline(module: ir.Module, text: str) -> None:
    """Parses `text`, runs it on `module` and verifies the result.

    Raises PipelineError (bad pipeline), ir.MLIRError (a pass failed) or
    camlir.dialects.ca.VerificationError (the result breaks a `ca` invariant).
    """
    build_pass_manager(parse_pipeline(text), module.context).run(module.operation)
    verify_or_raise(module.operation)
