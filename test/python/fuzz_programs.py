"""A program fuzzer for camlir: random small PyTorch programs, their gradients through camlir
compared with eager PyTorch, gradient for gradient and hook call for hook call.

    python test/python/fuzz_programs.py --seeds 0:2000 --json out.json   # the long run
    python test/python/fuzz_programs.py --seeds 0:50 --modes camlir_eager
    python test/python/fuzz_programs.py --show 17        # the program of seed 17, standalone
    python test/python/fuzz_programs.py --reduce 17 --modes camlir_cpu   # drop what is not needed
    python test/python/fuzz_programs.py --seeds 762 --modes camlir_cpu,compiled_autograd  # PyTorch's own?

`generate(seed)` builds a `Program` deterministically from the seed: the Python source of a
small model (parameters, inputs, a forward of 3-12 ops drawn from `OPS`, hooks of every
kind, custom `autograd.Function`s, small `nn.Module`s, `torch.compile`'d sub-functions with
a graph break) plus what it uses (its features). `run(program, mode)` runs it for 2-3 steps
with new input values, step-dependent ctx scalars and hook closure values, and returns
every gradient (parameters, leaf inputs, retained intermediates) and the hook log of each
step. `check(seed)` compares camlir's backends with eager and classifies the program:

- ok-native: every backward compiled by camlir, same gradients and hook log as eager;
- ok-interpreted: same results, some graph ran on camlir's reference interpreter;
- ok-fallback: same results, some graph was handed back to PyTorch (the reason is kept);
- WRONG: a gradient or hook-log entry differs, or one is missing or extra (the worst);
- CRASH: camlir raised where eager did not, or the process died or hung (the CLI runs the
  programs in worker subprocesses, so a segfault is recorded and the run goes on);
- invalid: eager itself raised or crashed the process (the generator's fault or PyTorch's,
  not camlir's).

docs/fuzzing.md describes the long runs and what they found; test_fuzz_seeds.py runs a
fixed seed set in CI.
"""

import argparse
import contextlib
import dataclasses
import json
import linecache
import logging
import math
import os
import random
import re
import select
import subprocess
import sys
import time
import traceback
import types

RTOL, ATOL = 1e-4, 1e-5
MODES = ("camlir_cpu", "camlir_eager")
# camlir_async: the cpu backend as a training loop gets it by default: step 0 runs eagerly
# while its program compiles in a worker, camlir.wait() after it, the later steps compiled.
# The other camlir modes wait for each program (`enable(wait=True)`): every step runs camlir.
BACKEND_OF = {"camlir_cpu": "cpu", "camlir_eager": "eager", "camlir_async": "cpu"}
MAX_NUMEL = 240
SEVERITY = {"ok-native": 0, "ok-interpreted": 1, "ok-fallback": 2, "invalid": 3, "CRASH": 4, "WRONG": 5}


# --------------------------------------------------------------------------------------
# The program: source text built from records
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Record:
    """One statement of the forward. `defs` names the values it defines; a record with an
    `alias` (an input of the same shape) can be replaced by `out = alias` when reducing."""

    lines: list
    kind: str
    defs: tuple = ()
    alias: str = None
    removable: bool = True


@dataclasses.dataclass
class Program:
    seed: int
    steps: int
    accumulate: bool           # .grad is kept (accumulated into) across steps
    uses_compile: bool
    classes: list              # source chunks at module level: Functions, Modules, compiled subs
    setup_lines: list          # body of setup(): parameters, modules, persistent hooks
    input_lines: list          # body of make_inputs()
    records: list              # the forward
    loss_terms: list           # (value name, constant name)
    features: list
    dtype: str = "float32"     # the default dtype while it runs (bfloat16 sometimes)
    twice: bool = False        # backward(retain_graph=True) then backward() again, each step
    compiled_step: bool = False  # forward and backward inside one torch.compile'd function
    dropped: tuple = ()        # what the reducer removed: record indexes,
    dropped_terms: tuple = ()  # loss term indexes,
    dropped_setup: tuple = ()  # setup() and make_inputs() line indexes
    dropped_inputs: tuple = ()

    def live_setup(self):
        return [ln for i, ln in enumerate(self.setup_lines) if i not in self.dropped_setup]

    def live_inputs(self):
        return [ln for i, ln in enumerate(self.input_lines) if i not in self.dropped_inputs]

    def live_terms(self):
        return [t for i, t in enumerate(self.loss_terms) if i not in self.dropped_terms]

    def forward_lines(self):
        out = []
        for i, rec in enumerate(self.records):
            if i in self.dropped:
                if rec.alias is not None:
                    out.extend(f"{d} = {rec.alias}" for d in rec.defs)
                continue
            out.extend(rec.lines)
        if not self.dropped:
            return out
        # after reduction: drop `a = b` lines and definitions nothing reads any more
        terms = " ".join(v for v, _ in self.live_terms())
        while True:
            for i, line in enumerate(out):
                m = re.match(r"(v\d+) = ", line)
                rest = out[i + 1:] + [terms]
                if m and not any(re.search(rf"\b{m.group(1)}\b", ln) for ln in rest):
                    del out[i]
                    break
            else:
                return out

    def kinds(self):
        return [r.kind for i, r in enumerate(self.records) if i not in self.dropped]

    def description(self) -> str:
        """A one-line summary: the forward's statement kinds, in order."""
        flags = []
        if self.accumulate:
            flags.append("accumulate")
        if self.uses_compile:
            flags.append("compile")
        if self.dtype != "float32":
            flags.append(self.dtype)
        if self.twice:
            flags.append("backward twice")
        if self.compiled_step:
            flags.append("compiled step")
        return f"steps={self.steps}{' ' + ' '.join(flags) if flags else ''}: " + ", ".join(self.kinds())

    @property
    def source(self) -> str:
        body = ["    " + line for line in self.forward_lines()]
        loss = " + ".join(f"({v} * X[{c!r}]).sum()" for v, c in self.live_terms()) or "0.0"
        out = [f"# camlir fuzz program, seed {self.seed}: {self.description()}",
               "import torch", "import torch.nn as nn", "import torch.nn.functional as F", "",
               "log = []  # what the hooks record, per step", ""]
        uses_gs = any("GS" in line for line in self.forward_lines() + self.live_setup()
                      + [ln for chunk in self.classes for ln in chunk])
        if uses_gs:
            out[-1:] = ["GS = 1.0", ""]
        used = "\n".join(self.forward_lines() + self.live_setup())
        for chunk in self.classes:
            name = chunk[0].split()[1].split("(")[0]
            if name in used or name + "_c" in used:
                out.extend(chunk)
                out.append("")
        out.append("def setup():")
        out.extend("    " + line for line in self.live_setup())
        out.append("    return P, M")
        out.append("")
        out.append("def make_inputs():")
        out.extend("    " + line for line in self.live_inputs())
        out.append("    return X")
        out.append("")
        out.append("def forward(P, M, X, step):")
        if uses_gs:
            out.append("    global GS")
            out.append("    GS = 1.0 + 0.5 * step  # a global that hooks read")
        out.append("    R = {}")
        out.extend(body)
        out.append(f"    loss = {loss}")
        out.append("    return loss, R")
        out.append("")
        out.append("def train_step(P, M, X, step):")
        out.append("    loss, R = forward(P, M, X, step)")
        if self.twice:
            out.append("    loss.backward(retain_graph=True)")
        out.append("    loss.backward()")
        out.append("    return R")
        if self.compiled_step:
            out.append("")
            out.append("train_step = torch.compile(train_step, backend='aot_eager')")
        if self.dtype != "float32":
            out.insert(out.index("def setup():"), f"DTYPE = torch.{self.dtype}  # run with torch.set_default_dtype(DTYPE)")
            out.insert(out.index("def setup():") + 1, "")
        return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------
# The generator
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Value:
    name: str
    shape: tuple
    rg: bool                    # requires grad
    leaf: bool = False
    root: str = None            # the base whose storage this value shares (itself if None)
    fresh: bool = True          # not read by any op yet (so an in-place update is legal)
    out_saved: bool = False     # its producer saved it for backward (no in-place on it)
    noinplace: bool = False     # expanded / hooked module output / compiled region output
    contig: bool = True
    f64: bool = False           # float64 (the rest is float32)


_NAME = re.compile(r"\bv\d+\b|P\['p\d+'\]|X\['x\d+'\]")


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


class _Gen:
    def __init__(self, seed):
        self.seed = seed
        self.r = random.Random(seed)
        self.values = []
        self.by_name = {}
        self.records = []
        self.features = set()
        self.classes = {}
        self.setup_lines = ["P = {}", "M = {}"]
        self.input_lines = ["X = {}"]
        self.n = 0
        self.np = 0
        self.nx = 0
        self.nc = 0
        self.nm = 0
        self.nh = 0

    # -- values ---------------------------------------------------------------------

    def fresh_name(self):
        self.n += 1
        return f"v{self.n}"

    def add(self, v):
        self.values.append(v)
        self.by_name[v.name] = v
        return v

    def root_of(self, v):
        return self.by_name[v.root] if v.root else v

    def consume(self, *vals):
        for v in vals:
            v.fresh = False
            if v.root:
                self.by_name[v.root].fresh = False

    def rand_shape(self, rank=None):
        rank = self.r.choice([1, 2, 2, 2, 3, 3]) if rank is None else rank
        return tuple(self.r.choice([2, 3, 4, 5]) for _ in range(rank))

    def new_param(self, shape, scale=0.5, like=None, f64=False):
        """A new parameter; `like`: a value whose dtype it takes (for matmul, linear, ...)."""
        self.np += 1
        name = f"p{self.np}"
        f64 = f64 or (like is not None and like.f64)
        dt = ".double()" if f64 else ""
        self.setup_lines.append(f"P[{name!r}] = (torch.randn({shape!r}){dt} * {scale}).requires_grad_()")
        return self.add(Value(f"P[{name!r}]", tuple(shape), True, leaf=True, f64=f64))

    def new_input(self, shape, rg):
        self.nx += 1
        name = f"x{self.nx}"
        self.input_lines.append(f"X[{name!r}] = torch.randn({shape!r})" + (".requires_grad_()" if rg else ""))
        return self.add(Value(f"X[{name!r}]", tuple(shape), rg, leaf=True))

    def new_const(self, shape):
        self.nc += 1
        name = f"c{self.nc}"
        self.input_lines.append(f"X[{name!r}] = torch.randn({shape!r})")
        return name

    def pick(self, pred=lambda v: True, prefer_rg=True):
        cands = [v for v in self.values if pred(v)]
        if not cands:
            return None
        weights = []
        for i, v in enumerate(cands):
            w = 1.0 + 2.0 * i / max(1, len(cands))  # prefer recent values: longer chains
            if prefer_rg and v.rg:
                w *= 3.0
            if v.leaf:
                w *= 0.4
            if v.fresh:
                w *= 1.5
            weights.append(w)
        return self.r.choices(cands, weights)[0]

    def emit(self, kind, lines, defs=(), alias=None, removable=True):
        if isinstance(lines, str):
            lines = [lines]
        self.records.append(Record(list(lines), kind, tuple(defs), alias, removable))
        self.features.add(kind.split("(")[0])
        self.features.add(kind)

    def mentioned(self, expr):
        return [self.by_name[m] for m in _NAME.findall(expr) if m in self.by_name]

    def define(self, kind, expr, shape, rg, alias_of=None, **kw):
        name = self.fresh_name()
        kw.setdefault("f64", any(v.f64 for v in self.mentioned(expr)))
        v = self.add(Value(name, tuple(shape), rg, **kw))
        alias = alias_of.name if alias_of is not None and tuple(alias_of.shape) == tuple(shape) else None
        self.emit(kind, f"{name} = {expr}", (name,), alias)
        return v

    def broadcast_partner(self, a):
        """Something to combine with `a` elementwise: a value of the same shape, a value that
        broadcasts to it, a new parameter, a constant, or a number."""
        r = self.r.random()
        same = [v for v in self.values if v.shape == a.shape and v is not a]
        if same and r < 0.45:
            return self.pick(lambda v: v.shape == a.shape and v is not a).name, a.shape
        suffix = [v for v in self.values if 0 < len(v.shape) < len(a.shape) and v.shape == a.shape[-len(v.shape):]]
        if suffix and r < 0.6:
            b = self.r.choice(suffix)
            return b.name, a.shape
        if r < 0.8:
            shape = a.shape if self.r.random() < 0.6 or not a.shape else a.shape[-1:]
            return self.new_param(shape).name, a.shape
        if r < 0.9:
            return f"X[{self.new_const(a.shape)!r}]", a.shape
        return repr(self.r.choice([0.5, 1.5, -2.0, 3.0])), a.shape

    # -- the op table ---------------------------------------------------------------

    def op_unary(self):
        a = self.pick()
        if a is None:
            return False
        self.consume(a)
        choice = self.r.choice(["exp", "tanh", "sigmoid", "relu", "gelu", "gelu_tanh", "sin", "pow_int",
                                "pow_float", "pow_neg", "clamp", "clamp_min", "scale", "neg"])
        x = a.name
        expr, saved = {
            "exp": (f"torch.exp({x}.clamp(-3.0, 3.0))", True),
            "tanh": (f"torch.tanh({x})", True),
            "sigmoid": (f"torch.sigmoid({x})", True),
            "relu": (f"torch.relu({x})", True),
            "gelu": (f"F.gelu({x})", False),
            "gelu_tanh": (f"F.gelu({x}, approximate='tanh')", False),
            "sin": (f"torch.sin({x})", False),
            "pow_int": (f"{x}.pow({self.r.choice([2, 3])})", False),
            "pow_float": (f"({x}.abs() + 0.5).pow({self.r.choice([1.5, 0.5, 2.5])})", False),
            "pow_neg": (f"({x} * {x} + 1.0).pow(-0.5)", False),
            "clamp": (f"{x}.clamp(-0.5, 0.8)", False),
            "clamp_min": (f"torch.clamp({x}, min=0.1)", False),
            "scale": (f"{x} * {self.r.choice([0.5, 1.5, -2.0])}", False),
            "neg": (f"-{x}", False),
        }[choice]
        self.define(f"unary({choice})", expr, a.shape, a.rg, alias_of=a, out_saved=saved)
        return True

    def op_unary_more(self):
        """Elementwise ops beyond the brief's list, on safe domains."""
        a = self.pick()
        if a is None:
            return False
        self.consume(a)
        choice = self.r.choice(["log", "sqrt", "rsqrt", "silu", "softplus", "leaky_relu", "erf", "atan", "abs",
                                "dropout", "masked_fill", "clone", "contiguous", "square", "reciprocal"])
        x = a.name
        if choice == "masked_fill":
            expr = f"{x}.masked_fill(X[{self.new_const(a.shape)!r}] > 0.5, {self.r.choice([0.0, 1.5])})"
        else:
            expr = {
                "log": f"torch.log({x} * {x} + 0.5)",
                "sqrt": f"torch.sqrt({x} * {x} + 0.25)",
                "rsqrt": f"torch.rsqrt({x}.abs() + 0.5)",
                "silu": f"F.silu({x})",
                "softplus": f"F.softplus({x}, beta={self.r.choice([1.0, 2.0])})",
                "leaky_relu": f"F.leaky_relu({x}, {self.r.choice([0.01, 0.2])})",
                "erf": f"torch.erf({x})",
                "atan": f"torch.atan({x})",
                "abs": f"{x}.abs()",
                "dropout": f"F.dropout({x}, p=0.3, training=True)",
                "clone": f"{x}.clone()",
                "contiguous": f"{x}.contiguous()",
                "square": f"torch.square({x})",
                "reciprocal": f"torch.reciprocal({x}.abs() + 1.0)",
            }[choice]
        saved = choice in ("sqrt", "rsqrt", "reciprocal")
        if choice == "contiguous" and a.contig:
            self.view_of(a, "contiguous (alias)", expr, a.shape)
        else:
            self.define(f"unary({choice})", expr, a.shape, a.rg, alias_of=a, out_saved=saved)
        return True

    def op_index(self):
        """Indexing with integer tensors that change every step: index_select, advanced
        indexing (duplicates accumulate in the backward), gather, max/amax (saved indices)."""
        a = self.pick(lambda v: len(v.shape) >= 1)
        if a is None:
            return False
        self.consume(a)
        s = a.shape
        d = self.r.randrange(len(s))
        choice = self.r.choice(["index_select", "advanced", "gather", "max", "amax"])
        x = a.name
        if choice in ("index_select", "advanced"):
            k = self.r.choice([1, 2, 3, 4, 5])
            self.nc += 1
            idx = f"i{self.nc}"
            self.input_lines.append(f"X[{idx!r}] = torch.randint(0, {s[d]}, ({k},))")
            shape = s[:d] + (k,) + s[d + 1:]
            if choice == "index_select":
                expr = f"{x}.index_select({d}, X[{idx!r}])"
            else:
                expr = f"{x}[{', '.join([':'] * d + [f'X[{idx!r}]'])}]"
            self.define(f"index({choice})", expr, shape, a.rg)
        elif choice == "gather":
            shape = tuple(self.r.randint(1, n) for n in s)
            self.nc += 1
            idx = f"i{self.nc}"
            self.input_lines.append(f"X[{idx!r}] = torch.randint(0, {s[d]}, {shape!r})")
            self.define("index(gather)", f"torch.gather({x}, {d}, X[{idx!r}])", shape, a.rg)
        elif choice == "max":
            keep = self.r.random() < 0.3
            shape = tuple(1 if i == d else n for i, n in enumerate(s)) if keep else s[:d] + s[d + 1:]
            self.define("index(max dim)", f"{x}.max(dim={d}{', keepdim=True' if keep else ''}).values", shape, a.rg,
                        out_saved=False)
        else:
            shape = s[:d] + s[d + 1:]
            self.define("index(amax)", f"{x}.amax(dim={d})", shape, a.rg, out_saved=True)
        return True

    def op_loss(self):
        """A loss function as an intermediate (rank 0): cross entropy with changing targets,
        mse, smooth l1."""
        a = self.pick(lambda v: len(v.shape) == 2 and v.rg)
        if a is None:
            return False
        self.consume(a)
        choice = self.r.choice(["cross_entropy", "cross_entropy_ls", "mse", "smooth_l1", "nll"])
        if choice.startswith("cross_entropy") or choice == "nll":
            self.nc += 1
            t = f"t{self.nc}"
            self.input_lines.append(f"X[{t!r}] = torch.randint(0, {a.shape[1]}, ({a.shape[0]},))")
            expr = {"cross_entropy": f"F.cross_entropy({a.name}, X[{t!r}])",
                    "cross_entropy_ls": f"F.cross_entropy({a.name}, X[{t!r}], label_smoothing=0.1)",
                    "nll": f"F.nll_loss(F.log_softmax({a.name}, dim=1), X[{t!r}], reduction='sum')"}[choice]
        elif choice == "mse":
            expr = f"F.mse_loss({a.name}, X[{self.new_const(a.shape)!r}])"
        else:
            expr = f"F.smooth_l1_loss({a.name}, X[{self.new_const(a.shape)!r}], beta=0.5)"
        self.define(f"loss({choice})", expr, (), True)
        return True

    def op_bmm(self):
        a = self.pick(lambda v: len(v.shape) == 3)
        if a is None:
            return False
        self.consume(a)
        b_, m, k = a.shape
        n = self.r.choice([2, 3, 4])
        cand = [v for v in self.values if v.shape == (b_, k, n) and v.f64 == a.f64]
        b = self.r.choice(cand) if cand and self.r.random() < 0.5 else self.new_param((b_, k, n), like=a)
        self.consume(b)
        expr = self.r.choice([f"torch.bmm({a.name}, {b.name})", f"torch.einsum('bmk,bkn->bmn', {a.name}, {b.name})"])
        self.define("bmm", expr, (b_, m, n), a.rg or b.rg)
        return True

    def op_binary(self):
        a = self.pick()
        if a is None:
            return False
        choice = self.r.choice(["mul", "add", "sub", "div", "div_scalar", "add_alpha", "where"])
        b, shape = self.broadcast_partner(a)
        bv = self.by_name.get(b)
        self.consume(a, *([bv] if bv else []))
        rg = a.rg or (bv.rg if bv else b.startswith("P["))
        x = a.name
        expr = {
            "mul": f"{x} * {b}",
            "add": f"{x} + {b}",
            "sub": f"{b} - {x}",
            "div": f"{x} / ({b} * {b} + 1.0)" if not b[0].isdigit() and b[0] != "-" else f"{x} / {b}",
            "div_scalar": f"{x} / {self.r.choice([2.0, -4.0, 0.3])}",
            "add_alpha": f"torch.add({x}, {b}, alpha=0.5)",
            "where": f"torch.where({x} > 0, {x}, {b})" if self.r.random() < 0.5
                     else f"torch.where(X[{self.new_const(a.shape)!r}] > 0, {b}, {x})",
        }[choice]
        if choice == "where" and b[0] in "-0123456789":
            expr = f"torch.where({x} > 0, {x}, torch.zeros_like({x}) + {b})"
        self.define(f"binary({choice})", expr, shape, rg, alias_of=a)
        return True

    def op_reduce(self):
        a = self.pick(lambda v: len(v.shape) >= 1)
        if a is None:
            return False
        self.consume(a)
        fn = self.r.choice(["sum", "mean"])
        r = self.r.random()
        if r < 0.1 or len(a.shape) == 1 and r < 0.3:
            self.define(f"reduce({fn} all)", f"{a.name}.{fn}()", (), a.rg)
            return True
        keep = self.r.random() < 0.4
        if len(a.shape) >= 3 and self.r.random() < 0.3:
            dims = tuple(sorted(self.r.sample(range(len(a.shape)), 2)))
        else:
            dims = (self.r.randrange(len(a.shape)),)
        shape = tuple(1 if i in dims else d for i, d in enumerate(a.shape)) if keep else \
            tuple(d for i, d in enumerate(a.shape) if i not in dims)
        dim_arg = dims[0] if len(dims) == 1 and self.r.random() < 0.5 else dims
        self.define(f"reduce({fn} dim{' keepdim' if keep else ''})",
                    f"{a.name}.{fn}(dim={dim_arg!r}{', keepdim=True' if keep else ''})", shape, a.rg)
        return True

    def op_matmul(self):
        a = self.pick(lambda v: len(v.shape) >= 1)
        if a is None:
            return False
        self.consume(a)
        k = a.shape[-1]
        n = self.r.choice([2, 3, 4, 5])
        if self.r.random() < 0.5:
            w = self.new_param((n, k), like=a)
            bias = self.new_param((n,), like=a) if self.r.random() < 0.6 else None
            expr = f"F.linear({a.name}, {w.name}" + (f", {bias.name})" if bias else ")")
            self.define("linear", expr, a.shape[:-1] + (n,), True)
            return True
        cand = [v for v in self.values if len(v.shape) == 2 and v.shape[0] == k and v is not a and v.f64 == a.f64]
        if cand and self.r.random() < 0.4:
            b = self.r.choice(cand)
            self.consume(b)
            n = b.shape[1]
        else:
            b = self.new_param((k, n), like=a)
        shape = a.shape[:-1] + (n,)
        self.define("matmul", f"torch.matmul({a.name}, {b.name})" if self.r.random() < 0.5
                    else f"{a.name} @ {b.name}", shape, a.rg or b.rg)
        return True

    def view_of(self, a, kind, expr, shape, contig=None, **kw):
        root = a.root or a.name
        noinplace = kw.pop("noinplace", False) or a.noinplace
        return self.define(f"view({kind})", expr, shape, a.rg, root=root, noinplace=noinplace,
                           contig=a.contig if contig is None else contig, **kw)

    def op_view(self):
        a = self.pick()
        if a is None:
            return False
        s = a.shape
        rank = len(s)
        kinds = ["unsqueeze", "reshape"]
        if rank >= 2:
            kinds += ["transpose", "permute", "transpose"]
        if rank >= 1:
            kinds += ["slice", "select", "narrow", "unsqueeze_expand"]
        if rank >= 2:
            kinds += ["flatten"]
        if a.contig and rank >= 1:
            kinds += ["view"]
            if self.r.random() < 0.35:
                kinds += ["as_strided"]
        if any(d == 1 for d in s):
            kinds += ["expand"]
        if rank >= 2 and s[0] <= 3:
            kinds += ["unbind"]
        kind = self.r.choice(kinds)
        self.consume(a)
        x = a.name
        if kind == "transpose":
            d0, d1 = self.r.sample(range(rank), 2)
            shape = list(s)
            shape[d0], shape[d1] = shape[d1], shape[d0]
            self.view_of(a, kind, f"{x}.transpose({d0}, {d1})" if self.r.random() < 0.7 or rank != 2 else f"{x}.t()",
                         tuple(shape), contig=False)
        elif kind == "permute":
            perm = list(range(rank))
            while perm == list(range(rank)):
                self.r.shuffle(perm)
            self.view_of(a, kind, f"{x}.permute{tuple(perm)!r}", tuple(s[p] for p in perm), contig=False)
        elif kind in ("reshape", "view", "flatten"):
            n = _numel(s)
            options = [(n,)]
            for d in (2, 3, 4, 5):
                if n % d == 0 and n // d > 1:
                    options.append((d, n // d))
                    options.append((d, -1))
            shape = self.r.choice(options)
            real = tuple(n // _numel([e for e in shape if e != -1]) if d == -1 else d for d in shape)
            if kind == "flatten":
                self.view_of(a, kind, f"{x}.flatten()", (n,), contig=True) if a.contig else \
                    self.define("view(flatten copy)", f"{x}.flatten()", (n,), a.rg)
            elif kind == "view":
                self.view_of(a, kind, f"{x}.view{shape!r}" if len(shape) > 1 else f"{x}.view({shape[0]})", real)
            elif a.contig:
                self.view_of(a, kind, f"{x}.reshape{shape!r}" if len(shape) > 1 else f"{x}.reshape({shape[0]})", real)
            else:
                self.define("view(reshape copy)", f"{x}.reshape{shape!r}" if len(shape) > 1 else
                            f"{x}.reshape({shape[0]})", real, a.rg)
        elif kind == "unsqueeze":
            d = self.r.randrange(rank + 1)
            self.view_of(a, kind, f"{x}.unsqueeze({d})", s[:d] + (1,) + s[d:])
        elif kind == "expand":
            i = self.r.choice([i for i, d in enumerate(s) if d == 1])
            shape = list(s)
            shape[i] = self.r.choice([2, 3])
            if _numel(shape) > MAX_NUMEL:
                return False
            self.view_of(a, kind, f"{x}.expand{tuple(shape)!r}", tuple(shape), contig=False, noinplace=True)
        elif kind == "unsqueeze_expand":
            d = self.r.randrange(rank + 1)
            k = self.r.choice([2, 3])
            shape = s[:d] + (k,) + s[d:]
            if _numel(shape) > MAX_NUMEL:
                return False
            self.view_of(a, "expand", f"{x}.unsqueeze({d}).expand{tuple(shape)!r}", shape, contig=False,
                         noinplace=True)
        elif kind == "slice":
            d = self.r.randrange(rank)
            if s[d] < 2:
                return False
            start = self.r.randrange(s[d] - 1)
            stop = self.r.randrange(start + 1, s[d] + 1)
            step = self.r.choice([1, 1, 2])
            length = len(range(start, stop, step))
            idx = ", ".join([":"] * d + [f"{start}:{stop}" + (f":{step}" if step != 1 else "")])
            shape = s[:d] + (length,) + s[d + 1:]
            self.view_of(a, kind, f"{x}[{idx}]", shape, contig=a.contig and d == 0 and step == 1)
        elif kind == "select":
            d = self.r.randrange(rank)
            i = self.r.randrange(s[d])
            expr = f"{x}[{i}]" if d == 0 and self.r.random() < 0.5 else f"{x}.select({d}, {i})"
            self.view_of(a, kind, expr, s[:d] + s[d + 1:], contig=a.contig and d == 0)
        elif kind == "narrow":
            d = self.r.randrange(rank)
            length = self.r.randrange(1, s[d] + 1)
            start = self.r.randrange(s[d] - length + 1)
            self.view_of(a, kind, f"{x}.narrow({d}, {start}, {length})", s[:d] + (length,) + s[d + 1:],
                         contig=a.contig and d == 0)
        elif kind == "as_strided":
            n = _numel(s)
            if n < 4:
                return False
            overlap = self.r.random() < 0.3
            p = self.r.choice([2, 3])
            q = self.r.choice([1, 2, 3])
            st = (1, 1) if overlap else (q, 1)
            if (p - 1) * st[0] + (q - 1) * st[1] >= n:
                p, q, st = 2, 1, (1, 1)
            if (p - 1) * st[0] + (q - 1) * st[1] >= n:
                return False
            self.view_of(a, kind, f"{x}.as_strided(({p}, {q}), {st!r})", (p, q), contig=False,
                         noinplace=True)
            self.features.add("as_strided")
        elif kind == "unbind":
            names = [self.fresh_name() for _ in range(s[0])]
            root = a.root or a.name
            for nm in names:
                self.add(Value(nm, s[1:], a.rg, root=root, noinplace=a.noinplace, contig=a.contig))
            self.emit("view(unbind)", f"{', '.join(names)}, = {x}.unbind(0)" if len(names) == 1
                      else f"{', '.join(names)} = {x}.unbind(0)", tuple(names))
        return True

    def op_inplace(self):
        def ok(v):
            root = self.root_of(v)
            return (not v.leaf and not root.leaf and v.fresh and root.fresh and not v.out_saved
                    and not root.out_saved and not v.noinplace and not root.noinplace and len(v.shape) >= 1)
        t = self.pick(ok)
        if t is None:
            return False
        x = t.name
        target, tshape, how = x, t.shape, "whole"
        r = self.r.random()
        if r < 0.3 and t.shape[0] >= 2:
            i = self.r.randrange(t.shape[0])
            target, tshape, how = f"{x}[{i}]", t.shape[1:], "select"
        elif r < 0.5:
            d = self.r.randrange(len(t.shape))
            length = self.r.randrange(1, t.shape[d] + 1)
            start = self.r.randrange(t.shape[d] - length + 1)
            target, tshape, how = f"{x}.narrow({d}, {start}, {length})", t.shape[:d] + (length,) + t.shape[d + 1:], "narrow"
        elif r < 0.6 and len(t.shape) >= 2:
            target, how = f"{x}.transpose(0, 1)", "transpose"
            tshape = (t.shape[1], t.shape[0]) + t.shape[2:]
        op = self.r.choice(["mul_", "add_", "mul_", "add_"])
        scalar = self.r.random() < 0.4 or not tshape
        root = self.root_of(t)
        if scalar:
            arg = repr(self.r.choice([0.5, 2.0, -1.5]))
        else:
            same = [v for v in self.values if v.shape == tshape and v is not t and v.root != (t.root or t.name)
                    and v.name != (t.root or "") and (v.rg <= root.rg) and v.f64 <= t.f64]
            if same and self.r.random() < 0.5:
                b = self.r.choice(same)
                self.consume(b)
                arg = b.name
            elif root.rg and self.r.random() < 0.6:
                arg = self.new_param(tshape, like=t).name
            else:
                arg = f"X[{self.new_const(tshape)!r}]"
        if op == "add_" and not scalar and self.r.random() < 0.3:
            line = f"{target}.add_({arg}, alpha=0.5)"
        else:
            line = f"{target}.{op}({arg})"
        if not scalar and op == "mul_":
            t.fresh = False
            root.fresh = False
        self.emit(f"inplace({op} {how})", line)
        return True

    def op_cat(self):
        a = self.pick(lambda v: len(v.shape) >= 1)
        if a is None:
            return False
        stack = self.r.random() < 0.4
        same = [v for v in self.values if v.shape == a.shape]
        b = self.r.choice(same)  # may be a itself
        self.consume(a, b)
        if stack:
            d = self.r.randrange(len(a.shape) + 1)
            shape = a.shape[:d] + (2,) + a.shape[d:]
            fn = "stack"
        else:
            d = self.r.randrange(len(a.shape))
            shape = a.shape[:d] + (2 * a.shape[d],) + a.shape[d + 1:]
            fn = "cat"
        if _numel(shape) > MAX_NUMEL:
            return False
        dd = d - len(shape) if self.r.random() < 0.3 else d
        self.define(f"{fn}", f"torch.{fn}([{a.name}, {b.name}], dim={dd})", shape, a.rg or b.rg)
        return True

    def op_softmax(self):
        a = self.pick(lambda v: len(v.shape) >= 1)
        if a is None:
            return False
        self.consume(a)
        fn = self.r.choice(["softmax", "log_softmax"])
        d = self.r.randrange(-len(a.shape), len(a.shape))
        self.define(fn, f"torch.{fn}({a.name}, dim={d})", a.shape, a.rg, alias_of=a, out_saved=True)
        return True

    def op_layer_norm(self):
        a = self.pick(lambda v: len(v.shape) >= 1 and v.shape[-1] >= 2)
        if a is None:
            return False
        self.consume(a)
        d = a.shape[-1]
        if self.r.random() < 0.6:
            w = self.new_param((d,), like=a)
            b = self.new_param((d,), like=a) if self.r.random() < 0.7 else None
            expr = f"F.layer_norm({a.name}, ({d},), {w.name}, {b.name if b else 'None'})"
            rg = True
        else:
            expr = f"F.layer_norm({a.name}, ({d},))"
            rg = a.rg
        self.define("layer_norm", expr, a.shape, rg, alias_of=a)
        return True

    def op_detach(self):
        a = self.pick(lambda v: v.rg and not v.leaf)
        if a is None:
            return False
        self.consume(a)
        root = a.root or a.name
        self.define("detach", f"{a.name}.detach()", a.shape, False, alias_of=a, root=root,
                    noinplace=a.noinplace, contig=a.contig)
        return True

    # -- custom Functions -----------------------------------------------------------

    FUNCTIONS = {
        "FScale": [
            "class FScale(torch.autograd.Function):",
            "    @staticmethod",
            "    def forward(ctx, x, s):",
            "        ctx.s = s",
            "        ctx.save_for_backward(x)",
            "        return torch.sin(x) * s",
            "",
            "    @staticmethod",
            "    def backward(ctx, g):",
            "        x, = ctx.saved_tensors",
            "        return g * torch.cos(x) * ctx.s, None",
        ],
        "FMul2": [
            "class FMul2(torch.autograd.Function):",
            "    @staticmethod",
            "    def forward(ctx, x, y, k):",
            "        ctx.save_for_backward(x, y)",
            "        ctx.k = k",
            "        return x * y + k * y",
            "",
            "    @staticmethod",
            "    def backward(ctx, g):",
            "        x, y = ctx.saved_tensors",
            "        gx = g * y if ctx.needs_input_grad[0] else None",
            "        gy = g * (x + ctx.k) if ctx.needs_input_grad[1] else None",
            "        return gx, gy, None",
        ],
        "FTanhOut": [
            "class FTanhOut(torch.autograd.Function):",
            "    @staticmethod",
            "    def forward(ctx, x, k):",
            "        out = torch.tanh(x)",
            "        ctx.save_for_backward(out)",
            "        ctx.k = k",
            "        return out",
            "",
            "    @staticmethod",
            "    def backward(ctx, g):",
            "        out, = ctx.saved_tensors",
            "        return g * (1 - out * out) * ctx.k, None",
        ],
        "FShape": [
            "class FShape(torch.autograd.Function):",
            "    @staticmethod",
            "    def forward(ctx, x, flag):",
            "        ctx.shape = x.shape",
            "        ctx.flag = flag",
            "        return x.reshape(-1) * 2.0",
            "",
            "    @staticmethod",
            "    def backward(ctx, g):",
            "        g = g * 2.0 if ctx.flag else g * 3.0",
            "        return g.reshape(ctx.shape), None",
        ],
    }

    def step_scalar(self):
        r = self.r.random()
        if r < 0.5:
            return f"{self.r.choice([0.5, 1.0, 1.5])} + {self.r.choice([0.25, 0.5])} * step"
        if r < 0.7:
            return f"[0.5, 2.0, 0.5][step]"
        return repr(self.r.choice([0.5, 1.5, 2.0]))

    def op_function(self):
        a = self.pick()
        if a is None:
            return False
        name = self.r.choice(list(self.FUNCTIONS))
        self.classes[name] = self.FUNCTIONS[name]
        self.consume(a)
        if name == "FScale":
            self.define(f"function({name})", f"FScale.apply({a.name}, {self.step_scalar()})", a.shape, a.rg,
                        noinplace=True)
        elif name == "FMul2":
            b, _ = self.broadcast_partner(a)
            if b not in self.by_name and not b.startswith(("P[", "X[")):
                b = self.new_param(a.shape).name
            bv = self.by_name.get(b)
            if bv is not None and bv.shape != a.shape:
                b = self.new_param(a.shape).name
                bv = self.by_name[b]
            if bv is not None:
                self.consume(bv)
            rg = a.rg or (bv.rg if bv is not None else b.startswith("P["))
            self.define(f"function({name})", f"FMul2.apply({a.name}, {b}, {self.step_scalar()})", a.shape, rg,
                        noinplace=True)
        elif name == "FTanhOut":
            self.define(f"function({name})", f"FTanhOut.apply({a.name}, {self.step_scalar()})", a.shape, a.rg,
                        noinplace=True)
        else:
            flag = self.r.choice(["step % 2 == 0", "True", "step > 0"])
            self.define(f"function({name})", f"FShape.apply({a.name}, {flag})", (_numel(a.shape),), a.rg,
                        noinplace=True)
        self.features.add("ctx_value")
        return True

    # -- modules and torch.compile ------------------------------------------------

    def op_module(self):
        a = self.pick(lambda v: len(v.shape) >= 1 and not v.f64)
        if a is None:
            return False
        self.consume(a)
        self.nm += 1
        m = f"m{self.nm}"
        d_in = a.shape[-1]
        d_out = self.r.choice([2, 3, 4, 5])
        act = self.r.choice(["torch.tanh(h)", "F.gelu(h)", "h * self.scale", "torch.relu(h) + h"])
        cls = f"Block{self.nm}"
        self.classes[cls] = [
            f"class {cls}(nn.Module):",
            "    def __init__(self, d_in, d_out):",
            "        super().__init__()",
            "        self.lin = nn.Linear(d_in, d_out)",
            "        self.scale = nn.Parameter(torch.ones(d_out) * 0.5)",
            "",
            "    def forward(self, x):",
            "        h = self.lin(x)",
            f"        return {act}",
        ]
        self.setup_lines.append(f"M[{m!r}] = {cls}({d_in}, {d_out})")
        hooked = False
        if self.r.random() < 0.6:
            self.nh += 1
            h = self.nh
            form = self.r.choice([
                f"lambda mod, gi, go: log.append(('full{h}', [None if g is None else g.sum().item() for g in gi]))",
                "lambda mod, gi, go: tuple(None if g is None else g * 0.5 for g in gi)",
                "lambda mod, gi, go: None",
            ])
            self.setup_lines.append(f"M[{m!r}].register_full_backward_hook({form})")
            self.features.add("hook(module full)")
            hooked = True
        if self.r.random() < 0.5:
            self.nh += 1
            h = self.nh
            form = self.r.choice([
                f"lambda mod, go: log.append(('mpre{h}', go[0].sum().item()))",
                "lambda mod, go: (go[0] * 2.0,)",
                "lambda mod, go: tuple(g * GS for g in go)",
            ])
            self.setup_lines.append(f"M[{m!r}].register_full_backward_pre_hook({form})")
            self.features.add("hook(module pre)")
            hooked = True
        self.define("module", f"M[{m!r}]({a.name})", a.shape[:-1] + (d_out,), True, out_saved=True,
                    noinplace=hooked)
        return True

    def op_compile(self):
        if self.r.random() < 0.6 or any(r.kind.startswith("compile") for r in self.records):
            return False
        a = self.pick()
        if a is None or not a.rg:
            return False
        self.consume(a)
        name = f"sub{len(self.classes)}"
        variant = self.r.choice(["plain", "param", "break_twice"])
        lines = [f"def {name}(a{', w' if variant == 'param' else ''}):",
                 "    b = torch.sin(a) * 2.0"]
        if variant == "param":
            lines.append("    b = b * w")
        lines.append("    torch._dynamo.graph_break()")
        lines.append("    c = torch.tanh(b) + a")
        if variant == "break_twice":
            lines.append("    torch._dynamo.graph_break()")
            lines.append("    c = c * c.sigmoid()")
        lines.append("    return c")
        lines.append(f"{name}_c = torch.compile({name}, backend='aot_eager')")
        self.classes[name] = lines
        args = a.name
        if variant == "param":
            args += ", " + self.new_param(a.shape[-1:] if a.shape else ()).name
        self.define(f"compile({variant})", f"{name}_c({args})", a.shape, True, out_saved=True, noinplace=True)
        self.features.add("compile")
        return True

    # -- hooks and retain_grad on values ------------------------------------------

    def tensor_hook_form(self, h, where):
        """(lambda or def lines, pure?)"""
        forms = [
            ("lambda g: g * 0.5", "pure"),
            ("lambda g: g * hs", "closure"),
            ("lambda g: g * GS", "global"),
            ("lambda g: g.clamp(-1.0, 1.0)", "pure"),
            ("lambda g: g + 0.1 * torch.tanh(g)", "pure"),
            ("lambda g: None", "pure"),
            (f"lambda g: log.append(('t{h}', g.sum().item()))", "impure"),
            (f"lambda g: log.append(('t{h}', g.abs().sum().item())) or g * 2.0", "impure"),
            # data-dependent, on a value rounding cannot flip (a gradient's sum can be 0 up
            # to rounding, e.g. through a softmax: its sign would be noise)
            ("lambda g: g * (0.5 if g.abs().max().item() > 0.3 else 2.0)", "data"),
        ]
        return self.r.choice(forms)

    def op_hook(self):
        r = self.r.random()
        if r < 0.45:
            # a tensor hook on an intermediate (or a leaf input)
            a = self.pick(lambda v: v.rg and not v.name.startswith("P["))
            if a is None:
                return False
            self.nh += 1
            form, purity = self.tensor_hook_form(self.nh, "value")
            lines = []
            if purity == "closure":
                lines.append(f"hs = {self.step_scalar()}")
            lines.append(f"{a.name}.register_hook({form})")
            if self.r.random() < 0.2:  # the graph changes between steps: a new capture
                lines = [self.r.choice(["if step > 0:", "if step % 2 == 1:", "if step == 0:"])] + ["    " + ln for ln in lines]
                self.features.add("graph changes between steps")
            self.emit(f"hook(tensor {purity})", lines)
            return True
        if r < 0.6:
            # a persistent hook on a parameter (registered once, in setup)
            a = self.pick(lambda v: v.name.startswith("P["), prefer_rg=False)
            if a is None:
                return False
            self.nh += 1
            form, purity = self.tensor_hook_form(self.nh, "param")
            if purity == "closure":
                form, purity = "lambda g: g * 0.5", "pure"
            self.setup_lines.append(f"{a.name}.register_hook({form})")
            self.features.add(f"hook(param tensor {purity})")
            return True
        if r < 0.7:
            a = self.pick(lambda v: v.name.startswith("P["), prefer_rg=False)
            if a is None:
                return False
            self.nh += 1
            if self.r.random() < 0.5:
                form = f"lambda p: log.append(('acc{self.nh}', p.grad.sum().item()))"
            else:
                form = f"acc_scale{self.nh}"
                self.setup_lines += [f"def acc_scale{self.nh}(p):", "    p.grad.mul_(0.5)"]
            self.setup_lines.append(f"{a.name}.register_post_accumulate_grad_hook({form})")
            self.features.add("hook(post accumulate)")
            return True
        a = self.pick(lambda v: v.rg and not v.leaf)
        if a is None:
            return False
        self.nh += 1
        h = self.nh
        if r < 0.85:
            form = self.r.choice([
                "lambda gos: tuple(None if g is None else g * 0.5 for g in gos)",
                f"lambda gos: log.append(('pre{h}', [None if g is None else g.sum().item() for g in gos]))",
                "lambda gos: (gos[0] * 1.5,) + tuple(gos[1:])",
            ])
            self.emit("hook(grad_fn pre)", f"{a.name}.grad_fn.register_prehook({form})")
        else:
            form = self.r.choice([
                "lambda gis, gos: tuple(None if g is None else g * 2.0 for g in gis)",
                f"lambda gis, gos: log.append(('post{h}', [None if g is None else g.sum().item() for g in gis]))",
                "lambda gis, gos: None",
            ])
            self.emit("hook(grad_fn post)", f"{a.name}.grad_fn.register_hook({form})")
        return True

    def op_retain(self):
        a = self.pick(lambda v: v.rg and not v.leaf)
        if a is None:
            return False
        self.emit("retain_grad", [f"{a.name}.retain_grad()", f"R[{a.name!r}] = {a.name}"])
        return True

    # -- the whole program ----------------------------------------------------------

    OPS = [  # (weight, method)
        (14, "op_unary"), (12, "op_binary"), (6, "op_reduce"), (6, "op_matmul"), (12, "op_view"),
        (6, "op_inplace"), (4, "op_cat"), (4, "op_softmax"), (3, "op_layer_norm"), (3, "op_detach"),
        (5, "op_function"), (3, "op_module"), (3, "op_compile"), (12, "op_hook"), (5, "op_retain"),
        # beyond the brief's list
        (5, "op_unary_more"), (3, "op_index"), (2, "op_loss"), (2, "op_bmm"),
    ]

    def build(self) -> Program:
        r = self.r
        for _ in range(r.choice([1, 1, 2, 2, 3])):
            self.new_input(self.rand_shape(), rg=r.random() < 0.4)
        self.new_param(self.rand_shape())
        if r.random() < 0.5:
            self.new_param(self.rand_shape())
        # the first op mixes an input with a parameter, so gradients flow from the start;
        # sometimes that parameter is float64 (and with it much of the program)
        x = self.values[0]
        f64 = r.random() < 0.08
        if f64:
            self.features.add("float64")
        p = self.new_param(x.shape if r.random() < 0.7 else x.shape[-1:], f64=f64)
        self.consume(x, p)
        self.define("binary(mul)", f"{x.name} * {p.name}", x.shape, True)
        n_ops = r.randint(3, 12)
        done = 0
        tries = 0
        weights = [w for w, _ in self.OPS]
        while done < n_ops and tries < 200:
            tries += 1
            method = r.choices([m for _, m in self.OPS], weights)[0]
            if getattr(self, method)():
                done += 1
        # the loss: every value nothing read yet (and a few that were read), weighted by
        # constants that change every step
        sinks = [v for v in self.values if v.rg and not v.leaf and (v.fresh or r.random() < 0.15)]
        if not sinks:
            sinks = [v for v in self.values if v.rg][-1:]
        loss_terms = [(v.name, self.new_const(v.shape)) for v in sinks[-6:]]
        if self.r.random() < 0.2:
            self.features.add("accumulate")
        dtype = "bfloat16" if r.random() < 0.05 else "float32"
        twice = r.random() < 0.06
        compiled_step = r.random() < 0.04
        for flag, name in ((dtype == "bfloat16", "bfloat16"), (twice, "backward twice"),
                           (compiled_step, "compiled step")):
            if flag:
                self.features.add(name)
        return Program(
            seed=self.seed, steps=r.choice([2, 3, 3]), accumulate="accumulate" in self.features,
            uses_compile="compile" in self.features or compiled_step, classes=list(self.classes.values()),
            setup_lines=self.setup_lines, input_lines=self.input_lines, records=self.records,
            loss_terms=loss_terms, features=sorted(self.features), dtype=dtype, twice=twice,
            compiled_step=compiled_step)


def generate(seed: int) -> Program:
    """A small random program, the same for the same seed."""
    return _Gen(seed).build()


# --------------------------------------------------------------------------------------
# Running a program
# --------------------------------------------------------------------------------------


def load(program: Program) -> dict:
    """Executes the program's source in a fresh namespace (fresh functions, so torch.compile
    compiles again) and returns that namespace."""
    filename = f"<fuzz program {program.seed}>"
    src = program.source
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    module = types.ModuleType(f"fuzz_program_{program.seed}")
    module.__file__ = filename
    sys.modules[module.__name__] = module  # Dynamo looks functions' modules up
    exec(compile(src, filename, "exec"), module.__dict__)  # noqa: S102 - our own generated code
    return module.__dict__


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _clone(t):
    if t is None:
        return None
    return t.detach().clone()


_ON_RUN = []  # callbacks told (seed, mode) before each run (the CLI's workers)


def run(program: Program, mode: str) -> list:
    """Runs the program for `program.steps` steps in `mode` ("eager", "camlir_cpu",
    "camlir_eager"; "eager64": eager on the same values in float64, the reference that
    tells float32 rounding from a wrong gradient; "compiled_autograd": PyTorch's compiled
    autograd with no compiler, to tell camlir's bugs from PyTorch's) and returns, per step,
    {"grads": {name: tensor or None}, "log": [...]}."""
    import torch

    import camlir

    for on_run in _ON_RUN:
        on_run(program.seed, mode)
    ns = load(program)
    with _default_dtype(program.dtype):
        return _run_steps(program, mode, ns)


@contextlib.contextmanager
def _default_dtype(name):
    import torch

    before = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, name))
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _run_steps(program, mode, ns):
    import torch

    import camlir

    torch.manual_seed(program.seed)
    P, M = ns["setup"]()
    if mode == "eager64":
        for p in P.values():
            p.data = p.data.double()
        for m in M.values():
            m.double()
    log = ns["log"]
    out = []
    for step in range(program.steps):
        torch.manual_seed(program.seed * 1000 + step + 1)
        X = ns["make_inputs"]()
        if mode == "eager64":
            X = {k: x.detach().double().requires_grad_(x.requires_grad) if x.is_floating_point() else x
                 for k, x in X.items()}
        if mode.startswith("eager"):
            scope = contextlib.nullcontext()
        elif mode == "compiled_autograd":  # PyTorch's own, with no compiler: is a bug camlir's?
            from torch._dynamo import compiled_autograd
            scope = compiled_autograd._enable(lambda gm: gm)
        else:
            scope = camlir.enable(backend=BACKEND_OF[mode], wait=mode != "camlir_async")
        with scope:
            R = ns["train_step"](P, M, X, step)
        if mode == "camlir_async" and step == 0:
            camlir.wait()
        grads = {}
        for name, p in P.items():
            grads[f"P[{name!r}]"] = _clone(p.grad)
        for mname, m in M.items():
            for pname, p in m.named_parameters():
                grads[f"M[{mname!r}].{pname}"] = _clone(p.grad)
        for name, x in X.items():
            if x.requires_grad:
                grads[f"X[{name!r}]"] = _clone(x.grad)
        for name, t in R.items():
            grads[f"{name}.grad"] = _clone(t.grad)
        out.append({"grads": grads, "log": list(log)})
        log.clear()
        if not program.accumulate:
            for p in list(P.values()) + [p for m in M.values() for p in m.parameters()]:
                p.grad = None
    return out


class _Step:
    """Step `step` of the reference run, computed on first use (`ref` is a list, a
    zero-argument function returning one or None, or None)."""

    def __init__(self, ref, step):
        self.ref, self.step = ref, step

    def get(self, key, default=None):
        ref = self.ref() if callable(self.ref) else self.ref
        if ref is None or self.step >= len(ref):
            return default
        return ref[self.step].get(key, default)


def reference(program):
    """A function that runs `program` in float64 once, on first call (None if that raises)."""
    cache = []

    def get():
        if not cache:
            try:
                cache.append(run(program, "eager64"))
            except Exception:  # noqa: BLE001 - no reference: differences stay differences
                cache.append(None)
        return cache[0]
    return get


def _within_rounding(ours, eager, ref):
    """True when camlir's float32 result is no further from the float64 reference than 4x
    eager's own float32 error (or than 1e-6 of the values' scale): float32 reassociation."""
    import torch

    ours, eager, ref = (torch.as_tensor(t, dtype=torch.float64) for t in (ours, eager, ref))
    err_ours = (ours - ref).abs().max().item() if ref.numel() else 0.0
    err_eager = (eager - ref).abs().max().item() if ref.numel() else 0.0
    scale = ref.abs().max().item() if ref.numel() else 0.0
    return err_ours <= max(4 * err_eager, 1e-6 * (1 + scale))


def compare(eager: list, ours: list, rtol=RTOL, atol=ATOL, ref=None, notes=None):
    """None when the two runs agree; otherwise what differs first (a string). With `ref`
    (the float64 run), a difference beyond rtol/atol that is float32 rounding (see
    `_within_rounding`) is not a difference; it is added to `notes`."""
    import torch

    notes = [] if notes is None else notes
    for step, (e, o) in enumerate(zip(eager, ours)):
        r = _Step(ref, step)
        for name, ge in e["grads"].items():
            go = o["grads"].get(name, "absent")
            if isinstance(go, str):
                return f"step {step}: {name} absent"
            if ge is None and go is None:
                continue
            if ge is None:
                return f"step {step}: {name} has a gradient where eager has None"
            if go is None:
                return f"step {step}: {name} missing (eager has a gradient)"
            if ge.shape != go.shape or ge.dtype != go.dtype:
                return f"step {step}: {name} is {tuple(go.shape)} {go.dtype}, eager {tuple(ge.shape)} {ge.dtype}"
            try:
                torch.testing.assert_close(go, ge, rtol=rtol, atol=atol, equal_nan=True)
            except AssertionError as exc:
                gr = r.get("grads", {}).get(name)
                if gr is not None and _within_rounding(go, ge, gr):
                    notes.append(f"float32 rounding: {name}")
                    continue
                lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
                return f"step {step}: {name} differs: " + "; ".join(lines[1:4])
        extra = set(o["grads"]) - set(e["grads"])
        if extra:
            return f"step {step}: extra gradients {sorted(extra)}"
        # Hooks are compared per hook, in call order. The order between hooks of independent
        # branches is not compared: PyTorch's compiled autograd itself orders independent
        # branches differently from the eager engine (`hook_order_differs` reports it).
        le = sorted(e["log"], key=lambda entry: entry[0])  # stable: each hook's calls keep their order
        lo = sorted(o["log"], key=lambda entry: entry[0])
        if len(le) != len(lo) or any(a[0] != b[0] for a, b in zip(le, lo)):
            return (f"step {step}: hook calls differ: eager {[a[0] for a in e['log']]}, "
                    f"camlir {[b[0] for b in o['log']]}")
        lr = sorted(r.get("log", []), key=lambda entry: entry[0]) if r.get("log") else None
        if lr is not None and [c[0] for c in lr] != [a[0] for a in le]:
            lr = None
        for i, (a, b) in enumerate(zip(le, lo)):
            va, vb = _flat(a[1]), _flat(b[1])
            if len(va) != len(vb) or any((x is None) != (y is None) for x, y in zip(va, vb)):
                return f"step {step}: hook {a[0]} saw {b[1]}, eager {a[1]}"
            vr = _flat(lr[i][1]) if lr is not None else None
            for j, (x, y) in enumerate(zip(va, vb)):
                if x is not None and not (math.isclose(x, y, rel_tol=rtol, abs_tol=atol)
                                          or (math.isnan(x) and math.isnan(y))):
                    if vr is not None and len(vr) == len(va) and vr[j] is not None and \
                            _within_rounding(y, x, vr[j]):
                        notes.append(f"float32 rounding: hook {a[0]}")
                        continue
                    return f"step {step}: hook {a[0]} saw {b[1]}, eager {a[1]}"
    if len(eager) != len(ours):
        return f"{len(ours)} steps, eager ran {len(eager)}"
    return None


def hook_order_differs(eager: list, ours: list) -> bool:
    """True when the hooks ran in another order than eager's (same calls, same values)."""
    return any([a[0] for a in e["log"]] != [b[0] for b in o["log"]] for e, o in zip(eager, ours))


def _flat(v):
    if isinstance(v, (list, tuple)):
        return [x for item in v for x in _flat(item)]
    return [v]


def _reset(program):
    import camlir
    import torch

    camlir.reset()
    if program.uses_compile:
        torch._dynamo.reset()


def run_mode(program: Program, mode: str, eager: list, ref=None) -> dict:
    """Runs one camlir mode and classifies it against the eager results."""
    import camlir

    _reset(program)
    handler = _Collect()
    logger = logging.getLogger("camlir")
    logger.addHandler(handler)
    start = time.perf_counter()
    try:
        ours = run(program, mode)
    except Exception as exc:  # noqa: BLE001 - any exception eager did not raise is a crash
        tb = traceback.format_exc().strip().splitlines()
        return {"class": "CRASH", "detail": f"{type(exc).__name__}: {str(exc).strip()[:400]}",
                "where": tb[-8:], "seconds": time.perf_counter() - start}
    finally:
        logger.removeHandler(handler)
    counters = dict(camlir.counters)
    seconds = time.perf_counter() - start
    rounding = []
    rtol, atol = tolerance(program)
    detail = compare(eager, ours, rtol, atol, ref=ref, notes=rounding)
    reasons = [m for m in handler.messages if "falling back" in m or "cannot compile" in m]
    if detail is not None:
        cls = "WRONG"
    elif counters.get("fallbacks", 0):
        cls = "ok-fallback"
    elif counters.get("interpreted", 0):
        cls = "ok-interpreted"
    else:
        cls = "ok-native"
    notes = ["hook order differs from eager (independent branches)"] if detail is None and \
        hook_order_differs(eager, ours) else []
    notes += sorted(set(rounding))
    return {"class": cls, "detail": detail, "reasons": sorted(set(_short_reason(m) for m in reasons)), "notes": notes,
            "counters": {k: v for k, v in counters.items() if v}, "seconds": seconds}


def _short_reason(message: str) -> str:
    for prefix in ("camlir: falling back to PyTorch for this backward: ", "camlir: "):
        if message.startswith(prefix):
            message = message[len(prefix):]
            break
    return message.strip().splitlines()[0][:300]


def check(seed: int, modes=MODES) -> dict:
    """Generates the program of `seed`, runs it eagerly and in each camlir mode, and
    classifies each mode. Runs in this process (the CLI adds the subprocess isolation)."""
    program = generate(seed)
    result = {"seed": seed, "description": program.description(), "features": program.features, "modes": {}}
    _reset(program)
    try:
        eager = run(program, "eager")
    except Exception as exc:  # noqa: BLE001
        result["class"] = "invalid"
        result["detail"] = f"eager raised {type(exc).__name__}: {str(exc).strip()[:300]}"
        return result
    ref = reference(program)
    for mode in modes:
        result["modes"][mode] = run_mode(program, mode, eager, ref)
    _reset(program)
    result["class"] = max((m["class"] for m in result["modes"].values()), key=SEVERITY.get)
    return result


# --------------------------------------------------------------------------------------
# The CLI: worker subprocesses, summary, show, reduce
# --------------------------------------------------------------------------------------


def _worker(seeds, modes):
    """Runs in a subprocess: one JSON line per event on stdout."""
    threads = int(os.environ.get("CAMLIR_FUZZ_THREADS", "1"))
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    import torch  # import before the first "begin", so startup is not a program's time

    torch.set_num_threads(threads)

    import camlir  # noqa: F401

    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    logging.getLogger("camlir").propagate = False
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # programs and libraries print to stderr; stdout is ours

    def on_mode(seed, mode):  # so that a process that dies is known to have died in eager or camlir
        real_stdout.write(json.dumps({"mode": mode}) + "\n")
        real_stdout.flush()
    _ON_RUN[:] = [on_mode]
    for seed in seeds:
        real_stdout.write(json.dumps({"begin": seed}) + "\n")
        real_stdout.flush()
        try:
            res = check(seed, modes)
        except Exception as exc:  # noqa: BLE001 - the harness itself failed
            res = {"seed": seed, "class": "CRASH", "modes": {}, "features": [], "description": "?",
                   "detail": f"harness: {type(exc).__name__}: {exc}"}
        real_stdout.write(json.dumps(res) + "\n")
        real_stdout.flush()


def run_batch(seeds, modes=MODES, timeout=300, jobs=1, progress=None):
    """Runs `check` for every seed in worker subprocesses (`jobs` at a time); a worker that
    dies or hangs records a CRASH for the seed it was on and a new worker takes the rest."""
    pending = list(seeds)
    chunks = [pending[i::jobs] for i in range(jobs)] if jobs > 1 else [pending]
    results = {}
    workers = []

    def start(chunk):
        if not chunk:
            return None
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", ",".join(map(str, chunk)),
               "--modes", ",".join(modes)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        return {"proc": proc, "todo": list(chunk), "current": None, "mode": None, "since": time.time()}

    for chunk in chunks:
        w = start(chunk)
        if w:
            workers.append(w)
    while workers:
        fds = {w["proc"].stdout.fileno(): w for w in workers}
        ready, _, _ = select.select(list(fds), [], [], 5.0)
        for fd in ready:
            w = fds[fd]
            line = w["proc"].stdout.readline()
            if not line:  # the worker ended
                rc = w["proc"].wait()
                workers.remove(w)
                if w["current"] is not None:
                    seed = w["current"]
                    in_eager = (w["mode"] or "eager").startswith("eager")  # eager's own crash: not camlir's
                    results[seed] = {"seed": seed, "class": "invalid" if in_eager else "CRASH", "modes": {},
                                     "detail": f"the process died in {w['mode']} (exit status {rc})",
                                     "description": generate(seed).description(),
                                     "features": generate(seed).features}
                    if progress:
                        progress(results[seed], len(results))
                    rest = w["todo"][w["todo"].index(seed) + 1:]
                    nw = start(rest)
                    if nw:
                        workers.append(nw)
                continue
            msg = json.loads(line)
            if "begin" in msg:
                w["current"] = msg["begin"]
                w["mode"] = None
                w["since"] = time.time()
            elif "mode" in msg:
                w["mode"] = msg["mode"]
            else:
                results[msg["seed"]] = msg
                w["current"] = None
                if progress:
                    progress(msg, len(results))
        for w in list(workers):
            if w["current"] is not None and time.time() - w["since"] > timeout:
                w["proc"].kill()
                w["proc"].wait()
                workers.remove(w)
                seed = w["current"]
                results[seed] = {"seed": seed, "class": "CRASH", "modes": {},
                                 "detail": f"hung: no result after {timeout} s",
                                 "description": generate(seed).description(), "features": generate(seed).features}
                if progress:
                    progress(results[seed], len(results))
                nw = start(w["todo"][w["todo"].index(seed) + 1:])
                if nw:
                    workers.append(nw)
    return [results[s] for s in seeds if s in results]


def summarize(results, modes=MODES) -> dict:
    """Counts per class (overall and per mode), a per-feature breakdown, and the bad seeds."""
    from collections import Counter, defaultdict

    overall = Counter(r["class"] for r in results)
    per_mode = {m: Counter(r["modes"][m]["class"] for r in results if m in r.get("modes", {})) for m in modes}
    features = defaultdict(Counter)
    for r in results:
        for f in r.get("features", []):
            features[f][r["class"]] += 1
    reasons = Counter()
    for r in results:
        for m in r.get("modes", {}).values():
            for reason in m.get("reasons", []):
                reasons[reason[:160]] += 1
    bad = [{"seed": r["seed"], "class": r["class"], "description": r.get("description"),
            "detail": r.get("detail") or {m: v.get("detail") for m, v in r.get("modes", {}).items()
                                          if v["class"] in ("WRONG", "CRASH")}}
           for r in results if r["class"] in ("WRONG", "CRASH")]
    invalid = [{"seed": r["seed"], "detail": r.get("detail")} for r in results if r["class"] == "invalid"]
    return {"programs": len(results), "overall": dict(overall), "per_mode": {m: dict(c) for m, c in per_mode.items()},
            "features": {f: dict(c) for f, c in sorted(features.items())}, "reasons": dict(reasons.most_common(30)),
            "bad": bad, "invalid": invalid}


def print_summary(s):
    print(f"\n{s['programs']} programs")
    print("overall (worst mode per program):", ", ".join(f"{k}={v}" for k, v in sorted(s["overall"].items())))
    for m, c in s["per_mode"].items():
        print(f"  {m}:", ", ".join(f"{k}={v}" for k, v in sorted(c.items())))
    print("\nper feature (programs using it, by class):")
    for f, c in s["features"].items():
        print(f"  {f:34s}", ", ".join(f"{k}={v}" for k, v in sorted(c.items())))
    if s["reasons"]:
        print("\nfallback / interpreter reasons (count):")
        for reason, n in s["reasons"].items():
            print(f"  {n:5d}  {reason}")
    if s["invalid"]:
        print(f"\ninvalid (eager raised): {len(s['invalid'])}")
        for r in s["invalid"][:10]:
            print(f"  seed {r['seed']}: {r['detail'][:150]}")
    print(f"\nWRONG/CRASH: {len(s['bad'])}")
    for b in s["bad"]:
        print(f"  seed {b['seed']} {b['class']}: {b['description']}\n      {b['detail']}")


def tolerance(program: Program) -> tuple:
    """(rtol, atol) that gradients are compared at before the float64 check: bf16's for a
    bf16 program."""
    return (1.6e-2, 1e-2) if program.dtype == "bfloat16" else (RTOL, ATOL)


def standalone(program: Program, mode="camlir_cpu") -> str:
    """The program as a script that compares camlir with eager by itself (at the fuzzer's
    first tolerance, `tolerance`: the script has no float64 check)."""
    rtol, atol = tolerance(program)
    return program.source + f"""

if __name__ == "__main__":
    import camlir
{"" if program.dtype == "float32" else chr(10) + "    torch.set_default_dtype(DTYPE)"}
    def steps(enabled):
        torch.manual_seed({program.seed})
        P, M = setup()
        out = []
        for step in range({program.steps}):
            torch.manual_seed({program.seed * 1000} + step + 1)
            X = make_inputs()
            with (camlir.enable(backend={BACKEND_OF[mode]!r}, wait=True) if enabled else torch.enable_grad()):
                R = train_step(P, M, X, step)
            grads = {{n: p.grad.clone() for n, p in P.items() if p.grad is not None}}
            grads.update({{n: t.grad.clone() for n, t in R.items() if t.grad is not None}})
            grads.update({{n: x.grad.clone() for n, x in X.items() if x.grad is not None}})
            out.append((grads, list(log)))
            log.clear()
            {"" if program.accumulate else "for p in P.values(): p.grad = None"}
        return out

    for (ge, le), (gc, lc) in zip(steps(False), steps(True)):
        assert ge.keys() == gc.keys(), (ge.keys(), gc.keys())
        for n in ge:
            torch.testing.assert_close(gc[n], ge[n], rtol={rtol}, atol={atol}, msg=n)
        assert [t for t, _ in le] == [t for t, _ in lc], (le, lc)
    print("same gradients as eager; camlir counters:", dict(camlir.counters))
"""


def reduce(seed: int, mode: str, isolated=False) -> Program:
    """Drops forward statements (a value-defining one becomes `out = its input` when shapes
    agree) while the program keeps its class in `mode`; returns the smallest program found.
    `isolated` runs each trial in a subprocess (for a crash that kills the process)."""
    classify = _classify_isolated if isolated else _classify_here
    program = generate(seed)
    target = classify(program, mode)
    print(f"seed {seed} {mode}: {target}", file=sys.stderr)
    if target not in ("WRONG", "CRASH"):
        return program

    def attempt(what, **change):
        nonlocal program
        trial = dataclasses.replace(program, **{k: tuple(sorted(getattr(program, k) + (v,)))
                                                for k, v in change.items()})
        if classify(trial, mode) == target:
            program = trial
            print(f"  dropped {what}", file=sys.stderr)
            return True
        return False

    changed = True
    while changed:
        changed = False
        for i in reversed(range(len(program.loss_terms))):
            if i not in program.dropped_terms and len(program.live_terms()) > 1:
                changed |= attempt(f"loss term {program.loss_terms[i][0]}", dropped_terms=i)
        for i in reversed(range(len(program.records))):
            rec = program.records[i]
            if i in program.dropped or not rec.removable:
                continue
            # a dropped value-defining statement becomes `out = input` (alias) or goes away; a
            # program that still reads a value that went away fails in eager: not kept
            changed |= attempt(f"{i}: {rec.kind}", dropped=i)
    # parameters, hooks in setup() and inputs nothing reads any more (this changes the random
    # values of what follows, so each removal is checked too)
    for field, lines_of in (("dropped_setup", "setup_lines"), ("dropped_inputs", "input_lines")):
        for i in reversed(range(len(getattr(program, lines_of)))):
            line = getattr(program, lines_of)[i]
            m = re.match(r"(P|X)\[('\w+')\] = ", line)
            if m is None or i in getattr(program, field):
                continue
            key = f"{m.group(1)}[{m.group(2)}]"
            text = program.forward_lines() + [f"{v} {c}" for v, c in program.live_terms()]
            if m.group(1) == "X":
                text += [f"X[{c!r}]" for _, c in program.live_terms()]
            if not any(key in ln for ln in text):
                hooks = [j for j, ln in enumerate(program.setup_lines) if ln.startswith(key + ".")]
                trial = dataclasses.replace(program, **{field: tuple(sorted(getattr(program, field) + (i,)))})
                if field == "dropped_setup":
                    trial = dataclasses.replace(trial, dropped_setup=tuple(sorted(trial.dropped_setup + tuple(hooks))))
                if classify(trial, mode) == target:
                    program = trial
                    print(f"  dropped {key}", file=sys.stderr)
    return program


def _classify_isolated(program, mode):
    """The class of `program` in `mode`, run in a subprocess (a crash may be a segfault)."""
    import pickle
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".pkl", delete=False) as f:
        pickle.dump(program, f)
    try:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--classify", f.name, "--modes", mode],
                              capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "CRASH"
    finally:
        os.unlink(f.name)
    if proc.returncode != 0:  # died: in eager (not camlir's) or after it
        return "CRASH" if "eager ran" in proc.stdout else "invalid"
    return proc.stdout.strip().splitlines()[-1]


def _classify_here(program, mode):
    import torch

    torch.set_num_threads(1)
    _reset(program)
    try:
        eager = run(program, "eager")
    except Exception:  # noqa: BLE001
        return "invalid"
    return run_mode(program, mode, eager, reference(program))["class"]


def _classify_main(path, mode):
    import pickle

    import torch

    torch.set_num_threads(1)
    with open(path, "rb") as f:
        program = pickle.load(f)
    _reset(program)
    try:
        eager = run(program, "eager")
    except Exception:  # noqa: BLE001
        print("invalid")
        return
    print("eager ran", flush=True)
    res = run_mode(program, mode, eager, reference(program))
    print(res["detail"], file=sys.stderr)
    print(res["class"])


def _seeds(spec):
    out = []
    for part in spec.split(","):
        if ":" in part:
            a, b = part.split(":")
            out.extend(range(int(a), int(b)))
        elif part:
            out.append(int(part))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0:100", help="a:b ranges and single seeds, comma separated")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--json", help="write every result and the summary here")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes at a time")
    ap.add_argument("--timeout", type=int, default=300, help="seconds one program may take")
    ap.add_argument("--threads", type=int, default=1,
                    help="intra-op threads in the workers; with more than 1, loop nests of 8 or more "
                         "iterations are split over them (CAMLIR_THREADS_MIN_ELEMENTS) and every kernel "
                         "runs natively (CAMLIR_KERNEL_CHOICE=0), to test the split")
    ap.add_argument("--show", type=int, help="print the program of this seed as a standalone script")
    ap.add_argument("--reduce", type=int, help="minimize this seed's program in the first mode")
    ap.add_argument("--isolated", action="store_true", help="--reduce: each trial in a subprocess")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--classify", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    modes = tuple(m for m in args.modes.split(",") if m)
    if args.worker is not None:
        _worker(_seeds(args.worker), modes)
        return 0
    if args.classify is not None:
        _classify_main(args.classify, modes[0])
        return 0
    if args.show is not None:
        print(standalone(generate(args.show), modes[0]))
        return 0
    if args.reduce is not None:
        logging.getLogger("camlir").propagate = False
        program = reduce(args.reduce, modes[0], args.isolated)
        print(standalone(program, modes[0]))
        return 0
    seeds = _seeds(args.seeds)
    if args.threads > 1:  # the workers inherit both
        os.environ["CAMLIR_FUZZ_THREADS"] = str(args.threads)
        os.environ.setdefault("CAMLIR_THREADS_MIN_ELEMENTS", "8")
        os.environ.setdefault("CAMLIR_KERNEL_CHOICE", "0")  # native kernels on every step, not torch twins
    start = time.time()
    counts = {}

    def progress(res, done):
        counts[res["class"]] = counts.get(res["class"], 0) + 1
        el = time.time() - start
        line = (f"[{done}/{len(seeds)}] {el:6.0f}s seed {res['seed']}: {res['class']:14s} "
                + " ".join(f"{k}={v}" for k, v in sorted(counts.items())))
        print(line, flush=True)
        if res["class"] in ("WRONG", "CRASH"):
            print(f"    {res.get('description')}\n    {res.get('detail') or {m: v.get('detail') for m, v in res['modes'].items()}}",
                  flush=True)

    results = run_batch(seeds, modes, args.timeout, args.jobs, progress)
    summary = summarize(results, modes)
    summary["seconds"] = time.time() - start
    print_summary(summary)
    print(f"\n{summary['seconds']:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seeds": args.seeds, "modes": modes, "results": results, "summary": summary}, f, indent=1)
    return 1 if summary["bad"] else 0


if __name__ == "__main__":
    sys.exit(main())
