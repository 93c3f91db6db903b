"""Writes docs/op-coverage.md: which route each aten op of the measured backwards takes to linalg.

    python test/python/gen_op_coverage.py            # rewrites docs/op-coverage.md
    python test/python/gen_op_coverage.py --stdout   # prints it instead
    python test/python/gen_op_coverage.py --opinfo-only   # only the OpInfo section, from the JSON

The last section, "OpInfo differential run", is rendered from docs/opinfo-run.json, the
JSON of a full run of test/python/opinfo_diff.py (see that section for the command).

Measured, not declared: every backward of lowering_cases.py (the zoo and the single-op
cases) is captured through camlir; each aten op of each node is then lowered alone, in a
function of its own, and classified by what happened:
- decomposed by camlir before import: the op's decomposition (capture/decompositions.py)
  ran during the re-trace (recorded by wrapping the table), so the op never reaches MLIR;
- torch-mlir lowers it directly: the op survives torch-mlir's backend-contract pipeline and
  its TorchToLinalg pattern converts it;
- torch-mlir decomposes it: the op is gone after that pipeline (torch-mlir's own
  DecomposeComplexOps); its pieces then lower;
- "+ scatter loops": the lowering left a `tm_tensor.scatter`, which camlir rewrites into
  `scf.for` loops over tensors (lowering/tm_tensor.py);
- extern: in EXTERN_OPS, called through torch at run time.
"""

import os
import re
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from torch_mlir import ir  # noqa: E402
from torch_mlir.dialects import func  # noqa: E402
from torch_mlir.passmanager import PassManager  # noqa: E402

import camlir.capture.retrace as retrace  # noqa: E402
from camlir.capture.decompositions import decomposition_table  # noqa: E402
from camlir.lowering import EXTERN_OPS, LoweringError, aten_name, lower_to_linalg  # noqa: E402
from camlir.lowering.dynamic_dims import pin_results, refine_transpose_inputs  # noqa: E402
from camlir.lowering.torch_to_linalg import _TORCH_BACKEND  # noqa: E402
from lowering_cases import KNOWN_GAPS, SINGLE_OPS, ZOO, captured_modules, single_op_modules  # noqa: E402
from node_funcs import outline_nodes  # noqa: E402

_FREE = ("torch.constant.", "torch.prim.ListConstruct")


def _recording_table(seen: set):
    """camlir's table with each decomposition noting its op in `seen` when it rewrites it.
    Several apply only to some calls (bf16/f16 tensors, a 0-d input, negative pads) and
    return NotImplemented otherwise: the op then stays, and is not counted."""
    def wrap(op, fn):
        def run(*args, **kwargs):
            out = fn(*args, **kwargs)
            if out is not NotImplemented:
                seen.add(str(op).removesuffix(".default"))
            return out
        return run
    table = {op: wrap(op, fn) for op, fn in decomposition_table().items()}
    return lambda: table


def _single_op_module(op: ir.Operation) -> ir.Module:
    """A module with one public function running `op` alone: its tensor (and symbolic
    scalar) operands become arguments, constants and constant lists are copied in."""
    args = []

    def collect(v):
        owner = v.owner
        if isinstance(owner, ir.OpView) and owner.operation.name.startswith(_FREE):
            for o in owner.operation.operands:
                collect(o)
        elif v not in args:
            args.append(v)

    for v in op.operands:
        collect(v)
    module = ir.Module.create()
    with ir.InsertionPoint(module.body):
        fn = func.FuncOp("f", ([a.type for a in args], [r.type for r in op.results]), visibility="public")
    block = fn.add_entry_block()
    mapping = dict(zip(args, block.arguments))

    def materialize(v):
        if v not in mapping:
            owner = v.owner.operation
            for o in owner.operands:
                materialize(o)
            copy = owner.clone(ir.InsertionPoint(block))
            for i, o in enumerate(owner.operands):
                copy.operands[i] = mapping[o]
            mapping[v] = copy.results[0]
        return mapping[v]

    operands = [materialize(v) for v in op.operands]
    copy = op.clone(ir.InsertionPoint(block))
    for i, v in enumerate(operands):
        copy.operands[i] = v
    with ir.InsertionPoint(block):
        func.ReturnOp(list(copy.results))
    return module


_ROUTES = {}  # single-op function text, sizes and constants blurred -> route


def _route(op: ir.Operation) -> str:
    name = aten_name(op)
    with op.context, ir.Location.unknown():
        module = _single_op_module(op)
    key = re.sub(r"\b\d+\b", "N", str(module))  # the route does not depend on static sizes
    if key not in _ROUTES:
        _ROUTES[key] = _classify(name, module)
    return _ROUTES[key]


def _classify(name: str, module: ir.Module) -> str:
    probe = ir.Module.parse(str(module), module.context)
    try:
        # As lower_to_linalg does, then only torch-mlir's backend-contract pipeline: is the
        # op still there (a direct TorchToLinalg pattern) or was it decomposed?
        refine_transpose_inputs(probe)
        pin_results(probe)
        with probe.context:
            PassManager.parse(_TORCH_BACKEND).run(probe.operation)
        kept = any(aten_name(o) == name for o in _walk(probe))
        lower_to_linalg(module)
    except (LoweringError, ir.MLIRError) as exc:
        return f"FAILS: {str(exc).splitlines()[0]}"
    route = "torch-mlir lowers it directly" if kept else "torch-mlir decomposes it"
    if any(o.name == "scf.for" for o in _walk(module)):
        route += " + scatter loops"
    return route


def _walk(module: ir.Module) -> list:
    found = []
    module.operation.walk(lambda o: found.append(o.operation) or ir.WalkResult.ADVANCE)
    return found


def measure_gaps() -> dict:
    """{case: first line of the error} for the backwards that do not lower."""
    gaps = {}
    for case in KNOWN_GAPS:
        for text in single_op_modules(case):
            module, _labels, _skipped = outline_nodes(text)
            try:
                lower_to_linalg(module)
            except LoweringError as exc:
                gaps[case] = str(exc).splitlines()[0]
        gaps.setdefault(case, "lowers now: move it to SINGLE_OPS")
    return gaps


def measure():
    """{op: {route: set of cases}}, {op: set of cases} for camlir's decompositions."""
    routes = defaultdict(lambda: defaultdict(set))
    decomposed = defaultdict(set)
    original = retrace.decomposition_table
    cases = [(f"zoo:{n}", lambda n=n: captured_modules(*ZOO[n])) for n in ZOO]
    cases += [(f"op:{n}", lambda n=n: single_op_modules(n)) for n in SINGLE_OPS]
    try:
        for case, capture in cases:
            seen = set()
            retrace.decomposition_table = _recording_table(seen)
            texts = capture()
            for op in seen:
                decomposed[op].add(case)
            for text in texts:
                module, _labels, skipped = outline_nodes(text)
                for _label, externs in skipped:  # nodes with an extern op are not outlined
                    for name in externs:
                        routes[name]["extern"].add(case)
                for op in _walk(module):
                    name = aten_name(op)
                    if name is not None:
                        routes[name][_route(op)].add(case)
    finally:
        retrace.decomposition_table = original
    return routes, decomposed


def _cases(cases: set) -> str:
    zoo = sorted(c[4:] for c in cases if c.startswith("zoo:"))
    ops = sorted(c[3:] for c in cases if c.startswith("op:"))
    parts = []
    if zoo:
        parts.append("zoo: " + ", ".join(zoo))
    if ops:
        parts.append("single-op: " + ", ".join(ops))
    return "; ".join(parts)


_DECOMPOSITION_NOTES = {
    "aten.native_layer_norm_backward": "reductions + elementwise",
    "aten.native_batch_norm_backward": "reductions + elementwise",
    "aten.embedding_dense_backward": "masked `_unsafe_index_put(accumulate=True)` (scatter loops)",
    "aten._unsafe_masked_index_put_accumulate": "`_unsafe_index_put(accumulate=True)`",
    "aten.index_add": "`index_put(accumulate=True)` (scatter loops)",
    "aten.slice_backward": "`new_zeros` + `slice_scatter`",
    "aten.select_backward": "`new_zeros` + `select_scatter`",
    "aten.silu_backward": "elementwise (sigmoid, mul, add)",
    "aten.native_group_norm_backward": "reductions + elementwise",
    "aten.mse_loss_backward": "elementwise",
    "aten.smooth_l1_loss_backward": "elementwise (where, sign)",
    # Rewritten so that eager's semantics survive torch-mlir's lowering (the reason for each
    # is in camlir/capture/decompositions.py):
    "aten.index_put": "the same op, negative indices wrapped first (`where(i < 0, i + size, i)`)",
    "aten._unsafe_index_put": "the same op, negative indices wrapped first (`where(i < 0, i + size, i)`)",
    "aten.threshold_backward": "`where(x <= threshold, 0, grad)` (NaN passes, as in eager)",
    "aten.clamp": "`where`s on `<`/`>` and `isnan` (NaN passes, as in eager)",
    "aten.hardtanh_backward": "`where` with eager's boundaries (0 at min_val and max_val)",
    "aten.leaky_relu_backward": "`where(x > 0, grad, grad * slope)`",
    "aten.softplus_backward": "elementwise with a `where` on the threshold (NaN passes)",
    "aten.gelu_backward": "elementwise, exact constants (approximate='tanh' only; the erf form lowers whole)",
    "aten.constant_pad_nd": "slices, then the non-negative pads (negative pads only)",
}

_EXTERN_NOTES = {
    "aten._scaled_dot_product_flash_attention_for_cpu_backward":
        "torch-mlir has no lowering and PyTorch no decomposition (the op recomputes attention "
        "blockwise from the saved logsumexp). Saved by the forward of SDPA / "
        "`nn.MultiheadAttention` on CPU; the backward graph can only contain what the forward "
        "saved for.",
}


def render(routes, decomposed, gaps) -> str:
    lines = [
        "# Op coverage: how each aten op of the backward reaches linalg",
        "",
        "Generated by `python test/python/gen_op_coverage.py` from what it measured on the",
        "backwards of `test/python/lowering_cases.py` (the capture zoo and single-op cases);",
        "do not edit by hand. Each op was lowered alone, in a function of its own, with",
        "`camlir.lowering.lower_to_linalg`. `test/python/test_lowering_coverage.py` checks that",
        "every node of those backwards lowers.",
        "",
        "Routes:",
        "- **decomposed by camlir**: `camlir/capture/decompositions.py` rewrites the op while the",
        "  backward is re-traced (PyTorch's decomposition), because torch-mlir cannot lower it;",
        "- **torch-mlir lowers it directly**: a TorchToLinalg pattern converts it;",
        "- **torch-mlir decomposes it**: torch-mlir's own decompositions (DecomposeComplexOps)",
        "  rewrite it into ops it lowers;",
        "- **+ scatter loops**: the lowering goes through `tm_tensor.scatter`, which camlir",
        "  rewrites into `scf.for` loops over tensors with `tensor.extract`/`tensor.insert`",
        "  (`camlir/lowering/tm_tensor.py`): sequential, naive code;",
        "- **extern**: stays outside the JIT kernels and is called through torch at run time",
        "  (`EXTERN_OPS`).",
        "",
        "## Decomposed by camlir before import",
        "",
        "| aten op | becomes | used by |",
        "|---|---|---|",
    ]
    for op in sorted(decomposed):
        lines.append(f"| `{op}` | {_DECOMPOSITION_NOTES.get(op, '')} | {_cases(decomposed[op])} |")
    lines += ["", "## Extern: called through torch at run time", "", "| aten op | why | used by |", "|---|---|---|"]
    for op in sorted(EXTERN_OPS):
        used = set().union(*routes[op].values()) if op in routes else set()
        lines.append(f"| `{op}` | {_EXTERN_NOTES.get(op, '')} | {_cases(used) or 'not seen'} |")
    lines += ["", "## Lowered by torch-mlir", "", "| aten op | route | used by |", "|---|---|---|"]
    for op in sorted(routes):
        if op in EXTERN_OPS:
            continue
        for route in sorted(routes[op]):
            lines.append(f"| `{op}` | {route} | {_cases(routes[op][route])} |")
    lines += [
        "",
        "## What the lowered code looks like (for the JIT)",
        "",
        "- `aten.mm` / `aten.bmm` become `linalg.matmul` / `linalg.batch_matmul`; a transposed",
        "  operand (`aten.t`, `aten.transpose.int`) is a `linalg.transpose` first. The cpu",
        "  backend's blas stage turns both into MKL calls (`sgemm_`, `sgemm_batch_`), the",
        "  transposes into BLAS's flags ([cpu-backend.md](cpu-backend.md)).",
        "- `aten.convolution_backward` becomes, by torch-mlir's decomposition, `aten.convolution`s:",
        "  `linalg.conv_2d_nchw_fchw` with `linalg.transpose`, `tensor.pad`, and for the input",
        "  gradient a kernel flip (a `linalg.generic` gathering with `tensor.extract`). That is",
        "  what this page measures; compiled programs keep convolutions (and max-pool's",
        "  backward) on the host, through torch's oneDNN kernels, because the loops were much",
        "  slower (`SLOW_WHEN_LOWERED` in `passes/outline_kernels.py`). The exception: a",
        "  depthwise backward with at most 16 output positions, where torch's CPU kernel is slow,",
        "  becomes a camlir kernel of two window loops",
        "  (`passes/depthwise_kernels.py`; none of the cases here is one).",
        "- Scatter loops (`+ scatter loops` above) are sequential `scf.for` nests with scalar",
        "  `tensor.extract`/`tensor.insert`: correct with repeated indices, but naive code.",
        "- With dynamic dims, torch-mlir adds run-time size checks (`cf.assert`).",
        "",
        "## Known gaps (outside the zoo)", "",
              "Single-op backwards of `KNOWN_GAPS` that do not lower yet, with the error's first line.",
              "", "| case | error |", "|---|---|"]
    for case in sorted(gaps):
        lines.append(f"| {case} | {gaps[case]} |")
    return "\n".join(lines) + "\n"


OPINFO_JSON = os.path.join(os.path.dirname(os.path.dirname(HERE)), "docs", "opinfo-run.json")
OPINFO_HEADING = "## OpInfo differential run"


def _cell(text, limit=300) -> str:
    text = " ".join(str(text).removeprefix("falling back to PyTorch for this backward: ").split())
    if len(text) > limit:
        text = text[:limit - 3] + "..."
    return text.replace("|", "\\|")


def render_opinfo(report: dict) -> str:
    """The "OpInfo differential run" section from the JSON that opinfo_diff.py wrote."""
    from collections import Counter

    summary, results = report["summary"], report["results"]
    samples, ops = summary["samples"], summary["ops"]
    routes = ("native", "host-op", "fallback", "interpreted", "WRONG", "CRASH")
    lines = [
        OPINFO_HEADING, "",
        "Every OpInfo of PyTorch's `op_db` with float32 autograd on the CPU, its backward run through",
        "camlir and compared with eager by `test/python/opinfo_diff.py` (gradients of every leaf,",
        f"`assert_close(rtol={report['rtol']}, atol={report['atol']})`, loss `sum((out * w).sum())` with fixed random `w`).",
        "Generated from `docs/opinfo-run.json` by `python test/python/gen_op_coverage.py --opinfo-only`;",
        "`test/python/test_opinfo_subset.py` runs a fixed subset of common ops in CI.",
        "",
        f"- command: `{report['command'].strip()}`",
        f"- started {report['date']} at commit {report['commit']}"
        + (f" (the work tree was at {report['commit_end']} when it ended)"
           if report.get("commit_end", report["commit"]) != report["commit"] else "")
        + f"; torch {report['torch']}; backend `{report['backend']}`",
        f"- at most {report['samples_per_op']} samples per op (the first ones `sample_inputs` gives that have a",
        f"  tensor requiring grad); wall time {report['wall_seconds'] / 60:.1f} min on the 2-core development machine",
        "",
        f"**Native share: {summary['native_share']:.3f}** ({samples['native']} of {summary['tested_samples']} tested samples"
        f" ran all-native kernels); compiled share (native + host-op): {summary['compiled_share']:.3f};"
        f" ops whose every sample is native: {ops['native']} of {summary['tested_ops']} ({summary['native_share_ops']:.3f}).",
        "",
        "Routes, worst first for an op (an op counts under its worst sample):",
        "- **WRONG**: a gradient differs from eager, or one side has a gradient the other has not;",
        "- **CRASH**: the backward raised through camlir, the process died (segfault, abort) or a",
        "  sample ran past the time limit;",
        "- **fallback**: camlir gave the graph back to PyTorch (`counters[\"fallbacks\"]`, the warning's reason);",
        "- **interpreted**: the cpu backend could not compile it and ran the reference interpreter;",
        "- **host-op**: compiled, with some aten ops kept in the host function and run through torch;",
        "- **native**: compiled, every aten op inside native kernels.",
        "",
        "Rerun one op with `python test/python/opinfo_diff.py --ops OP`, one sample in process (camlir's",
        "logs on) with `--repro OP:INDEX`; INDEX is the sample's position in `op.sample_inputs`.",
        "",
        "| route | samples | ops |", "|---|---|---|",
    ]
    for r in routes:
        lines.append(f"| {r} | {samples[r]} | {ops[r]} |")
    lines.append(f"| skipped (not tested) | {summary['skipped_samples']} | {ops['skipped']} |")

    def listed(route):
        rows = []
        for res in results:
            hits = [s for s in res["samples"] if s["route"] == route]
            if not hits and res["route"] == route and not res["samples"]:
                hits = [{"index": "?", "sample": "", "reason": res.get("reason", "")}]
            for s in hits:
                reason = s.get("reason", "")
                if route == "WRONG" and "max_abs_error" in s:
                    reason += f" (max abs error {s['max_abs_error']:.3g}" + \
                        ("; passes at 10x the tolerance)" if s.get("tolerance_only") else ")")
                rows.append(f"| `{res['op']}` | {s['index']}: {_cell(s.get('sample', ''))} | {_cell(reason)} |")
        return rows

    for route, title in (("WRONG", "WRONG: gradients that differ from eager"),
                         ("CRASH", "CRASH"),
                         ("fallback", "Fallbacks to PyTorch"),
                         ("interpreted", "Interpreted (the cpu backend could not compile)")):
        rows = listed(route)
        lines += ["", f"### {title}", ""]
        lines += (["| op | sample | reason |", "|---|---|---|"] + rows) if rows else ["None."]

    host = {}
    for res in results:
        for s in res["samples"]:
            if s["route"] == "host-op":
                for name in s.get("host_ops", []):
                    host.setdefault(name, set()).add(res["op"])
    lines += ["", "### Aten ops kept on the host (host-op samples)", "",
              "| aten op | OpInfo ops |", "|---|---|"]
    for name in sorted(host, key=lambda n: (-len(host[n]), n)):
        lines.append(f"| `{name}` | {len(host[name])}: {', '.join(sorted(host[name]))} |")

    skipped = Counter()
    for res in results:
        if res["route"] == "skipped" and not res["samples"]:
            skipped[res.get("reason", "")] += 1
        for s in res["samples"]:
            if s["route"] == "skipped":
                skipped[s["reason"].split(":")[0]] += 1
    lines += ["", "### Skipped, by reason", "",
              "Samples (or whole ops, when none of their samples could be tested) left out of the counts.", ""]
    if not skipped:
        lines.append("None.")
    else:
        lines += ["| reason | count |", "|---|---|"]
        lines += [f"| {_cell(reason)} | {n} |" for reason, n in skipped.most_common()]
    return "\n".join(lines) + "\n"


def opinfo_section() -> str:
    if not os.path.exists(OPINFO_JSON):
        return ""
    import json
    with open(OPINFO_JSON) as f:
        return "\n" + render_opinfo(json.load(f))


def main(argv) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--opinfo-only", action="store_true",
                    help="only the OpInfo section, from docs/opinfo-run.json (no measuring)")
    ap.add_argument("--stdout", action="store_true", help="print the page instead of writing it")
    args = ap.parse_args(argv)  # an unknown option (or --help) used to rewrite the whole page
    path = os.path.join(os.path.dirname(os.path.dirname(HERE)), "docs", "op-coverage.md")
    if args.opinfo_only:  # keep the measured sections, replace the OpInfo one
        with open(path) as f:
            text = f.read().split("\n" + OPINFO_HEADING)[0].rstrip("\n") + "\n" + opinfo_section()
    else:
        text = render(*measure(), measure_gaps()) + opinfo_section()
    if args.stdout:
        sys.stdout.write(text)
    else:
        with open(path, "w") as f:
            f.write(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
