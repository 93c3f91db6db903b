"""Which program of a captured module to build: `Variant`.

A static capture has one program (`STATIC`); a symbolic capture, on a backend that compiles
static sizes, has one per size set (`Variant.specialized(sizes, shapes)`) or one for every
size (`Variant(runtime_sizes=True)`). `cache.SizeVariants` chooses; `pipeline.compile`
builds. This module imports nothing, so both can use it.
"""

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Variant:
    """Which program of a captured module to build.

    `Variant()`: the capture's sizes as they are (a static capture). `sizes` (with `shapes`,
    argument number -> dims of each argument whose type has `?` dims): a symbolic capture
    specialized to one size set. `runtime_sizes=True`: a symbolic capture compiled once for
    every size its guards accept (kernels keep `?` dims and take the lifted sizes as `i64`
    arguments; the program is called with the inputs plus the sizes)."""

    sizes: Optional[tuple] = None
    shapes: tuple = ()  # ((argument number, dims), ...), sorted
    runtime_sizes: bool = False

    def __post_init__(self):
        if self.runtime_sizes and (self.sizes is not None or self.shapes):
            raise ValueError("a variant with runtime sizes has no sizes or shapes")

    @staticmethod
    def specialized(sizes, shapes: dict) -> "Variant":
        return Variant(tuple(int(s) for s in sizes), tuple(sorted((i, tuple(d)) for i, d in shapes.items())))

    @property
    def label(self) -> str:
        """What dumps and logs call it: "" (static), "sizes [4, 3]", "dynamic"."""
        if self.runtime_sizes:
            return "dynamic"
        return "" if self.sizes is None else f"sizes {list(self.sizes)}"


STATIC = Variant()
