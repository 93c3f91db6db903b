"""The cpu backend's JIT: MLIR's ExecutionEngine over the LLVM-dialect kernel module, with
the BLAS entry points the kernels call registered by address.

The BLAS is the MKL linked into `libtorch_cpu.so`, which exports the Fortran entry points
`sgemm_`/`dgemm_`; handing their addresses to the engine lets a kernel call them with no
Python in between, and they follow `torch.set_num_threads`.

For the disk cache, the engine's machine code is kept too: the engine compiles
position-independent code (measured: no slower to run), `shared_library` links its object
file into a shared library with the system linker (`ld`, ~10 ms; libtorch_cpu.so is linked
by name, so the loaded library binds the BLAS of the torch in this process), and
`SharedKernels` loads it back: a second process gets the kernels without LLVM.
"""

import ctypes
import os
import shutil
import subprocess
import tempfile

import torch
from torch_mlir import ir
from torch_mlir.execution_engine import ExecutionEngine

_BLAS_SYMBOLS = ("sgemm_", "dgemm_")


def blas_symbols() -> dict:
    """Native addresses of the BLAS entry points, by symbol name."""
    lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
    return {name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in _BLAS_SYMBOLS}


def jit(module: ir.Module, opt_level: int = 2) -> ExecutionEngine:
    """JIT-compiles an LLVM-dialect module (-O2: -O3 measured no faster to run or to compile,
    W3: 1.5 s of LLVM codegen either way) and links the BLAS symbols into it."""
    engine = ExecutionEngine(module, opt_level=opt_level, enable_pic=True)
    for name, address in blas_symbols().items():
        engine.raw_register_runtime(name, ctypes.c_void_p(address))
    engine.initialize()
    return engine


def object_code(engine: ExecutionEngine) -> bytes:
    """The machine code of a compiled engine, as an ELF relocatable object."""
    with tempfile.TemporaryDirectory(prefix="camlir-obj-") as tmp:
        path = os.path.join(tmp, "kernels.o")
        engine.dump_to_object_file(path)
        with open(path, "rb") as f:
            return f.read()


class LinkError(RuntimeError):
    """The system linker is missing or refused the object."""


def shared_library(obj: bytes) -> bytes:
    """`obj` (from `object_code`) linked into a shared library. Its undefined symbols are
    the BLAS entry points (bound by libtorch_cpu.so's name, already loaded by torch) and
    libm/libc functions."""
    linker = shutil.which("ld") or shutil.which("ld.lld") or shutil.which("ld.gold")
    if linker is None:
        raise LinkError("no system linker (ld) on the PATH: the disk cache keeps no native code")
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    with tempfile.TemporaryDirectory(prefix="camlir-link-") as tmp:
        src, out = os.path.join(tmp, "kernels.o"), os.path.join(tmp, "kernels.so")
        with open(src, "wb") as f:
            f.write(obj)
        # -L + -l: only the library's name is recorded, never this machine's path.
        cmd = [linker, "-shared", "-o", out, src, "-L", torch_lib, "-l:libtorch_cpu.so", "-lm", "-lc"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise LinkError(f"{' '.join(cmd[:1])} failed: {done.stderr.strip()[:500]}")
        with open(out, "rb") as f:
            return f.read()


class SharedKernels:
    """A shared library from `shared_library`, loaded: `raw_lookup(name)` gives the packed
    entry point the engine's `raw_lookup` would (`_mlir_<name>`), so `abi.Kernel` takes
    either. The bytes are written to a private temporary file and loaded from there (a
    cache entry can be evicted by another process at any time); the file is removed once
    loaded: the mapping stays. The library's dependency on libtorch_cpu.so binds to the
    copy torch loaded (the loader matches it by soname), wherever it lives."""

    def __init__(self, library: bytes):
        fd, path = tempfile.mkstemp(prefix="camlir-kernels-", suffix=".so")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(library)
            self._lib = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        finally:
            os.unlink(path)

    def raw_lookup(self, name: str) -> int:
        try:
            return ctypes.cast(getattr(self._lib, "_mlir_" + name), ctypes.c_void_p).value or 0
        except AttributeError:
            return 0

