"""Names of a captured backward's inputs, as the model calls them: `2.bias`, not `%arg8`.

Compiled autograd hands camlir each parameter the backward accumulates into as the tensor
itself, with no name. The names live in the modules that hold them, which camlir is never
given: `module_paths` finds the live `nn.Module`s (through the garbage collector's list of
objects), keeps the outermost ones (not a child of another), and names each wanted tensor
by its path from there (`named_parameters`, `named_buffers`). That walk costs ~50 ms in a
process holding a Hugging Face GPT-2 (340k objects, measured), so it runs only when a
person is about to read the names (`CAMLIR_LOGS=graph`, `camlir.draw`), never on the
training path; `Leaves` keeps weak references until then.

    leaves = Leaves(inputs)             # at a graph's first call: cheap
    leaves.names()                      # {8: "2.bias", 3: "2.weight", ...} (input index -> path)
"""

import gc
import weakref

import torch


def module_paths(tensors: dict) -> dict:
    """{key: path} for the tensors of `tensors` ({key: tensor}) that a live module holds as
    a parameter or buffer; a tensor no module holds has no entry. Among several outermost
    modules holding the same tensor, the first one found names it."""
    wanted = {id(t): key for key, t in tensors.items()}
    if not wanted:
        return {}
    module_type = torch.nn.Module  # type(), not isinstance: no __class__ property runs (one warns)
    modules = [o for o in gc.get_objects() if issubclass(type(o), module_type)]
    children = {id(child) for m in modules for child in m.children()}
    names = {}
    for root in (m for m in modules if id(m) not in children):
        for name, tensor in root.named_parameters(remove_duplicate=False):
            key = wanted.get(id(tensor))
            if key is not None and key not in names:
                names[key] = name
        for name, tensor in root.named_buffers(remove_duplicate=False):
            key = wanted.get(id(tensor))
            if key is not None and key not in names:
                names[key] = name
    return names


class Leaves:
    """Weak references to the leaf tensors among a graph's inputs (the parameters it
    accumulates into), by input index; `names()` resolves them when asked."""

    def __init__(self, inputs):
        self._refs = {i: weakref.ref(t) for i, t in enumerate(inputs)
                      if isinstance(t, torch.Tensor) and t.is_leaf and t.requires_grad}
        self._names = None

    def names(self) -> dict:
        """{input index: module path} for the leaves still alive that a module holds."""
        if self._names is None:
            alive = {i: ref() for i, ref in self._refs.items()}
            self._names = module_paths({i: t for i, t in alive.items() if t is not None})
        return self._names
