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

Kernels with dynamic dims (`Variant(runtime_sizes=True)`) take `DynamicKernel`:
the descriptors are still built once, but every call also writes each tensor's sizes and
(contiguous) strides, and the value of each scalar argument (a lifted size, `i64`), and
allocates the outputs with the shapes that the kernel's shape function
(`camlir.backends.cpu.shapes`) computes from this call's arguments.
"""

import ctypes
from dataclasses import dataclass

import torch

from camlir.backends.cpu.jit import blas_totals

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

    shape: tuple  # None for a dynamic dim (only with `from_type(..., dynamic=True)`)
    dtype: torch.dtype

    @staticmethod
    def from_type(t, runtime_sizes: bool = False) -> "TensorSpec":
        """From a builtin `tensor<...>` or `!torch.vtensor<[...],dt>` type's text. A `?` dim
        is refused unless `runtime_sizes`, then it is None."""
        text = str(t)

        def dim(d):
            return None if d in ("?", "-1") and runtime_sizes else int(d)

        try:
            if text.startswith("tensor<"):
                body = text[len("tensor<"):-1]
                *dims, elem = body.split("x")
                shape = tuple(dim(d) for d in dims)
            elif text.startswith("!torch.vtensor<["):
                dims_text, elem = text[len("!torch.vtensor<["):-1].split("],")
                shape = tuple(dim(d) for d in dims_text.split(",")) if dims_text else ()
            else:
                raise TypeError(f"kernel argument of type {text} is not a tensor")
        except ValueError:
            raise TypeError(f"kernel argument {text} has a dynamic size; specialise shapes first") from None
        if any(d is not None and d < 0 for d in shape):
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

    def __init__(self, engine, name: str, inputs: list, outputs: list, symbol: str = ""):
        self.name = name
        self.inputs = inputs
        self.outputs = outputs
        self._engine = engine  # keeps the code alive
        # `symbol`: the kernel whose code this one shares (same_kernels.merge_identical)
        address = engine.raw_lookup("_mlir_ciface_" + (symbol or name))
        if not address:
            raise RuntimeError(f"kernel {name} not found in the compiled module")
        self._fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(address)
        self.blas = blas_totals(engine, symbol or name)  # for camlir.profile(): its BLAS time
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
        # Per input (descriptor, shape, dtype); per output (descriptor, shape, dtype), read by
        # every call. `torch.empty(*shape, dtype=)` costs 1.4 us where `torch.empty(shape,
        # dtype=)` costs 2.2 (the tuple goes through a slower argument parser); a 0-d result
        # has no sizes to spread.
        self._ins = [(desc, torch.Size(s.shape), s.dtype) for desc, s in zip(self._descs, inputs)]
        self._outs = [(desc, tuple(s.shape), s.dtype) for desc, s in zip(self._descs[len(inputs):], outputs)]

    def __call__(self, args: list) -> list:
        if len(args) != len(self._ins):
            self._refuse(args)
        keep = None
        for (desc, shape, dtype), t in zip(self._ins, args):
            if t.shape != shape or t.dtype != dtype:
                # The kernel would read it with the compiled sizes: wrong values or a crash.
                # (A host op whose result disagreed with its traced shape once gave silently
                # wrong gradients this way.) ~0.1 us per argument.
                self._refuse(args)
            if not t.is_contiguous():
                # A layout the variant did not expect (a hook's result, a later call):
                # copy rather than read it with the wrong strides.
                t = t.contiguous()
                keep = [t] if keep is None else keep + [t]
            desc.allocated = desc.aligned = t.data_ptr()
        outs = []
        for desc, shape, dtype in self._outs:
            t = torch.empty(*shape, dtype=dtype) if shape else torch.empty((), dtype=dtype)
            desc.allocated = desc.aligned = t.data_ptr()
            outs.append(t)
        self._fn(self._packed)
        del keep
        return outs

    def _refuse(self, args):
        if len(args) != len(self._ins):
            raise RuntimeError(f"camlir: kernel {self.name} got {len(args)} arguments, but it was compiled for "
                               f"{len(self._ins)}; this is a camlir bug, please report it")
        for i, ((_, shape, dtype), t) in enumerate(zip(self._ins, args)):
            if t.shape != shape or t.dtype != dtype:
                raise RuntimeError(
                    f"camlir: kernel {self.name} argument {i} is {tuple(t.shape)} {t.dtype}, but it was "
                    f"compiled for {tuple(shape)} {dtype}; this is a camlir bug, please report it "
                    f"(camlir.save_repro writes a replayable case)")


@dataclass(frozen=True)
class ScalarSpec:
    """A scalar kernel argument (a lifted size, passed as `i64`; or an `f64`)."""

    ctype: type  # ctypes.c_int64 or ctypes.c_double

    @staticmethod
    def from_type(t) -> "ScalarSpec":
        text = str(t)
        if text in ("i64", "index"):
            return ScalarSpec(ctypes.c_int64)
        if text == "f64":
            return ScalarSpec(ctypes.c_double)
        raise TypeError(f"kernel argument of type {text} is not supported by the dynamic ABI")


def spec_of(t, runtime_sizes: bool = False):
    """The spec of one kernel argument or result type: tensors always, scalars (the sizes a
    kernel reads) with `runtime_sizes`."""
    if runtime_sizes and not str(t).startswith(("tensor<", "!torch.vtensor<")):
        return ScalarSpec.from_type(t)
    return TensorSpec.from_type(t, runtime_sizes)


class DynamicKernel:
    """A compiled kernel with dynamic dims, callable as `kernel(args) -> outputs`.

    `inputs` are `TensorSpec`s (None for a dynamic dim) and `ScalarSpec`s, in argument
    order; `outputs` the results' `TensorSpec`s; `shape_fn(*args)` returns each output's
    shape for this call's arguments (`shapes.derive`; it raises `shapes.ShapeError` where
    the kernel's own size check would abort). Per call: one shape function call, and per
    tensor two pointers written into the prebuilt descriptors, plus its sizes and strides
    when its spec has dynamic dims and its shape differs from the last call's.

    An output with dynamic dims was an allocation inside the kernel before
    `buffer-results-to-out-params{hoist-dynamic-allocs}` made it the out-parameter; an output
    the pass cannot hoist (a view of another buffer) is computed into a temporary and copied
    into the out-parameter: one extra pass over that output.
    """

    def __init__(self, engine, name: str, inputs: list, outputs: list, shape_fn, symbol: str = ""):
        self.name = name
        self.inputs = inputs
        self.outputs = outputs
        self.shape_fn = shape_fn
        self._engine = engine
        address = engine.raw_lookup("_mlir_ciface_" + (symbol or name))  # see Kernel
        if not address:
            raise RuntimeError(f"kernel {name} not found in the compiled module")
        self._fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(address)
        self.blas = blas_totals(engine, symbol or name)  # see Kernel
        specs = inputs + outputs
        self._packed = (ctypes.c_void_p * len(specs))()
        self._keep = []
        self._tensor_in, self._scalar_in, self._out = [], [], []
        for i, spec in enumerate(specs):
            if isinstance(spec, ScalarSpec):
                slot = spec.ctype(0)
                self._keep.append(slot)
                self._packed[i] = ctypes.cast(ctypes.pointer(slot), ctypes.c_void_p)
                self._scalar_in.append((i, slot))
                continue
            desc = descriptor_type(len(spec.shape))()
            desc.offset = 0
            ptr = ctypes.pointer(desc)
            ptr_ptr = ctypes.pointer(ptr)
            self._keep += [desc, ptr, ptr_ptr]
            self._packed[i] = ctypes.cast(ptr_ptr, ctypes.c_void_p)
            if None not in spec.shape:  # static: sizes and strides written once
                if spec.shape:
                    desc.sizes[:] = list(spec.shape)
                    desc.strides[:] = _contiguous_strides(spec.shape)
                entry = [i, desc, None]
            else:
                entry = [i, desc, ()]  # the shape last written (rewritten when it changes)
            (self._tensor_in if i < len(inputs) else self._out).append(entry)
        self._out_dtypes = [s.dtype for s in outputs]

    def __call__(self, args: list) -> list:
        shapes = self.shape_fn(*args)
        keep = []
        for entry in self._tensor_in:
            i, desc, last = entry
            t = args[i]
            if not t.is_contiguous():
                t = t.contiguous()
                keep.append(t)
            p = t.data_ptr()
            desc.allocated = p
            desc.aligned = p
            if last is not None:
                shape = t.shape
                if shape != last:
                    desc.sizes[:] = shape
                    desc.strides[:] = _strides(shape)
                    entry[2] = shape
        for i, slot in self._scalar_in:
            slot.value = args[i]
        outs = [torch.empty(shape, dtype=dtype) for shape, dtype in zip(shapes, self._out_dtypes)]
        for entry, t, shape in zip(self._out, outs, shapes):
            i, desc, last = entry
            p = t.data_ptr()
            desc.allocated = p
            desc.aligned = p
            if last is not None and shape != last:
                desc.sizes[:] = shape
                desc.strides[:] = _strides(shape)
                entry[2] = shape
        self._fn(self._packed)
        del keep
        return outs


_STRIDES: dict = {}


def _strides(shape) -> list:
    """Contiguous strides of `shape` (a torch.Size), cached: a dict look-up per tensor."""
    strides = _STRIDES.get(shape)
    if strides is None:
        if len(_STRIDES) > 4096:
            _STRIDES.clear()
        strides = _STRIDES[shape] = _contiguous_strides(shape)
    return strides
