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
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Optional

from torch_mlir import ir
from torch_mlir.execution_engine import ExecutionEngine

from camlir import environment

_BLAS_SYMBOLS = ("sgemm_", "dgemm_", "sgemm_batch_", "dgemm_batch_")
# MKL's bf16 GEMM (f32 result), for kernels of ca-bf16-matmuls; looked up where present.
_OPTIONAL_BLAS = ("gemm_bf16bf16f32_",)
# libgomp's, for the threads stage (passes/parallel_loops.py); reached through
# libtorch_cpu.so, which links the libgomp torch's OpenMP threads belong to.
_OMP_SYMBOLS = ("GOMP_parallel", "omp_get_thread_num", "omp_get_num_threads",
                "_ZN2at15get_num_threadsEv")  # torch's thread count (parallel_loops.TORCH_NUM_THREADS)
_symbols: dict = {}
# The packed entry point ca-define-blas-wrappers defines for the profiler's BLAS totals
# (passes/matmul_to_blas.py, BLAS_TOTALS_SYMBOL: not imported, the runtime loads no passes).
BLAS_TOTALS_SYMBOL = "camlir_blas_totals"


def torch_lib_dir() -> str:
    """The folder of torch's native libraries, found without importing torch (a compile
    worker runs this module without torch: it starts in 0.4 s instead of 3.3 s)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise LinkError("torch is not installed: no libtorch_cpu.so to link the kernels' BLAS calls to")
    return os.path.join(list(spec.submodule_search_locations)[0], "lib")


def _torch_cpu():
    return ctypes.CDLL(os.path.join(torch_lib_dir(), "libtorch_cpu.so"))


def blas_symbols() -> dict:
    """Native addresses of the BLAS entry points (and of libgomp's, where the process has
    them: `parallel_runtime`), by symbol name."""
    if not _symbols:
        lib = _torch_cpu()
        found = {name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in _BLAS_SYMBOLS}
        for name in _OPTIONAL_BLAS:
            try:
                found[name] = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
            except AttributeError:  # an MKL without it: native_bf16_gemm() says no
                pass
        try:
            found.update({name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in _OMP_SYMBOLS})
        except AttributeError:  # a torch built without OpenMP: kernels stay on one thread
            pass
        _symbols.update(found)
    return dict(_symbols)


_ASSUMED: dict = {}  # facts a compile worker was told by the training process (`assume`)


def parallel_runtime() -> bool:
    """Whether kernels may split loops over torch's OpenMP threads: libgomp is reachable and
    `CAMLIR_THREADS` is not 0."""
    if not environment.flag("CAMLIR_THREADS"):
        return False
    if "parallel_runtime" in _ASSUMED:
        return _ASSUMED["parallel_runtime"]
    return all(name in blas_symbols() for name in _OMP_SYMBOLS)


def facts() -> dict:
    """What decides the code here and a compile worker cannot see without loading torch's
    libraries (0.15 s and 113 MB there): whether libgomp is reachable, whether MKL has its
    bf16 GEMM."""
    return {"parallel_runtime": all(name in blas_symbols() for name in _OMP_SYMBOLS),
            "bf16_gemm": "gemm_bf16bf16f32_" in blas_symbols()}


def assume(told: dict) -> None:
    """In a compile worker: the training process's `facts()`, used instead of looking."""
    _ASSUMED.clear()
    _ASSUMED.update(told)


_WIDTH = []  # the vector width, once known (the CPU does not change under a process)


def vector_width() -> int:
    """f32 lanes per vector of the loops stage: 16 where the CPU has AVX-512 (the JIT
    compiles for this host, so `vector<16xf32>` is one zmm register), else 8 (AVX2's ymm).
    `CAMLIR_VECTOR_WIDTH` (8 or 16) overrides it; a kernel module with f64 values always
    takes 8 (`compiler.loops_and_llvm` says why). Measured on the 2-core AVX-512 Xeon, 4 x
    (mul, GELU) backward on 64 x 1024: 8 lanes 1.32-1.41x eager, 16 lanes 1.21-1.28x."""
    forced = environment.integer("CAMLIR_VECTOR_WIDTH")
    if forced is not None:
        if forced not in (8, 16):
            raise ValueError(f"CAMLIR_VECTOR_WIDTH must be 8 or 16, got {forced}")
        return forced
    if not _WIDTH:
        _WIDTH.append(16 if "avx512f" in _cpu_flags() else 8)
    return _WIDTH[0]


def native_bf16_gemm() -> bool:
    """Whether bf16 matmuls go to MKL's bf16 GEMM (`ca-bf16-matmuls`): the CPU has bf16
    units (`avx512_bf16` or `amx_bf16`) and torch's MKL exports `gemm_bf16bf16f32_`.
    Measured on this Sapphire Rapids Xeon, one thread: 44 us against sgemm's 214 for
    256 x 512 x 128 (docs/speed.md). Elsewhere MKL would emulate bf16, and sgemm stays."""
    if not _BF16:
        has = bool({"avx512_bf16", "amx_bf16"} & _cpu_flags())
        if has:
            has = _ASSUMED["bf16_gemm"] if "bf16_gemm" in _ASSUMED else "gemm_bf16bf16f32_" in blas_symbols()
        _BF16.append(has)
    return _BF16[0]


_BF16: list = []


def _cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def parallel_min_elements() -> int:
    """The smallest loop nest (in iterations) that the threads stage splits over the threads:
    32768, the grain below which PyTorch's own elementwise kernels stay on one thread.
    `CAMLIR_THREADS_MIN_ELEMENTS` overrides it (the fuzzer sets it low, so that the split
    runs on its small programs)."""
    return max(1, environment.integer("CAMLIR_THREADS_MIN_ELEMENTS"))


def jit(module: ir.Module, opt_level: int = 2) -> ExecutionEngine:
    """JIT-compiles an LLVM-dialect module (-O2: -O3 measured no faster to run or to compile,
    W3: 1.5 s of LLVM codegen either way) and links the BLAS (and libgomp) symbols into it."""
    engine = ExecutionEngine(module, opt_level=opt_level, enable_pic=True)
    for name, address in blas_symbols().items():
        engine.raw_register_runtime(name, ctypes.c_void_p(address))
    engine.initialize()
    return engine


# A module with fewer ops than this in its kernels compiles in this process alone:
# starting a worker costs ~0.2 s, and LLVM takes ~0.11 ms per op (T5's backward: 27,000
# LLVM-dialect ops in its kernels, 3.1 s; MobileNetV3's: 3.4 s).
PARALLEL_MIN_OPS = 5_000


def codegen_workers() -> int:
    """How many worker processes compile parts of a big kernel module besides this one:
    `CAMLIR_JIT_WORKERS`, else one less than the cores this process may run on (at most 7)."""
    value = environment.integer("CAMLIR_JIT_WORKERS")
    if value is not None:
        return max(0, value)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(0, min(cores - 1, 7))


def compile_kernels(module: ir.Module, workers: Optional[int] = None):
    """`jit(module)`, with LLVM's work spread over processes when the module is big: its
    kernels are split into parts of about equal size (each part keeps the module's helpers
    and declarations), worker processes (`codegen_worker.py`) compile all parts but the
    first to object code while this process JIT-compiles the first, and each worker's
    object is linked and loaded (`SharedKernels`). Returns something with `raw_lookup`, like
    an engine; `objects_of` gives its machine code for the disk cache. A worker that fails
    is logged and its part compiled here: the result is the same code either way."""
    workers = codegen_workers() if workers is None else workers
    parts = _split(module, workers + 1) if workers else None
    if parts is None:
        return jit(module)
    texts = [part.operation.get_asm(assume_verified=True) for part in parts[1:]]
    started = [_Worker(text) for text in texts]
    local = jit(parts[0])
    _force_codegen(local, parts[0])
    libraries, objects = [], []
    for worker, part in zip(started, parts[1:]):
        try:
            obj = worker.result()
            libraries.append(SharedKernels(shared_library(obj)))
            objects.append(obj)
        except (WorkerError, LinkError, OSError) as exc:
            logging.getLogger("camlir").info("a codegen worker failed (%s); compiling its part here", exc)
            engine = jit(part)
            _force_codegen(engine, part)
            libraries.append(engine)
            objects.append(None)
    return PartedKernels(local, libraries, objects)


def compile_objects(module: ir.Module, workers: Optional[int] = None) -> list:
    """The machine code of the LLVM-dialect `module` as ELF objects, for a process that will
    not run it (a compile worker): the parts of a big module (`_split`) go to codegen worker
    processes as in `compile_kernels`, the first is compiled here; no BLAS address is needed
    (the objects keep those calls as relocations, bound when the library is loaded)."""
    from camlir.backends.cpu.codegen_worker import compile_to_object

    workers = codegen_workers() if workers is None else workers
    parts = _split(module, workers + 1) if workers else None
    if parts is None:
        return [compile_to_object(module.operation.get_asm(assume_verified=True))]
    texts = [part.operation.get_asm(assume_verified=True) for part in parts]
    started = [_Worker(text) for text in texts[1:]]
    objects = [compile_to_object(texts[0])]
    for worker, text in zip(started, texts[1:]):
        try:
            objects.append(worker.result())
        except (WorkerError, OSError) as exc:
            logging.getLogger("camlir").info("a codegen worker failed (%s); compiling its part here", exc)
            objects.append(compile_to_object(text))
    return objects


class PartedKernels:
    """The kernels of one module compiled in parts (`compile_kernels`): `raw_lookup` finds a
    kernel's entry point in whichever part has it."""

    def __init__(self, local: ExecutionEngine, others: list, objects: list):
        self.local = local
        self.others = others     # SharedKernels (or an engine, for a part compiled here)
        self.objects = objects   # each other part's object code (None: compiled here)

    def raw_lookup(self, name: str) -> int:
        for part in [self.local] + self.others:
            address = part.raw_lookup(name)
            if address:
                return address
        return 0


def blas_totals(compiled, kernel_symbol: str):
    """The [nanoseconds, flops, calls] the BLAS calls of the loaded code that holds
    `kernel_symbol` have summed (`camlir_blas_totals` of ca-define-blas-wrappers), as a
    ctypes array read in place; None where that code calls no BLAS (or was compiled before
    the counters existed). `compiled`: an engine, `SharedKernels` or `PartedKernels`."""
    parts = [compiled.local] + compiled.others if isinstance(compiled, PartedKernels) else [compiled]
    for part in parts:
        if not part.raw_lookup("_mlir_ciface_" + kernel_symbol):
            continue
        getter = part.raw_lookup(BLAS_TOTALS_SYMBOL)
        if not getter:
            return None
        address = ctypes.c_int64(0)
        args = (ctypes.c_void_p * 1)(ctypes.addressof(address))
        ctypes.CFUNCTYPE(None, ctypes.c_void_p)(getter)(args)  # packed: args[0] -> the result
        return (ctypes.c_int64 * 3).from_address(address.value) if address.value else None
    return None


def objects_of(compiled) -> list:
    """The machine code of `jit` or `compile_kernels` output, as ELF relocatable objects."""
    if isinstance(compiled, PartedKernels):
        return [object_code(compiled.local)] + [obj if obj is not None else object_code(part)
                                                for obj, part in zip(compiled.objects, compiled.others)]
    return [object_code(compiled)]


class WorkerError(RuntimeError):
    """A codegen worker exited with an error."""


WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "codegen_worker.py")


class _Worker:
    """One `codegen_worker.py` process compiling `text`; `result()` waits for its object.
    Text, object and errors go through files: pipes would need a thread to feed them, and
    a thread gets no turn while this process compiles (the ExecutionEngine holds the GIL),
    so the worker would wait for its input until this process's own part was done."""

    def __init__(self, text: str):
        self._dir = tempfile.TemporaryDirectory(prefix="camlir-codegen-")
        src, self._obj, self._err = (os.path.join(self._dir.name, n) for n in ("part.mlir", "part.o", "errors"))
        with open(src, "w") as f:
            f.write(text)
        script = WORKER_SCRIPT
        with open(self._err, "wb") as err:
            self._proc = subprocess.Popen([sys.executable, script, src, self._obj], stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=err)

    def result(self) -> bytes:
        try:
            status = self._proc.wait()
            if status != 0 or not os.path.exists(self._obj):
                with open(self._err, "rb") as f:
                    why = f.read().decode(errors="replace").strip()[-500:]
                raise WorkerError(f"exit status {status}: {why}")
            with open(self._obj, "rb") as f:
                return f.read()
        finally:
            self._dir.cleanup()


_PREFIXES = ("_mlir_ciface_", "_mlir_")


def _split(module: ir.Module, count: int) -> Optional[list]:
    """The module as `count` (or fewer) new modules, each with a clone of every op that is
    not a kernel's (helpers, declarations, constants) and a share of the kernels, balanced
    by op count; None when the kernels are too small to be worth it or fewer than two.
    Cloned, not cut from the printed text: a module with large constants prints them as
    resources after its body, which a textual cut lost (Swin's backward; "Unable to parse
    module assembly"); each clone prints with the resources it uses."""
    common, kernels = [], {}
    for op in module.body.operations:
        op = op.operation
        name = ir.StringAttr(op.attributes["sym_name"]).value if op.name == "llvm.func" else ""
        for prefix in _PREFIXES:
            name = name.removeprefix(prefix)
        name = name.partition("__par")[0]  # a kernel's outlined loops, forks, tasks: with it
        if "_kernel_" in name and len(op.regions[0].blocks):
            kernels.setdefault(name, []).append(op)
        else:
            common.append(op)
    if len(kernels) < 2:
        return None
    sizes = {name: sum(_op_count(op) for op in ops) for name, ops in kernels.items()}
    if sum(sizes.values()) < PARALLEL_MIN_OPS:
        return None
    bins = [[] for _ in range(min(count, len(kernels)))]
    loads = [0] * len(bins)
    for name in sorted(kernels, key=lambda n: -sizes[n]):  # largest first, into the lightest part
        i = loads.index(min(loads))
        bins[i].append(name)
        loads[i] += sizes[name]
    parts = []
    with module.context, ir.Location.unknown():
        for names in bins:
            part = ir.Module.create()
            for op in common + [op for name in names for op in kernels[name]]:
                op.clone(ir.InsertionPoint(part.body))
            parts.append(part)
    return parts


def _op_count(op: ir.Operation) -> int:
    count = [0]

    def visit(_):
        count[0] += 1
        return ir.WalkResult.ADVANCE

    op.walk(visit)
    return count[0]


def _force_codegen(engine: ExecutionEngine, module: ir.Module) -> None:
    """LLVM's codegen runs at the first symbol lookup: done now, so that it overlaps the
    workers' instead of landing on the first kernel call."""
    for op in module.body.operations:
        op = op.operation
        if op.name == "llvm.func" and len(op.regions[0].blocks):
            name = ir.StringAttr(op.attributes["sym_name"]).value
            if "_kernel_" in name:
                engine.raw_lookup(name)
                return


def object_code(engine: ExecutionEngine) -> bytes:
    """The machine code of a compiled engine, as an ELF relocatable object."""
    with tempfile.TemporaryDirectory(prefix="camlir-obj-") as tmp:
        path = os.path.join(tmp, "kernels.o")
        engine.dump_to_object_file(path)
        with open(path, "rb") as f:
            return f.read()


class LinkError(RuntimeError):
    """The system linker is missing or refused the object."""


def shared_library(*objects: bytes) -> bytes:
    """`objects` (from `object_code` or `objects_of`) linked into one shared library. Its
    undefined symbols are the BLAS entry points (bound by libtorch_cpu.so's name, already
    loaded by torch) and libm/libc functions. The parts of one module compiled apart
    (`compile_kernels`) each define the same helpers (the gemm wrappers), compiled from the
    same IR: the linker keeps the first definition of each."""
    linker = shutil.which("ld") or shutil.which("ld.lld") or shutil.which("ld.gold")
    if linker is None:
        raise LinkError("no system linker (ld) on the PATH: the disk cache keeps no native code")
    torch_lib = torch_lib_dir()
    with tempfile.TemporaryDirectory(prefix="camlir-link-") as tmp:
        out = os.path.join(tmp, "kernels.so")
        sources = []
        for i, obj in enumerate(objects):
            sources.append(os.path.join(tmp, f"kernels{i}.o"))
            with open(sources[-1], "wb") as f:
                f.write(obj)
        shared = ["--allow-multiple-definition"] if len(objects) > 1 else []
        # -L + -l: only the library's name is recorded, never this machine's path.
        cmd = [linker, "-shared", *shared, "-o", out, *sources, "-L", torch_lib, "-l:libtorch_cpu.so", "-lm", "-lc"]
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
    copy torch loaded (the loader matches it by soname), wherever it lives.

    `CAMLIR_KEEP_KERNEL_LIBS=1` keeps the file (its path is logged at INFO on
    `camlir.cpu`): a measurement aid, so that `perf report` can name every loop nest of a
    kernel (docs/speed.md, "Where the time inside camlir's kernels goes")."""

    def __init__(self, library: bytes):
        fd, path = tempfile.mkstemp(prefix="camlir-kernels-", suffix=".so")
        keep = environment.flag("CAMLIR_KEEP_KERNEL_LIBS")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(library)
            self._lib = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        finally:
            if keep:
                logging.getLogger("camlir.cpu").info("kernel library kept at %s", path)
            else:
                os.unlink(path)

    def raw_lookup(self, name: str) -> int:
        try:
            return ctypes.cast(getattr(self._lib, "_mlir_" + name), ctypes.c_void_p).value or 0
        except AttributeError:
            return 0

