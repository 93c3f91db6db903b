"""ca-matmul-to-blas and ca-define-blas-wrappers: matmuls become calls into the BLAS
PyTorch itself uses, called natively from JIT code.

Why: the MLIR loops the wheel can generate for a matmul are 60-110x slower than MKL, and a
tiled, vectorized schedule was still 2-3.6x slower (../shared anchors). Eager PyTorch's
backward is mostly BLAS, so camlir can only win by calling the same BLAS, with the right
transpose flags and `beta`, and by doing better around it (fusion, no engine overhead).

The BLAS is the MKL linked into `libtorch_cpu.so`, which exports the Fortran entry points
`sgemm_`/`dgemm_` and `sgemm_batch_`/`dgemm_batch_` (not the CBLAS ones); the cpu backend hands their addresses to the JIT
(`camlir.backends.cpu.jit.blas_symbols`), so a kernel calls them with no Python in between, and
they follow `torch.set_num_threads`. The tensor-level half (a transpose feeding a matmul
becomes a transposed indexing map) is part of ca-fuse-elementwise.
"""

import dataclasses

from torch_mlir import ir
from torch_mlir.dialects import arith, func, memref

from camlir.dialects.ca.ir_helpers import func_name, funcs, ops_named

from .base import CAPass
from .fuse_elementwise import contraction_maps

_ELEM = {"f32": ("s", 4), "f64": ("d", 8)}


@dataclasses.dataclass(frozen=True)
class MatmulToBlas(CAPass):
    """Replaces each f32/f64 `linalg.matmul` and `linalg.batch_matmul` on memrefs (after
    bufferization) by a call to `@camlir_gemm_<t>` / `@camlir_bgemm_<t>`, declared private
    in the module; `ca-define-blas-wrappers` gives the declarations their bodies (kept apart
    so that the rewrite reads, and is tested, without two hundred lines of wrapper).

    Transposed indexing maps become `memref.transpose` views (for a `batch_matmul`, an
    operand with its last two dims swapped; other batched maps stay loops); a zero `linalg.fill` of the
    output right before the matmul becomes `beta = 0`; a `ca.alpha` attribute (a scalar
    epilogue folded by ca-fuse-elementwise) becomes the BLAS `alpha`. The wrapper reads the
    strides at run time, picks the transpose flags and leading dimensions, and copies an
    operand to a packed buffer only when neither of its dims is unit-stride. Other dtypes
    stay loops (correct, slow; rare in a backward).

    Before:
    ```mlir
    linalg.fill ins(%zero : f32) outs(%c : memref<4x5xf32>)
    linalg.matmul ins(%a, %b : memref<4x3xf32>, memref<3x5xf32>) outs(%c : memref<4x5xf32>)
    ```
    After:
    ```mlir
    %ca = memref.cast %a : memref<4x3xf32> to memref<?x?xf32, strided<[?, ?], offset: ?>>
    ...
    call @camlir_gemm_f32(%ca, %cb, %cc, %alpha, %beta) : (...) -> ()   // alpha 1.0, beta 0.0
    func.func private @camlir_gemm_f32(memref<?x?xf32, strided<[?, ?], offset: ?>>, ...)
    ```
    """

    argument = "ca-matmul-to-blas"
    summary = "Replace memref matmuls by calls to BLAS wrappers (sgemm_/dgemm_)"

    def run(self, module: ir.Operation) -> None:
        needed = set()
        for op in ops_named(module, "linalg.matmul", "linalg.batch_matmul"):
            elem = str(ir.MemRefType(op.operands[2].type).element_type)
            operands = [str(ir.MemRefType(v.type).element_type) for v in op.operands[:2]]
            batched = op.name == "linalg.batch_matmul"
            if elem == "f32" and operands == ["bf16", "bf16"] and not batched:
                _rewrite(op, "camlir_gemm_bf16", False)  # ca-bf16-matmuls made it
                needed.add(("camlir_gemm_bf16", "bf16"))
                continue
            if elem not in _ELEM or any(e != elem for e in operands):
                continue
            if batched and _batch_transposes(op) is None:
                continue  # maps BLAS cannot take: loops
            name = f"camlir_{'bgemm' if batched else 'gemm'}_{elem}"
            _rewrite(op, name, batched)
            needed.add((name, elem))
        if needed:
            _declare(module, needed)


@dataclasses.dataclass(frozen=True)
class DefineBlasWrappers(CAPass):
    """Gives the `@camlir_gemm_<t>` / `@camlir_bgemm_<t>` declarations left by
    `ca-matmul-to-blas` their bodies (MLIR on memrefs, `scf` and `llvm`), plus their helpers
    and the declaration of the BLAS entry point (`sgemm_`/`dgemm_`). A batch whose matrices
    BLAS can read as they are goes to `sgemm_batch_`/`dgemm_batch_` in one call, else one
    gemm per matrix; an output whose rows are not contiguous is computed in a row-major
    copy (sgemm has no transpose flag for C). The wrappers are written
    with `scf` loops, not linalg, so the loops stage's affine vectorizer (which refuses their
    fully dynamic layouts) leaves them alone.

    Each BLAS call is timed (`clock_gettime`, ~50 ns a call) and its flops (2 m n k per
    matrix) counted into the module's `@camlir_blas_totals_data` ([nanoseconds, flops,
    calls]), whose address `@camlir_blas_totals()` returns: `camlir.profile()` reads it
    around each kernel call to split the kernel's time into MKL's and the rest.

    Before:
    ```mlir
    func.func private @camlir_gemm_f32(memref<?x?xf32, strided<[?, ?], offset: ?>>, ...)
    ```
    After:
    ```mlir
    func.func private @camlir_gemm_f32(%A: memref<?x?xf32, strided<[?, ?], offset: ?>>, ...) {
      ...
      %t0 = func.call @camlir_clock_ns() : () -> i64
      func.call @sgemm_(%sTb, %sTa, %sN, %sM, %sK, %sAl, %pb, %sLb, %pa, %sLa, %sBe, %pc, %sLc) : ...
      func.call @camlir_blas_done(%t0, %c1, %m, %n, %k) : (i64, index, index, index, index) -> ()
    ```
    """

    argument = "ca-define-blas-wrappers"
    summary = "Define the BLAS wrapper functions that ca-matmul-to-blas declared"

    def run(self, module: ir.Operation) -> None:
        declared = {func_name(fn): fn for fn in funcs(module, lambda fn: len(fn.regions[0].blocks) == 0)
                    if func_name(fn).startswith(("camlir_gemm_", "camlir_bgemm_"))}
        elems = sorted({name.rsplit("_", 1)[1] for name in declared})
        if not elems:
            return
        for fn in declared.values():
            fn.erase()
        helpers, entries, text = set(), set(), ""
        for elem in elems:
            if elem == "bf16":  # bf16 operands, f32 result: MKL's gemm_bf16bf16f32_
                helpers |= {"bf16", "f32"}
                entries.add("gemm_bf16bf16f32_")
                text += _GEMM_BF16.format(gemm_args=_gemm_args("f32"))
                continue
            helpers.add(elem)
            entries.add(f"{_ELEM[elem][0]}gemm_")
            text += _GEMM_FN.format(t=elem, p=_ELEM[elem][0], gemm_args=_gemm_args(elem))
            if f"camlir_bgemm_{elem}" in declared:
                text += _BGEMM.format(t=elem, p=_ELEM[elem][0], gemm_args=_gemm_args(elem),
                                      batch_args=_by_reference(elem, _BATCH_SLOTS))
        text += "".join(_HELPERS.format(t=t, p="") for t in sorted(helpers))
        text += "".join(_DECLARE_BLAS.format(blas=entry) for entry in sorted(entries))
        text += _BLAS_TOTALS
        lib = ir.Module.parse(text, module.context)
        body = module.regions[0].blocks[0]
        for op in list(lib.body.operations):
            body.append(op.operation)


def _declare(module: ir.Operation, needed: set) -> None:
    present = {func_name(fn) for fn in funcs(module)}
    body = module.regions[0].blocks[0]
    with module.context, ir.Location.unknown(), ir.InsertionPoint(body):
        for name, elem in sorted(needed):
            if name in present:
                continue
            out_type = ir.F64Type.get() if elem == "f64" else ir.F32Type.get()  # bf16: f32 result
            in_type = ir.BF16Type.get() if elem == "bf16" else out_type
            rank = 3 if name.startswith("camlir_bgemm_") else 2
            dyn = ir.ShapedType.get_dynamic_stride_or_offset()

            def mem(t):
                return ir.MemRefType.get([ir.ShapedType.get_dynamic_size()] * rank, t,
                                         ir.StridedLayoutAttr.get(dyn, [dyn] * rank))

            func.FuncOp(name, ir.FunctionType.get([mem(in_type), mem(in_type), mem(out_type), out_type, out_type], []),
                        visibility="private")


def _batch_transposes(op):
    """(a transposed, b transposed) for a `linalg.batch_matmul` whose maps are the default
    ones or have an operand's last two dims swapped (ca-fuse-elementwise folds transposes
    so); None for any other maps."""
    maps = [str(m) for m in contraction_maps(op, op.name)]
    d = [ir.AffineDimExpr.get(i) for i in range(4)]
    a_maps = {str(ir.AffineMap.get(4, 0, [d[0], d[1], d[3]])): False, str(ir.AffineMap.get(4, 0, [d[0], d[3], d[1]])): True}
    b_maps = {str(ir.AffineMap.get(4, 0, [d[0], d[3], d[2]])): False, str(ir.AffineMap.get(4, 0, [d[0], d[2], d[3]])): True}
    if maps[0] not in a_maps or maps[1] not in b_maps or maps[2] != str(ir.AffineMap.get(4, 0, [d[0], d[1], d[2]])):
        return None
    return a_maps[maps[0]], b_maps[maps[1]]


def _rewrite(op, name: str, batched: bool) -> None:
    a, b, c = op.operands[0], op.operands[1], op.operands[2]
    with op.context, op.location, ir.InsertionPoint(op):
        if batched:
            ta, tb = _batch_transposes(op)
            if ta:
                a = _transpose_view(a, 3)
            if tb:
                b = _transpose_view(b, 3)
        else:
            maps = contraction_maps(op)
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


def _transpose_view(v, rank: int = 2):
    """`v` with its last two dims swapped, as a view.
    The input is made fully dynamic first: memref.transpose insists on its canonical
    result layout, which is simplest to state when everything is dynamic."""
    v = _to_dynamic(v, rank)
    perm = ir.AffineMapAttr.get(ir.AffineMap.get_permutation(list(range(rank - 2)) + [rank - 1, rank - 2]))
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


def _by_reference(t: str, slots: list) -> str:
    """MLIR that passes scalars the Fortran way (BLAS takes every argument by reference): an
    `llvm.alloca` and a store per `(slot, value, type)`."""
    lines = []
    for slot, value, ty in slots:
        ty = ty.format(t=t)
        lines.append(f"  {slot} = llvm.alloca %one x {ty} : (i64) -> !llvm.ptr")
        lines.append(f"  llvm.store {value}, {slot} : {ty}, !llvm.ptr")
    return "\n".join(lines)


# The arguments every ?gemm_ / ?gemm_batch_ call shares: flags, sizes, leading dims, scalars.
_GEMM_SLOTS = [("%sTa", "%ta", "i8"), ("%sTb", "%tb", "i8"), ("%sM", "%mi", "i32"), ("%sN", "%ni", "i32"),
               ("%sK", "%ki", "i32"), ("%sLa", "%la", "i32"), ("%sLb", "%lb", "i32"), ("%sLc", "%lc", "i32"),
               ("%sAl", "%alpha", "{t}"), ("%sBe", "%beta", "{t}")]
_BATCH_SLOTS = [("%sG", "%g1", "i32"), ("%sGs", "%nbi", "i32")]  # one group of all the matrices


def _gemm_args(t: str) -> str:
    return ("  %one = arith.constant 1 : i64\n  %mi = arith.index_cast %m : index to i32\n"
            "  %ni = arith.index_cast %n : index to i32\n  %ki = arith.index_cast %k : index to i32\n"
            + _by_reference(t, _GEMM_SLOTS))


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
  %Cc = func.call @camlir_pack_out_{t}(%C) : (memref<?x?x{t}, strided<[?, ?], offset: ?>>) -> memref<?x?x{t}, strided<[?, ?], offset: ?>>
  %pa, %la, %ta = func.call @camlir_operand_{t}(%Ap) : (memref<?x?x{t}, strided<[?, ?], offset: ?>>) -> (!llvm.ptr, i32, i8)
  %pb, %lb, %tb = func.call @camlir_operand_{t}(%Bp) : (memref<?x?x{t}, strided<[?, ?], offset: ?>>) -> (!llvm.ptr, i32, i8)
  %pc, %lc, %tc = func.call @camlir_operand_{t}(%Cc) : (memref<?x?x{t}, strided<[?, ?], offset: ?>>) -> (!llvm.ptr, i32, i8)
{gemm_args}
  // Row-major C = A B is column-major C^T = B^T A^T: B comes first.
  %t0 = func.call @camlir_clock_ns() : () -> i64
  func.call @{p}gemm_(%sTb, %sTa, %sN, %sM, %sK, %sAl, %pb, %sLb, %pa, %sLa, %sBe, %pc, %sLc)
      : (!llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
  func.call @camlir_blas_done(%t0, %c1, %m, %n, %k) : (i64, index, index, index, index) -> ()
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

// Whether BLAS can read X as it is: one of its dims has stride 1 and the other a valid
// leading dimension (`rows_only`: the first, as the output must, sgemm having no
// transpose flag for C).
func.func private @camlir_readable_{t}(%X: memref<?x?x{t}, strided<[?, ?], offset: ?>>, %rows_only: i1) -> i1 {{
  %c1 = arith.constant 1 : index
  %base, %off, %sz:2, %st:2 = memref.extract_strided_metadata %X : memref<?x?x{t}, strided<[?, ?], offset: ?>> -> memref<{t}>, index, index, index, index, index
  %r1 = arith.maxui %sz#1, %c1 : index
  %r0 = arith.maxui %sz#0, %c1 : index
  %unit1 = arith.cmpi eq, %st#1, %c1 : index
  %ld0 = arith.cmpi uge, %st#0, %r1 : index
  %rowmajor = arith.andi %unit1, %ld0 : i1
  %unit0 = arith.cmpi eq, %st#0, %c1 : index
  %ld1 = arith.cmpi uge, %st#1, %r0 : index
  %colmajor0 = arith.andi %unit0, %ld1 : i1
  %false = arith.constant false
  %colmajor = arith.select %rows_only, %false, %colmajor0 : i1
  %ok = arith.ori %rowmajor, %colmajor : i1
  return %ok : i1
}}

// An operand BLAS can read as it is, or a packed row-major copy (the caller frees it).
func.func private @camlir_pack_{t}(%X: memref<?x?x{t}, strided<[?, ?], offset: ?>>) -> memref<?x?x{t}, strided<[?, ?], offset: ?>> {{
  %any = arith.constant false
  %r = func.call @camlir_pack_as_{t}(%X, %any) : (memref<?x?x{t}, strided<[?, ?], offset: ?>>, i1) -> memref<?x?x{t}, strided<[?, ?], offset: ?>>
  return %r : memref<?x?x{t}, strided<[?, ?], offset: ?>>
}}

// The output as it is when its rows are contiguous, else a row-major copy (copied back
// and freed by the caller). A column-major C passed as it is would be written transposed.
func.func private @camlir_pack_out_{t}(%X: memref<?x?x{t}, strided<[?, ?], offset: ?>>) -> memref<?x?x{t}, strided<[?, ?], offset: ?>> {{
  %rows = arith.constant true
  %r = func.call @camlir_pack_as_{t}(%X, %rows) : (memref<?x?x{t}, strided<[?, ?], offset: ?>>, i1) -> memref<?x?x{t}, strided<[?, ?], offset: ?>>
  return %r : memref<?x?x{t}, strided<[?, ?], offset: ?>>
}}

func.func private @camlir_pack_as_{t}(%X: memref<?x?x{t}, strided<[?, ?], offset: ?>>, %rows_only: i1) -> memref<?x?x{t}, strided<[?, ?], offset: ?>> {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %sz0 = memref.dim %X, %c0 : memref<?x?x{t}, strided<[?, ?], offset: ?>>
  %sz1 = memref.dim %X, %c1 : memref<?x?x{t}, strided<[?, ?], offset: ?>>
  %ok = func.call @camlir_readable_{t}(%X, %rows_only) : (memref<?x?x{t}, strided<[?, ?], offset: ?>>, i1) -> i1
  %r = scf.if %ok -> memref<?x?x{t}, strided<[?, ?], offset: ?>> {{
    scf.yield %X : memref<?x?x{t}, strided<[?, ?], offset: ?>>
  }} else {{
    %new = memref.alloc(%sz0, %sz1) : memref<?x?x{t}>
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

# `_GEMM` in its parts: the helpers of one element type (packing, operand pointers, copies),
# which a bf16 GEMM needs for bf16 (its operands) and f32 (its result) whatever else the
# module has, and the BLAS entry point's declaration.
_GEMM_FN, _GEMM_REST = _GEMM.split("// Whether BLAS can read X as it is", 1)
_HELPERS = "// Whether BLAS can read X as it is" + _GEMM_REST.rsplit("func.func private @{p}gemm_(", 1)[0]
_DECLARE_BLAS = "func.func private @{blas}(" + "!llvm.ptr, " * 12 + "!llvm.ptr)\n"

# bf16 operands, f32 result and scalars: MKL's `gemm_bf16bf16f32_` (same arguments as
# `sgemm_`, A and B as bf16). As `camlir_gemm_f32` otherwise.
_GEMM_BF16 = """
func.func private @camlir_gemm_bf16(%A: memref<?x?xbf16, strided<[?, ?], offset: ?>>,
                                 %B: memref<?x?xbf16, strided<[?, ?], offset: ?>>,
                                 %C: memref<?x?xf32, strided<[?, ?], offset: ?>>, %alpha: f32, %beta: f32) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %m = memref.dim %C, %c0 : memref<?x?xf32, strided<[?, ?], offset: ?>>
  %n = memref.dim %C, %c1 : memref<?x?xf32, strided<[?, ?], offset: ?>>
  %k = memref.dim %A, %c1 : memref<?x?xbf16, strided<[?, ?], offset: ?>>
  %Ap = func.call @camlir_pack_bf16(%A) : (memref<?x?xbf16, strided<[?, ?], offset: ?>>) -> memref<?x?xbf16, strided<[?, ?], offset: ?>>
  %Bp = func.call @camlir_pack_bf16(%B) : (memref<?x?xbf16, strided<[?, ?], offset: ?>>) -> memref<?x?xbf16, strided<[?, ?], offset: ?>>
  %Cc = func.call @camlir_pack_out_f32(%C) : (memref<?x?xf32, strided<[?, ?], offset: ?>>) -> memref<?x?xf32, strided<[?, ?], offset: ?>>
  %pa, %la, %ta = func.call @camlir_operand_bf16(%Ap) : (memref<?x?xbf16, strided<[?, ?], offset: ?>>) -> (!llvm.ptr, i32, i8)
  %pb, %lb, %tb = func.call @camlir_operand_bf16(%Bp) : (memref<?x?xbf16, strided<[?, ?], offset: ?>>) -> (!llvm.ptr, i32, i8)
  %pc, %lc, %tc = func.call @camlir_operand_f32(%Cc) : (memref<?x?xf32, strided<[?, ?], offset: ?>>) -> (!llvm.ptr, i32, i8)
{gemm_args}
  // Row-major C = A B is column-major C^T = B^T A^T: B comes first.
  %t0 = func.call @camlir_clock_ns() : () -> i64
  func.call @gemm_bf16bf16f32_(%sTb, %sTa, %sN, %sM, %sK, %sAl, %pb, %sLb, %pa, %sLa, %sBe, %pc, %sLc)
      : (!llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
  func.call @camlir_blas_done(%t0, %c1, %m, %n, %k) : (i64, index, index, index, index) -> ()
  %same = func.call @camlir_same_f32(%C, %Cc) : (memref<?x?xf32, strided<[?, ?], offset: ?>>, memref<?x?xf32, strided<[?, ?], offset: ?>>) -> i1
  scf.if %same {{
  }} else {{
    func.call @camlir_copy_f32(%Cc, %C) : (memref<?x?xf32, strided<[?, ?], offset: ?>>, memref<?x?xf32, strided<[?, ?], offset: ?>>) -> ()
    memref.dealloc %Cc : memref<?x?xf32, strided<[?, ?], offset: ?>>
  }}
  %sameA = func.call @camlir_same_bf16(%A, %Ap) : (memref<?x?xbf16, strided<[?, ?], offset: ?>>, memref<?x?xbf16, strided<[?, ?], offset: ?>>) -> i1
  scf.if %sameA {{
  }} else {{
    memref.dealloc %Ap : memref<?x?xbf16, strided<[?, ?], offset: ?>>
  }}
  %sameB = func.call @camlir_same_bf16(%B, %Bp) : (memref<?x?xbf16, strided<[?, ?], offset: ?>>, memref<?x?xbf16, strided<[?, ?], offset: ?>>) -> i1
  scf.if %sameB {{
  }} else {{
    memref.dealloc %Bp : memref<?x?xbf16, strided<[?, ?], offset: ?>>
  }}
  return
}}
"""

_BGEMM = """
// A batch whose matrices BLAS can read as they are goes to `{p}gemm_batch_` in one call;
// otherwise (or for one matrix) one `camlir_gemm` per matrix, packing as needed. One call
// for the batch: BERT's attention bmm (16 matrices of 64x64x32) took 150 us as 16 `sgemm_`
// calls and ~100 us in PyTorch's bmm, which batches.
func.func private @camlir_bgemm_{t}(%A: memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>>,
                                %B: memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>>,
                                %C: memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>>, %alpha: {t}, %beta: {t}) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %nb = memref.dim %C, %c0 : memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>>
  %m = memref.dim %A, %c1 : memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>>
  %k = memref.dim %A, %c2 : memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>>
  %n = memref.dim %B, %c2 : memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>>
  %many = arith.cmpi ugt, %nb, %c1 : index
  %whole = scf.if %many -> i1 {{
    %a = memref.subview %A[0, 0, 0] [1, %m, %k] [1, 1, 1] : memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>> to memref<?x?x{t}, strided<[?, ?], offset: ?>>
    %b = memref.subview %B[0, 0, 0] [1, %k, %n] [1, 1, 1] : memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>> to memref<?x?x{t}, strided<[?, ?], offset: ?>>
    %c = memref.subview %C[0, 0, 0] [1, %m, %n] [1, 1, 1] : memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>> to memref<?x?x{t}, strided<[?, ?], offset: ?>>
    %any = arith.constant false
    %rows = arith.constant true
    %ra = func.call @camlir_readable_{t}(%a, %any) : (memref<?x?x{t}, strided<[?, ?], offset: ?>>, i1) -> i1
    %rb = func.call @camlir_readable_{t}(%b, %any) : (memref<?x?x{t}, strided<[?, ?], offset: ?>>, i1) -> i1
    %rc = func.call @camlir_readable_{t}(%c, %rows) : (memref<?x?x{t}, strided<[?, ?], offset: ?>>, i1) -> i1
    %rab = arith.andi %ra, %rb : i1
    %r = arith.andi %rab, %rc : i1
    scf.yield %r : i1
  }} else {{
    %no = arith.constant false
    scf.yield %no : i1
  }}
  scf.if %whole {{
    func.call @camlir_bgemm_batch_{t}(%A, %B, %C, %alpha, %beta) : (memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>>, memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>>, memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>>, {t}, {t}) -> ()
  }} else {{
    scf.for %i = %c0 to %nb step %c1 {{
      %a = memref.subview %A[%i, 0, 0] [1, %m, %k] [1, 1, 1] : memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>> to memref<?x?x{t}, strided<[?, ?], offset: ?>>
      %b = memref.subview %B[%i, 0, 0] [1, %k, %n] [1, 1, 1] : memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>> to memref<?x?x{t}, strided<[?, ?], offset: ?>>
      %c = memref.subview %C[%i, 0, 0] [1, %m, %n] [1, 1, 1] : memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>> to memref<?x?x{t}, strided<[?, ?], offset: ?>>
      func.call @camlir_gemm_{t}(%a, %b, %c, %alpha, %beta) : (memref<?x?x{t}, strided<[?, ?], offset: ?>>, memref<?x?x{t}, strided<[?, ?], offset: ?>>, memref<?x?x{t}, strided<[?, ?], offset: ?>>, {t}, {t}) -> ()
    }}
  }}
  return
}}

// The batch as one group of `{p}gemm_batch_`: every matrix shares the flags, sizes and
// leading dimensions of the first, and its pointer is the first's plus i batch strides.
func.func private @camlir_bgemm_batch_{t}(%A: memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>>,
                                      %B: memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>>,
                                      %C: memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>>, %alpha: {t}, %beta: {t}) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %nb = memref.dim %C, %c0 : memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>>
  %m = memref.dim %A, %c1 : memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>>
  %k = memref.dim %A, %c2 : memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>>
  %n = memref.dim %B, %c2 : memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>>
  %a = memref.subview %A[0, 0, 0] [1, %m, %k] [1, 1, 1] : memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>> to memref<?x?x{t}, strided<[?, ?], offset: ?>>
  %b = memref.subview %B[0, 0, 0] [1, %k, %n] [1, 1, 1] : memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>> to memref<?x?x{t}, strided<[?, ?], offset: ?>>
  %c = memref.subview %C[0, 0, 0] [1, %m, %n] [1, 1, 1] : memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>> to memref<?x?x{t}, strided<[?, ?], offset: ?>>
  %pa, %la, %ta = func.call @camlir_operand_{t}(%a) : (memref<?x?x{t}, strided<[?, ?], offset: ?>>) -> (!llvm.ptr, i32, i8)
  %pb, %lb, %tb = func.call @camlir_operand_{t}(%b) : (memref<?x?x{t}, strided<[?, ?], offset: ?>>) -> (!llvm.ptr, i32, i8)
  %pc, %lc, %tc = func.call @camlir_operand_{t}(%c) : (memref<?x?x{t}, strided<[?, ?], offset: ?>>) -> (!llvm.ptr, i32, i8)
  %bA, %oA, %zA:3, %sA:3 = memref.extract_strided_metadata %A : memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>> -> memref<{t}>, index, index, index, index, index, index, index
  %bB, %oB, %zB:3, %sB:3 = memref.extract_strided_metadata %B : memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>> -> memref<{t}>, index, index, index, index, index, index, index
  %bC, %oC, %zC:3, %sC:3 = memref.extract_strided_metadata %C : memref<?x?x?x{t}, strided<[?, ?, ?], offset: ?>> -> memref<{t}>, index, index, index, index, index, index, index
  %arrA = memref.alloc(%nb) : memref<?xi64>
  %arrB = memref.alloc(%nb) : memref<?xi64>
  %arrC = memref.alloc(%nb) : memref<?xi64>
  scf.for %i = %c0 to %nb step %c1 {{
    %ii = arith.index_cast %i : index to i64
    %sa = arith.index_cast %sA#0 : index to i64
    %sb = arith.index_cast %sB#0 : index to i64
    %sc = arith.index_cast %sC#0 : index to i64
    %da = arith.muli %ii, %sa : i64
    %db = arith.muli %ii, %sb : i64
    %dc = arith.muli %ii, %sc : i64
    %qa = llvm.getelementptr %pa[%da] : (!llvm.ptr, i64) -> !llvm.ptr, {t}
    %qb = llvm.getelementptr %pb[%db] : (!llvm.ptr, i64) -> !llvm.ptr, {t}
    %qc = llvm.getelementptr %pc[%dc] : (!llvm.ptr, i64) -> !llvm.ptr, {t}
    %ia = llvm.ptrtoint %qa : !llvm.ptr to i64
    %ib = llvm.ptrtoint %qb : !llvm.ptr to i64
    %ic = llvm.ptrtoint %qc : !llvm.ptr to i64
    memref.store %ia, %arrA[%i] : memref<?xi64>
    memref.store %ib, %arrB[%i] : memref<?xi64>
    memref.store %ic, %arrC[%i] : memref<?xi64>
  }}
  %xa = memref.extract_aligned_pointer_as_index %arrA : memref<?xi64> -> index
  %xb = memref.extract_aligned_pointer_as_index %arrB : memref<?xi64> -> index
  %xc = memref.extract_aligned_pointer_as_index %arrC : memref<?xi64> -> index
  %xai = arith.index_cast %xa : index to i64
  %xbi = arith.index_cast %xb : index to i64
  %xci = arith.index_cast %xc : index to i64
  %ppa = llvm.inttoptr %xai : i64 to !llvm.ptr
  %ppb = llvm.inttoptr %xbi : i64 to !llvm.ptr
  %ppc = llvm.inttoptr %xci : i64 to !llvm.ptr
{gemm_args}
  %nbi = arith.index_cast %nb : index to i32
  %g1 = arith.constant 1 : i32
{batch_args}
  // Row-major C = A B is column-major C^T = B^T A^T: B comes first, as in camlir_gemm.
  %t0 = func.call @camlir_clock_ns() : () -> i64
  func.call @{p}gemm_batch_(%sTb, %sTa, %sN, %sM, %sK, %sAl, %ppb, %sLb, %ppa, %sLa, %sBe, %ppc, %sLc, %sG, %sGs)
      : (!llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()
  func.call @camlir_blas_done(%t0, %nb, %m, %n, %k) : (i64, index, index, index, index) -> ()
  memref.dealloc %arrA : memref<?xi64>
  memref.dealloc %arrB : memref<?xi64>
  memref.dealloc %arrC : memref<?xi64>
  return
}}

func.func private @{p}gemm_batch_(!llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr)
"""


# What `camlir.profile()` reads to split a kernel's time into its BLAS calls and the rest
# (`jit.blas_totals`): nanoseconds inside the BLAS entry points, floating-point operations
# (2 m n k per matrix) and calls, summed over every GEMM of the loaded code.
# Always counted: two vDSO `clock_gettime` calls cost ~50 ns a GEMM, under 0.1% of the
# smallest GEMM in the bench's transformers (~60 us) and ~2% of a 10x10 one. One copy per
# loaded library: the global and its getter are external, so the parts of a big module
# linked into one library (the linker keeps the first definition) share one. Not atomic: a
# profile is read on the thread that runs the backward.
BLAS_TOTALS_SYMBOL = "camlir_blas_totals"
_BLAS_TOTALS = """
llvm.mlir.global external @camlir_blas_totals_data(dense<0> : tensor<3xi64>) {addr_space = 0 : i32} : !llvm.array<3 x i64>

// The address of [nanoseconds, flops, calls], for the profiler (a packed entry point, as
// kernels are, so that a JIT engine and a loaded library answer the same lookup).
func.func @camlir_blas_totals() -> i64 {
  %p = llvm.mlir.addressof @camlir_blas_totals_data : !llvm.ptr
  %i = llvm.ptrtoint %p : !llvm.ptr to i64
  return %i : i64
}

func.func private @camlir_clock_ns() -> i64 {
  %one = arith.constant 1 : i64
  %ts = llvm.alloca %one x !llvm.array<2 x i64> : (i64) -> !llvm.ptr
  %monotonic = arith.constant 1 : i32
  %ok = func.call @clock_gettime(%monotonic, %ts) : (i32, !llvm.ptr) -> i32
  %s = llvm.load %ts : !llvm.ptr -> i64
  %pns = llvm.getelementptr %ts[1] : (!llvm.ptr) -> !llvm.ptr, i64
  %ns = llvm.load %pns : !llvm.ptr -> i64
  %giga = arith.constant 1000000000 : i64
  %sns = arith.muli %s, %giga : i64
  %t = arith.addi %sns, %ns : i64
  return %t : i64
}

// Adds one BLAS call that started at `t0`: `nb` matrices of m x n x k.
func.func private @camlir_blas_done(%t0: i64, %nb: index, %m: index, %n: index, %k: index) {
  %t1 = func.call @camlir_clock_ns() : () -> i64
  %dt = arith.subi %t1, %t0 : i64
  %nbi = arith.index_cast %nb : index to i64
  %mi = arith.index_cast %m : index to i64
  %ni = arith.index_cast %n : index to i64
  %ki = arith.index_cast %k : index to i64
  %two = arith.constant 2 : i64
  %f0 = arith.muli %nbi, %mi : i64
  %f1 = arith.muli %f0, %ni : i64
  %f2 = arith.muli %f1, %ki : i64
  %flops = arith.muli %f2, %two : i64
  %one = arith.constant 1 : i64
  %p0 = llvm.mlir.addressof @camlir_blas_totals_data : !llvm.ptr
  %p1 = llvm.getelementptr %p0[1] : (!llvm.ptr) -> !llvm.ptr, i64
  %p2 = llvm.getelementptr %p0[2] : (!llvm.ptr) -> !llvm.ptr, i64
  %a0 = llvm.load %p0 : !llvm.ptr -> i64
  %a1 = llvm.load %p1 : !llvm.ptr -> i64
  %a2 = llvm.load %p2 : !llvm.ptr -> i64
  %b0 = arith.addi %a0, %dt : i64
  %b1 = arith.addi %a1, %flops : i64
  %b2 = arith.addi %a2, %one : i64
  llvm.store %b0, %p0 : i64, !llvm.ptr
  llvm.store %b1, %p1 : i64, !llvm.ptr
  llvm.store %b2, %p2 : i64, !llvm.ptr
  return
}

func.func private @clock_gettime(i32, !llvm.ptr) -> i32
"""
