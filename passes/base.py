"""What every camlir pass is: a small frozen dataclass whose fields are its options.

A pass has a kebab-case `argument` with the `ca-` prefix (its name on the command line),
a one-line `summary`, and a docstring that is its description with a before/after example
(`docs/passes.md` is generated from it). Options are written the way MLIR writes them:
`ca-flatten-nodes{keep-provenance=false}` sets the field `keep_provenance`.

Passes run on the top-level module. They report a problem with `PassFailure(message, op)`:
the driver turns it into an error diagnostic at the op's location and fails the pipeline.
"""

import dataclasses
from typing import ClassVar

from torch_mlir import ir


class PassFailure(Exception):
    """Raised by a pass to fail the pipeline with an error at `op`'s location."""

    def __init__(self, message: str, op=None):
        super().__init__(message)
        self.op = op


class OptionError(ValueError):
    """A pass option that does not exist or does not parse."""


@dataclasses.dataclass(frozen=True)
class CAPass:
    """The base of every camlir pass (see the module docstring): subclasses set `argument`
    and `summary`, declare their options as dataclass fields and implement `run`.

    `FlattenNodes.from_options("keep-provenance=false")` builds a configured instance;
    `option_text()` writes its options back as `{keep-provenance=false}`.
    """

    argument: ClassVar[str] = ""
    summary: ClassVar[str] = ""

    def run(self, module: ir.Operation) -> None:  # pragma: no cover - overridden
        """Transforms `module` (the top-level `builtin.module` op) in place; raises
        `PassFailure` to fail the pipeline."""
        raise NotImplementedError

    @classmethod
    def options(cls) -> list[dataclasses.Field]:
        """The pass's options: its dataclass fields, in declaration order."""
        return list(dataclasses.fields(cls))

    @classmethod
    def from_options(cls, text: str) -> "CAPass":
        """Builds the pass from MLIR-style options: `key=value key2=value2`."""
        fields = {f.name.replace("_", "-"): f for f in cls.options()}
        values = {}
        for item in text.split():
            key, eq, raw = item.partition("=")
            if key not in fields:
                known = ", ".join(sorted(fields)) or "none"
                raise OptionError(f"pass '{cls.argument}' has no option '{key}' (options: {known})")
            field = fields[key]
            values[field.name] = _parse_value(cls.argument, key, field.type, raw if eq else "true")
        return cls(**values)

    def option_text(self) -> str:
        """All option values in MLIR pipeline form, `{key=value ...}`; "" for a pass
        without options."""
        parts = [f"{f.name.replace('_', '-')}={_format_value(getattr(self, f.name))}"
                 for f in self.options()]
        return "{" + " ".join(parts) + "}" if parts else ""


def _parse_value(pass_name: str, key: str, type_, raw: str):
    type_name = type_ if isinstance(type_, str) else type_.__name__
    if type_name == "bool":
        if raw.lower() in ("true", "1"):
            return True
        if raw.lower() in ("false", "0"):
            return False
    elif type_name == "int":
        try:
            return int(raw)
        except ValueError:
            pass
    elif type_name == "str":
        return raw
    raise OptionError(f"pass '{pass_name}': option '{key}' expects a {type_name}, got '{raw}'")


def _format_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
