"""ca-opt: an mlir-opt for the `ca` dialect, the torch dialect and upstream MLIR.

    ca-opt [input.mlir|-] [-o out] [--pass-pipeline='builtin.module(...)' | --<pass>[=opts] ...]
           [--split-input-file] [--verify-diagnostics] [--mlir-print-ir-after-all]
           [--mlir-print-op-generic] [--mlir-print-debuginfo] [--list-passes]

Passes given as flags run in command-line order; `--ca-flatten-nodes=keep-provenance=false`
sets an option (MLIR's `--canonicalize="max-iterations=3"` form). Every failure (a file that
cannot be read, malformed IR, an unknown op or pass, a verifier) is reported as
`file:line:col: error: ...` with exit status 1.
"""

import argparse
import sys
import traceback

from torch_mlir import ir

from camlir import environment
from camlir.context import make_context
from camlir.dialects.ca import verify as verify_ca
from camlir.passes import PASSES, PipelineError, build_pass_manager, parse_pipeline
from camlir.passes.pipeline import Element

from . import diagnostics as dg

SPLIT_MARKER = "// -----"
PIPELINE_NAME = "<pass-pipeline>"


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message):  # argparse exits with 2; every ca-opt failure exits with 1
        raise _Failure(f"ca-opt: error: {message}")


def _arg_parser() -> argparse.ArgumentParser:
    p = _ArgumentParser(
        prog="ca-opt", allow_abbrev=False,
        description="Parse, verify, transform and print MLIR in the ca, torch and upstream dialects.",
        epilog="Passes: any camlir pass (see --list-passes) or upstream MLIR pass, either as "
               "--<pass>[=options] flags in order or as one --pass-pipeline.\n\n" + _pass_list(),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", nargs="?", default="-", help="input file ('-' or nothing: stdin)")
    p.add_argument("-o", dest="output", default="-", help="output file (default: stdout)")
    p.add_argument("--pass-pipeline", help="textual pipeline, e.g. 'builtin.module(ca-flatten-nodes,cse)'")
    p.add_argument("--split-input-file", action="store_true",
                   help=f"treat each '{SPLIT_MARKER}'-separated chunk as its own input")
    p.add_argument("--verify-diagnostics", action="store_true",
                   help="check diagnostics against expected-error/warning/note/remark comments")
    p.add_argument("--mlir-print-ir-after-all", action="store_true", help="print the IR after every pass (stderr)")
    p.add_argument("--mlir-print-op-generic", action="store_true", help="print ops in generic form")
    p.add_argument("--mlir-print-debuginfo", action="store_true", help="print locations")
    p.add_argument("--allow-unregistered-dialect", action="store_true", help="accept unknown ops")
    p.add_argument("--list-passes", action="store_true", help="list camlir passes and exit")
    return p


def _pass_list() -> str:
    lines = ["camlir passes:"]
    for cls in PASSES:
        lines.append(f"  --{cls.argument}  {cls.summary}")
        for f in cls.options():
            default = f.default if not isinstance(f.default, bool) else str(f.default).lower()
            lines.append(f"      {f.name.replace('_', '-')}={default}  ({_type_name(f.type)})")
    lines.append("Upstream MLIR and torch-mlir passes are accepted by name as well "
                 "(canonicalize, cse, inline, linalg-fuse-elementwise-ops, ...).")
    return "\n".join(lines)


def _type_name(t) -> str:
    return t if isinstance(t, str) else t.__name__


class _Failure(Exception):
    """A reported error: the message is already in `file:line:col: error:` form."""


def _pass_flags_to_elements(flags: list) -> list:
    elements = []
    for flag in flags:
        if not flag.startswith("-") or flag in ("-", "--"):
            raise _Failure(f"ca-opt: error: unexpected argument '{flag}'")
        body = flag.lstrip("-")
        name, eq, opts = body.partition("=")
        text = f"{name}{{{opts}}}" if eq else name
        elements.append(Element(name=name, column=1, options=opts if eq else None, text=text))
    return elements


def _read_input(path: str) -> tuple[str, str]:
    if path == "-":
        return "<stdin>", sys.stdin.read()
    try:
        with open(path, encoding="utf-8") as f:
            return path, f.read()
    except OSError as exc:
        raise _Failure(f"{path}:0:0: error: could not open input file: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise _Failure(f"{path}:0:0: error: input is not UTF-8 text: {exc.reason}") from None


def _chunks(text: str, split: bool):
    """Yields (first line number, chunk text). Line numbers stay those of the whole file."""
    if not split:
        yield 1, text
        return
    start, current = 1, []
    for lineno, line in enumerate(text.splitlines(keepends=True), start=1):
        if line.strip() == SPLIT_MARKER:
            yield start, "".join(current)
            start, current = lineno + 1, []
        else:
            current.append(line)
    yield start, "".join(current)


class _Session:
    def __init__(self, args, elements):
        self.args = args
        self.elements = elements

    def run_chunk(self, filename: str, first_line: int, text: str) -> tuple:
        """Parses, verifies, transforms one chunk. Returns (printed IR or None, diagnostics)."""
        allow = self.args.allow_unregistered_dialect
        ctx = make_context()
        handled = []

        def handler(d):
            handled.append(dg.from_diagnostic(d))
            return True

        ctx.attach_diagnostic_handler(handler)
        # Leading newlines make the parser's line numbers those of the whole file.
        source = "\n" * (first_line - 1) + text
        with ctx, ir.Location.unknown():
            try:
                module = ir.Module.parse(source)
            except ir.MLIRError as exc:
                return None, handled + [dg.from_info(i) for i in exc.error_diagnostics]
            problems = verify_ca(module.operation, allow)
            if problems:
                return None, handled + [_problem_diag(p) for p in problems]
            if self.elements:
                pm = build_pass_manager(self.elements, ctx, allow_unregistered=allow)
                if self.args.mlir_print_ir_after_all:
                    pm.enable_ir_printing(print_after_all=True)
                try:
                    pm.run(module.operation)
                except ir.MLIRError as exc:
                    return None, handled + [dg.from_info(i) for i in exc.error_diagnostics]
                problems = verify_ca(module.operation, allow)
                if problems:
                    return None, handled + [_problem_diag(p) for p in problems]
            asm = module.operation.get_asm(print_generic_op_form=self.args.mlir_print_op_generic,
                                           enable_debug_info=self.args.mlir_print_debuginfo)
            return asm, handled


def _problem_diag(problem) -> "dg.Diag":
    return dg.from_location(problem.location, "error", problem.message)


def _split_argv(parser, argv: list) -> tuple[list, list]:
    """Separates ca-opt's own options from pass flags, before argparse sees them.

    argparse would read `-one-shot-bufferize` as `-o ne-shot-bufferize`, so a token is
    ours only if its name (before any `=`) is exactly one of our option strings.
    """
    ours = {s for a in parser._actions for s in a.option_strings}
    takes_value = {s for a in parser._actions for s in a.option_strings if a.nargs is None and a.const is None
                   and not isinstance(a, (argparse._StoreTrueAction, argparse._HelpAction))}
    mine, passes, i = [], [], 0
    while i < len(argv):
        tok = argv[i]
        name = tok.split("=", 1)[0]
        if tok.startswith("-") and tok != "-" and name not in ours:
            passes.append(tok)
        else:
            mine.append(tok)
            if name in takes_value and "=" not in tok and i + 1 < len(argv):
                mine.append(argv[i + 1])
                i += 1
        i += 1
    return mine, passes


def run(argv: list) -> int:
    """Runs ca-opt on `argv` (without the program name) and returns its exit status: 0, or
    1 when a diagnostic was an error or `--verify-diagnostics` found a mismatch.

    Diagnostics go to stderr and the output to `-o` (stdout by default). Raises `_Failure`
    for a bad command line, an unreadable input, an unwritable output or a bad
    pipeline (`main` prints it).
    """
    parser = _arg_parser()
    mine, extra = _split_argv(parser, argv)
    args = parser.parse_args(mine)
    if args.list_passes:
        print(_pass_list())
        return 0
    flags = _pass_flags_to_elements(extra)
    if args.pass_pipeline and flags:
        raise _Failure("ca-opt: error: give passes either as flags or as --pass-pipeline, not both")
    if args.pass_pipeline is not None:
        try:
            elements = parse_pipeline(args.pass_pipeline)
        except PipelineError as exc:
            raise _Failure(f"{PIPELINE_NAME}:1:{exc.column}: error: {exc}") from None
    else:
        elements = flags

    filename, text = _read_input(args.input)
    # Check the pipeline once, before any input is transformed.
    try:
        build_pass_manager(elements, make_context())
    except PipelineError as exc:
        where = f"{PIPELINE_NAME}:1:{exc.column}" if args.pass_pipeline else f"{PIPELINE_NAME}:1:1"
        raise _Failure(f"{where}: error: {exc}") from None

    session = _Session(args, elements)
    outputs, failed = [], False
    for first_line, chunk in _chunks(text, args.split_input_file):
        asm, diags = session.run_chunk(filename, first_line, chunk)
        if args.verify_diagnostics:
            problems = dg.verify_expected(diags, dg.expectations(chunk, first_line), filename)
            for p in problems:
                print(p, file=sys.stderr)
            failed |= bool(problems)
        else:
            for d in diags:
                print(d.render(filename), file=sys.stderr)
            failed |= any(d.severity == "error" for d in diags)
        if asm is not None:
            outputs.append(asm)

    _write_output(args.output, (SPLIT_MARKER + "\n").join(outputs))
    return 1 if failed else 0


def _write_output(path: str, text: str) -> None:
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise _Failure(f"{path}:0:0: error: could not write output file: {exc.strerror}") from None


def main(argv=None) -> int:
    """The `ca-opt` entry point: `run`s `argv` (default `sys.argv[1:]`) and exits the process
    with its status, never with a traceback (1 for any failure, 130 on Ctrl-C;
    `CAMLIR_OPT_TRACEBACK=1` prints the traceback of an internal error)."""
    try:
        code = run(sys.argv[1:] if argv is None else argv)
    except _Failure as exc:
        print(str(exc), file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        code = 130
    except Exception as exc:  # never a bare traceback for users; CAMLIR_OPT_TRACEBACK=1 shows it
        if environment.flag("CAMLIR_OPT_TRACEBACK"):
            traceback.print_exc()
        print(f"ca-opt: error: internal error: {exc!r} (set CAMLIR_OPT_TRACEBACK=1 for details)",
              file=sys.stderr)
        code = 1
    sys.exit(code)


if __name__ == "__main__":
    main()
