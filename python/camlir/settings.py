"""`camlir.config`: the process-wide settings.

    camlir.config.enabled = True   # every backward in the process goes through camlir
    camlir.config.backend = "cpu"  # the default; "eager" is the reference interpreter
    camlir.config.fullgraph = False
    camlir.config.dynamic = None   # None: sizes start static and become symbolic when they change

Bad values are rejected when set, with a message that says what is accepted.
"""

BACKENDS = ("eager", "cpu")


class Config:
    def __init__(self):
        self._enabled = False
        self._backend = "cpu"
        self.fullgraph = False
        self._dynamic = None

    @property
    def enabled(self) -> bool:
        return self._enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        from .capture import engine

        self._enabled = bool(value)
        engine.refresh_patch()

    @property
    def backend(self) -> str:
        return self._backend

    @backend.setter
    def backend(self, value: str) -> None:
        self._backend = check_backend(value)

    @property
    def dynamic(self):
        return self._dynamic

    @dynamic.setter
    def dynamic(self, value) -> None:
        if value not in (None, True, False):
            raise ValueError(f"camlir.config.dynamic must be None, True or False, got {value!r}")
        self._dynamic = value


def check_backend(value) -> str:
    if value not in BACKENDS:
        raise ValueError(f"unknown camlir backend {value!r}; available: {', '.join(BACKENDS)}")
    return value


config = Config()
