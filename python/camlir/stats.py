"""Process-wide counters (`camlir.counters`), cleared by `camlir.reset()`.

- captures: backward graphs handed to camlir by the autograd engine (cache misses);
- compiles: captured graphs turned into a compiled artifact for a backend;
- unique_graphs: distinct `ca` modules compiled (by their printed IR);
- cache_hits: backward calls served by an artifact compiled earlier;
- disk_cache_hits: artifacts loaded from the on-disk cache (no disk cache yet: stays 0);
- fallbacks: backward graphs run by PyTorch instead, because camlir could not handle them;
- interpreted: graphs the cpu backend could not compile, run by camlir's reference
  interpreter instead (correct, not fast; the log says why).
"""

import collections

KEYS = ("captures", "compiles", "unique_graphs", "cache_hits", "disk_cache_hits", "fallbacks", "interpreted")


class Counters(collections.Counter):
    """The type of `camlir.counters`: a Counter that always has every key of `KEYS`.

    `clear()` sets them all to 0 instead of removing them, so a fresh process prints
    `captures=0, compiles=0, ...` rather than nothing.
    """

    def clear(self):
        super().clear()
        for key in KEYS:
            self[key] = 0


counters = Counters()
counters.clear()
