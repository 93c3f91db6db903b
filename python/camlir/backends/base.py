"""What a backend is to the driver: one small interface, the same for every backend.

    class MyBackend(Backend):
        name = "my"
        def stages(self, variant):           # what compiles one program (pipeline.compile runs them)
            return pipeline.KERNEL_STAGES + (Stage("my-code", make_my_code),)

    camlir.backend_registry.register(MyBackend())   # then enable(backend="my")

The driver (`compiled.py`) only ever talks to a backend through this class:

- `stages(variant)`: the list of `pipeline.Stage`s that builds one program for a
  `pipeline.Variant`; the last stage sets `work.program`, which is called as
  `program(args, hooks, callbacks=(), packed=())` and returns the backward's results.
- `require_device()`: raises a clear error when the backend cannot run here (a gpu backend
  with no CUDA device); asked before anything is compiled.
- How it fails: a stage raises (`stages.StageError` names the stage). The driver's one
  fallback policy then runs that program on the reference interpreter (`reference = True`
  marks that backend: its own failure hands the graph back to PyTorch).
- Sizes: `needs_static_sizes` (a symbolic capture gets one program per size set or one with
  runtime sizes, `cache.SizeVariants`) and `runtime_sizes` (whether `Variant(runtime_sizes=
  True)` compiles).
- What it caches on disk: `stores_programs`, with `not_storable(program)`, `to_files(program)`
  and `from_files(entry, context)` (`disk_cache.py` keys and stores them; `code_options()`
  joins the key).
- `apart_from`: the first stage that may run in a thread of its own (`pipeline.compile`).
- `service_from`: the first stage that may run in a compile worker process (the compile
  service, `compile_service.py`); None (the default): the backend compiles in the training
  process. The worker runs `service_stages(variant)` (by default `stages(variant)` from
  `service_from` on) over the module and `Work`'s picklable fields (perms, expected
  effects); their last sets `work.artifact` to the (files, meta) that `from_files` loads in
  the training process (or, if none does, `to_files(work.program)` gives them).
  `worker_facts()` is what the training process tells the worker about itself (a dict),
  `assume(facts)` how the worker takes it.
"""

from typing import Optional


class Backend:
    """The interface every backend implements (see the module docstring)."""

    name: str = ""
    reference: bool = False          # the reference interpreter: nothing runs below it
    needs_static_sizes: bool = True  # False: one program serves every size set of a symbolic capture
    runtime_sizes: bool = False      # whether Variant(runtime_sizes=True) compiles
    apart_from: Optional[str] = None
    service_from: Optional[str] = None
    stores_programs: bool = False

    def stages(self, variant) -> tuple:
        raise NotImplementedError(f"backend {self.name!r} defines no stages")

    def service_stages(self, variant) -> tuple:
        """The stages a compile worker runs (from `service_from` on)."""
        stages = tuple(self.stages(variant))
        names = [s.name for s in stages]
        return stages[names.index(self.service_from):]

    def worker_facts(self) -> dict:
        """What a compile worker must be told about the training process (`assume`)."""
        return {}

    def assume(self, facts: dict) -> None:
        """In a compile worker: takes the training process's `worker_facts()`."""

    def code_options(self) -> str:
        """What, besides the graph and the machine, decides this backend's code (part of the
        disk-cache key: a program stored under other options is not loaded)."""
        return ""

    def require_device(self) -> None:
        """Raises when this backend cannot run in this process (nothing by default)."""

    def not_storable(self, program) -> str:
        """Why `program` cannot go to the disk cache ("" when it can)."""
        return f"backend {self.name!r} keeps no programs on disk"

    def to_files(self, program) -> tuple:
        """(files: name -> bytes, meta: dict) from which `from_files` rebuilds `program`."""
        raise NotImplementedError

    def from_files(self, entry, context):
        """The program stored in disk-cache `entry`, in MLIR `context`."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<camlir backend {self.name!r}>"
