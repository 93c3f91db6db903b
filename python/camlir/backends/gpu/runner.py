"""Runs a compiled GPU backward with torch and the CUDA driver only.

This file imports nothing but the standard library and torch (no MLIR, no torch-mlir, no
other part of camlir), so it can be copied next to an artifact and run where camlir is not
installed:

    python runner.py ARTIFACT_DIR [--check]        # validates; with a GPU, runs it once

An artifact (written by `camlir.backends.gpu.export`) is a directory:

    manifest.json   format "camlir-gpu/1", target, the host program, the kernel plans,
                    the inputs' shapes/dtypes and permutations, torch's enum codes
    kernels.ptx     every device kernel, one `.entry` each (PTX ISA 8.0)
    constants.pt    tensors the host program uses as literals (only when it has some)
    inputs.pt, expected.pt   optional: example inputs and the gradients eager PyTorch gave

The in-process gpu backend (`program.GpuProgram`) uses `KernelRunner` and `Driver` from
here as well, so what CI validates and what the GPU machine runs are the same code.

Kernels are loaded with `cuModuleLoadData` and launched with `cuLaunchKernel` on torch's
current stream, through ctypes on `libcuda.so.1` (the driver library every CUDA machine
has; no binding package needed). Tensors are torch CUDA tensors, passed by pointer: no copies
(an input that is not contiguous is made contiguous first, as the cpu backend does).
Matmuls run as `addmm_`/`baddbmm_` (cuBLAS through torch).
"""

import ctypes
import json
import os
import sys

import torch

FORMAT = "camlir-gpu/1"

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16, "int64": torch.int64, "int32": torch.int32, "int16": torch.int16,
          "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool}
_SCALAR_CTYPES = {"i64": ctypes.c_int64, "i32": ctypes.c_int32, "i8": ctypes.c_int8,
                  "f32": ctypes.c_float, "f64": ctypes.c_double}
_NEEDS_CUDA = "backend 'gpu' needs a CUDA device: torch.cuda.is_available() is False"


class ArtifactError(ValueError):
    """An artifact that does not parse or does not hold together."""


# --------------------------------------------------------------------------- the CUDA driver

class Driver:
    """The few CUDA driver calls the runner needs, through ctypes on libcuda."""

    _instance = None

    @classmethod
    def get(cls) -> "Driver":
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def __init__(self):
        if not torch.cuda.is_available():
            raise RuntimeError(_NEEDS_CUDA)
        lib = None
        for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
            try:
                lib = ctypes.CDLL(name)
                break
            except OSError:
                continue
        if lib is None:
            raise RuntimeError("the CUDA driver library (libcuda.so.1) cannot be loaded")
        self.lib = lib
        vp, u = ctypes.c_void_p, ctypes.c_uint
        lib.cuInit.argtypes = [u]
        lib.cuModuleLoadData.argtypes = [ctypes.POINTER(vp), ctypes.c_char_p]
        lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(vp), vp, ctypes.c_char_p]
        lib.cuLaunchKernel.argtypes = [vp, u, u, u, u, u, u, u, vp, ctypes.POINTER(vp), ctypes.POINTER(vp)]
        lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(vp)]
        lib.cuCtxSetCurrent.argtypes = [vp]
        lib.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(vp), ctypes.c_int]
        lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self.check(lib.cuInit(0), "cuInit")
        self.modules = {}  # (device index, id of the PTX owner) -> (CUmodule, {entry: CUfunction})

    def check(self, status: int, what: str) -> None:
        if status != 0:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorString(status, ctypes.byref(text))
            message = text.value.decode() if text.value else "unknown error"
            raise RuntimeError(f"{what} failed: CUDA error {status} ({message})")

    def make_current(self, device: int) -> None:
        """Makes the primary context of `device` (the one torch uses) current here."""
        torch.cuda.set_device(device)
        ctx = ctypes.c_void_p()
        self.check(self.lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
        if not ctx.value:
            dev = ctypes.c_int()
            self.check(self.lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
            self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev.value), "cuDevicePrimaryCtxRetain")
            self.check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def functions(self, key, device: int, ptx: str, entries) -> dict:
        """The CUfunction of each entry of `ptx`, loaded once per device."""
        found = self.modules.get((device, key))
        if found is None:
            self.make_current(device)
            module = ctypes.c_void_p()
            self.check(self.lib.cuModuleLoadData(ctypes.byref(module), ptx.encode() + b"\0"), "cuModuleLoadData")
            fns = {}
            for entry in entries:
                fn = ctypes.c_void_p()
                self.check(self.lib.cuModuleGetFunction(ctypes.byref(fn), module, entry.encode()),
                           f"cuModuleGetFunction({entry})")
                fns[entry] = fn
            found = self.modules[(device, key)] = (module, fns)
        return found[1]

    def launch(self, fn, grid, block, params, stream: int) -> None:
        self.check(self.lib.cuLaunchKernel(fn, grid[0], grid[1], grid[2], block[0], block[1], block[2], 0,
                                           ctypes.c_void_p(stream), params, None), "cuLaunchKernel")


# --------------------------------------------------------------------------- kernel plans

class _Launch:
    """One launch step with its parameter array built once; a call writes the pointers."""

    def __init__(self, step):
        self.entry, self.grid, self.block = step["entry"], tuple(step["grid"]), tuple(step["block"])
        self.holders, self.pointers = [], []  # pointers: (holder, slot, offset in elements)
        for arg in step["args"]:
            if arg["kind"] == "ptr":
                holder = ctypes.c_void_p(0)
                self.pointers.append((holder, arg["slot"], arg["offset"]))
            else:
                holder = _SCALAR_CTYPES[arg["kind"]](arg["value"])
            self.holders.append(holder)
        self.params = (ctypes.c_void_p * max(1, len(self.holders)))()
        for i, holder in enumerate(self.holders):
            self.params[i] = ctypes.cast(ctypes.pointer(holder), ctypes.c_void_p)


class KernelRunner:
    """One kernel function's plan (`plan.kernel_plan`), callable as `runner(inputs) -> outputs`
    on CUDA tensors. `functions()` gives the loaded CUfunctions by entry name."""

    def __init__(self, name: str, plan: dict, functions):
        self.name = name
        self.inputs = [(tuple(s["shape"]), DTYPES[s["dtype"]]) for s in plan["inputs"]]
        self.outputs = [(tuple(s["shape"]), DTYPES[s["dtype"]]) for s in plan["outputs"]]
        self.n_slots = plan["slots"]
        self.functions = functions
        self.steps = []
        for step in plan["steps"]:
            op = step["op"]
            if op == "launch":
                self.steps.append(("launch", _Launch(step)))
            elif op == "alloc":
                self.steps.append(("alloc", (step["out"], tuple(step["shape"]), DTYPES[step["dtype"]])))
            else:
                self.steps.append((op, step))

    def __call__(self, args: list) -> list:
        env = [None] * self.n_slots
        device = None
        for i, (t, (shape, dtype)) in enumerate(zip(args, self.inputs)):
            if tuple(t.shape) != shape or t.dtype != dtype:
                raise RuntimeError(f"kernel {self.name}: input {i} is {tuple(t.shape)} {t.dtype}, "
                                   f"expected {shape} {dtype}")
            if not t.is_contiguous():
                t = t.contiguous()
            env[i] = t
            device = device or t.device
        device = device or torch.device("cuda", torch.cuda.current_device())
        n_in = len(args)
        outs = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in self.outputs]
        for i, t in enumerate(outs):
            env[n_in + i] = t
        fns = None
        stream = torch.cuda.current_stream(device).cuda_stream
        for op, step in self.steps:
            if op == "launch":
                if fns is None:
                    fns = self.functions(device.index if device.index is not None else torch.cuda.current_device())
                for holder, slot, offset in step.pointers:
                    t = env[slot]
                    holder.value = t.data_ptr() - offset * t.element_size()
                Driver.get().launch(fns[step.entry], step.grid, step.block, step.params, stream)
            elif op == "alloc":
                slot, shape, dtype = step
                env[slot] = torch.empty(shape, dtype=dtype, device=device)
            elif op == "free":
                env[step["slot"]] = None
            elif op == "view":
                src = env[step["in"]]
                env[step["out"]] = src.as_strided(step["shape"], step["strides"], src.storage_offset() + step["delta"])
            elif op == "alias":
                env[step["out"]] = env[step["in"]]
            elif op == "permute":
                env[step["out"]] = env[step["in"]].permute(step["dims"])
            elif op == "reshape":
                env[step["out"]] = env[step["in"]].view(step["shape"])
            elif op == "gemm":
                a, b, c = env[step["a"]], env[step["b"]], env[step["c"]]
                if step["batched"]:
                    c.baddbmm_(a, b, beta=step["beta"], alpha=step["alpha"])
                else:
                    c.addmm_(a, b, beta=step["beta"], alpha=step["alpha"])
            else:
                raise RuntimeError(f"kernel {self.name}: unknown step {op}")
        return outs


def check_kernel_plan(name: str, plan: dict, entries: set) -> None:
    """Structural checks of one kernel plan (no GPU needed): slots in range, known dtypes,
    launches of entries the PTX defines."""
    n = plan["slots"]
    n_args = len(plan["inputs"]) + len(plan["outputs"])
    if n_args > n:
        raise ArtifactError(f"kernel {name}: {n_args} arguments but {n} slots")
    for spec in plan["inputs"] + plan["outputs"]:
        if spec["dtype"] not in DTYPES:
            raise ArtifactError(f"kernel {name}: unknown dtype {spec['dtype']}")
    defined = set(range(n_args))
    for step in plan["steps"]:
        op = step["op"]
        used = [step[k] for k in ("in", "a", "b", "c", "slot") if k in step]
        if op == "launch":
            if step["entry"] not in entries:
                raise ArtifactError(f"kernel {name}: launches {step['entry']}, which the PTX does not define")
            if len(step["grid"]) != 3 or len(step["block"]) != 3 or min(step["grid"] + step["block"]) < 1:
                raise ArtifactError(f"kernel {name}: bad launch shape {step['grid']} x {step['block']}")
            for arg in step["args"]:
                if arg["kind"] == "ptr":
                    used.append(arg["slot"])
                elif arg["kind"] not in _SCALAR_CTYPES:
                    raise ArtifactError(f"kernel {name}: unknown argument kind {arg['kind']}")
        elif op not in ("alloc", "free", "view", "alias", "permute", "reshape", "gemm"):
            raise ArtifactError(f"kernel {name}: unknown step {op}")
        for s in used:
            if not (0 <= s < n) or s not in defined:
                raise ArtifactError(f"kernel {name}: step {op} reads slot {s} before it is defined")
        if "out" in step:
            if not (0 <= step["out"] < n):
                raise ArtifactError(f"kernel {name}: step {op} writes slot {step['out']} out of range")
            defined.add(step["out"])


def ptx_entries(ptx: str) -> set:
    """The names of the `.entry` functions a PTX text defines."""
    names = set()
    for line in ptx.splitlines():
        line = line.strip()
        if ".entry " in line:
            names.add(line.split(".entry ", 1)[1].split("(", 1)[0].strip())
    return names


# --------------------------------------------------------------------------- whole artifacts

class Artifact:
    """A loaded artifact: `run(inputs)` runs the backward on CUDA tensors (gradients
    accumulate into `.grad` of the inputs that are parameters) and returns its results."""

    def __init__(self, directory: str):
        self.directory = directory
        path = os.path.join(directory, "manifest.json")
        try:
            with open(path) as f:
                self.manifest = json.load(f)
        except (OSError, json.JSONDecodeError) as exc:
            raise ArtifactError(f"{path}: {exc}") from exc
        m = self.manifest
        if m.get("format") != FORMAT:
            raise ArtifactError(f"{path}: format {m.get('format')!r}, this runner reads {FORMAT!r}")
        with open(os.path.join(directory, m["ptx"])) as f:
            self.ptx = f.read()
        self.constants = []
        if m.get("constants"):
            self.constants = torch.load(os.path.join(directory, m["constants"]), map_location="cpu")
        # torch's integer codes of ScalarType, Layout, MemoryFormat arguments: kind -> code -> object
        self.codes = {kind: {int(k): getattr(torch, v) for k, v in table.items() if hasattr(torch, v)}
                      for kind, table in m["codes"].items()}
        self.validate()
        self.kernels = {name: KernelRunner(name, plan, self._functions) for name, plan in m["kernels"].items()}
        self._device_constants = {}

    def _functions(self, device: int) -> dict:
        return Driver.get().functions(id(self), device, self.ptx, ptx_entries(self.ptx))

    def validate(self) -> None:
        """Checks that the artifact holds together (no GPU needed)."""
        m = self.manifest
        entries = ptx_entries(self.ptx)
        for name, plan in m["kernels"].items():
            check_kernel_plan(name, plan, entries)
        host = m["host"]
        n = host["slots"]
        defined = set(range(len(m["inputs"])))
        for step in host["steps"]:
            op = step["op"]
            reads = list(step.get("ins", [])) + ([step["in"]] if "in" in step else [])
            reads += [a["slot"] for a in step.get("args", [])]
            for s in reads:
                if s not in defined:
                    raise ArtifactError(f"host step {op} reads slot {s} before it is defined")
            if op == "kernel":
                if step["name"] not in m["kernels"]:
                    raise ArtifactError(f"host step calls kernel {step['name']}, which the artifact lacks")
                if len(step["ins"]) != len(m["kernels"][step["name"]]["inputs"]):
                    raise ArtifactError(f"host call of {step['name']} passes {len(step['ins'])} inputs")
            elif op == "torch":
                _resolve(step["target"])
            elif op == "literal":
                if not (0 <= step["index"] < len(self.constants)):
                    raise ArtifactError(f"literal {step['index']} is not in {m.get('constants')}")
            elif op not in ("const", "list", "unpack", "accumulate", "alias"):
                raise ArtifactError(f"unknown host step {op}")
            outs = list(step.get("outs", [])) + ([step["out"]] if "out" in step else [])
            for s in outs:
                if not (0 <= s < n):
                    raise ArtifactError(f"host step {op} writes slot {s} out of range")
                defined.add(s)
        for s in host["results"]:
            if s not in defined:
                raise ArtifactError(f"host result slot {s} is never defined")

    def input_specs(self) -> list:
        return [(tuple(s["shape"]), DTYPES[s["dtype"]]) for s in self.manifest["inputs"]]

    def run(self, inputs: list, device=None) -> list:
        """Runs the host program on `inputs` (CUDA tensors, in the manifest's order)."""
        if not torch.cuda.is_available():
            raise RuntimeError(_NEEDS_CUDA)
        device = torch.device(device) if device is not None else next(
            (t.device for t in inputs if isinstance(t, torch.Tensor)), torch.device("cuda"))
        m, host = self.manifest, self.manifest["host"]
        args = list(inputs)
        for i, perm in enumerate(m.get("perms") or []):
            if perm is not None:
                args[i] = args[i].permute(perm)
        env = [None] * host["slots"]
        for i, a in enumerate(args):
            env[i] = a
        for step in host["steps"]:
            op = step["op"]
            if op == "kernel":
                outs = self.kernels[step["name"]]([env[s] for s in step["ins"]])
                for s, t in zip(step["outs"], outs):
                    env[s] = t
            elif op == "accumulate":
                accumulate(env[step["ins"][0]], env[step["ins"][1]], step.get("fresh", False))
            elif op == "alias":
                env[step["out"]] = env[step["in"]]
            elif op == "const":
                value = step["value"]
                env[step["out"]] = device if step.get("device") else value
            elif op == "literal":
                key = (step["index"], str(device))
                if key not in self._device_constants:
                    self._device_constants[key] = self.constants[step["index"]].to(device)
                env[step["out"]] = self._device_constants[key]
            elif op == "list":
                env[step["out"]] = [env[s] for s in step["ins"]]
            elif op == "unpack":
                for s, v in zip(step["outs"], env[step["in"]]):
                    env[s] = v
            elif op == "torch":
                results = run_torch_op(step, env, self.codes)
                for s, v in zip(step["outs"], results):
                    env[s] = v
        return [env[s] for s in host["results"]]


def accumulate(param, grad, fresh: bool) -> None:
    """PyTorch's AccumulateGrad: with `.grad` unset, take the gradient (a fresh, private
    kernel output of the parameter's layout) or a copy of it; else add in place."""
    if param.grad is None:
        if fresh and param.is_contiguous() and grad.dtype == param.dtype and grad.shape == param.shape:
            param.grad = grad
        else:
            param.grad = grad.detach().clone(memory_format=torch.contiguous_format).reshape(param.shape)
    else:
        param.grad += grad


def _resolve(target: str):
    parts = target.split(".")
    try:
        packet = getattr(getattr(torch.ops, parts[0]), parts[1])
        return getattr(packet, ".".join(parts[2:]) or "default")
    except (AttributeError, RuntimeError, IndexError):
        raise ArtifactError(f"{target}: no such PyTorch operator") from None


_OPS = {}


def run_torch_op(step: dict, env: list, codes: dict) -> tuple:
    """A host op by name (`aten.sum.dim_IntList`), its arguments from slots; ScalarType,
    Layout and MemoryFormat arguments arrive as torch's integer codes and are converted
    (`codes`: kind -> code -> torch object)."""
    overload = _OPS.get(step["target"])
    if overload is None:
        overload = _OPS[step["target"]] = _resolve(step["target"])
    args, kwargs = [], {}
    for a in step["args"]:
        value = env[a["slot"]]
        if a.get("conv") and isinstance(value, int):
            value = codes[a["conv"]][value]
        if a.get("kwarg"):
            kwargs[a["name"]] = value
        else:
            args.append(value)
    out = overload(*args, **kwargs)
    n = len(step["outs"])
    if n == 0:
        return ()
    return (out,) if n == 1 else tuple(out)


def load(directory: str) -> Artifact:
    """Parses and validates the artifact in `directory` (no GPU needed)."""
    return Artifact(directory)


def main(argv=None) -> int:
    """`python runner.py <artifact dir> ...`: runs (or, without CUDA, validates) artifacts."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(__doc__.strip().splitlines()[0])
        print("usage: python runner.py ARTIFACT_DIR [ARTIFACT_DIR ...]")
        return 2
    for directory in argv:
        artifact = load(directory)
        print(f"{directory}: valid ({len(artifact.kernels)} kernel functions, "
              f"{len(ptx_entries(artifact.ptx))} device kernels)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
