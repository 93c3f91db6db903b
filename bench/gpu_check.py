"""The GPU check: build artifacts of the zoo here, run and time them on a GPU machine there.

    python bench/gpu_check.py build OUT     # here (camlir installed, no GPU needed)
    python OUT/gpu_check.py run OUT         # there (torch + a CUDA GPU; no camlir, no network)

`build` exports, for every case of `gpu_zoo.py`, the compiled gpu backward
(`camlir.backends.gpu.export`: manifest, PTX, inputs) and the gradients eager PyTorch gives
on the cpu (`expected.pt`, by parameter name), and copies this script, `gpu_zoo.py` and the
runner into OUT, so OUT is all the GPU machine needs. `run` imports only torch, the runner
and the zoo: per case it runs the artifact on CUDA tensors, compares its gradients with eager
CUDA's (the same model and seed, rebuilt there) and with the saved cpu ones, times the
backward against eager CUDA's, and prints one table. Exit status 1 when any case is wrong.
"""

import json
import os
import shutil
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
RTOL, ATOL = 1e-4, 1e-5


def build(out: str) -> None:
    sys.path.insert(0, HERE)
    import gpu_zoo

    import camlir
    from camlir.backends.gpu import export, runner

    os.makedirs(out, exist_ok=True)
    for name in gpu_zoo.ZOO:
        model, inputs, loss = gpu_zoo.build(name)
        loss(model, *inputs).backward()
        expected = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        names = {id(p): n for n, p in model.named_parameters()}
        case = os.path.join(out, name)
        shutil.rmtree(case, ignore_errors=True)
        camlir.reset()
        from camlir.backends.gpu import program as gpu_program

        with gpu_program.recording() as recorded:
            with camlir.enable(backend="gpu", fullgraph=True):
                loss(model, *inputs).backward()
        graphs = []
        for i, (program, args) in enumerate(recorded, 1):
            path = export.write(program, os.path.join(case, f"graph{i}"), args)
            params = {str(j): names[id(a)] for j, a in enumerate(args) if id(a) in names}
            graphs.append({"dir": f"graph{i}", "params": params})
        torch.save(expected, os.path.join(case, "expected.pt"))
        with open(os.path.join(case, "case.json"), "w") as f:
            json.dump({"name": name, "graphs": graphs}, f, indent=1)
        print(f"built {name}: {len(graphs)} graph(s)")
    for src in (os.path.join(HERE, "gpu_check.py"), os.path.join(HERE, "gpu_zoo.py"), runner.__file__):
        shutil.copyfile(src, os.path.join(out, os.path.basename(src)))
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs)
    print(f"{out}: {size / 2**20:.2f} MiB")
    if size > 60 * 2**20:
        raise SystemExit(f"{out} is {size / 2**20:.1f} MiB: more than the 64 MiB the GPU machine takes")


def _time(fn, repeat: int) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeat


def _max_err(got: dict, want: dict) -> tuple:
    worst, ok = 0.0, True
    for n, w in want.items():
        g = got.get(n)
        if g is None:
            return float("inf"), False
        w = w.to(g.device)
        worst = max(worst, float((g - w).abs().max()))
        ok = ok and torch.allclose(g, w, rtol=RTOL, atol=ATOL)
    return worst, ok


def run(out: str, repeat: int = 50) -> int:
    sys.path.insert(0, out)
    import gpu_zoo
    import runner

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to run")
        return 1
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    rows, failed = [], False
    for name in gpu_zoo.ZOO:
        case_dir = os.path.join(out, name)
        try:
            case = json.load(open(os.path.join(case_dir, "case.json")))
            expected_cpu = torch.load(os.path.join(case_dir, "expected.pt"))
            # eager CUDA: the same model and seed, rebuilt here
            model, inputs, loss = gpu_zoo.build(name)
            model = model.cuda()
            inputs = [i.cuda() for i in inputs]
            loss(model, *inputs).backward()
            eager = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
            model.zero_grad(set_to_none=True)
            out_loss = loss(model, *inputs)
            eager_s = _time(lambda: out_loss.backward(retain_graph=True), repeat)

            artifacts, args_list, grads = [], [], {}
            for g in case["graphs"]:
                art = runner.load(os.path.join(case_dir, g["dir"]))
                args = [t.cuda() for t in torch.load(os.path.join(case_dir, g["dir"], "inputs.pt"))]
                art.run(args)
                for j, pname in g["params"].items():
                    grads[pname] = args[int(j)].grad
                artifacts.append(art)
                args_list.append(args)
            torch.cuda.synchronize()
            err_cuda, ok_cuda = _max_err(grads, eager)
            err_cpu, ok_cpu = _max_err(grads, expected_cpu)

            def compiled():
                for art, args in zip(artifacts, args_list):
                    art.run(args)
            camlir_s = _time(compiled, repeat)
            launches = sum(1 for art in artifacts for plan in art.manifest["kernels"].values()
                           for s in plan["steps"] if s["op"] == "launch")
            gemms = sum(1 for art in artifacts for plan in art.manifest["kernels"].values()
                        for s in plan["steps"] if s["op"] == "gemm")
            ok = ok_cuda and ok_cpu
            failed |= not ok
            rows.append((name, "ok" if ok else "WRONG", f"{err_cuda:.2e}", f"{err_cpu:.2e}", str(launches),
                         str(gemms), f"{eager_s * 1e3:.3f}", f"{camlir_s * 1e3:.3f}", f"{eager_s / camlir_s:.2f}x"))
        except Exception as exc:  # noqa: BLE001 - one broken case must not hide the others
            failed = True
            rows.append((name, f"ERROR {type(exc).__name__}: {str(exc)[:120]}", "", "", "", "", "", "", ""))
    header = ("case", "grads", "max err vs eager CUDA", "vs eager cpu", "launches", "cuBLAS calls",
              "eager CUDA ms", "camlir ms", "speed-up")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    return 1 if failed else 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 2 or argv[0] not in ("build", "run"):
        print(__doc__)
        return 2
    if argv[0] == "build":
        build(argv[1])
        return 0
    return run(argv[1])


if __name__ == "__main__":
    sys.exit(main())
