"""The launch plan: what the host does for each compiled kernel, as plain data.

After the gpu-outline stage, each kernel function `@backward_kernel_N` (on memrefs, results
as out-parameters) holds only host work: buffer allocations, views, constants, the matmul
calls `ca-matmul-to-blas` left (`@camlir_gemm_f32`), and `gpu.launch_func`s of the outlined
device code. `kernel_plan` turns one into a list of steps over tensor slots, with every
scalar (grid, block, launch scalars, gemm alpha/beta) resolved to its constant value:

    {"op": "alloc",   "out": 4, "shape": [8, 4], "dtype": "float32"}
    {"op": "view",    "in": 4, "out": 5, "shape": [8, 1, 4], "strides": [4, 4, 1], "delta": 0}
    {"op": "permute", "in": 5, "out": 6, "dims": [1, 0]}
    {"op": "alias",   "in": 6, "out": 7}
    {"op": "gemm",    "a": 7, "b": 2, "c": 9, "alpha": 1.0, "beta": 0.0, "batched": false}
    {"op": "launch",  "entry": "backward_kernel_0_kernel_3", "grid": [1, 1, 1], "block": [256, 1, 1],
                      "args": [{"kind": "ptr", "slot": 4, "offset": 0}, {"kind": "i64", "value": 32}]}
    {"op": "free",    "slot": 4}

Slots 0..len(inputs)-1 are the kernel's inputs, the next ones its outputs (allocated by
the caller with `outputs`' shapes and dtypes). `view` makes `torch.as_strided` of the
source with `storage_offset = source.storage_offset() + delta` (the memref types' static
offsets differ by `delta`); a `ptr` argument is the tensor's `data_ptr()` minus its memref
type's static `offset` elements, because the kernels take bare pointers
(`use-bare-ptr-memref-call-conv`) and add the static offset themselves.

`host_plan` writes the `@backward` host function (kernel calls, accumulations, ops kept on
the host) the same way, for `export`. The runner (`runner.py`) executes both with torch
and the CUDA driver only.
"""

from torch_mlir import ir

from camlir.dialects.ca.ir_helpers import func_name, function_type

FORMAT = "camlir-gpu/1"

DTYPES = {"f32": "float32", "f64": "float64", "f16": "float16", "bf16": "bfloat16", "i64": "int64",
          "si64": "int64", "i32": "int32", "si32": "int32", "i16": "int16", "i8": "int8", "si8": "int8",
          "ui8": "uint8", "i1": "bool"}
_SCALARS = {"index": "i64", "i64": "i64", "i32": "i32", "f32": "f32", "f64": "f64", "i1": "i8", "i8": "i8"}
GEMMS = {"camlir_gemm_f32": False, "camlir_gemm_f64": False, "camlir_bgemm_f32": True, "camlir_bgemm_f64": True}


class PlanError(ValueError):
    """Host-side code the plan cannot express (the gpu-outline stage reports it)."""


def tensor_spec(t) -> dict:
    """`{"shape": [...], "dtype": "float32"}` of a static `memref`/`tensor`/`!torch.vtensor` type."""
    text = str(t)
    if text.startswith("!torch.vtensor<["):
        dims, elem = text[len("!torch.vtensor<["):-1].split("],")
        shape = [int(d) for d in dims.split(",")] if dims else []
    else:
        shaped = ir.ShapedType(t)
        if not shaped.has_static_shape:
            raise PlanError(f"{text} has dynamic sizes; the gpu backend compiles static shapes")
        shape, elem = list(shaped.shape), str(shaped.element_type)
    elem = elem.strip()
    if elem not in DTYPES:
        raise PlanError(f"element type {elem} is not supported by the gpu backend")
    return {"shape": shape, "dtype": DTYPES[elem]}


def _layout(t):
    """(strides, offset) of a memref type, or None when any is dynamic."""
    strides, offset = ir.MemRefType(t).get_strides_and_offset()
    dyn = ir.ShapedType.get_dynamic_stride_or_offset()
    if offset == dyn or dyn in strides or not ir.ShapedType(t).has_static_shape:
        return None
    return list(strides), offset


def _constant(value: ir.Value, what: str):
    owner = getattr(value.owner, "operation", value.owner)  # an OpView or an Operation
    if not (isinstance(owner, ir.Operation) and owner.name == "arith.constant"):
        raise PlanError(f"{what} is not a constant")
    attr = owner.attributes["value"]
    if isinstance(attr, ir.FloatAttr):
        return ir.FloatAttr(attr).value
    if isinstance(attr, ir.IntegerAttr):
        return ir.IntegerAttr(attr).value
    raise PlanError(f"{what} is a {attr} constant")


def kernel_plan(fn: ir.Operation, n_outputs: int) -> dict:
    """The plan of one kernel function after gpu-outline (see the module docstring); its
    last `n_outputs` arguments are the out-parameters."""
    slots = {}

    def slot(v):
        if v not in slots:
            slots[v] = len(slots)
        return slots[v]

    block = fn.regions[0].blocks[0]
    ftype = function_type(fn)
    args = list(block.arguments)
    n_out = n_outputs
    specs = [tensor_spec(t) for t in ftype.inputs]
    for a in args:
        slot(a)
    steps = []
    for op in block.operations:
        op = op.operation
        name = op.name
        if name in ("arith.constant", "func.return"):
            continue
        if name == "memref.alloc":
            steps.append({"op": "alloc", "out": slot(op.results[0]), **tensor_spec(op.results[0].type)})
        elif name == "memref.dealloc":
            steps.append({"op": "free", "slot": slot(op.operands[0])})
        elif name in ("memref.cast", "memref.expand_shape", "memref.collapse_shape", "memref.transpose",
                      "memref.subview", "memref.reinterpret_cast"):
            steps.append(_view_step(op, slot))
        elif name == "func.call":
            callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
            if callee not in GEMMS:
                raise PlanError(f"@{func_name(fn)} calls @{callee}, which the gpu runtime does not know")
            a, b, c, alpha, beta = op.operands
            steps.append({"op": "gemm", "a": slot(a), "b": slot(b), "c": slot(c), "batched": GEMMS[callee],
                          "alpha": float(_constant(alpha, "gemm alpha")), "beta": float(_constant(beta, "gemm beta"))})
        elif name == "gpu.launch_func":
            steps.append(_launch_step(op, slot))
        else:
            raise PlanError(f"@{func_name(fn)}: {name} stayed on the host (only buffers, views, matmul calls "
                            f"and kernel launches may)")
    return {"inputs": specs[:len(specs) - n_out], "outputs": specs[len(specs) - n_out:],
            "slots": len(slots), "steps": steps}


def _view_step(op: ir.Operation, slot) -> dict:
    src, res = op.operands[0], op.results[0]
    src_layout, res_layout = _layout(src.type), _layout(res.type)
    if op.name == "memref.cast":
        return {"op": "alias", "in": slot(src), "out": slot(res)}
    if res_layout is not None and src_layout is not None:
        strides, offset = res_layout
        return {"op": "view", "in": slot(src), "out": slot(res), "shape": list(ir.ShapedType(res.type).shape),
                "strides": strides, "delta": offset - src_layout[1]}
    if op.name == "memref.transpose":
        text = str(op.attributes["permutation"])  # affine_map<(d0, d1) -> (d1, d0)>
        results = text.split("->")[1].strip(" ()>").split(",")
        return {"op": "permute", "in": slot(src), "out": slot(res), "dims": [int(r.strip()[1:]) for r in results]}
    if op.name in ("memref.expand_shape", "memref.collapse_shape") and ir.ShapedType(res.type).has_static_shape:
        return {"op": "reshape", "in": slot(src), "out": slot(res), "shape": list(ir.ShapedType(res.type).shape)}
    raise PlanError(f"{op.name} from {src.type} to {res.type}: a view with dynamic layout")


def _launch_step(op: ir.Operation, slot) -> dict:
    sizes = list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))
    if sizes[0] or any(sizes[7:11]) or (len(sizes) > 12 and sizes[12]):
        raise PlanError("gpu.launch_func with async tokens, clusters or dynamic shared memory")
    operands = list(op.operands)
    grid = [int(_constant(v, "grid size")) for v in operands[0:3]]  # no async dependencies before them
    block = [int(_constant(v, "block size")) for v in operands[3:6]]
    entry = ir.SymbolRefAttr(op.attributes["kernel"]).value[0]
    args = []
    for v in operands[sum(sizes[:11]):sum(sizes[:12])]:
        text = str(v.type)
        if text.startswith("memref<"):
            layout = _layout(v.type)
            if layout is None:
                raise PlanError(f"kernel argument of type {text}: bare pointers need static layouts")
            args.append({"kind": "ptr", "slot": slot(v), "offset": layout[1]})
        elif text in _SCALARS:
            value = _constant(v, f"kernel scalar argument of type {text}")
            args.append({"kind": _SCALARS[text], "value": value})
        else:
            raise PlanError(f"kernel argument of type {text} is not supported")
    return {"op": "launch", "entry": entry, "grid": grid, "block": block, "args": args}


def host_plan(host: ir.Operation, fresh) -> tuple:
    """The `@backward` host function as steps over slots (for `export`): returns (plan,
    literal tensors). `fresh(value)` says whether an accumulated gradient is a private
    kernel output (`.grad` may take it without a copy). Python hooks and callbacks cannot
    leave the process: they raise PlanError."""
    from camlir.backends.host_runtime import constant_value, literal_tensor, resolve_op

    slots, literals, steps = {}, [], []

    def slot(v):
        if v not in slots:
            slots[v] = len(slots)
        return slots[v]

    block = host.regions[0].blocks[0]
    for a in block.arguments:
        slot(a)
    results = []
    for op in block.operations:
        op = op.operation
        name = op.name
        ins = [slot(v) for v in op.operands]
        if name == "func.return":
            results = ins
        elif name == "torch.bind_symbolic_shape":
            continue
        elif name.startswith("torch_c."):
            steps.append({"op": "alias", "in": ins[0], "out": slot(op.results[0])})
        elif name == "func.call":
            steps.append({"op": "kernel", "name": ir.FlatSymbolRefAttr(op.attributes["callee"]).value,
                          "ins": ins, "outs": [slot(r) for r in op.results]})
        elif name == "ca.accumulate_grad":
            steps.append({"op": "accumulate", "ins": ins, "fresh": bool(fresh(op.operands[1]))})
        elif name == "ca.size" and "value" in op.attributes:
            steps.append({"op": "const", "out": slot(op.results[0]), "value": ir.IntegerAttr(op.attributes["value"]).value})
        elif name == "torch.constant.device":
            steps.append({"op": "const", "out": slot(op.results[0]), "value": None, "device": True})
        elif name.startswith("torch.constant."):
            steps.append({"op": "const", "out": slot(op.results[0]), "value": constant_value(op)})
        elif name in ("torch.prim.ListConstruct", "torch.prim.TupleConstruct"):
            steps.append({"op": "list", "ins": ins, "out": slot(op.results[0])})
        elif name in ("torch.prim.ListUnpack", "torch.prim.TupleUnpack"):
            steps.append({"op": "unpack", "in": ins[0], "outs": [slot(r) for r in op.results]})
        elif name == "torch.vtensor.literal":
            literals.append(literal_tensor(op.attributes["value"], op))
            steps.append({"op": "literal", "index": len(literals) - 1, "out": slot(op.results[0])})
        elif name == "torch.operator" or name.startswith(("torch.aten.", "torch.prims.")):
            target = (ir.StringAttr(op.attributes["name"]).value if name == "torch.operator" else name)
            target = target.removeprefix("torch.")
            schema = resolve_op(target)._schema
            args = []
            for value, arg in zip(ins, schema.arguments):
                t = str(arg.type)
                conv = ("dtype" if "ScalarType" in t else "memory_format" if "MemoryFormat" in t
                        else "layout" if "Layout" in t else None)
                args.append({"slot": value, "name": arg.name, "kwarg": arg.kwarg_only, "conv": conv})
            steps.append({"op": "torch", "target": target, "args": args, "outs": [slot(r) for r in op.results]})
        elif name in ("ca.hook", "ca.call_python"):
            raise PlanError(f"{name}: a Python hook or callback cannot be exported (it runs only in this process)")
        else:
            raise PlanError(f"host op {name} cannot be exported")
    return {"slots": len(slots), "steps": steps, "results": results}, literals


def codes() -> dict:
    """torch's integer codes of ScalarType, Layout and MemoryFormat (what the `torch`
    dialect writes for such arguments), as names of torch attributes."""
    from torch_mlir.extras.fx_importer import (TORCH_DTYPE_TO_INT, TORCH_LAYOUT_TO_INT,
                                               TORCH_MEMORY_FORMAT_TO_INT)

    def names(table):
        return {str(code): str(obj).removeprefix("torch.") for obj, code in table.items()}

    return {"dtype": names(TORCH_DTYPE_TO_INT), "layout": names(TORCH_LAYOUT_TO_INT),
            "memory_format": names(TORCH_MEMORY_FORMAT_TO_INT)}
