"""Exporting a compiled GPU backward as a self-contained artifact directory.

    from camlir.backends.gpu import export
    paths = export.export_backward(lambda: loss_fn(model, x), "out/mlp")   # no GPU needed
    # out/mlp/graph1/{manifest.json, kernels.ptx, runner.py[, constants.pt, inputs.pt]}

On the GPU machine, with torch only:

    import runner                      # the copy inside the artifact directory
    art = runner.load("out/mlp/graph1")
    art.run([t.cuda() for t in torch.load("out/mlp/graph1/inputs.pt")])   # grads in .grad

`export_backward` runs one backward with `backend="gpu"` inside `program.recording()`: each
captured graph is compiled to PTX (no CUDA needed), the backward itself runs on the
reference interpreter, and `write` stores every compiled program with the arguments of its
call. The manifest (format `camlir-gpu/1`, docs/gpu-backend.md) holds the host program
(`plan.host_plan`), the kernel plans, the inputs' shapes and dtypes (and which inputs are
parameters whose `.grad` the backward accumulates into), the permutations of the inputs and
torch's enum codes. A backward with Python hooks cannot be exported (they only exist in this
process): `plan.PlanError`.
"""

import json
import os
import shutil

import torch

import camlir  # the public API (camlir.enable), loaded on first use
from camlir.backends.host_runtime import fresh_and_private
from camlir.backends.gpu import plan as gpu_plan
from camlir.backends.gpu import program as gpu_program
from camlir.backends.gpu import runner
from camlir.dialects.ca.ir_helpers import require_func


def export_backward(make_loss, directory: str, save_inputs: bool = True) -> list:
    """Compiles the backward of `make_loss()` (a callable returning the loss) for the gpu and
    writes one artifact per compiled graph under `directory` (`graph1`, `graph2`, ...).
    Returns their paths. The gradients of this backward land in `.grad` as usual (computed
    by the reference interpreter)."""
    with gpu_program.recording() as recorded:
        with camlir.enable(backend="gpu", fullgraph=True):
            make_loss().backward()
    if not recorded:
        raise RuntimeError("the backward compiled no gpu program (was it captured?)")
    paths = []
    for i, (program, args) in enumerate(recorded, 1):
        path = os.path.join(directory, f"graph{i}")
        write(program, path, args, save_inputs)
        paths.append(path)
    return paths


def manifest(program: gpu_program.GpuProgram, args: list) -> tuple:
    """(the manifest dict, literal tensors) of `program` called with `args`."""
    host = require_func(program.module, "backward")
    host_steps, literals = gpu_plan.host_plan(host, fresh_and_private)
    params = {step["ins"][0] for step in host_steps["steps"] if step["op"] == "accumulate"}
    inputs = []
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor):
            raise gpu_plan.PlanError(f"argument {i} is a {type(a).__name__}: only tensors can be exported")
        spec = {"shape": list(a.shape), "dtype": str(a.dtype).removeprefix("torch."), "param": i in params}
        inputs.append(spec)
    return {
        "format": runner.FORMAT,
        "target": program.target,
        "ptx": "kernels.ptx",
        "inputs": inputs,
        "perms": [list(p) if p is not None else None for p in program.arg_perms],
        "kernels": program.plans,
        "host": host_steps,
        "codes": gpu_plan.codes(),
        "constants": "constants.pt" if literals else None,
        "label": program.label,
    }, literals


def write(program: gpu_program.GpuProgram, directory: str, args: list, save_inputs: bool = True) -> str:
    """Writes the artifact of `program` (called with `args`) to `directory` (created; files
    replaced), with a copy of `runner.py`; with `save_inputs`, also `inputs.pt` (the
    tensors, detached, on the cpu)."""
    os.makedirs(directory, exist_ok=True)
    data, literals = manifest(program, args)
    with open(os.path.join(directory, "manifest.json"), "w") as f:
        json.dump(data, f, indent=1)
    with open(os.path.join(directory, "kernels.ptx"), "w") as f:
        f.write(program.ptx)
    if literals:
        torch.save(literals, os.path.join(directory, "constants.pt"))
    if save_inputs:
        torch.save([a.detach().cpu().clone() for a in args], os.path.join(directory, "inputs.pt"))
    shutil.copyfile(runner.__file__, os.path.join(directory, "runner.py"))
    return directory
