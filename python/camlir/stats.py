"""Process-wide counters (`camlir.counters`), cleared by `camlir.reset()`.

- captures: backward graphs handed to camlir by the autograd engine (cache misses);
- compiles: programs built (a captured graph's first, each new size set's or changed
  hook's, the dynamic-size one): each is a run of the pipeline;
- unique_graphs: distinct `ca` modules compiled (by their printed IR);
- cache_hits: backward calls served by an artifact compiled earlier;
- disk_cache_hits: programs loaded from the disk cache instead of compiled (disk_cache.py);
- fallbacks: backward graphs run by PyTorch instead, because camlir could not handle them;
- interpreted: graphs the cpu backend could not compile, run by camlir's reference
  interpreter instead (correct, not fast; the log says why);
- eager_runs: backward calls camlir sent to PyTorch's eager engine before any capture,
  because their structure measured faster there or its compiled backward fell back
  (`graph_choice.py`; `camlir.explain(kind="choice")` says which and why), or while its
  program compiled in a worker (the compile service);
- while_compiling: backward calls that ran uncompiled because their program was still
  compiling in a worker: the call that started the compile runs PyTorch's captured graph,
  the later ones the eager engine (also counted in `eager_runs`).
"""

import collections

KEYS = ("captures", "compiles", "unique_graphs", "cache_hits", "disk_cache_hits", "fallbacks", "interpreted",
        "eager_runs", "while_compiling")


class Counters(collections.Counter):
    """The type of `camlir.counters`: a Counter that always has every key of `KEYS`.

    The keys (also the module's docstring): `captures` (backward graphs handed to camlir),
    `compiles` (programs built), `unique_graphs` (distinct `ca` modules compiled),
    `cache_hits` (backward calls served with nothing compiled), `disk_cache_hits`
    (programs loaded from disk instead of compiled), `fallbacks` (graphs or calls PyTorch
    ran because camlir could not), `interpreted` (graphs the cpu backend could not compile,
    run by the reference interpreter), `eager_runs` (backward calls sent to the eager
    engine by the speed choice, after a fallback, or while the program compiled),
    `while_compiling` (backward calls run uncompiled while their program compiled in a
    worker process).

        >>> camlir.counters["compiles"], camlir.counters["cache_hits"]
        (1, 41)

    `clear()` sets them all to 0 instead of removing them, so a fresh process prints
    `captures=0, compiles=0, ...` rather than nothing.
    """

    def clear(self):
        super().clear()
        for key in KEYS:
            self[key] = 0


counters = Counters()
counters.clear()
