"""No compiled backward slower than the eager engine's: the choice, per backward structure,
by measurement, made before compiled autograd runs.

What a compiled backward replaces is `loss.backward()` on PyTorch's eager autograd engine,
which calls PyTorch's own backward formulas (oneDNN's batch-norm and convolution backward,
for example) with no capture at all. The compiled path adds compiled autograd's own work
on every call: its C++ walk of the graph, lifting every saved tensor and size, and its
Python wrapper. Measured on W1 (one `Linear(10, 10)`): the eager step 59 us, compiled
autograd with a compiled function that does nothing 85 us, camlir's program 120 us. On a
backward that small no compiled program can win; on the bench CNN camlir's loops lost to
oneDNN's batch-norm backward. So:

- `structure_key(roots, inputs)` names a backward before it runs: the autograd nodes
  reachable from the roots (their types and edges). It is only a routing key: two
  backwards that share one run the same way, and either way is exact.
- `Routes` keeps a `Route` per key. After `START` calls (the kernel-level choices of
  `backends/cpu/choice.py` settle first), blocks of `BLOCK` calls alternate between the
  compiled backward and the eager engine, the last `BLOCK - WARM` of each block timed, until
  each side has `SAMPLES` timings. Each compiled block is compared with the eager blocks on
  either side of it (`paired_ratio`); the eager engine is kept when the median of those time
  ratios (compiled over eager) is at least 1 / `MARGIN`. A ratio within `TIE` of 1 takes `SAMPLES` more a side
  first, up to `MAX_SAMPLES`, and if it is still within `TIE` the eager engine is kept.
  Either way the decision is an event
  (`camlir.explain(kind="choice")`). It is taken again on fresh timings after `RECHECK`
  more calls.
- A structure whose compiled backward fell back (`CompiledBackward.fallback_reason`) is
  routed to the eager engine from its next call on: a fallback would otherwise run compiled
  autograd's own graph, with compiled autograd's own bugs (issue 10, item 9).

Keys cost a walk of the graph in Python (measured below), so they are computed only while
the table is `awake`: a new capture wakes it, and it sleeps again once every route has
decided for the compiled backward. A structure decided for the eager engine is found by a
`shallow_key` (the roots' node types) instead, checked against the full key on a random one
call in `VERIFY`: on W1 the full walk cost 7 us of a 44 us backward (3 us for the walk, the
rest inside the engine, which then frees the Python objects the walk made for its nodes).
A shallow key shared by two structures is found by that check and from then on always
walks; until then the newcomer runs on the eager engine, which is exact (only its speed
can be lost, for ~`VERIFY` calls). `fullgraph=True` always runs the compiled backward;
so does a process in a `torch.distributed` group (ranks deciding differently would issue
different collectives). `CAMLIR_GRAPH_CHOICE=0` turns the measurement off (fallback routing
stays: it is about correctness, not speed).
"""

import random
import statistics

from camlir import environment

START = 16
# Timed in blocks, not alternating call by call: each side's first calls after a switch run
# with the other side's data in the caches. Alternating every call, the bench CNN's eager
# backward measured 4.7 ms against 3.5 ms steady (camlir's 5.8 against 6.4), so the choice
# kept the compiled backward at 1.8x eager's time. Blocks of BLOCK calls, the first WARM of
# each untimed.
BLOCK = 4
WARM = 2
# The faster side wins, with no margin: "no compiled backward slower than the eager engine"
# is the promise. With a 15% margin in favour of the compiled program (until 2026-12-02),
# bench rows ran compiled at up to 14% over the eager engine measured beside them (ResNet18
# 75.2 against 65.7 ms, BERT and MobileNetV3 1.08-1.10x in the bench). Where the two sides
# are within noise, either pick costs about the noise. 12 samples a side (6 blocks), so one
# slow block moves neither median much.
SAMPLES = 12
MARGIN = 1.0
# The decision compares each compiled block with the eager blocks on either side of it
# (`paired_ratio`) and takes the median of those ratios. The two sides' medians, compared
# as they were until 2026-12-02, follow a load that rises or falls during the measurement:
# the eager blocks come later on average, so a machine getting busier by 5% a block made a
# program 4% slower than the eager engine look faster (test_speed_guarantees). Where the
# median ratio is within TIE of 1, SAMPLES more timings a side are taken, up to MAX_SAMPLES,
# and the decision is made on all of them (still within TIE: the eager engine); it is
# checked only at multiples of SAMPLES, so that the stop is not chosen at a lucky sample.
# (Seen before the change: a bench run's MobileNetV3 route kept its compiled backward on
# 25.3 against 26.5 ms, and the row came out 1.13x eager; the eager engine in a twin process
# ran at 1.06x.)
TIE = 0.03
MAX_SAMPLES = 36
# A decision is taken again, on fresh timings, after RECHECK[i] more calls of the side it
# chose (the (i+1)-th decision; none after the last): the first is made in a run's first ~64
# calls, when the machine may still be busy with start-up work, and a training loop runs
# for thousands. A re-measure runs 24 of its 48 calls on the other side.
RECHECK = (1000, 10000)
MAX_ROUTES = 512
# A shortcut's full key is checked on a random 1 call in 2**VERIFY_BITS (random, not every
# Nth: two structures alternating with a period that divides N would never be told apart).
VERIFY_BITS = 4
_SHARED = "shared"  # a shallow key seen with two structures: always walk


def enabled() -> bool:
    """Whether compiled backwards are timed against the eager engine (`CAMLIR_GRAPH_CHOICE`,
    default on)."""
    return environment.flag("CAMLIR_GRAPH_CHOICE")


def structure_key(roots, inputs=()) -> tuple:
    """A name for the backward from `roots` (tensors), before it runs: per reachable node, in
    a fixed depth-first order, its type and the numbers of its successors; plus how many
    `inputs=` tensors there are. No tensor identity: a loop that makes new leaves every step
    (an input that requires grad) must map to one route, not one per step. Cost: ~1 us per
    node."""
    numbers: dict = {}
    items = []
    stack = []
    for t in roots:
        node = t.grad_fn
        if node is None:
            items.append(("leaf",))
            continue
        if id(node) not in numbers:
            numbers[id(node)] = len(numbers)
            stack.append(node)
    while stack:
        node = stack.pop()
        children = []
        for child, _ in node.next_functions:
            if child is None:
                children.append(-1)
                continue
            number = numbers.get(id(child))
            if number is None:
                number = numbers[id(child)] = len(numbers)
                stack.append(child)
            children.append(number)
        items.append((type(node).__name__, tuple(children)))
    return tuple(items) + (len(inputs),)


def shallow_key(roots, inputs=()) -> tuple:
    """A cheap name for the backward from `roots`: the types of their autograd nodes and how
    many `inputs=` tensors there are (~0.3 us). Many structures share one; see
    `Routes.for_backward` for how that is caught."""
    return tuple(type(t.grad_fn) for t in roots) + (len(inputs),)


def paired_ratio(compiled: list, eager: list):
    """The median, over compiled blocks, of (the block's mean time) / (the mean time of the
    eager blocks on either side of it, or of the one there is); `compiled` and `eager` hold
    (block, seconds). Against a load that changes steadily over the measurement, both
    neighbours cancel it. None when no compiled block has an eager neighbour."""
    def means(samples):
        by_block: dict = {}
        for block, seconds in samples:
            by_block.setdefault(block, []).append(seconds)
        return {block: sum(v) / len(v) for block, v in by_block.items()}

    c, e = means(compiled), means(eager)
    ratios = []
    for block, seconds in c.items():
        near = [e[b] for b in (block - 1, block + 1) if b in e]
        if near and sum(near) > 0:
            ratios.append(seconds / (sum(near) / len(near)))
    return statistics.median(ratios) if ratios else None


class Route:
    """How backwards of one structure run. `pick()` says which runs next ("compiled" or
    "eager"); `record(which, seconds)` adds a timing and returns True when it decided;
    `decided` is then set, with `compiled_s`/`eager_s` the medians it decided on, and
    `reason` says why (for a fallback, the fallback's reason)."""

    __slots__ = ("calls", "decided", "compiled_s", "eager_s", "ratio", "reason", "graph", "timing", "rounds",
                 "since", "final", "pending", "_block", "_compiled", "_eager")

    def __init__(self):
        self.calls = 0
        self.timing = False  # whether the call `pick()` just chose is one to time
        self.decided = None
        self.compiled_s = self.eager_s = None
        self.ratio = None  # median of the paired blocks' compiled/eager ratios it decided on
        self.reason = ""
        self.graph = 0  # capture id of the compiled backward that served it, when known
        self.rounds = 0  # decisions taken by timing
        self.since = 0  # calls run on the decided side since the last decision
        self.final = False  # decided for correctness (a fallback): never timed again
        self.pending = None  # the compiled backward whose program compiles in a worker (compile service)
        self._block = 0  # the block of the call `pick()` just chose
        self._compiled, self._eager = [], []  # (block, seconds)

    def due(self) -> bool:
        """Counts a call run on the decided side; True when the decision is to be taken
        again (`RECHECK`): the caller then `reopen()`s the route and wakes the table."""
        self.since += 1
        return not self.final and 0 < self.rounds <= len(RECHECK) and self.since >= RECHECK[self.rounds - 1]

    def reopen(self) -> None:
        """Measures both sides again (blocks from the first one, no warm-up calls)."""
        self.decided = None
        self.calls = START
        self.since = 0
        self._compiled, self._eager = [], []

    def pick(self) -> str:
        if self.decided is not None:
            return self.decided
        n = self.calls
        self.calls += 1
        if n < START:
            self.timing = False
            return "compiled"
        block, position = divmod(n - START, BLOCK)
        self.timing = position >= WARM
        self._block = block
        return "eager" if block % 2 else "compiled"

    def measuring(self) -> bool:
        """Whether the call `pick()` just chose is to be timed."""
        return self.decided is None and self.timing

    def record(self, which: str, seconds: float) -> bool:
        (self._eager if which == "eager" else self._compiled).append((self._block, seconds))
        n = min(len(self._compiled), len(self._eager))
        if n < SAMPLES or n % SAMPLES:
            return False
        ratio = paired_ratio(self._compiled, self._eager)
        if ratio is None:  # no block has its pair yet (timings recorded out of step)
            return False
        if abs(ratio - 1.0) < TIE and n < MAX_SAMPLES:
            return False  # within noise: measure SAMPLES more a side
        self.compiled_s = statistics.median(s for _, s in self._compiled)
        self.eager_s = statistics.median(s for _, s in self._eager)
        self.ratio = ratio
        # A tie, or a difference still within TIE after MAX_SAMPLES, goes to the eager engine:
        # it is what the program replaces, and it runs here with part of the capture's cost
        # to the process that it would not have without camlir (docs/speed.md, "What a
        # capture leaves behind"), so a program not measurably faster is not kept.
        near = abs(ratio - 1.0) < TIE
        self.decided = "eager" if (ratio >= 1.0 / MARGIN or near) else "compiled"
        self._compiled = self._eager = None
        self.rounds += 1
        self.since = 0
        paired = f" (paired blocks: compiled at {ratio:.2f}x the eager engine)"
        if self.decided == "eager":
            self.reason = (f"runs on PyTorch's eager engine: {1e3 * self.eager_s:.3f} ms per backward against "
                           f"{1e3 * self.compiled_s:.3f} ms compiled{paired}")
        else:
            self.reason = (f"runs compiled: {1e3 * self.compiled_s:.3f} ms per backward against "
                           f"{1e3 * self.eager_s:.3f} ms on the eager engine{paired}")
        return True

    def to_eager(self, reason: str) -> None:
        """Routes this structure to the eager engine for good (its compiled backward fell back)."""
        self.decided, self.reason, self.final = "eager", reason, True
        self._compiled = self._eager = None


class Routes:
    """The routes by structure key, and whether keys must be computed at all (`awake`)."""

    def __init__(self):
        self.routes: dict = {}
        self.shortcuts: dict = {}  # shallow key -> the one eager-decided Route seen with it, or _SHARED
        self._check_next = False  # `eager_shortcut` drew a check: the next `for_backward` walks
        self.awake = False
        self.asleep_calls = 0  # compiled backwards run while asleep (all decided compiled)
        self.asleep_rounds = 0

    def wake(self) -> None:
        self.awake = True

    def for_backward(self, roots, inputs=()) -> Route:
        """The route of the backward from `roots`: by its shallow key where that names one
        structure decided for the eager engine (checked now and then), else by its full
        `structure_key`."""
        shallow = shallow_key(roots, inputs)
        known = self.shortcuts.get(shallow)
        check, self._check_next = self._check_next, False
        if known is not None and known is not _SHARED and not check and random.getrandbits(VERIFY_BITS):
            return known
        route = self.route(structure_key(roots, inputs))
        if route.decided == "eager":
            if known is None:
                self.shortcuts[shallow] = route
            elif known is not route:
                self.shortcuts[shallow] = _SHARED
        elif known is not None and known is not _SHARED and known is not route:
            self.shortcuts[shallow] = _SHARED
        return route

    def forget_shortcuts(self, route) -> None:
        """Drops the shallow keys that name `route` (decided again, for the compiled side)."""
        for shallow in [k for k, r in self.shortcuts.items() if r is route]:
            del self.shortcuts[shallow]

    def eager_shortcut(self, root):
        """The eager-decided route of the backward from the one tensor `root` (no `inputs=`)
        by its shallow key alone, or None: for a shared key, or on the random calls where
        `for_backward` must check the full key."""
        route = self.shortcuts.get((type(root.grad_fn), 0))
        if route is None or route is _SHARED or route.decided != "eager":
            return None
        if not random.getrandbits(VERIFY_BITS):
            self._check_next = True  # the draw is made: `for_backward` walks this call
            return None
        return route

    def route(self, key) -> Route:
        route = self.routes.get(key)
        if route is None:
            if len(self.routes) >= MAX_ROUTES:
                # Structures that change every few steps never finish measuring: forget the
                # undecided ones rather than grow without bound.
                self.routes = {k: r for k, r in self.routes.items() if r.decided is not None}
                self.shortcuts.clear()
            route = self.routes[key] = Route()
        return route

    def settle(self) -> None:
        """Sleeps once nothing needs a key: every route decided for the compiled backward."""
        self.awake = not all(r.decided == "compiled" for r in self.routes.values())
        if not self.awake:
            self.asleep_calls = 0
            due = [r.rounds for r in self.routes.values() if r.rounds <= len(RECHECK)]
            self.asleep_rounds = min(due) if due else 0

    def tick_asleep(self) -> bool:
        """Counts a compiled backward run while the table sleeps (no key is computed then);
        True when `RECHECK` says the decisions are to be taken again (`reopen_all`)."""
        self.asleep_calls += 1
        return 0 < self.asleep_rounds <= len(RECHECK) and self.asleep_calls >= RECHECK[self.asleep_rounds - 1]

    def reopen_all(self) -> None:
        """Measures every route decided by timing again, and wakes."""
        for route in self.routes.values():
            if not route.final and route.decided == "compiled" and route.rounds <= len(RECHECK):
                route.reopen()
        self.asleep_rounds = 0
        self.wake()

    def clear(self) -> None:
        self.routes.clear()
        self.shortcuts.clear()
        self.awake = False
        self.asleep_calls = self.asleep_rounds = 0


routes = Routes()
