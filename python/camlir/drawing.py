"""A picture of a captured backward: `camlir.draw(path)` and `python -m camlir.drawing`.

The SVG shows the `ca` module's autograd nodes (`ca.node`, named as PyTorch names them:
`AddmmBackward0#2`), Python hooks (`ca.hook`), calls back into Python (`ca.call_python`)
and accumulations into `.grad` (`ca.accumulate_grad`), with arrows where gradients flow.
Each node says what became of its ops in the cpu program:
- in a native kernel: boxes filled with that kernel's color and its name (`@backward_kernel_0`);
- kept on the host, run through torch (`ca.host_ops`): red border, the op names;
- a hook traced and inlined into a kernel, or left a Python call (orange);
- a node from an AOT-compiled region (`aot` attribute): dashed border, `aot<N>` in the label.

Which op went where comes from `ca.provenance`, the attribute `ca-flatten-nodes` puts on
every op (`"AddmmBackward0#2"`): the kernels' torch-dialect twins (`@<kernel>__torch`) in
the module after the linalg stage (`program.lowered_text`) carry it, and so do ops left
on the host. Without a compiled program (eager backend, a module file), the `kernels` and
`linalg` stages are run on a copy, with no hook traced (every hook stays a Python call),
and the picture says so.

Layout: layers are networkx's topological generations of the flow graph (loss at the top,
accumulations at the bottom), ordered within a layer by the mean position of their
predecessors; the SVG is written here (boxes, labels, arrows, a legend). networkx comes
with torch; graphviz would need a `dot` binary, which CI does not have.

    python -m camlir.drawing module.mlir out.svg [--lowered linalg.mlir]

draws a `ca` module file (e.g. `CA_DUMP_DIR`'s `*-import.mlir`; `--lowered`: that graph's
`*-linalg.mlir`, instead of running the stages). The module is `drawing`, not `draw`: a
submodule named like the function `camlir.draw` would replace it on the package once imported.
"""

import argparse
import re
import sys
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

import networkx as nx
from torch_mlir import ir

from . import compiled, pipeline
from .stages import Dump
from .context import make_context
from .dialects.ca.ir_helpers import func_name, funcs, is_kernel, require_func, torch_op_name

_TAG = re.compile(r"^(?:aot(\d+):)?(.+)#(\d+)$")
_SKIP_HOST = ("torch_c.", "torch.constant.", "torch.prim.ListConstruct", "func.", "ca.", "arith.constant")
PALETTE = ["#cfe2f3", "#d9ead3", "#fff2cc", "#ead1dc", "#d0e0e3", "#e6d8f0", "#fce5cd", "#dfe8c8"]
HOOK_FILL, HOST_FILL, ACC_FILL, PLAIN_FILL = "#f9cb9c", "#f4cccc", "#b6d7a8", "#eeeeee"


@dataclass
class Item:
    """One box: an autograd node, a hook, a Python call or an accumulation."""

    key: str                 # "n3", "h0", "a2", "p1"
    kind: str                # "node", "hook", "call", "accumulate"
    label: str               # "AddmmBackward0#2", "hook 0 (tensor_pre_hook)", ...
    tag: str = ""            # the ca.provenance tag of its ops ("aot0:MmBackward0#4"; "hook#0")
    aot: object = None       # AOT region number, or None
    kernels: list = field(default_factory=list)     # kernels its ops went into
    host_ops: list = field(default_factory=list)    # op names it left on the host
    python: bool = False     # a hook that stays a Python call
    detail: str = ""         # the second line


@dataclass
class Picture:
    """What `to_svg` draws: the items, the flow edges, the kernels and where they came from."""

    items: dict
    edges: list
    kernels: list            # kernel names, in module order
    source: str              # where the kernel assignment came from (subtitle)
    title: str = "captured backward"
    loose_host_ops: list = field(default_factory=list)  # host ops no node claims


def picture(module_text: str, lowered_text=None, title: str = "captured backward", source: str = "",
            names=None) -> Picture:
    """The picture of a `ca` module (text). `lowered_text`: the module after the linalg
    stage (`program.lowered_text`); None runs the kernels and linalg stages on a copy.
    `names`: {argument number: name} ("2.bias") for the tensors accumulated into."""
    context = make_context()
    module = ir.Module.parse(module_text, context)
    items, edges = _flow(module, names or {})
    if lowered_text is None:
        lowered_text, source = _lower(module_text, context)
    kernels, loose = [], []
    if lowered_text:
        kernels, loose = _assign(ir.Module.parse(lowered_text, context), items)
    for item in items.values():
        _describe(item)
    return Picture(items, edges, kernels, source or "kernels of the compiled cpu program", title, loose)


def _flow(module, names: dict) -> tuple:
    """The boxes of `@backward` and the edges between them (through any op in between)."""
    block = require_func(module, "backward").regions[0].blocks[0]
    items, owner = {}, {}
    for i, op in enumerate(block.operations):
        op = op.operation
        attrs = op.attributes
        if op.name == "ca.node":
            name, index = ir.StringAttr(attrs["node"]).value, ir.IntegerAttr(attrs["index"]).value
            aot = ir.IntegerAttr(attrs["aot"]).value if "aot" in attrs else None
            tag = (f"aot{aot}:" if aot is not None else "") + f"{name}#{index}"
            item = Item(f"n{i}", "node", f"{name}#{index}", tag, aot)
        elif op.name == "ca.hook":
            hook_id, kind = ir.IntegerAttr(attrs["hook_id"]).value, ir.StringAttr(attrs["kind"]).value
            item = Item(f"h{i}", "hook", f"hook {hook_id} ({kind})", f"hook#{hook_id}", python=True)
        elif op.name == "ca.call_python":
            item = Item(f"p{i}", "call", f"Python call {ir.StringAttr(attrs['callee']).value}", python=True)
        elif op.name == "ca.accumulate_grad":
            arg = op.operands[0]
            if isinstance(arg, ir.BlockArgument):
                number = ir.BlockArgument(arg).arg_number
                what = names.get(number, f"arg{number}")
            else:
                what = "a tensor"
            shape = re.search(r"<\[([^\]]*)\]", str(arg.type))
            item = Item(f"a{i}", "accumulate", "accumulate_grad",
                        detail=f".grad of {what}" + (f" [{shape.group(1)}]" if shape else ""))
        else:
            owner[op] = None  # not drawn: edges pass through it
            continue
        items[item.key] = item
        owner[op] = item.key
    edges, memo = set(), {}

    def sources(value) -> set:
        if not isinstance(value, ir.OpResult):
            return set()
        op = value.owner.operation
        if owner.get(op):
            return {owner[op]}
        if op not in memo:
            memo[op] = set()
            memo[op] = set().union(*[sources(v) for v in op.operands]) if len(op.operands) else set()
        return memo[op]

    for op in block.operations:
        key = owner.get(op.operation)
        if key:
            for v in op.operands:
                edges.update((s, key) for s in sources(v) if s != key)
    return items, sorted(edges)


def _lower(module_text: str, context) -> tuple:
    """The module after the kernels and linalg stages (no hook traced), and what it is."""
    module = ir.Module.parse(module_text, context)
    work = pipeline.Work(module, [], [], Dump("draw"), pipeline.STATIC, module=module)
    try:
        with context, ir.Location.unknown():
            pipeline.kernels(work)
    except Exception as exc:  # noqa: BLE001 - the picture still shows the nodes
        return "", f"no kernels: the kernels stage failed ({type(exc).__name__})"
    after_kernels = str(module)
    try:
        with context, ir.Location.unknown():
            pipeline.linalg(work)
    except Exception as exc:  # noqa: BLE001
        return after_kernels, f"kernels as outlined, before lowering (the linalg stage failed: {type(exc).__name__})"
    return str(module), "kernels as the cpu backend forms them with no hook traced (stages kernels, linalg)"


def _assign(lowered, items: dict) -> tuple:
    """Marks each item with the kernels and host ops its provenance tag appears in;
    returns the kernel names and the host ops no item claims."""
    by_tag = {}
    for item in items.values():
        if item.tag:
            by_tag.setdefault(item.tag, []).append(item)
    kernels = [func_name(fn) for fn in funcs(lowered, is_kernel)]
    twins = {ir.StringAttr(fn.attributes["ca.torch_twin"]).value: fn
             for fn in funcs(lowered, lambda fn: "ca.torch_twin" in fn.attributes)}
    for name in kernels:
        fn = twins.get(name) or next(f for f in funcs(lowered, is_kernel) if func_name(f) == name)
        for tag in sorted(_tags(fn)):
            for item in by_tag.get(tag, ()):
                if name not in item.kernels:
                    item.kernels.append(name)
                item.python = False  # an inlined hook
    loose = []
    for op in require_func(lowered, "backward").regions[0].blocks[0].operations:
        op = op.operation
        if op.name.startswith(_SKIP_HOST):
            continue
        tag = ir.StringAttr(op.attributes["ca.provenance"]).value if "ca.provenance" in op.attributes else ""
        claimed = by_tag.get(tag, [])
        for item in claimed:
            item.host_ops.append(torch_op_name(op).removeprefix("torch."))
        if not claimed:
            loose.append(torch_op_name(op).removeprefix("torch."))
    return kernels, loose


def _tags(fn) -> set:
    found = set()

    def visit(op):
        if "ca.provenance" in op.attributes:
            found.add(ir.StringAttr(op.attributes["ca.provenance"]).value)
        return ir.WalkResult.ADVANCE

    fn.walk(visit)
    return found


def _describe(item: Item) -> None:
    if item.kind == "accumulate":
        return
    parts = []
    if item.kernels:
        parts.append(("inlined into " if item.kind == "hook" else "") + ", ".join(f"@{k}" for k in item.kernels))
    if item.host_ops:
        parts.append("host: " + ", ".join(sorted(set(item.host_ops))))
    if item.python:
        parts.append("Python call")
    item.detail = "; ".join(parts) or ("no compute" if item.kind == "node" else "")
    if item.aot is not None:
        item.detail = f"aot{item.aot} · " + item.detail


# --------------------------------------------------------------------------- layout and SVG

BOX_H, LAYER_GAP, BOX_GAP, MARGIN, CHAR_W = 38, 34, 18, 20, 6.6


def layout(pic: Picture) -> dict:
    """key -> (x, y, width) of each box: topological generations as layers, each ordered
    by the mean x of its predecessors (one sweep down), centered."""
    g = nx.DiGraph()
    g.add_nodes_from(pic.items)
    g.add_edges_from(pic.edges)
    widths = {k: max(len(it.label), len(it.detail)) * CHAR_W + 16 for k, it in pic.items.items()}
    layers = [sorted(layer, key=lambda k: int(k[1:])) for layer in nx.topological_generations(g)]
    x_center = {}
    rows = []
    for layer in layers:
        def where(k):
            preds = [x_center[p] for p in g.predecessors(k) if p in x_center]
            return sum(preds) / len(preds) if preds else float(int(k[1:]))
        if x_center:
            layer.sort(key=where)
        total = sum(widths[k] for k in layer) + BOX_GAP * (len(layer) - 1)
        rows.append((layer, total))
        x = -total / 2
        for k in layer:
            x_center[k] = x + widths[k] / 2
            x += widths[k] + BOX_GAP
    widest = max((total for _, total in rows), default=0)
    pos = {}
    for depth, (layer, total) in enumerate(rows):
        x = MARGIN + (widest - total) / 2
        for k in layer:
            pos[k] = (x, MARGIN + 56 + depth * (BOX_H + LAYER_GAP), widths[k])
            x += widths[k] + BOX_GAP
    return pos


def _fill(item: Item, colors: dict) -> str:
    if item.kind == "accumulate":
        return ACC_FILL
    if item.python:
        return HOOK_FILL
    if item.kernels:
        return colors[item.kernels[0]]
    return HOST_FILL if item.host_ops else PLAIN_FILL


def _classes(item: Item) -> str:
    names = {"node": "ca-node", "hook": "hook", "call": "python-call", "accumulate": "accumulate"}
    out = [names[item.kind]]
    if item.kernels:
        out.append("inlined-hook kernel" if item.kind == "hook" else "kernel")
    if item.host_ops:
        out.append("host-op")
    if item.python:
        out.append("python-hook" if item.kind == "hook" else "python")
    if item.aot is not None:
        out.append("aot")
    return " ".join(out)


def to_svg(pic: Picture) -> str:
    """The SVG text of a picture."""
    pos = layout(pic)
    colors = {k: PALETTE[i % len(PALETTE)] for i, k in enumerate(pic.kernels)}
    legend = _legend(pic, colors)
    width = max([x + w for x, _, w in pos.values()] + [300]) + MARGIN
    graph_bottom = max([y + BOX_H for _, y, _ in pos.values()] + [60])
    height = graph_bottom + 30 + 18 * len(legend) + MARGIN
    width = max(width, max((len(text) for _, text, _ in legend), default=0) * CHAR_W + 60)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="monospace" font-size="11">',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#555"/></marker></defs>',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text class="title" x="{MARGIN}" y="{MARGIN + 12}" font-size="14" font-weight="bold">'
           f'{escape(pic.title)}</text>',
           f'<text class="subtitle" x="{MARGIN}" y="{MARGIN + 30}">{escape(pic.source)}</text>']
    for a, b in pic.edges:
        (xa, ya, wa), (xb, yb, wb) = pos[a], pos[b]
        x1, y1, x2, y2 = xa + wa / 2, ya + BOX_H, xb + wb / 2, yb
        mid = (y1 + y2) / 2
        out.append(f'<path class="edge" d="M {x1:.1f} {y1:.1f} C {x1:.1f} {mid:.1f}, {x2:.1f} {mid:.1f}, '
                   f'{x2:.1f} {y2:.1f}" fill="none" stroke="#777" marker-end="url(#arrow)"/>')
    for key, item in pic.items.items():
        x, y, w = pos[key]
        stroke = "#cc0000" if item.host_ops else "#333"
        dash = ' stroke-dasharray="5,3"' if item.aot is not None else ""
        rx = 12 if item.kind == "accumulate" else 3
        kernel = f' data-kernel="{escape(",".join(item.kernels))}"' if item.kernels else ""
        out.append(f'<g class="{_classes(item)}" data-label="{escape(item.label)}"{kernel}>'
                   f'<title>{escape(item.label + ": " + item.detail)}</title>'
                   f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{BOX_H}" rx="{rx}" '
                   f'fill="{_fill(item, colors)}" stroke="{stroke}" stroke-width="{2 if item.host_ops else 1}"{dash}/>'
                   f'<text x="{x + w / 2:.1f}" y="{y + 15:.1f}" text-anchor="middle" font-weight="bold">'
                   f'{escape(item.label)}</text>'
                   f'<text x="{x + w / 2:.1f}" y="{y + 30:.1f}" text-anchor="middle">{escape(item.detail)}</text></g>')
    y = graph_bottom + 30
    for cls, text, fill in legend:
        stroke = ' stroke="#cc0000" stroke-width="2"' if cls == "legend-host" else ' stroke="#333"'
        dash = ' stroke-dasharray="5,3"' if cls == "legend-aot" else ""
        out.append(f'<g class="legend {cls}"><rect x="{MARGIN}" y="{y - 10}" width="24" height="12" '
                   f'fill="{fill}"{stroke}{dash}/><text x="{MARGIN + 32}" y="{y}">{escape(text)}</text></g>')
        y += 18
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _legend(pic: Picture, colors: dict) -> list:
    rows = []
    for k in pic.kernels:
        members = [it.label for it in pic.items.values() if k in it.kernels]
        shown = ", ".join(members[:6]) + (f", ... ({len(members)} in all)" if len(members) > 6 else "")
        rows.append(("legend-kernel", f"native kernel @{k}: {shown}", colors[k]))
    rows += [("legend-host", "op kept on the host, run through torch", HOST_FILL),
             ("legend-hook", "Python hook / call (stays a call into Python)", HOOK_FILL),
             ("legend-accumulate", "accumulation into .grad (ca.accumulate_grad)", ACC_FILL),
             ("legend-aot", "dashed: node from an AOT-compiled region (aot<N>)", "white"),
             ("legend-plain", "autograd node with no compute of its own", PLAIN_FILL)]
    if pic.loose_host_ops:
        rows.append(("legend-host", "host ops of no node: " + ", ".join(sorted(set(pic.loose_host_ops))), HOST_FILL))
    return rows


# --------------------------------------------------------------------------- entry points

def draw(path: str, graph=None) -> str:
    """Writes an SVG of captured backward `graph` (a capture id as in `explain()`; None, the
    default, is the most recently compiled one) to `path`: its autograd nodes, which native
    kernels their ops went into, which stayed host ops or Python hooks, where gradients
    accumulate, AOT regions dashed. Returns `path`; a ValueError when nothing was captured.

        camlir.compile_backward(model(x).sum())
        camlir.draw("backward.svg")
    """
    graphs = compiled.captured_graphs()
    programs = compiled.compiled_programs()
    if not graphs:
        raise ValueError("no captured backward to draw: run a backward under camlir first")
    chosen = [i for i, (capture_id, _) in enumerate(graphs) if graph is None or capture_id == graph]
    if not chosen:
        raise ValueError(f"graph {graph} was not compiled (compiled: {sorted({g for g, _ in graphs})})")
    capture_id, text = graphs[chosen[-1]]
    _, backend, program = programs[chosen[-1]]
    lowered = getattr(program, "lowered_text", "") or None
    source = f"{backend} program: kernels of the compiled program" if lowered else ""
    pic = picture(text, lowered, f"camlir: captured backward graph {capture_id} ({backend} backend)", source,
                  compiled.input_names(capture_id))
    with open(path, "w") as f:
        f.write(to_svg(pic))
    return path


def main(argv=None) -> int:
    """`python -m camlir.drawing module.mlir out.svg [--lowered linalg.mlir]`."""
    parser = argparse.ArgumentParser(prog="python -m camlir.drawing", description="Draw a captured ca module as SVG.")
    parser.add_argument("module", help="a ca module file (e.g. CA_DUMP_DIR's NN-import.mlir)")
    parser.add_argument("output", help="the SVG to write")
    parser.add_argument("--lowered", help="the same graph after the linalg stage (NN-linalg.mlir); "
                                          "default: run the kernels and linalg stages here")
    args = parser.parse_args(argv)
    try:
        with open(args.module) as f:
            text = f.read()
        lowered = None
        if args.lowered:
            with open(args.lowered) as f:
                lowered = f.read()
    except OSError as exc:
        print(f"python -m camlir.drawing: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    try:
        pic = picture(text, lowered, f"camlir: {args.module}", f"kernels from {args.lowered}" if lowered else "")
    except ir.MLIRError as exc:  # the parser's own diagnostics, with the file in place of "-"
        detail = str(exc).replace('"-":', f"{args.module}:")
        print(f"python -m camlir.drawing: {args.module} is not a ca module camlir can read: {detail}",
              file=sys.stderr)
        return 1
    except ValueError as exc:  # parsed, but not a captured backward (no @backward, ...)
        print(f"python -m camlir.drawing: {args.module}: {exc}", file=sys.stderr)
        return 1
    try:
        with open(args.output, "w") as f:
            f.write(to_svg(pic))
    except OSError as exc:
        print(f"python -m camlir.drawing: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}: {sum(it.kind == 'node' for it in pic.items.values())} autograd nodes, "
          f"{len(pic.kernels)} kernels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
