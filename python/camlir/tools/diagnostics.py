"""Diagnostics for the tools: `file:line:col: severity: message`, and `expected-*` checking.

MLIR's Python bindings parse from a string, so locations name the buffer `"-"`; the tools
map that back to the real file name. `--verify-diagnostics` is MLIR's convention: comments
`// expected-error {{text}}` (same line) or `// expected-error@+1 {{text}}` (a relative line)
must each match a produced diagnostic of that severity on that line whose message contains
the text, and no other diagnostic may be produced.
"""

import re
from dataclasses import dataclass, field

from torch_mlir import ir

_FILE_LINE_COL = re.compile(r'"((?:[^"\\]|\\.)*)":(\d+):(\d+)')
_SEVERITY = {
    ir.DiagnosticSeverity.ERROR: "error",
    ir.DiagnosticSeverity.WARNING: "warning",
    ir.DiagnosticSeverity.NOTE: "note",
    ir.DiagnosticSeverity.REMARK: "remark",
}


@dataclass
class Diag:
    """One diagnostic of a tool, with its notes; `render(filename)` prints it the MLIR way:
    `f.mlir:3:5: error: 'ca.yield' op must be nested directly in a 'ca.node'`."""

    severity: str
    line: int  # 0 when the location has no position
    col: int
    message: str
    notes: list = field(default_factory=list)

    def render(self, filename: str) -> str:
        """`filename:line:col: severity: message`, then each note on its own line."""
        lines = [f"{filename}:{self.line}:{self.col}: {self.severity}: {self.message}"]
        lines += [n.render(filename) for n in self.notes]
        return "\n".join(lines)


def from_location(loc, severity: str, message: str, notes=()) -> Diag:
    """A Diag at the first `"file":line:col` in `loc`'s text (line and col 0 when there is
    none, e.g. `loc(unknown)`)."""
    m = _FILE_LINE_COL.search(str(loc))
    line, col = (int(m.group(2)), int(m.group(3))) if m else (0, 0)
    return Diag(severity, line, col, message, list(notes))


def from_info(info) -> Diag:
    """From an `ir.DiagnosticInfo` (what `ir.MLIRError` carries)."""
    notes = [from_info(n) for n in info.notes]
    return from_location(info.location, _SEVERITY.get(info.severity, "error"), info.message, notes)


def from_diagnostic(d) -> Diag:
    """From a live `ir.Diagnostic` handed to a context's diagnostic handler."""
    notes = [from_diagnostic(n) for n in d.notes]
    return from_location(d.location, _SEVERITY.get(d.severity, "error"), str(d.message), notes)


def flatten(diags):
    """Yields each diagnostic followed by its notes (recursively), depth first."""
    for d in diags:
        yield d
        yield from flatten(d.notes)


_EXPECTED = re.compile(
    r"expected-(error|warning|note|remark)\s*(?:@([+-]\d+))?\s*\{\{(.*?)\}\}")


@dataclass
class Expectation:
    """One `expected-<severity>` comment: the text a diagnostic on `line` must contain.
    `comment_line` is where the comment is (for reporting); `matched` is set once a
    diagnostic meets it."""

    severity: str
    line: int
    text: str
    comment_line: int
    matched: bool = False


def expectations(text: str, first_line: int) -> list:
    """Finds `expected-*` comments in `text`, whose first line is `first_line` of the file."""
    found = []
    for offset, line in enumerate(text.splitlines()):
        lineno = first_line + offset
        for m in _EXPECTED.finditer(line):
            delta = int(m.group(2)) if m.group(2) else 0
            found.append(Expectation(m.group(1), lineno + delta, m.group(3), lineno))
    return found


def verify_expected(diags, expected, filename: str) -> list:
    """Returns error lines for unexpected diagnostics and unmet expectations."""
    problems = []
    for d in flatten(diags):
        match = next((e for e in expected if not e.matched and e.severity == d.severity
                      and e.line == d.line and e.text in d.message), None)
        if match:
            match.matched = True
        else:
            problems.append(f"{filename}:{d.line}:{d.col}: error: unexpected {d.severity}: {d.message}")
    for e in expected:
        if not e.matched:
            problems.append(f"{filename}:{e.comment_line}:1: error: expected {e.severity} "
                            f"\"{e.text}\" on line {e.line} was not produced")
    return problems
