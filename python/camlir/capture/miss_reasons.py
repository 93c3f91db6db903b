"""Why PyTorch's compiled autograd captured a backward again, in camlir's words.

Compiled autograd keeps one cache entry per graph structure and logs, on a miss, a line
written for its own developers:

    Cache miss due to new autograd node: torch::autograd::GraphRoot (NodeCall 0) with key
    size 39, previous key sizes=[]
    Cache miss due to 2 changed tensor shapes (total of 6): sizes[0], sizes[4]

`explained(message)` says the same for a user: which node of the backward (counted from the
root, as `CAMLIR_LOGS=graph` numbers them) made the structure new, or which sizes changed;
`cause(messages)` gives the (what, new) pair a `capture` event records. A line this module
does not know is kept as PyTorch wrote it.
"""

import re
from typing import Optional

_NEW_NODE = re.compile(r"new autograd node: (?P<name>.+?) \(NodeCall (?P<index>\d+)\) with key size \d+, "
                       r"previous key sizes=\[(?P<previous>[^\]]*)\]")
_SIZES = re.compile(r"(?P<changed>\d+) changed tensor shapes \(total of (?P<total>\d+)\): "
                    r"(?P<which>sizes\[\d+\](?:, sizes\[\d+\])*)")
_INDEX = re.compile(r"sizes\[(\d+)\]")


def node_name(cpp_name: str) -> str:
    """`torch::autograd::generated::AddmmBackward0` -> `AddmmBackward0` (the name
    `grad_fn` prints); a name with template arguments keeps them."""
    head, bracket, rest = cpp_name.partition("<")
    return head.rsplit("::", 1)[-1] + bracket + rest


def explained(message: str) -> str:
    """One cache-miss line of compiled autograd, as a sentence for a user."""
    m = _NEW_NODE.search(message)
    if m:
        name, index = node_name(m.group("name")), int(m.group("index"))
        if index == 0 and not m.group("previous").strip():
            return "the first backward of a new graph (no graph of this structure was captured before)"
        if index == 0:
            return ("a new graph: its roots differ from every graph captured before (their number, or their "
                    "gradients' shapes, dtypes or devices)")
        text = (f"a new graph: autograd node {index} ({name}) differs from every graph captured before at that "
                f"place (another node there, or other saved values or settings)")
        if name == "AccumulateGrad":
            text += "; for AccumulateGrad that is often a .grad that was None and now holds a tensor, or the reverse"
        return text
    m = _SIZES.search(message)
    if m:
        which = [int(i) for i in _INDEX.findall(m.group("which"))]
        shown = ", ".join(f"sizes[{i}]" for i in which[:8]) + (", ..." if len(which) > 8 else "")
        return (f"sizes changed: {m.group('changed')} of the {m.group('total')} sizes this graph's nodes read "
                f"({shown}); compiled autograd passes them as dynamic sizes from now on")
    return message


def changed_sizes(messages: list) -> Optional[list]:
    """The indices of the sizes a miss reports as changed (`[0, 4]`), or None."""
    for message in messages:
        m = _SIZES.search(message)
        if m:
            return [int(i) for i in _INDEX.findall(m.group("which"))]
    return None


def cause(messages: list) -> tuple:
    """(what, new) of compiled autograd's cache-miss messages, for a capture `Event`:
    `("node ReluBackward0", None)`, `("sizes", [0, 3])` (which sizes changed), `("first
    call", None)` when there are none, `("other", None)` for a line not known here."""
    for message in messages:
        m = _NEW_NODE.search(message)
        if m:
            return f"node {node_name(m.group('name'))}", None
        which = changed_sizes([message])
        if which is not None:
            return "sizes", which
    if messages:
        return "other", None
    return "first call", None
