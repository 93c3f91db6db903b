"""A compiled cpu program as files, and back: what the disk cache keeps of it.

A `CpuProgram` is a host function (walked by the runtime) plus native kernels. Stored:

    host.mlir    the host function and a private declaration of every kernel it calls
                 (their types give the kernels' argument specs back)
    kernels.so   the kernels' machine code, linked by `jit.shared_library` (absent when
                 the program has no kernels)
    meta         the input permutations, whether the kernels have dynamic dims, each
                 dynamic kernel's shape function (Python source, `shapes.derive`), and
                 which kernels run another's code (`same_kernels.merge_identical`)

Loading parses the host module (milliseconds) and loads the library: no re-trace, no
lowering, no LLVM. `to_files` refuses (`NotStorable`) what cannot be rebuilt exactly that
way: a program that is not a `CpuProgram` (the reference interpreter ran it instead).

A compile worker makes the same files without building a program (`files`): the runtime
(`abi`, `program`, which need torch) is imported only where a program is built or read,
so the worker runs without torch.
"""

from torch_mlir import ir

from camlir.backends.cpu import jit
from camlir.dialects.ca.ir_helpers import func_name, function_type, funcs, is_kernel, require_func

FORMAT = 1


class NotStorable(RuntimeError):
    """This program cannot be stored; the message says why."""


def host_text(module: ir.Module) -> str:
    """The host module to store: every op of `module` but the kernels, which become
    private declarations (`func.func private @k(tensor<4xf32>) -> tensor<4xf32>`)."""
    kernels = {func_name(fn): fn for fn in funcs(module, is_kernel)}
    parts = []
    for op in module.body.operations:
        op = op.operation
        name = func_name(op) if op.name == "func.func" else None
        if name in kernels:
            ftype = function_type(op)
            ins = ", ".join(str(t) for t in ftype.inputs)
            outs = ", ".join(str(t) for t in ftype.results)
            parts.append(f"func.func private @{name}({ins}) -> ({outs})")
        else:  # verified by the stage that made it; str(op) would verify it again (0.4 s)
            parts.append(op.get_asm(assume_verified=True))
    return "module {\n" + "\n".join(parts) + "\n}\n"


def files(host: str, library, perms, runtime_sizes: bool, shape_functions: dict, not_native: str,
          compile_seconds: float, shared_kernels: dict) -> tuple:
    """(files, meta) from a program's parts: the host module's text (`host_text`), the
    kernels' linked library (bytes, or None without kernels), and what `meta` records."""
    stored = {"host.mlir": host.encode()}
    if library is not None:
        stored["kernels.so"] = library
    meta = {
        "format": FORMAT,
        "perms": [list(p) if p is not None else None for p in perms],
        "dynamic": bool(runtime_sizes),  # the key of format 1
        "shape_functions": dict(shape_functions),
        "not_native": not_native,
        "compile_seconds": compile_seconds,
        "shared_kernels": dict(shared_kernels),
    }
    return stored, meta


def to_files(program) -> tuple:
    """(files, meta) for `DiskStore.put`. Links the kernels' machine code (~0.2 s: the
    caller runs it off the critical path)."""
    from camlir.backends.cpu.program import CpuProgram

    if not isinstance(program, CpuProgram) or getattr(program, "host_text", None) is None:
        raise NotStorable(f"a {type(program).__name__} is not native code")
    library = jit.shared_library(*jit.objects_of(program.engine)) if program.engine is not None else None
    shape_functions = {name: k.shape_fn.source for name, k in program.kernels.items()
                       if getattr(k, "shape_fn", None) is not None}
    return files(program.host_text, library, program.arg_perms, program.runtime_sizes, shape_functions,
                 getattr(program, "not_native", ""), program.compile_seconds,
                 getattr(program, "shared_kernels", {}))


def from_files(entry, context: ir.Context):
    """The `CpuProgram` `to_files` stored, rebuilt from a verified `disk_store.Entry`."""
    from camlir.backends.cpu import abi
    from camlir.backends.cpu.program import CpuProgram, torch_twins
    from camlir.backends.cpu.shapes import ShapeFunction

    meta = entry.meta
    if meta.get("format") != FORMAT:
        raise ValueError(f"stored program format {meta.get('format')!r}, expected {FORMAT}")
    runtime_sizes = bool(meta["dynamic"])
    text = entry.read("host.mlir").decode()
    with context, ir.Location.unknown():
        module = ir.Module.parse(text)
        library = jit.SharedKernels(entry.read("kernels.so")) if "kernels.so" in entry.names() else None
        kernels = {}
        shared = meta.get("shared_kernels", {})  # {kernel: the kernel whose code it runs}
        for op in module.body.operations:
            op = op.operation
            if op.name != "func.func" or len(op.regions[0].blocks) or func_name(op) == "backward":
                continue
            name = func_name(op)
            ftype = function_type(op)
            ins = [abi.spec_of(t, runtime_sizes) for t in ftype.inputs]
            outs = [abi.TensorSpec.from_type(t, runtime_sizes) for t in ftype.results]
            if library is None:
                raise ValueError(f"the stored host calls kernel @{name} but no kernels.so is stored")
            if runtime_sizes:
                shape_fn = ShapeFunction(meta["shape_functions"][name], name)
                kernels[name] = abi.DynamicKernel(library, name, ins, outs, shape_fn, shared.get(name, ""))
            else:
                kernels[name] = abi.Kernel(library, name, ins, outs, shared.get(name, ""))
        perms = [tuple(p) if p is not None else None for p in meta["perms"]]
        program = CpuProgram(require_func(module, "backward"), kernels, perms, "", 0.0, twins=torch_twins(module))
    program.module = module  # keeps the parsed IR alive with the program
    program.host_text = text
    program.engine = None
    program.runtime_sizes = runtime_sizes
    program.not_native = meta.get("not_native", "")
    return program
