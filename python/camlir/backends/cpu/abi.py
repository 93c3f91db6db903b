"""Calling a JIT-compiled kernel on torch tensors without copies or per-call rebuilding.

A kernel `@k(inputs...) -> results...` was compiled with identity-layout (contiguous)
static memrefs; its results became out-parameters after the inputs. The C interface
`_mlir_ciface_k` takes a pointer to one memref descriptor per argument:
`{allocated, aligned, offset, sizes[rank], strides[rank]}`.

All descriptors of a kernel are built once, with the sizes and strides fixed at compile
time; a call only writes two pointers per tensor and calls the packed entry point
(`void (*)(void **)`) through ctypes. Building descriptors with MLIR's numpy helpers costs
about 94 us per array; this path costs well under a microsecond per tensor.

Inputs must be contiguous with the expected shape and dtype: the host program guarantees it
(the variant was specialised on the first call's layouts: `ca-specialize-layouts`, and
`CpuProgram` passes permuted views).
"""

import ctypes
from dataclasses import dataclass

import torch

_DTYPES = {
    "f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "bf16": torch.bfloat16,
    "i64": torch.int64, "i32": torch.int32, "i16": torch.int16, "i8": torch.int8, "i1": torch.bool,
    "ui8": torch.uint8,
}

_DESCRIPTOR_TYPES = {}


def descriptor_type(rank: int):
    """The ctypes Structure of a rank-`rank` memref descriptor (built once per rank, cached).

    Fields `allocated`, `aligned`, `offset`, then `sizes` and `strides` (arrays of `rank`
    int64) when `rank > 0`: `descriptor_type(2)` is `MemRef2D`, a 0-d tensor's has no arrays.
    """
    if rank not in _DESCRIPTOR_TYPES:
        fields = [("allocated", ctypes.c_void_p), ("aligned", ctypes.c_void_p), ("offset", ctypes.c_longlong)]
        if rank:
            fields += [("sizes", ctypes.c_longlong * rank), ("strides", ctypes.c_longlong * rank)]
        _DESCRIPTOR_TYPES[rank] = type(f"MemRef{rank}D", (ctypes.Structure,), {"_fields_": fields})
    return _DESCRIPTOR_TYPES[rank]


@dataclass(frozen=True)
class TensorSpec:
    """The static shape and torch dtype of one kernel argument or result.

    `TensorSpec.from_type("tensor<4x8xf32>")` is `TensorSpec((4, 8), torch.float32)`.
    """

    shape: tuple
    dtype: torch.dtype

    @staticmethod
    def from_type(t) -> "TensorSpec":
        """From a builtin `tensor<...>` or `!torch.vtensor<[...],dt>` type's text."""
        text = str(t)
        if text.startswith("tensor<"):
            body = text[len("tensor<"):-1]
            *dims, elem = body.split("x")
            shape = tuple(int(d) for d in dims)
        elif text.startswith("!torch.vtensor<["):
            dims_text, elem = text[len("!torch.vtensor<["):-1].split("],")
            shape = tuple(int(d) for d in dims_text.split(",")) if dims_text else ()
        else:
            raise TypeError(f"kernel argument of type {text} is not a tensor")
        if any(d < 0 for d in shape) or "?" in text:
            raise TypeError(f"kernel argument {text} has a dynamic size; specialise shapes first")
        elem = elem.strip()
        elem = {"si64": "i64", "si32": "i32", "si16": "i16", "si8": "i8"}.get(elem, elem)
        if elem not in _DTYPES:
            raise TypeError(f"kernel argument {text}: element type {elem} is not supported")
        return TensorSpec(shape, _DTYPES[elem])


def _contiguous_strides(shape) -> list:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return list(reversed(strides))


class Kernel:
    """One compiled kernel, callable as `kernel(inputs) -> outputs` on torch tensors."""

    def __init__(self, engine, name: str, inputs: list, outputs: list):
        self.name = name
        self.inputs = inputs
        self.outputs = outputs
        self._engine = engine  # keeps the code alive
        address = engine.raw_lookup("_mlir_ciface_" + name)
        if not address:
            raise RuntimeError(f"kernel {name} not found in the compiled module")
        self._fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(address)
        self._descs = []
        specs = inputs + outputs
        self._packed = (ctypes.c_void_p * len(specs))()
        self._keep = []
        for i, spec in enumerate(specs):
            desc = descriptor_type(len(spec.shape))()
            desc.offset = 0
            if spec.shape:
                desc.sizes[:] = list(spec.shape)
                desc.strides[:] = _contiguous_strides(spec.shape)
            ptr = ctypes.pointer(desc)
            ptr_ptr = ctypes.pointer(ptr)
            self._keep += [ptr, ptr_ptr]
            self._packed[i] = ctypes.cast(ptr_ptr, ctypes.c_void_p)
            self._descs.append(desc)
        self._out_specs = [(s.shape, s.dtype) for s in outputs]

    def __call__(self, args: list) -> list:
        descs = self._descs
        keep = None
        for desc, t in zip(descs, args):
            if not t.is_contiguous():
                # A layout the variant did not expect (a hook's result, a later call):
                # copy rather than read it with the wrong strides.
                t = t.contiguous()
                keep = [t] if keep is None else keep + [t]
            p = t.data_ptr()
            desc.allocated = p
            desc.aligned = p
        outs = [torch.empty(shape, dtype=dtype) for shape, dtype in self._out_specs]
        for desc, t in zip(descs[len(args):], outs):
            p = t.data_ptr()
            desc.allocated = p
            desc.aligned = p
        self._fn(self._packed)
        del keep
        return outs
