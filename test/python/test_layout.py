"""The layout of the package: no import circle among camlir's own modules.

The import graph is read from the source with `ast`, so nothing is imported. Every import
counts, at module level or inside a function: a function-level import only delays a
circle, it does not remove it. Three folders make up the package: `python/camlir` is
`camlir`, `dialects/` is `camlir.dialects`, `passes/` is `camlir.passes`.
"""

import ast
import os

from conftest import REPO

ROOTS = {"camlir": "python/camlir", "camlir.dialects": "dialects", "camlir.passes": "passes"}

# Edges (importer, imported) that close a circle existing today, left out of the check until
# the layout removes them. Each one is a known debt: remove it from here when it is gone.
ALLOWED_EDGES = {
}


def _modules() -> dict:
    """Module name -> path, for every .py file under the three roots."""
    found = {}
    for package, folder in ROOTS.items():
        top = os.path.join(REPO, folder)
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
            rel = os.path.relpath(dirpath, top)
            parts = [package] + ([] if rel == "." else rel.split(os.sep))
            for name in sorted(filenames):
                if not name.endswith(".py"):
                    continue
                mod = ".".join(parts if name == "__init__.py" else parts + [name[:-3]])
                assert mod not in found, f"{mod} is in two folders: {found[mod]}, {dirpath}"
                found[mod] = os.path.join(dirpath, name)
    return found


def _imports(path: str, module: str, is_package: bool, known: set) -> set:
    """The camlir modules `module` imports (a `from X import y` counts X.y when it is a module)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    package = module if is_package else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    out.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in known:
                    out.add(sub)
                elif target in known:
                    out.add(target)
    out.discard(module)
    return out


def import_graph() -> dict:
    modules = _modules()
    known = set(modules)
    return {m: _imports(p, m, p.endswith("__init__.py"), known) for m, p in modules.items()}


def components(graph: dict) -> list:
    """The strongly connected components of more than one module (each a set)."""
    index, low, on_stack, stack, sccs = {}, {}, set(), [], []
    counter = [0]

    def connect(v):  # Tarjan, iterative so that deep graphs do not hit the recursion limit
        work = [(v, iter(sorted(graph[v])))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        while work:
            node, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    advanced = True
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                scc = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    scc.append(w)
                    if w == node:
                        break
                if len(scc) > 1:
                    sccs.append(set(scc))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sccs


def find_cycles(graph: dict) -> list:
    """One circle (a list of modules, first repeated last) per strongly connected component."""
    cycles = []
    for scc in components(graph):  # a shortest circle through the component's first module, by BFS
        start = min(scc)
        parent, queue = {start: None}, [start]
        while queue:
            v = queue.pop(0)
            for w in sorted(graph[v] & scc):
                if w == start:
                    path = [v]
                    while parent[path[-1]] is not None:
                        path.append(parent[path[-1]])
                    cycles.append(list(reversed(path)) + [start])
                    queue = []
                    break
                if w not in parent:
                    parent[w] = v
                    queue.append(w)
    return cycles


def test_the_three_roots_are_found():
    graph = import_graph()
    for module in ("camlir.settings", "camlir.capture.engine", "camlir.dialects.ca.ops",
                   "camlir.passes.registry"):
        assert module in graph


def test_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]


def test_no_import_cycles():
    graph = import_graph()
    for importer, imported in ALLOWED_EDGES:
        graph.get(importer, set()).discard(imported)
    cycles = find_cycles(graph)
    assert not cycles, "import circles among camlir modules:\n" + "\n".join(
        f"  {' -> '.join(c)}   (all in this circle: {', '.join(sorted(scc))})"
        for c, scc in zip(cycles, components(graph)))


def test_settings_imports_nothing_of_camlir():
    # but the backend registry, which imports nothing of camlir itself (backends load by name)
    graph = import_graph()
    assert graph["camlir.settings"] <= {"camlir.backend_registry"}
    assert graph["camlir.backend_registry"] == set()


def test_hook_guard_does_not_import_capture():
    assert not any(m.startswith("camlir.capture") for m in import_graph()["camlir.cache"])


def _undocumented(path: str) -> list:
    """The public (no leading `_`) top-level functions and classes of a file without a docstring."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    return [node.name for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and not node.name.startswith("_") and not ast.get_docstring(node)]


def test_public_functions_and_classes_have_docstrings():
    missing = [f"{os.path.relpath(path, REPO)}: {name}"
               for path in sorted(_modules().values()) for name in _undocumented(path)]
    assert not missing, ("public top-level functions and classes without a docstring:\n  "
                         + "\n  ".join(missing))
