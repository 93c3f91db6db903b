"""DistributedDataParallel with the compiled backward: two real processes (gloo on the CPU),
each rank's gradients equal eager DDP's. A DDP module built after `import camlir` uses the
Python reducer, whose all-reduce hooks run inside the compiled backward; one built with the
C++ reducer cannot run under compiled autograd and runs eagerly, with a warning."""

import os
import socket
import sys

import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank, world, port, cpp_reducer, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), CAMLIR_DISK_CACHE="0")
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        if cpp_reducer:  # built before camlir is imported: DDP's C++ reducer
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
            ours = torch.nn.parallel.DistributedDataParallel(model)
        import camlir

        torch.manual_seed(0)
        reference = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
        if not cpp_reducer:
            model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
            model.load_state_dict(reference.state_dict())
            ours = torch.nn.parallel.DistributedDataParallel(model)
        eager = torch.nn.parallel.DistributedDataParallel(reference)
        worst = 0.0
        for step in range(3):
            torch.manual_seed(100 + 10 * rank + step)  # each rank its own data
            x = torch.randn(8, 16)
            eager(x).pow(2).sum().backward()
            with camlir.enable():
                ours(x).pow(2).sum().backward()
            for p, r in zip(model.parameters(), reference.parameters()):
                torch.testing.assert_close(p.grad, r.grad, rtol=1e-4, atol=1e-5)
                worst = max(worst, float((p.grad - r.grad).abs().max()))
            model.zero_grad(set_to_none=True)
            reference.zero_grad(set_to_none=True)
        results.put((rank, "ok", dict(camlir.counters), worst))
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        results.put((rank, f"{type(exc).__name__}: {exc}", {}, None))
    finally:
        dist.destroy_process_group()


def _run(cpp_reducer: bool) -> list:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    sys.path.insert(0, HERE)
    procs = [ctx.Process(target=_rank, args=(r, 2, port, cpp_reducer, results)) for r in range(2)]
    for p in procs:
        p.start()
    out = [results.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(60)
    return sorted(out)


def test_ddp_gradients_equal_eager_ddp_on_every_rank():
    out = _run(cpp_reducer=False)
    for rank, status, counters, _ in out:
        assert status == "ok", (rank, status)
        assert counters["compiles"] >= 1 and counters["fallbacks"] == 0, counters


def test_ddp_with_the_cpp_reducer_runs_eagerly_and_right():
    out = _run(cpp_reducer=True)
    for rank, status, counters, _ in out:
        assert status == "ok", (rank, status)
        assert counters["fallbacks"] >= 1 and counters["compiles"] == 0, counters
