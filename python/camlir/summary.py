"""A short, human-readable summary of a captured `ca` module."""

import collections
import re


def summarize(module_text: str) -> dict:
    """Counts what a captured backward holds, from `module_text`, its `ca` module (as
    `captured_graphs()` gives it): a dict with `nodes`, `node_names` (name -> count),
    `aot_nodes`, `hooks` (kind -> count), `accumulate_grad`, `sizes` (lifted sizes),
    `python_callbacks` and `aten_ops`.

        graph_id, text = camlir.captured_graphs()[-1]
        camlir.summarize(text)["accumulate_grad"]      # e.g. 2 for one Linear
    """
    nodes = collections.Counter(re.findall(r'node = "([^"]+)"', module_text))
    aot = len(re.findall(r"\baot = \d+", module_text))
    hooks = collections.Counter(re.findall(r'kind = "([a-z_]+)"', module_text))
    return {
        "nodes": sum(nodes.values()),
        "node_names": dict(nodes),
        "aot_nodes": aot,
        "hooks": dict(hooks),
        "accumulate_grad": module_text.count('"ca.accumulate_grad"'),
        "sizes": module_text.count('"ca.size"'),
        "python_callbacks": module_text.count('"ca.call_python"'),
        "aten_ops": len(re.findall(r"torch\.aten\.", module_text)),
    }
