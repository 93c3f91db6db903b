"""DistributedDataParallel under the compiled backward: bucketed, overlapped all-reduce.

DDP's C++ reducer cannot run under compiled autograd (PyTorch refuses before the backward
starts, and its reducer was once silently wrong under it, pytorch #152735). DDP's Python
reducer can, but it all-reduces one gradient at a time, synchronously. So camlir keeps
DDP's Python-reducer mode (no C++ autograd hooks) and replaces DDP's per-parameter hooks
with its own reducer, `BucketReducer`, which works like the C++ one:

- Buckets as DDP makes them: parameters in reverse order (the order their gradients are
  usually ready), cut at `bucket_cap_mb` (the first bucket at 1 MiB when `bucket_cap_mb` is
  left at its default), one dtype and device per bucket
  (`dist._compute_bucket_assignment_by_size`).
- A post-accumulate-grad hook per parameter copies the gradient, times 1/world_size, into
  its slot of the bucket's flat buffer. When a bucket's last gradient is in, and every
  bucket before it has been launched, the bucket is launched: `dist.all_reduce(...,
  async_op=True)`, or the comm hook registered with `register_comm_hook` (it gets the bucket
  undivided, as from the C++ reducer). The hooks run as Python calls inside camlir's
  compiled backward, right after each gradient is accumulated, so the all-reduce runs on
  gloo's threads while the rest of the backward is computed.
- When the backward ends (`engine.at_end`; `queue_callback` on the eager engine), every
  bucket is waited for and the reduced values are copied into `.grad` (or `.grad` becomes
  a view of the bucket, with `gradient_as_bucket_view=True`), before `backward()` returns.
- As in eager DDP, a backward reduces only after a forward run with grad enabled outside
  `no_sync()`. `find_unused_parameters=True` and `static_graph=True`: a bucket whose
  gradients did not all arrive is launched at the end with zeros for the missing ones, and
  a parameter that no rank used keeps its `.grad` (a used-flags all-reduce decides, as in
  DDP). Without them, a parameter with no gradient is an error naming it, as in DDP.

DDP picks its reducer when a module is built, from `torch._dynamo.config.optimize_ddp`;
`install()` wraps `DistributedDataParallel.__init__` so that every DDP module built from
then on picks the Python mode and gets a `BucketReducer`. `import camlir` installs it when
torch is already imported, and loading camlir's API does in any case. A module built
earlier, or built with an option this reducer does not handle (`mixed_precision`,
`delay_all_reduce_named_params`, `bucket_cap_mb_list`, `skip_all_reduce_unused_params`,
sparse embeddings), keeps the C++ reducer: its backwards run eagerly under camlir, with a
warning (`capture/engine.py`). `_register_builtin_comm_hook` on a camlir-reduced module
raises (DDP would register it on the unused C++ reducer: a silent no-op).
"""

import functools
import inspect
import logging
import time
import weakref

_installed = []
log = logging.getLogger("camlir")


def select_python_reducer() -> None:
    """Sets `torch._dynamo.config.optimize_ddp = "python_reducer"` (DDP reads it at build time)."""
    import torch._dynamo

    if torch._dynamo.utils.get_optimize_ddp_mode() != "python_reducer":
        torch._dynamo.config.optimize_ddp = "python_reducer"


def _needs_cpp_reducer(bound: dict) -> str:
    """Why a DDP built with these arguments keeps the C++ reducer, or ''."""
    import torch

    for name in ("mixed_precision", "delay_all_reduce_named_params", "param_to_hook_all_reduce",
                 "bucket_cap_mb_list"):
        if bound.get(name):
            return f"{name}="
    if bound.get("skip_all_reduce_unused_params"):
        return "skip_all_reduce_unused_params=True"
    module = bound.get("module")
    if isinstance(module, torch.nn.Module):
        for m in module.modules():
            if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse:
                return "sparse gradients (an embedding with sparse=True)"
    return ""


def install() -> None:
    """Every DistributedDataParallel built from now on uses camlir's bucketed reducer."""
    if _installed:
        return
    import torch._dynamo
    from torch.nn.parallel import DistributedDataParallel

    original = DistributedDataParallel.__init__
    signature = inspect.signature(original)
    original_builtin = DistributedDataParallel._register_builtin_comm_hook

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        try:
            bound = signature.bind(self, *args, **kwargs).arguments
        except TypeError:  # let DDP say what is wrong with the call
            bound = {}
        reason = _needs_cpp_reducer(bound)
        if not reason:
            select_python_reducer()
            original(self, *args, **kwargs)
            if self._use_python_reducer and not self._delay_all_reduce_all_params:
                self._camlir_reducer = BucketReducer(self)
            return
        log.warning("a DistributedDataParallel with %s keeps DDP's C++ reducer, which compiled "
                    "autograd cannot run: its backwards run eagerly under camlir (correct, not compiled)",
                    reason)
        mode = torch._dynamo.config.optimize_ddp
        torch._dynamo.config.optimize_ddp = "ddp_optimizer"
        try:
            original(self, *args, **kwargs)
        finally:
            torch._dynamo.config.optimize_ddp = mode

    @functools.wraps(original_builtin)
    def _register_builtin_comm_hook(self, comm_hook_type):
        if getattr(self, "_camlir_reducer", None) is not None:
            raise NotImplementedError(
                f"camlir: _register_builtin_comm_hook({comm_hook_type}) is not supported on a DDP module "
                f"reduced by camlir (DDP would register it on its unused C++ reducer). Register the Python "
                f"equivalent instead, e.g. ddp.register_comm_hook(None, torch.distributed.algorithms."
                f"ddp_comm_hooks.default_hooks.fp16_compress_hook)")
        return original_builtin(self, comm_hook_type)

    DistributedDataParallel.__init__ = __init__
    DistributedDataParallel._register_builtin_comm_hook = _register_builtin_comm_hook
    _installed.append((original, original_builtin))


class GradBucket:
    """What a DDP comm hook receives (the methods of `torch.distributed.GradBucket`)."""

    def __init__(self, index, flat, params, views, last):
        self._index, self._flat, self._params, self._views, self._last = index, flat, params, views, last

    def index(self) -> int:
        return self._index

    def buffer(self):
        return self._flat

    def set_buffer(self, tensor) -> None:
        self._flat = tensor

    def gradients(self) -> list:
        return list(self._views)

    def parameters(self) -> list:
        return list(self._params)

    def is_last(self) -> bool:
        return self._last


class _Bucket:
    def __init__(self, index, params, positions):
        import torch

        self.index = index
        self.params = params          # in the order of the flat buffer
        self.positions = positions    # each parameter's index in BucketReducer.params
        total = sum(p.numel() for p in params)
        self.flat = torch.zeros(total, dtype=params[0].dtype, device=params[0].device)
        self.views, offset = [], 0
        for p in params:
            self.views.append(self.flat[offset:offset + p.numel()].view(p.shape))
            offset += p.numel()


class BucketReducer:
    """camlir's reducer for one DDP module (see the module docstring)."""

    def __init__(self, ddp):
        import torch.distributed as dist

        self._ddp = weakref.ref(ddp)
        self.group = ddp.process_group
        self.world = self.group.size()
        params, expect_sparse = ddp._build_params_for_reducer()
        self.params = params
        config = ddp._bucket_config
        limits = ([config.first_bucket_bytes_cap, config.bucket_bytes_cap]
                  if config.first_bucket_bytes_cap < config.bucket_bytes_cap else [config.bucket_bytes_cap])
        order = list(reversed(range(len(params))))
        assignment, _ = dist._compute_bucket_assignment_by_size(
            [params[i] for i in order], limits, [expect_sparse[i] for i in order], order)
        self.buckets = [_Bucket(b, [params[i] for i in idx], list(idx)) for b, idx in enumerate(assignment)]
        self.where = {}
        for bucket in self.buckets:
            for slot, i in enumerate(bucket.positions):
                self.where[i] = (bucket, slot)
        names = {p: n for n, p in ddp.module.named_parameters()}
        self.names = [names.get(p, f"parameter {i}") for i, p in enumerate(params)]
        self.last = {}        # the last reducing backward: buckets, launched_in_hooks, end_wait_s
        self.overlap = True   # False: every bucket waits for the end of the backward (bench/ddp.py)
        self.expect = False   # a forward with grad, outside no_sync, ran since the last reduction
        self.active = False   # inside a reducing backward
        self.handles = [p.register_post_accumulate_grad_hook(functools.partial(_grad_ready, weakref.ref(self), i))
                        for i, p in enumerate(params)]
        self.forward_handle = ddp.register_forward_pre_hook(functools.partial(_forward_pre, weakref.ref(self)))
        for handle in ddp._accum_grad_hooks:  # DDP's own one-gradient-at-a-time hooks: not both
            handle.remove()
        ddp._accum_grad_hooks.clear()
        self._reset()

    def _reset(self):
        self.got = [False] * len(self.params)
        self.missing = [len(b.params) for b in self.buckets]
        self.next = 0          # the next bucket to launch: buckets launch in order, as in DDP
        self.pending = {}      # bucket index -> ("work", Work) or ("future", Future)

    def _unused_allowed(self, ddp) -> bool:
        return bool(ddp.find_unused_parameters or ddp.static_graph)

    def grad_ready(self, i: int, param) -> None:
        if not self.expect:
            return
        grad = param.grad
        if grad is None:
            return
        if not self.active:
            self._begin()
        if self.got[i]:
            raise RuntimeError(f"camlir DDP: the gradient of {self.names[i]} was marked ready twice in one "
                               f"backward (as in DDP, a parameter may be reduced once per backward)")
        bucket, slot = self.where[i]
        if grad.layout != bucket.flat.layout or grad.dtype != bucket.flat.dtype:
            raise RuntimeError(f"camlir DDP: the gradient of {self.names[i]} is {grad.dtype}, {grad.layout}; "
                               f"its bucket holds {bucket.flat.dtype}, {bucket.flat.layout}")
        self._fill(bucket, slot, grad)
        self.got[i] = True
        self.missing[bucket.index] -= 1
        while self.overlap and self.next < len(self.buckets) and self.missing[self.next] == 0:
            self._launch(self.buckets[self.next])
            self.next += 1

    def _fill(self, bucket, slot, grad):
        import torch

        view = bucket.views[slot]
        if self._comm_hook() is not None:
            if grad.data_ptr() != view.data_ptr():
                view.copy_(grad)
        else:
            torch.mul(grad, 1.0 / self.world, out=view)

    def _comm_hook(self):
        ddp = self._ddp()
        hooks = getattr(ddp, "_comm_hooks", None) if ddp is not None else None
        return hooks[0] if hooks else None

    def _launch(self, bucket):
        import torch.distributed as dist

        hook = self._comm_hook()
        if hook is None:
            self.pending[bucket.index] = ("work", dist.all_reduce(bucket.flat, group=self.group, async_op=True))
        else:
            fn, state = hook
            grad_bucket = GradBucket(bucket.index, bucket.flat, bucket.params, bucket.views,
                                     bucket.index == len(self.buckets) - 1)
            self.pending[bucket.index] = ("future", fn(state, grad_bucket))

    def _begin(self):
        import torch
        from camlir.capture import engine

        self.active = True
        if engine.in_backward():
            engine.at_end(self._end)
        else:
            torch.autograd.Variable._execution_engine.queue_callback(lambda: self._end(False))

    def _wait(self, bucket):
        kind, handle = self.pending.pop(bucket.index)
        if kind == "work":
            handle.wait()
            return
        value = handle.wait()
        if isinstance(value, (list, tuple)):
            value = value[0]
        if value is not bucket.flat:
            bucket.flat.copy_(value.view(-1))

    def _end(self, failed: bool) -> None:
        import torch
        import torch.distributed as dist

        ddp = self._ddp()
        start = time.perf_counter()
        self.active = False
        self.expect = False
        try:
            if failed or ddp is None:
                for bucket in self.buckets:  # let launched collectives finish before the buffers are reused
                    if bucket.index in self.pending:
                        self._wait(bucket)
                return
            used = None
            self.last = {"buckets": len(self.buckets), "launched_in_hooks": self.next}
            if self.next < len(self.buckets) and (self.overlap or not all(self.got)):
                if not self._unused_allowed(ddp):
                    for bucket in self.buckets[:self.next]:
                        self._wait(bucket)
                    missing = [self.names[i] for i, got in enumerate(self.got) if not got]
                    raise RuntimeError(
                        f"camlir DDP: these parameters received no gradient in this backward: {missing}. As "
                        f"with eager DDP, pass find_unused_parameters=True to DistributedDataParallel when "
                        f"some parameters are not used in producing the loss.")
                for bucket in self.buckets[self.next:]:
                    for slot, i in enumerate(bucket.positions):
                        if not self.got[i]:
                            grad = bucket.params[slot].grad
                            if grad is None:
                                bucket.views[slot].zero_()
                            else:
                                self._fill(bucket, slot, grad)
                    self._launch(bucket)
            for bucket in self.buckets[self.next:]:  # overlap off: launched now, all gradients in
                if bucket.index not in self.pending:
                    self._launch(bucket)
            if self._unused_allowed(ddp):
                used = torch.tensor(self.got, dtype=torch.int32)
                dist.all_reduce(used, group=self.group)
            as_view = ddp.gradient_as_bucket_view
            for bucket in self.buckets:
                self._wait(bucket)
                for slot, i in enumerate(bucket.positions):
                    if used is not None and not used[i]:
                        continue  # no rank used it: its .grad stays as it is, as in DDP
                    p, view = bucket.params[slot], bucket.views[slot]
                    if as_view:
                        p.grad = view
                    elif p.grad is None:
                        p.grad = view.clone()
                    elif p.grad.data_ptr() != view.data_ptr():
                        p.grad.copy_(view)
            self.last["end_wait_s"] = time.perf_counter() - start
        finally:
            self._reset()


def _grad_ready(reducer_ref, i, param):
    reducer = reducer_ref()
    if reducer is not None:
        reducer.grad_ready(i, param)


def _forward_pre(reducer_ref, module, args):
    import torch

    reducer = reducer_ref()
    if reducer is not None and torch.is_grad_enabled() and module.require_backward_grad_sync:
        reducer.expect = True
