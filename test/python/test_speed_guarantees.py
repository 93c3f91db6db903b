"""The speed guarantees and the profiler: a slower compiled kernel or program is set aside,
by measurement, without changing a gradient; `camlir.profile()` attributes the time."""

import os
import random
import subprocess
import sys
import time

import pytest
import torch

import camlir
from camlir import graph_choice
from camlir.backends.cpu import choice


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setenv("CAMLIR_GRAPH_CHOICE", "1")  # conftest switches it off for the other tests
    camlir.reset()
    yield
    camlir.reset()


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _loss(model, step):
    torch.manual_seed(step)
    return model(torch.randn(6, 8)).pow(2).sum()


def _accumulating_steps(model, reference, steps, **enable):
    """`steps` backward calls WITHOUT zeroing the grads (accumulation into .grad), each
    compared with eager on a twin model."""
    for step in range(steps):
        _loss(reference, step).backward()
        with camlir.enable(**enable):
            _loss(model, step).backward()
        for p, r in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, r.grad)


def _choice_calls() -> int:
    """Calls after START until a route has SAMPLES timings of each side (blocks of BLOCK
    calls, the first WARM of each untimed)."""
    timed = graph_choice.BLOCK - graph_choice.WARM
    blocks_per_side = -(-graph_choice.SAMPLES // timed)
    return 2 * blocks_per_side * graph_choice.BLOCK


def _slowed(fn, seconds):
    def slow(*args):
        time.sleep(seconds)
        return fn(*args)
    return slow


def _steady_program(model, reference):
    """Two steps (the first backward into empty grads and the first accumulating one are
    two captures), then the program later steps run."""
    _accumulating_steps(model, reference, 2)
    return camlir.compiled_programs()[-1][2]


def test_a_slow_kernel_is_replaced_by_its_torch_ops():
    model, reference = _mlp(), _mlp()
    program = _steady_program(model, reference)
    assert program.choices, "every kernel has a torch twin"
    for c in program.choices.values():
        c.native = _slowed(c.native, 0.005)
    _accumulating_steps(model, reference, 2 + 2 * choice.SAMPLES + 4)
    assert all(c.chosen == "torch" for c in program.choices.values()), program.choices
    assert all(c.torch_s < c.native_s for c in program.choices.values())


def test_fast_kernels_stay_native():
    model, reference = _mlp(), _mlp()
    program = _steady_program(model, reference)
    _accumulating_steps(model, reference, 2 + 2 * choice.SAMPLES + 2)
    for c in program.choices.values():
        c._decide(0.001, 0.00095)  # within the margin: native code stays
        assert c.chosen == "native"


def test_twin_results_never_alias_inputs_or_each_other():
    x = torch.randn(3, 4)
    view = x.t()
    outs = choice._fresh([x, view, x.view(12), torch.ones(2)], [x])
    assert all(o.is_contiguous() for o in outs)
    assert outs[0].untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert len({o.untyped_storage().data_ptr() for o in outs}) == 4
    torch.testing.assert_close(outs[1], view)


def test_a_slow_program_runs_on_the_eager_engine(monkeypatch):
    monkeypatch.setattr(graph_choice, "START", 2)
    model, reference = _mlp(), _mlp()
    program = _steady_program(model, reference)
    original = type(program).__call__
    monkeypatch.setattr(type(program), "__call__", lambda self, *a, **k: (time.sleep(0.01), original(self, *a, **k))[1])
    _accumulating_steps(model, reference, 2 + _choice_calls() + 1)
    [event] = camlir.explain(kind="choice")
    assert "runs on PyTorch's eager engine" in event.reason and event.new < event.old
    eager_before = camlir.counters["eager_runs"]
    hits_before = camlir.counters["cache_hits"]
    _accumulating_steps(model, reference, 3)  # decided: every call goes to the eager engine
    assert camlir.counters["eager_runs"] == eager_before + 3
    assert camlir.counters["cache_hits"] == hits_before, "an eager run is not a cache hit"


def test_a_fast_program_stays_and_the_routes_sleep(monkeypatch):
    monkeypatch.setattr(graph_choice, "START", 2)
    model, reference = _mlp(), _mlp()
    program = _steady_program(model, reference)
    from camlir.capture import engine

    real = engine._eager

    def slow_eager(call, route):
        return real(lambda: (time.sleep(0.01), call())[1], route)

    monkeypatch.setattr(engine, "_eager", slow_eager)
    _accumulating_steps(model, reference, 2 + _choice_calls() + 1)
    [event] = camlir.explain(kind="choice")
    assert event.reason.startswith("runs compiled") and event.old < event.new
    assert not graph_choice.routes.awake, "nothing left to route: no key is computed any more"
    assert program is camlir.compiled_programs()[-1][2]


def test_a_decision_is_taken_again_after_recheck_calls(monkeypatch):
    # A choice made in a run's first calls may have been measured while the machine was
    # busy: it is taken again on fresh timings after RECHECK calls, either way, and not
    # after the last. Which side is slow is flipped between the rounds.
    monkeypatch.setattr(graph_choice, "START", 2)
    monkeypatch.setattr(graph_choice, "RECHECK", (5, 7))
    model, reference = _mlp(), _mlp()
    program = _steady_program(model, reference)
    from camlir.capture import engine

    slow = {"side": "eager"}
    real_eager, real_call = engine._eager, type(program).__call__

    def eager(call, route):
        return real_eager(lambda: (slow["side"] == "eager" and time.sleep(0.01), call())[1], route)

    def compiled(self, *a, **k):
        if slow["side"] == "compiled":
            time.sleep(0.01)
        return real_call(self, *a, **k)

    monkeypatch.setattr(engine, "_eager", eager)
    monkeypatch.setattr(type(program), "__call__", compiled)
    _accumulating_steps(model, reference, 2 + _choice_calls() + 1)
    decisions = [e.reason for e in camlir.explain(kind="choice")]
    assert len(decisions) == 1 and decisions[0].startswith("runs compiled")
    assert not graph_choice.routes.awake

    slow["side"] = "compiled"
    _accumulating_steps(model, reference, 5 + _choice_calls() + 1)
    decisions = [e.reason for e in camlir.explain(kind="choice")]
    assert len(decisions) == 2 and decisions[1].startswith("runs on PyTorch's eager engine"), decisions

    slow["side"] = "eager"
    _accumulating_steps(model, reference, 7 + _choice_calls() + 1)
    decisions = [e.reason for e in camlir.explain(kind="choice")]
    assert len(decisions) == 3 and decisions[2].startswith("runs compiled"), decisions
    assert not graph_choice.routes.shortcuts and not graph_choice.routes.awake

    slow["side"] = "compiled"  # no third re-check: the route stays as decided
    _accumulating_steps(model, reference, 2 * _choice_calls())
    assert len(camlir.explain(kind="choice")) == 3


def test_sleeping_routes_are_measured_again_on_their_own_schedule(monkeypatch):
    # While every route runs compiled no key is computed: calls are counted together, and
    # only routes whose schedule is not exhausted are measured again; a fallback never is.
    monkeypatch.setattr(graph_choice, "RECHECK", (3,))
    routes = graph_choice.Routes()
    fresh, exhausted = routes.route("fresh"), routes.route("exhausted")
    for route, rounds in ((fresh, 1), (exhausted, 2)):
        route.decided, route.rounds = "compiled", rounds
    routes.settle()
    assert not routes.awake
    assert [routes.tick_asleep() for _ in range(3)] == [False, False, True]
    routes.reopen_all()
    assert routes.awake and fresh.decided is None and exhausted.decided == "compiled"
    fallback = graph_choice.Route()
    fallback.to_eager("fell back")
    fallback.rounds = 1
    assert not any(fallback.due() for _ in range(10)) and fallback.decided == "eager"


def test_a_structure_that_fell_back_then_runs_on_the_eager_engine():
    # Sparse gradients are not compiled: the first backward falls back (compiled autograd's own
    # graph runs it), every later one of that structure runs on the eager engine.
    torch.manual_seed(0)
    emb, ref = torch.nn.Embedding(10, 3, sparse=True), torch.nn.Embedding(10, 3, sparse=True)
    ref.load_state_dict(emb.state_dict())
    for step in range(4):
        idx = torch.tensor([1, 2, 2, 7 + step % 2])
        with camlir.enable():
            (emb(idx) * step).sum().backward()
        (ref(idx) * step).sum().backward()
        torch.testing.assert_close(emb.weight.grad.to_dense(), ref.weight.grad.to_dense())
    assert camlir.counters["fallbacks"] == 1
    assert camlir.counters["eager_runs"] == 3
    [event] = camlir.explain(kind="choice")
    assert event.what == "fallback" and "fell back" in event.reason


def test_fullgraph_always_runs_the_program(monkeypatch):
    monkeypatch.setattr(graph_choice, "START", 0)
    model, reference = _mlp(), _mlp()
    _accumulating_steps(model, reference, 2 + _choice_calls(), fullgraph=True)
    assert camlir.explain(kind="choice") == []
    assert camlir.counters["eager_runs"] == 0


def test_structure_key_names_the_graph_not_the_values():
    lin = torch.nn.Linear(3, 2)
    a, b = lin(torch.randn(4, 3)).sum(), lin(torch.randn(4, 3)).sum()
    c = lin(torch.randn(4, 3)).relu().sum()
    other = torch.nn.Linear(3, 2)
    d = other(torch.randn(4, 3)).sum()
    key = graph_choice.structure_key
    assert key((a,)) == key((b,))
    assert key((a,)) != key((c,)), "a different node"
    assert key((a,)) == key((d,)), "a twin model shares the route: no tensor identity in the key"
    assert key((a,)) != key((a,), (lin.weight,)), "inputs= changes what runs"


def _steps_against_eager(models, make_loss, steps):
    """`steps` backward calls of each model in turn under camlir, each compared with eager on
    a twin (grads zeroed each step)."""
    for _ in range(steps):
        for model, reference in models:
            for m in (model, reference):
                m.zero_grad(set_to_none=True)
            make_loss(reference).backward()
            with camlir.enable():
                make_loss(model).backward()
            for p, r in zip(model.parameters(), reference.parameters()):
                torch.testing.assert_close(p.grad, r.grad)


def _twins(make):
    torch.manual_seed(0)
    model = make()
    reference = make()
    reference.load_state_dict(model.state_dict())
    return model, reference


def test_an_eager_route_is_found_by_its_shallow_key_and_a_look_alike_is_told_apart(monkeypatch):
    random.seed(0)  # the checks are drawn at random: fixed here, so the test is repeatable
    x = torch.randn(6, 8)
    a = _twins(lambda: torch.nn.Linear(8, 4))
    loss_a = lambda m: m(x).sum()  # noqa: E731 - root SumBackward0
    b = _twins(lambda: torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh()))
    loss_b = lambda m: m(x).sum()  # noqa: E731 - the same root type, another structure
    _steps_against_eager([a], loss_a, 2)  # captured (the routing table wakes), then routed
    routes = graph_choice.routes
    [route] = routes.routes.values()
    route.to_eager("test: decided for the eager engine")

    walks = []
    full_key = graph_choice.structure_key
    monkeypatch.setattr(graph_choice, "structure_key", lambda *args: (walks.append(1), full_key(*args))[1])
    eager_before = camlir.counters["eager_runs"]
    _steps_against_eager([a], loss_a, 64)
    assert camlir.counters["eager_runs"] == eager_before + 64
    assert 1 <= len(walks) < 24, f"{len(walks)} full walks for 64 calls: the shallow key should serve most"
    assert routes.shortcuts[(type(a[0](x).sum().grad_fn), 0)] is route

    # B shares A's shallow key. Until a random check walks B's graph it runs on the eager
    # engine too (exact); then the shallow key is marked shared and B gets its own route.
    captures = camlir.counters["captures"]
    _steps_against_eager([b], loss_b, 200)  # P(never checked) = (15/16)**200 ~ 2.5e-6
    assert routes.shortcuts[(type(a[0](x).sum().grad_fn), 0)] is graph_choice._SHARED
    assert camlir.counters["captures"] > captures, "B was captured and compiled once told apart"
    walks.clear()
    _steps_against_eager([a, b], loss_a, 4)
    assert len(walks) == 8, "a shared shallow key always walks"


def test_enable_is_a_context_and_a_decorator_and_checks_its_arguments():
    with pytest.raises(ValueError, match="unknown camlir backend 'tpu'"):
        camlir.enable(backend="tpu")
    with pytest.raises(ValueError, match="dynamic must be None, True or False"):
        camlir.enable(dynamic="yes")
    model, reference = _twins(lambda: torch.nn.Linear(8, 4))
    x = torch.randn(6, 8)

    @camlir.enable(backend="eager")
    def step(m):
        m(x).sum().backward()

    step(model)
    reference(x).sum().backward()
    torch.testing.assert_close(model.weight.grad, reference.weight.grad)
    assert camlir.counters["captures"] == 1
    scope = camlir.enable()
    with scope:
        with scope:  # the same scope object, nested
            assert torch.autograd.backward is not camlir.capture.engine._original_backward
    assert torch.autograd.backward is camlir.capture.engine._original_backward, "unpatched when unused"


def test_new_leaves_every_step_share_one_route_and_the_table_is_bounded(monkeypatch):
    lin = torch.nn.Linear(3, 2)
    keys = {graph_choice.structure_key((lin(torch.randn(4, 3, requires_grad=True)).sum(),)) for _ in range(5)}
    assert len(keys) == 1
    monkeypatch.setattr(graph_choice, "MAX_ROUTES", 4)
    routes = graph_choice.Routes()
    routes.route("decided").to_eager("test")
    for i in range(10):
        routes.route(i)
    assert len(routes.routes) <= 4 and "decided" in routes.routes


def test_profile_attributes_the_backward():
    model = _mlp()
    with camlir.enable():
        _loss(model, 0).backward()  # compile outside the profile
    with camlir.profile() as prof:
        for step in range(5):
            with camlir.enable():
                _loss(model, step).backward()
    assert prof.backwards == 5
    kernels = [label for label in prof.steps if label.startswith("kernel @")]
    assert kernels and prof.steps[kernels[0]][0] == 5
    # A kernel's label says what it computes (its torch twin's ops): the MLP's GEMMs show.
    assert any(" (" in k and "mm" in k.split(" (", 1)[1] for k in kernels), kernels
    assert "accumulate_grad" in " ".join(prof.steps)
    step_total = sum(s for _, s in prof.steps.values())
    assert 0 < step_total <= prof.program_seconds <= prof.backward_seconds
    table = prof.table()
    assert "5 backward calls" in table and kernels[0] in table
    assert "minor page faults during the backward calls" in table and prof.as_dict()["page_faults"] >= 0
    assert camlir.profiling.current() is None


@pytest.mark.skipif(not hasattr(os, "sysconf"), reason="POSIX page faults")
def test_profile_counts_the_page_faults_of_a_backward():
    # Page faults were most of W3's time outside its GEMMs (docs/speed.md); the profile must
    # show them. Touching 32 MB of fresh pages between the readings takes one fault per page
    # (an anonymous mmap: malloc, tuned by camlir, may hand back pages already mapped).
    import mmap

    from camlir.profiling import Profile, clock

    prof = Profile()
    page = os.sysconf("SC_PAGE_SIZE")
    pages = (32 << 20) // page
    buf = mmap.mmap(-1, 32 << 20)
    since = clock()
    for i in range(pages):
        buf[i * page] = 1
    prof.add_backward(since)
    buf.close()
    assert prof.page_faults >= 0.9 * pages, (prof.page_faults, pages)
    assert prof.backwards == 1 and prof.backward_seconds > 0


def test_ca_logs_perf_prints_the_table_at_exit(tmp_path):
    script = tmp_path / "perf.py"
    script.write_text("import torch, camlir\n"
                      "m = torch.nn.Linear(4, 4)\n"
                      "for _ in range(3):\n"
                      "    with camlir.enable():\n"
                      "        m(torch.randn(2, 4)).sum().backward()\n")
    env = dict(os.environ, CA_LOGS="perf", CAMLIR_DISK_CACHE="0")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "camlir profile: 3 backward calls" in done.stderr, done.stderr[-2000:]
    assert "kernel @backward_kernel_0" in done.stderr


def test_a_structure_whose_capture_failed_skips_compiled_autograd_after(monkeypatch):
    # A capture that fails (PyTorch's StopIteration of fuzz seeds 762/1449 is one) runs that
    # backward eagerly; later backwards of the structure go straight to the eager engine
    # instead of paying for a capture that fails the same way.
    from camlir.capture import engine

    attempts = []

    def failing_compiler(gm, reasons):
        attempts.append(gm)
        raise RuntimeError("capture broke")

    monkeypatch.setattr(engine, "_compiler", [failing_compiler])
    model, reference = _mlp(), _mlp()
    _accumulating_steps(model, reference, 3)
    assert len(attempts) == 1
    assert camlir.counters["fallbacks"] == 1 and camlir.counters["eager_runs"] == 2
    [event] = camlir.explain(kind="choice")
    assert event.what == "fallback" and "could not capture" in event.reason


def _decide_on(compiled_factor: float, drift_per_block: float, max_calls: int = 2000):
    """Drives a Route with synthetic timings: the eager engine takes 1 unit, the compiled
    backward `compiled_factor` units, both times (1 + drift_per_block * block) while the
    machine's load changes steadily. Returns the route once it decided."""
    route = graph_choice.Route()
    for _ in range(max_calls):
        which = route.pick()
        if route.measuring():
            block = (route.calls - 1 - graph_choice.START) // graph_choice.BLOCK
            load = 1.0 + drift_per_block * block
            if route.record(which, load * (compiled_factor if which == "compiled" else 1.0)):
                return route
    raise AssertionError("the route never decided")


@pytest.mark.parametrize("drift", [0.0, 0.05, -0.04])
def test_the_choice_pairs_blocks_so_a_changing_load_does_not_decide(drift):
    """A program 4% slower than the eager engine goes to the eager engine and one 4% faster
    stays compiled, also while the load rises (or falls) by 5% a block: comparing the two
    sides' medians picked the slower side there (the eager blocks come later on average)."""
    assert _decide_on(1.04, drift).decided == "eager"
    assert _decide_on(1 / 1.04, drift).decided == "compiled"


def test_a_near_tie_is_measured_longer_before_it_is_decided():
    """Within TIE of each other, the sides get SAMPLES more timings each (up to MAX_SAMPLES)
    before the decision, and a program still within TIE then runs on the eager engine; a
    clear difference decides at SAMPLES."""
    clear = _decide_on(1.5, 0.0)
    assert clear.rounds == 1 and clear.calls == graph_choice.START + _choice_calls()
    for factor in (1.01, 0.99):  # still within TIE at the end: the eager engine
        close = _decide_on(factor, 0.0)
        assert close.decided == "eager", factor
        assert close.calls == graph_choice.START + _choice_calls() * graph_choice.MAX_SAMPLES // graph_choice.SAMPLES
