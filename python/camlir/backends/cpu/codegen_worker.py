"""A codegen worker: one part of an LLVM-dialect kernel module in (a file), its machine code
out (another file, an ELF relocatable object). Run as a script by `parallel_jit`, so that LLVM
compiles parts of a big module in other processes while this one compiles its own part
(the MLIR ExecutionEngine holds the GIL: threads measured no faster, see docs/speed.md).

It imports torch-mlir only (0.15 s to start; torch would take seconds). The BLAS symbols
the kernels call get placeholder addresses: the object keeps them as relocations, which
the system linker binds to torch's BLAS when the parent links it (`jit.shared_library`).

Usage: `python codegen_worker.py PART.mlir PART.o [OPT_LEVEL]`; exit status 0 and the
object written, or status 1 and the error on stderr.
"""

import ctypes
import os
import sys
import tempfile

# Kept in step with jit._BLAS_SYMBOLS and jit._OMP_SYMBOLS (this file imports nothing of camlir's).
BLAS_SYMBOLS = ("sgemm_", "dgemm_", "sgemm_batch_", "dgemm_batch_",
                "GOMP_parallel", "omp_get_thread_num", "omp_get_num_threads", "_ZN2at15get_num_threadsEv")


def compile_to_object(text: str, opt_level: int = 2) -> bytes:
    """The machine code of the LLVM-dialect module `text`, as `jit.jit` would compile it
    (same opt level, position-independent), as an ELF relocatable object."""
    from torch_mlir import ir
    from torch_mlir.execution_engine import ExecutionEngine

    with ir.Context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        names = [ir.StringAttr(op.attributes["sym_name"]).value for op in module.body.operations
                 if op.operation.name == "llvm.func" and len(op.regions[0].blocks)]
        engine = ExecutionEngine(module, opt_level=opt_level, enable_pic=True)
        for name in BLAS_SYMBOLS:
            engine.raw_register_runtime(name, ctypes.c_void_p(1))  # never called here
        engine.initialize()
        if names:
            engine.raw_lookup(names[0])  # codegen is lazy: the first lookup compiles the module
        with tempfile.TemporaryDirectory(prefix="camlir-codegen-") as tmp:
            path = os.path.join(tmp, "part.o")
            engine.dump_to_object_file(path)
            with open(path, "rb") as f:
                return f.read()


def main() -> int:
    """Compiles the file named by argv[1] into the object file argv[2]; the exit status."""
    source, target = sys.argv[1], sys.argv[2]
    opt_level = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    try:
        with open(source) as f:
            obj = compile_to_object(f.read(), opt_level)
        with open(target + ".tmp", "wb") as f:
            f.write(obj)
        os.replace(target + ".tmp", target)  # never a half-written object
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which compiles it itself
        sys.stderr.write(f"{type(exc).__name__}: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
