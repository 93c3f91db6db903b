"""PTX from the NVVM-lowered kernels: MLIR's LLVM IR translation, then llvmlite's NVPTX.

Why llvmlite: the torch-mlir wheel's LLVM has only the X86 target, so `gpu-module-to-binary`
cannot make PTX ("Unable to find target for this triple"). `llvmlite` (PyPI, pinned in
pyproject.toml) bundles an LLVM with the NVPTX target registered. MLIR translates the
`llvm`/`nvvm` dialect module to LLVM IR text; llvmlite parses it, links libdevice, runs
LLVM's O3 pipeline (which includes NVVMReflect, resolving libdevice's `__nvvm_reflect`
queries) and prints PTX.

Decisions (docs/gpu-backend.md):
- PTX ISA 8.0 (`+ptx80`): CUDA 12.0's ptxas and drivers >= 525 accept it; sm_90 needs ISA
  7.8 at least. One ISA for every target keeps the artifact's text identical but for
  `.target`.
- Targets `sm_80` (A100) and `sm_90` (H100/H200); the default is sm_90, and a PTX for sm_80
  also runs (JIT-compiled by the driver) on sm_90.
- Math goes to libdevice (`__nv_expf`, `__nv_erff`, ...): `convert-gpu-to-nvvm` rewrites
  math ops into these calls. An `llvm.exp.f32` intrinsic aborts the NVPTX backend (the
  process, not an exception), so none may reach codegen.
- Every function but the kernels is made internal before optimizing, so LLVM drops the
  libdevice functions no kernel calls (a probe: 22,133 PTX lines with them, 72 without).
"""

import glob
import os
import re
import shutil
import struct
import subprocess
import tempfile

from camlir import environment

PTX_ISA = "+ptx80"
TARGETS = ("sm_80", "sm_90")
DEFAULT_TARGET = "sm_90"
TRIPLE = "nvptx64-nvidia-cuda"


class CodegenError(RuntimeError):
    """libdevice is missing, llvmlite is missing, or LLVM refused the module."""


def libdevice_path() -> str:
    """libdevice.10.bc: `$CAMLIR_LIBDEVICE`, else under `$CUDA_HOME`/`$CUDA_PATH`, else next to
    the `ptxas` on the PATH (`<cuda>/bin/ptxas` -> `<cuda>/nvvm/libdevice/`), else the copy
    the `triton` wheel ships (`triton/backends/nvidia/lib/`)."""
    explicit = environment.text("CAMLIR_LIBDEVICE")
    if explicit:
        return explicit
    roots = [environment.raw(v) for v in ("CUDA_HOME", "CUDA_PATH")]
    ptxas = shutil.which("ptxas")
    if ptxas:
        real = os.path.realpath(ptxas)
        roots += [os.path.dirname(os.path.dirname(real)), os.path.dirname(os.path.dirname(ptxas))]
    roots += sorted(glob.glob("/usr/local/cuda*"), reverse=True)
    for root in roots:
        if root:
            path = os.path.join(root, "nvvm", "libdevice", "libdevice.10.bc")
            if os.path.isfile(path):
                return path
    try:
        import triton  # noqa: F401 - only to find its bundled libdevice
        path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "lib", "libdevice.10.bc")
        if os.path.isfile(path):
            return path
    except ImportError:
        pass
    raise CodegenError("libdevice.10.bc not found: set CUDA_HOME (or CAMLIR_LIBDEVICE), or put ptxas of a "
                       "CUDA toolkit on the PATH")


_LLVM = {}


def _llvm():
    if not _LLVM:
        try:
            import llvmlite.binding as llvm
        except ImportError as exc:
            raise CodegenError("the gpu backend needs llvmlite (pip install llvmlite; pinned in "
                               "pyproject.toml)") from exc
        llvm.initialize_all_targets()
        llvm.initialize_all_asmprinters()
        _LLVM["llvm"] = llvm
        with open(libdevice_path(), "rb") as f:
            _LLVM["libdevice"] = f.read()
    return _LLVM["llvm"]


_HEX_FLOAT = re.compile(r"\b(half|bfloat|float|double)?(\s*)f0x([0-9A-Fa-f]+)\b")


def older_float_syntax(llvm_ir: str) -> str:
    """MLIR's LLVM (24) writes float constants as `f0x<bits>`, which llvmlite's LLVM (22)
    cannot parse: rewritten to the older forms (`0x<double bits>` for float and double,
    `0xH`/`0xR` for half and bfloat)."""
    def older(m):
        kind, space, digits = m.group(1), m.group(2), m.group(3)
        prefix = (kind or "") + space
        if len(digits) == 16:
            return f"{prefix}0x{digits.upper()}"
        if len(digits) == 8:
            value = struct.unpack("<f", struct.pack("<I", int(digits, 16)))[0]
            return f"{prefix}0x{struct.unpack('<Q', struct.pack('<d', value))[0]:016X}"
        if len(digits) == 4:
            return f"{prefix}0x{'R' if kind == 'bfloat' else 'H'}{digits.upper()}"
        return m.group(0)
    return _HEX_FLOAT.sub(older, llvm_ir)


def ptx_from_llvm_ir(llvm_ir: str, kernels: list, target: str = DEFAULT_TARGET) -> str:
    """PTX text for `target` from LLVM IR text whose entry points are `kernels`."""
    if target not in TARGETS:
        raise CodegenError(f"target {target} is not one of {', '.join(TARGETS)}")
    llvm = _llvm()
    try:
        module = llvm.parse_assembly(older_float_syntax(llvm_ir))
        module.triple = TRIPLE
        libdevice = llvm.parse_bitcode(_LLVM["libdevice"])
        libdevice.triple = TRIPLE
        machine = llvm.Target.from_triple(TRIPLE).create_target_machine(cpu=target, features=PTX_ISA, opt=3)
        module.data_layout = libdevice.data_layout = str(machine.target_data)
        module.link_in(libdevice)
        entries = set(kernels)
        for fn in module.functions:
            if not fn.is_declaration and fn.name not in entries:
                fn.linkage = "internal"
        builder = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(speed_level=3))
        builder.getModulePassManager().run(module, builder)
        module.verify()
        return machine.emit_assembly(module)
    except RuntimeError as exc:
        raise CodegenError(f"LLVM NVPTX codegen failed: {exc}") from exc


def ptxas_path():
    """The `ptxas` on the PATH (or under `$CUDA_HOME/bin`), or None."""
    found = shutil.which("ptxas")
    if found:
        return found
    home = environment.raw("CUDA_HOME") or environment.raw("CUDA_PATH")
    if home and os.path.isfile(os.path.join(home, "bin", "ptxas")):
        return os.path.join(home, "bin", "ptxas")
    return None


def assemble(ptx: str, target: str = DEFAULT_TARGET) -> bytes:
    """The cubin ptxas makes of `ptx` for `target` (raises CodegenError with ptxas's message)."""
    ptxas = ptxas_path()
    if ptxas is None:
        raise CodegenError("ptxas not found (PATH, CUDA_HOME)")
    with tempfile.TemporaryDirectory(prefix="camlir-ptx-") as tmp:
        src, out = os.path.join(tmp, "kernels.ptx"), os.path.join(tmp, "kernels.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        done = subprocess.run([ptxas, f"-arch={target}", src, "-o", out], capture_output=True, text=True)
        if done.returncode != 0:
            raise CodegenError(f"ptxas -arch={target} failed: {done.stderr.strip()[:2000]}")
        with open(out, "rb") as f:
            return f.read()
