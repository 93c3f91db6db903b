"""Matmul-class ops go to the BLAS PyTorch itself uses, called natively from JIT code.

Why: the MLIR loops the wheel can generate for a matmul are 60-110x slower than MKL, and a
tiled, vectorized schedule was still 2-3.6x slower (../shared anchors). Eager PyTorch's
backward is mostly BLAS, so camlir can only win by calling the same BLAS, with the right
transpose flags and `beta`, and by doing better around it (fusion, no engine overhead).

The BLAS is the MKL linked into `libtorch_cpu.so`, which exports the Fortran entry points
`sgemm_`/`dgemm_` (not the CBLAS ones). Its address is handed to the ExecutionEngine, so a
kernel calls it with no Python in between, and it follows `torch.set_num_threads`.

The tensor-level half, `fold_transposes` (a transpose feeding a matmul becomes a transposed
indexing map), is part of ca-fuse-elementwise. Here:
- `matmuls_to_calls` (buffers, after bufferization): each `linalg.matmul` /
  `linalg.batch_matmul` becomes a call to `@camlir_gemm_<t>` / `@camlir_bgemm_<t>`, written
  below in MLIR. Transposed maps become `memref.transpose` views, and a zero `linalg.fill`
  of the output right before the matmul becomes `beta = 0`. The wrapper reads the strides
  at run time, picks the transpose flags and leading dimensions, and copies an operand to a
  packed buffer only when neither of its dims is unit-stride. A `ca.alpha` attribute
  (a folded scalar epilogue, see passes/fuse_elementwise.py) becomes the BLAS `alpha`.
"""

import ctypes
import os

import torch
from torch_mlir import ir
from torch_mlir.dialects import arith, func, memref

from camlir.passes.fuse_elementwise import matmul_maps

_ELEM = {"f32": ("s", 4), "f64": ("d", 8)}


def blas_symbols() -> dict:
    """Native addresses of the BLAS entry points, by symbol name."""
    lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
    return {name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in ("sgemm_", "dgemm_")}


# ---------------------------------------------------------------------------------------
# Buffer level: matmuls into calls.

def matmuls_to_calls(module: ir.Module) -> set:
    """Replaces memref matmuls by BLAS wrapper calls; returns the wrappers to add with
    `add_wrappers` (after loop lowering: the wrappers' own loops are not vectorized)."""
    targets = []
    module.operation.walk(lambda o: (targets.append(o.operation)
                                     if o.operation.name in ("linalg.matmul", "linalg.batch_matmul") else None)
                          or ir.WalkResult.ADVANCE)
    needed = set()
    for op in targets:
        elem = str(ir.MemRefType(op.operands[2].type).element_type)
        if elem not in _ELEM or any(str(ir.MemRefType(v.type).element_type) != elem for v in op.operands[:3]):
            continue  # other dtypes stay loops (correct, slow; rare in a backward)
        batched = op.name == "linalg.batch_matmul"
        if batched and "indexing_maps" in op.attributes:
            continue
        name = f"camlir_{'bgemm' if batched else 'gemm'}_{elem}"
        _rewrite(op, name, batched)
        needed.add((name, elem, batched))
    return needed


def _rewrite(op, name: str, batched: bool) -> None:
    a, b, c = op.operands[0], op.operands[1], op.operands[2]
    with op.context, op.location, ir.InsertionPoint(op):
        if not batched:
            maps = matmul_maps(op)
            if str(maps[0]) == str(ir.AffineMap.get(3, 0, [ir.AffineDimExpr.get(2), ir.AffineDimExpr.get(0)])):
                a = _transpose_view(a)
            if str(maps[1]) == str(ir.AffineMap.get(3, 0, [ir.AffineDimExpr.get(1), ir.AffineDimExpr.get(2)])):
                b = _transpose_view(b)
        elem_type = ir.MemRefType(c.type).element_type
        beta = 1.0
        fill = _zero_fill_before(op, c)
        if fill is not None:
            fill.erase()
            beta = 0.0
        rank = 3 if batched else 2
        args = [_to_dynamic(v, rank) for v in (a, b, c)]
        # `ca.alpha` is set by ca-fuse-elementwise when it folds a scalar epilogue.
        alpha = ir.FloatAttr(op.attributes["ca.alpha"]).value if "ca.alpha" in op.attributes else 1.0
        alpha_v = arith.ConstantOp(elem_type, alpha).result
        beta_v = arith.ConstantOp(elem_type, beta).result
        func.CallOp([], ir.FlatSymbolRefAttr.get(name), args + [alpha_v, beta_v])
    op.erase()


def _transpose_view(v):
    # The input is made fully dynamic first: memref.transpose insists on its canonical
    # result layout, which is simplest to state when everything is dynamic.
    v = _to_dynamic(v, 2)
    perm = ir.AffineMapAttr.get(ir.AffineMap.get_permutation([1, 0]))
    return memref.TransposeOp(v.type, v, perm).result


def _to_dynamic(v, rank: int):
    t = ir.MemRefType(v.type)
    dyn = ir.ShapedType.get_dynamic_stride_or_offset()
    layout = ir.StridedLayoutAttr.get(dyn, [dyn] * rank)
    target = ir.MemRefType.get([ir.ShapedType.get_dynamic_size()] * rank, t.element_type, layout)
    if str(target) == str(t):
        return v
    return memref.CastOp(target, v).result


def _zero_fill_before(op, c):
    """The zero `linalg.fill` of `c` that `op` reads: the last op before `op` touching `c`."""
    before = []
    for o in op.block.operations:
        o = o.operation
        if o == op:
            break
        before.append(o)
    for prev in reversed(before):
        if not any(v == c for v in prev.operands):
            continue
        if prev.name != "linalg.fill" or prev.operands[1] != c:
            return None
        value = prev.operands[0].owner
        if not isinstance(value, ir.OpView) or value.operation.name != "arith.constant":
            return None
        attr = value.operation.attributes["value"]
        return prev if isinstance(attr, ir.FloatAttr) and ir.FloatAttr(attr).value == 0.0 else None
    return None


_GEMM = """
func.func private @camlir_gemm_{t}(%A: memref<?x?x{t}, strided<[?, ?], offset: ?>>,
                               %B: memref<?x?x{t}, strided<[?, ?], offset: ?>>,
                               %C: memref<?x?x{t}, strided<[?, ?], offset: ?>>, %alpha: {t}, %beta: {t}) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %m = memref.dim %C, %c0 : memref<?x?x{t}, strided<[?, ?], offset: ?>>
  %n = memref.dim %C, %c1 : memref<?x?x{t}, strided<[?, ?], offset: ?>>
  %k = memref.dim %A, %c1 : memref<?x?x{t}, strided<[?, ?], offset: ?>>
  %Ap = func.call @camlir_pack_{t}(%A) : (memref<?x?x{t}, strided<[?, ?], offset: ?>>) -> memref<?x?x{t}, strided<[?, ?], offset: ?>>
  %Bp = func.call @camlir_pack_{t}(%B) : (memref<?x?x{t}, strided<[?, ?], offset: ?>>) -> memref<?x?x{t}, strided<[?, ?], offset: ?>>
  %Cc = func.call @camlir_pack_{t}(%C) : (memref<?x?x{t}, strided<[?, ?], offset: ?>>) -> memref<?x?x{t}, strided<[?, ?], offset: ?>>
  %pa, %la, %ta = func.call @camlir_operand_{t}(%Ap) : (memref<?x?x{t}, strided<[?, ?], offset: ?>>) -> (!llvm.ptr, i32, i8)
  %pb, %lb, %tb = func.call @camlir_operand_{t}(%Bp) : (memref<?x?x{t}, strided<[?, ?], offset: ?>>) -> (!llvm.ptr, i32, i8)
  %pc, %lc, %tc = func.call @camlir_operand_{t}(%Cc) : (memref<?x?x{t}, strided<[?, ?], offset: ?>>) -> (!llvm.ptr, i32, i8)
  %one = arith.constant 1 : i64
  %mi = arith.index_cast %m : index to i32
  %ni = arith.index_cast %n : index to i32
  %ki = arith.index_cast %k : index to i32
  %sTa = llvm.alloca %one x i8 : (i64) -> !llvm.ptr
  %sTb = llvm.alloca %one x i8 : (i64) -> !llvm.ptr
  %sM = llvm.alloca %one x i32 : (i64) -> !llvm.ptr
  %sN = llvm.alloca %one x i32 : (i64) -> !llvm.ptr
  %sK = llvm.alloca %one x i32 : (i64) -> !llvm.ptr
  %sLa = llvm.alloca %one x i32 : (i64) -> !llvm.ptr
  %sLb = llvm.alloca %one x i32 : (i64) -> !llvm.ptr
  %sLc = llvm.alloca %one x i32 : (i64) -> !llvm.ptr
  %sAl = llvm.alloca %one x {t} : (i64) -> !llvm.ptr
  %sBe = llvm.alloca %one x {t} : (i64) -> !llvm.ptr
  llvm.store %ta, %sTa : i8, !llvm.ptr
  llvm.store %tb, %sTb : i8, !llvm.ptr
  llvm.store %mi, %sM : i32, !llvm.ptr
  llvm.store %ni, %sN : i32, !llvm.ptr
  llvm.store %ki, %sK : i32, !llvm.ptr
  llvm.store %la, %sLa : i32, !llvm.ptr
  llvm.store %lb, %sLb : i32, !llvm.ptr
  llvm.store %lc, %sLc : i32, !llvm.ptr
  llvm.store %alpha, %sAl : {t}, !llvm.ptr
  llvm.store %beta, %sBe : {t}, !llvm.ptr
  // Row-major C = A B is column-major C^T = B^T A^T: B comes first.
  func.call @{p}gemm_(%sTb, %sTa, %sN, %sM, %sK, %sAl, %pb, %sLb, %pa, %sLa, %sBe, %pc, %sLc)
      : (!llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
  %same = func.call @camlir_same_{t}(%C, %Cc) : (memref<?x?x{t}, strided<[?, ?], offset: ?>>, memref<?x?x{t}, strided<[?, ?], offset: ?>>) -> i1
  scf.if %same {{
  }} else {{
    func.call @camlir_copy_{t}(%Cc, %C) : (memref<?x?x{t}, strided<[?, ?], offset: ?>>, memref<?x?x{t}, strided<[?, ?], offset: ?>>) -> ()
    memref.dealloc %Cc : memref<?x?x{t}, strided<[?, ?], offset: ?>>
  }}
  %sameA = func.call @camlir_same_{t}(%A, %Ap) : (memref<?x?x{t}, strided<[?, ?], offset: ?>>, memref<?x?x{t}, strided<[?, ?], offset: ?>>) -> i1
  scf.if %sameA {{
  }} else {{
    memref.dealloc %Ap : memref<?x?x{t}, strided<[?, ?], offset: ?>>
  }}
  %sameB = func.call @camlir_same_{t}(%B, %Bp) : (memref<?x?x{t}, strided<[?, ?], offset: ?>>, memref<?x?x{t}, strided<[?, ?], offset: ?>>) -> i1
  scf.if %sameB {{
  }} else {{
    memref.dealloc %Bp : memref<?x?x{t}, strided<[?, ?], offset: ?>>
  }}
  return
}}

// An operand BLAS can read: one of its dims has stride 1 and the other a valid leading
// dimension. Otherwise a packed row-major copy (the caller frees it).
func.func private @camlir_pack_{t}(%X: memref<?x?x{t}, strided<[?, ?], offset: ?>>) -> memref<?x?x{t}, strided<[?, ?], offset: ?>> {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %base, %off, %sz:2, %st:2 = memref.extract_strided_metadata %X : memref<?x?x{t}, strided<[?, ?], offset: ?>> -> memref<{t}>, index, index, index, index, index
  %r1 = arith.maxui %sz#1, %c1 : index
  %r0 = arith.maxui %sz#0, %c1 : index
  %unit1 = arith.cmpi eq, %st#1, %c1 : index
  %ld0 = arith.cmpi uge, %st#0, %r1 : index
  %rowmajor = arith.andi %unit1, %ld0 : i1
  %unit0 = arith.cmpi eq, %st#0, %c1 : index
  %ld1 = arith.cmpi uge, %st#1, %r0 : index
  %colmajor = arith.andi %unit0, %ld1 : i1
  %ok = arith.ori %rowmajor, %colmajor : i1
  %r = scf.if %ok -> memref<?x?x{t}, strided<[?, ?], offset: ?>> {{
    scf.yield %X : memref<?x?x{t}, strided<[?, ?], offset: ?>>
  }} else {{
    %new = memref.alloc(%sz#0, %sz#1) : memref<?x?x{t}>
    %cast = memref.cast %new : memref<?x?x{t}> to memref<?x?x{t}, strided<[?, ?], offset: ?>>
    func.call @camlir_copy_{t}(%X, %cast) : (memref<?x?x{t}, strided<[?, ?], offset: ?>>, memref<?x?x{t}, strided<[?, ?], offset: ?>>) -> ()
    scf.yield %cast : memref<?x?x{t}, strided<[?, ?], offset: ?>>
  }}
  return %r : memref<?x?x{t}, strided<[?, ?], offset: ?>>
}}

// Pointer, leading dimension and BLAS transpose flag of an operand in row-major terms:
// 'N' (78) when rows are contiguous (lead = row stride), 'T' (84) when columns are.
func.func private @camlir_operand_{t}(%X: memref<?x?x{t}, strided<[?, ?], offset: ?>>) -> (!llvm.ptr, i32, i8) {{
  %c1 = arith.constant 1 : index
  %base, %off, %sz:2, %st:2 = memref.extract_strided_metadata %X : memref<?x?x{t}, strided<[?, ?], offset: ?>> -> memref<{t}>, index, index, index, index, index
  %r1 = arith.maxui %sz#1, %c1 : index
  %unit1 = arith.cmpi eq, %st#1, %c1 : index
  %ld0 = arith.cmpi uge, %st#0, %r1 : index
  %rowmajor = arith.andi %unit1, %ld0 : i1
  %r0 = arith.maxui %sz#0, %c1 : index
  %lead_r = arith.maxui %st#0, %r1 : index
  %lead_c = arith.maxui %st#1, %r0 : index
  %lead = arith.select %rowmajor, %lead_r, %lead_c : index
  %n = arith.constant 78 : i8
  %tr = arith.constant 84 : i8
  %flag = arith.select %rowmajor, %n, %tr : i8
  %addr = memref.extract_aligned_pointer_as_index %X : memref<?x?x{t}, strided<[?, ?], offset: ?>> -> index
  %addr_i = arith.index_cast %addr : index to i64
  %off_i = arith.index_cast %off : index to i64
  %p0 = llvm.inttoptr %addr_i : i64 to !llvm.ptr
  %p = llvm.getelementptr %p0[%off_i] : (!llvm.ptr, i64) -> !llvm.ptr, {t}
  %lead_i = arith.index_cast %lead : index to i32
  return %p, %lead_i, %flag : !llvm.ptr, i32, i8
}}

// Plain loops, not linalg.copy: the wrappers must stay out of the affine vectorizer,
// which refuses their fully dynamic layouts.
func.func private @camlir_copy_{t}(%X: memref<?x?x{t}, strided<[?, ?], offset: ?>>, %Y: memref<?x?x{t}, strided<[?, ?], offset: ?>>) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %r = memref.dim %X, %c0 : memref<?x?x{t}, strided<[?, ?], offset: ?>>
  %c = memref.dim %X, %c1 : memref<?x?x{t}, strided<[?, ?], offset: ?>>
  scf.for %i = %c0 to %r step %c1 {{
    scf.for %j = %c0 to %c step %c1 {{
      %v = memref.load %X[%i, %j] : memref<?x?x{t}, strided<[?, ?], offset: ?>>
      memref.store %v, %Y[%i, %j] : memref<?x?x{t}, strided<[?, ?], offset: ?>>
    }}
  }}
  return
}}

func.func private @camlir_same_{t}(%X: memref<?x?x{t}, strided<[?, ?], offset: ?>>, %Y: memref<?x?x{t}, strided<[?, ?], offset: ?>>) -> i1 {{
  %a = memref.extract_aligned_pointer_as_index %X : memref<?x?x{t}, strided<[?, ?], offset: ?>> -> index
  %b = memref.extract_aligned_pointer_as_index %Y : memref<?x?x{t}, strided<[?, ?], offset: ?>> -> index
  %same = arith.cmpi eq, %a, %b : index
  return %same : i1
}}

func.func private @{p}gemm_(!llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr)
"""

_BGEMM = """
func.func private @camlir_bgemm_{t}(%A: memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>>,
                                %B: memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>>,
                                %C: memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>>, %alpha: {t}, %beta: {t}) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %nb = memref.dim %C, %c0 : memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>>
  %m = memref.dim %A, %c1 : memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>>
  %c2 = arith.constant 2 : index
  %k = memref.dim %A, %c2 : memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>>
  %n = memref.dim %B, %c2 : memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>>
  scf.for %i = %c0 to %nb step %c1 {{
    %a = memref.subview %A[%i, 0, 0] [1, %m, %k] [1, 1, 1] : memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>> to memref<?x?x{t}, strided<[?, ?], offset: ?>>
    %b = memref.subview %B[%i, 0, 0] [1, %k, %n] [1, 1, 1] : memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>> to memref<?x?x{t}, strided<[?, ?], offset: ?>>
    %c = memref.subview %C[%i, 0, 0] [1, %m, %n] [1, 1, 1] : memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>> to memref<?x?x{t}, strided<[?, ?], offset: ?>>
    func.call @camlir_gemm_{t}(%a, %b, %c, %alpha, %beta) : (memref<?x?x{t}, strided<[?, ?], offset: ?>>, memref<?x?x{t}, strided<[?, ?], offset: ?>>, memref<?x?x{t}, strided<[?, ?], offset: ?>>, {t}, {t}) -> ()
  }}
  return
}}
"""


def add_wrappers(module: ir.Module, needed: set) -> None:
    elems = {elem for _, elem, _ in needed}
    text = ""
    for elem in sorted(elems):
        text += _GEMM.format(t=elem, p=_ELEM[elem][0])
        if any(batched and e == elem for _, e, batched in needed):
            text += _BGEMM.format(t=elem)
    lib = ir.Module.parse(text, module.context)
    for op in list(lib.body.operations):
        module.body.append(op.operation)
