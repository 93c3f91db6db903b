"""Differential sweep over `timm` image models (a long run, not CI; docs/model-sweep.md, "timm").

    nice -n 10 .venv/bin/python test/python/timm_sweep.py --extra-path DIR[:DIR]
        [--models A,B] [--backend cpu|eager] [--timeout 300] [--json out.json]
        [--keep-cache] [--threads 1] [--shim auto|yes|no] [--probe]
        [--autocast bf16] [--channels-last]

The sibling of model_sweep.py (Hugging Face `transformers`), and the same machinery: each
model in its own subprocess with a timeout (`model_sweep.sweep`), the same steps and judge
(`model_sweep.run_built`: 3 eval steps with an SGD update after each, 12 timed backwards per
side, 1 train step with dropout / drop-path / batch statistics, the RNG re-seeded before each
copy's forward; every parameter gradient compared with `assert_close(rtol=1e-4, atol=1e-5)`,
a failing one judged against a float64 rerun), the same verdicts and JSON records.

Each architecture is built with `timm.create_model(name, pretrained=False, num_classes=10,
...)` at its smallest variant and a small input (28-64 px, batch 4; see MODELS), seeded;
nothing is downloaded. Batch norms get running statistics from a few forwards on other
random images first (`_calibrate_batch_norms`), and the SGD update after a step moves no
parameter element by more than MAX_UPDATE (run_built's max_update). The loss is cross-entropy on random labels. `drop_rate` and
`drop_path_rate` are 0.1 where the model takes them, so the train step draws dropout masks.

timm is not a dependency of camlir: install it anywhere (`pip install --target DIR timm
--no-deps`) and pass that directory as `--extra-path` (or put it on PYTHONPATH). timm
imports torchvision at module level; when no torchvision can be imported beside this torch,
the stand-in in timm_shim/ is used (`--shim auto`, the default; see its __init__.py).

`--probe` builds each model and runs one eager forward and backward (no camlir): a quick
check of the table on a new timm version.

`--channels-last`: the model (`model.to(memory_format=torch.channels_last)`, after the
batch-norm calibration) and every step's images (`.contiguous(memory_format=
torch.channels_last)`) in channels_last on both sides; the float32 judge as usual.
`--autocast bf16`: every forward under CPU autocast to bf16 on both sides and the bf16
judge (model_sweep.py's doc: rtol 1.6e-2, atol 1e-2 x max|eager gradient|, then the
float64 check against the exact gradient; "max grad error" is relative to each gradient's
largest magnitude).
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import model_sweep  # noqa: E402  (the machinery: run_built, sweep, report, native)

BATCH = 4
CALIBRATION = (4, 8)  # forwards, batch: running statistics of batch norms before step 0
CLASSES = 10
DROP = 0.1
MAX_UPDATE = 1e-2  # the largest change of a parameter element in a step's SGD update

def _mixer(timm, pretrained=False, **kw):
    """timm's MlpMixer class (MLP-Mixer, or ResMLP with block_layer="ResBlock" and
    norm_layer="Affine"), at sizes its registered entry points do not let one change."""
    from timm.models import mlp_mixer

    for key in ("block_layer", "norm_layer"):
        if isinstance(kw.get(key), str):
            kw[key] = getattr(mlp_mixer, kw[key])
    return mlp_mixer.MlpMixer(**kw)


# name -> (timm model name or a function (timm, **kwargs) -> model, image size, extra create_model kwargs). The sizes are the smallest
# each model accepts without changing its structure beyond the kwargs given.
MODELS = {
    # convolutional: residual, depthwise / inverted residual, squeeze-excite, dense, grouped
    "resnet10t": ("resnet10t", 32, {}),
    "tinynet_e": ("tinynet_e", 32, {}),
    "mobilenetv3_small_050": ("mobilenetv3_small_050", 32, {}),
    "mobilenetv4_conv_small": ("mobilenetv4_conv_small_035", 32, {}),
    "ghostnet_050": ("ghostnet_050", 32, {}),
    "rexnet_100": ("rexnet_100", 32, {}),
    "regnetx_002": ("regnetx_002", 32, {}),
    "densenet_small": ("densenet121", 32, dict(growth_rate=8, block_config=(2, 2, 2, 2))),
    "convnext_atto": ("convnext_atto", 32, {}),
    "convnextv2_atto": ("convnextv2_atto", 32, {}),
    "edgenext_xx_small": ("edgenext_xx_small", 64, {}),
    "nf_resnet26": ("nf_resnet26", 32, {}),
    "cs3darknet_focus_s": ("cs3darknet_focus_s", 32, {}),
    "hrnet_w18_small": ("hrnet_w18_small", 64, {}),
    "dla46_c": ("dla46_c", 32, {}),
    "res2net50_26w_4s": ("res2net50_26w_4s", 32, {}),
    "selecsls42b": ("selecsls42b", 32, {}),
    "repvgg_a0": ("repvgg_a0", 32, {}),
    "mobileone_s0": ("mobileone_s0", 32, {}),
    "fastvit_t8": ("fastvit_t8", 64, {}),
    "skresnet18": ("skresnet18", 32, {}),
    "resnest14d": ("resnest14d", 32, {}),
    "lambda_resnet26t": ("lambda_resnet26t", 64, {}),
    "botnet26t": ("botnet26t_256", 64, dict(img_size=64)),
    # transformers, MLPs and hybrids
    "vit_tiny": ("vit_tiny_patch16_224", 32, dict(img_size=32, patch_size=8, depth=2)),
    "deit_tiny_distilled": ("deit_tiny_distilled_patch16_224", 32,
                            dict(img_size=32, patch_size=8, depth=2)),
    "swin_tiny": ("swin_tiny_patch4_window7_224", 32,
                  dict(img_size=32, window_size=4, embed_dim=24, depths=(1, 1), num_heads=(2, 4))),
    "swinv2_tiny": ("swinv2_tiny_window8_256", 32,
                    dict(img_size=32, window_size=4, embed_dim=24, depths=(1, 1),
                         num_heads=(2, 4))),
    # (the mixer entry points fix patch_size, num_blocks, embed_dim: the class, smaller)
    "mixer": (_mixer, 32, dict(img_size=32, patch_size=8, num_blocks=2, embed_dim=32)),
    "resmlp": (_mixer, 32, dict(img_size=32, patch_size=8, num_blocks=2, embed_dim=32,
                                mlp_ratio=4, block_layer="ResBlock", norm_layer="Affine")),
    "poolformer_s12": ("poolformer_s12", 32, {}),
    "levit_128s": ("levit_128s", 64, dict(img_size=64)),
    "efficientformer_l1": ("efficientformer_l1", 224, {}),  # its attention bias is 7x7
    "mobilevit_xxs": ("mobilevit_xxs", 64, {}),
    "coat_lite_tiny": ("coat_lite_tiny", 32, dict(img_size=32)),
    "maxvit_pico": ("maxvit_rmlp_pico_rw_256", 64, dict(img_size=64)),
    "coatnet_pico": ("coatnet_pico_rw_224", 64, dict(img_size=64)),
    "xcit_nano": ("xcit_nano_12_p8_224", 32, dict(img_size=32, depth=2)),
    "cait_xxs": ("cait_xxs24_224", 32, dict(img_size=32, patch_size=8, depth=2)),
    "pit_ti": ("pit_ti_224", 64, dict(img_size=64)),
    "tnt_s": ("tnt_s_patch16_224", 32, dict(img_size=32, depth=2)),
    "twins_svt_small": ("twins_svt_small", 64, dict(img_size=64)),
    "visformer_tiny": ("visformer_tiny", 64, dict(img_size=64)),
    "gcvit_xxtiny": ("gcvit_xxtiny", 64, dict(img_size=64)),
    "efficientvit_b0": ("efficientvit_b0", 64, {}),
    "efficientvit_m0": ("efficientvit_m0", 64, {}),
    "pvt_v2_b0": ("pvt_v2_b0", 64, {}),
    "eva02_tiny": ("eva02_tiny_patch14_224", 28, dict(img_size=28, depth=2)),
}


def setup_paths(extra_path=None, shim="auto"):
    """Puts `extra_path` (os.pathsep-separated directories, where timm is installed) first on
    sys.path, and the torchvision stand-in (timm_shim/) when `shim` is "yes", or "auto" and
    no real torchvision imports. Returns whether the stand-in is used."""
    for d in reversed([d for d in (extra_path or "").split(os.pathsep) if d]):
        if d not in sys.path:
            sys.path.insert(0, os.path.abspath(d))
    use = shim == "yes"
    if shim == "auto":
        try:
            import torchvision  # noqa: F401
        except Exception:
            for mod in [m for m in sys.modules if m == "torchvision" or
                        m.startswith("torchvision.")]:
                del sys.modules[mod]
            use = True
    if use:
        sys.path.insert(0, os.path.join(HERE, "timm_shim"))
    return use


def build(name, channels_last=False):
    """The model `name` (random weights from a seed, a cross-entropy loss: the forward returns
    an object with `.loss`) and `inputs(step)` (the same tensors for the same step); with
    `channels_last`, the model's parameters and the images in that memory format."""
    import types

    import timm
    import torch
    import torch.nn.functional as F

    timm_name, size, extra = MODELS[name]

    def make():
        kw = dict(pretrained=False, num_classes=CLASSES, **extra)
        # dropout and drop-path for the train step, where the model takes them
        for drops in (dict(drop_rate=DROP, drop_path_rate=DROP), dict(drop_rate=DROP), {}):
            torch.manual_seed(0)
            try:
                if callable(timm_name):
                    return timm_name(timm, **kw, **drops)
                return timm.create_model(timm_name, **kw, **drops)
            except TypeError as err:
                if "drop" not in str(err):
                    raise
        raise AssertionError("unreachable")

    class WithLoss(torch.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, pixel_values, labels):
            logits = self.net(pixel_values)
            if isinstance(logits, (tuple, list)):  # distilled heads in train mode
                logits = sum(logits) / len(logits)
            return types.SimpleNamespace(loss=F.cross_entropy(logits, labels))

    model = WithLoss(make()).float()
    _calibrate_batch_norms(model.net, size)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    if channels_last:
        model = model.to(memory_format=fmt)

    def inputs(step):
        g = torch.Generator().manual_seed(1000 + step)
        images = torch.randn(BATCH, 3, size, size, generator=g)
        return dict(pixel_values=images.contiguous(memory_format=fmt),
                    labels=torch.randint(0, CLASSES, (BATCH,), generator=g))

    return model, inputs


def _calibrate_batch_norms(net, size):
    """Gives every batch norm running statistics of the model's own activations: the
    cumulative average over CALIBRATION forwards in train mode, without gradients, on other
    random images. With the initial ones (mean 0, variance 1) an eval-mode forward of a
    deep convnet is unnormalized: logits and gradients reached 1e13 (MobileOne), so that
    float32 rounding was far above the tolerance, and one SGD step took the parameters to
    NaN. Returns how many batch norms there are."""
    import torch

    norms = [m for m in net.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
             and m.track_running_stats]
    if not norms:
        return 0
    momenta = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average
    g = torch.Generator().manual_seed(999)
    net.train()
    forwards, batch = CALIBRATION
    with torch.no_grad():
        for _ in range(forwards):
            net(torch.randn(batch, 3, size, size, generator=g))
    for m, momentum in zip(norms, momenta):
        m.momentum = momentum
    return len(norms)


def run_model(name, backend="cpu", steps=model_sweep.STEPS, train_step=True,
              timing_calls=model_sweep.TIMING_CALLS, autocast=None, channels_last=False):
    """model_sweep.run_model for a timm model: a record dict (see model_sweep's doc)."""
    try:
        model, inputs = build(name, channels_last)
    except Exception as err:
        return model_sweep._new_record(name, backend, result="eager-failed",
                                       error=f"build: {type(err).__name__}: {err}"[:2000])
    return model_sweep.run_built(name, model, inputs, backend, steps, train_step, timing_calls,
                                 max_update=MAX_UPDATE, autocast=autocast)


def probe(names):
    """One eager forward and backward per model (train mode): parameters, seconds, or why not."""
    import torch

    for name in names:
        t0 = time.perf_counter()
        try:
            model, inputs = build(name)
            model.train()
            model(**inputs(0)).loss.backward()
            params = sum(p.numel() for p in model.parameters())
            print(f"{name}: ok, {params / 1e6:.2f} M parameters, "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)
        except Exception as err:
            print(f"{name}: FAILED {type(err).__name__}: {str(err)[:300]}", flush=True)
        torch.manual_seed(0)


def _child(args):
    import json

    import timm
    import torch

    torch.set_num_threads(args.threads)  # as model_sweep: one intra-op thread by default
    if args.one not in MODELS:
        raise SystemExit(f"unknown model {args.one}")
    record = run_model(args.one, backend=args.backend, autocast=args.autocast,
                       channels_last=args.channels_last)
    record["timm"] = timm.__version__
    record["autocast"], record["channels_last"] = args.autocast, args.channels_last
    made = MODELS[args.one][0]
    record["timm_model"] = made if isinstance(made, str) else made.__name__
    with open(args.out, "w") as f:
        json.dump(record, f)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", help="comma-separated subset of: " + ",".join(MODELS))
    ap.add_argument("--backend", default="cpu", choices=["cpu", "eager"])
    ap.add_argument("--extra-path", default="",
                    help=f"directories ({os.pathsep}-separated) put first on sys.path: where "
                         "timm is installed (pip install --target DIR timm --no-deps)")
    ap.add_argument("--shim", default="auto", choices=["auto", "yes", "no"],
                    help="the torchvision stand-in in timm_shim/ (auto: when torchvision "
                         "does not import)")
    ap.add_argument("--probe", action="store_true",
                    help="only build each model and run one eager backward")
    ap.add_argument("--channels-last", action="store_true",
                    help="model and images in torch.channels_last memory format (both sides)")
    model_sweep.add_sweep_args(ap)
    args = ap.parse_args(argv)
    names = args.models.split(",") if args.models else list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        ap.error(f"unknown models: {unknown}")
    if args.one or args.probe:
        setup_paths(args.extra_path, args.shim)
        return _child(args) if args.one else probe(names)
    print(model_sweep.HEADER, flush=True)
    results = model_sweep.sweep(
        names, args.backend, args.timeout, args.keep_cache, args.threads,
        log=lambda line: print(line, flush=True), script=os.path.abspath(__file__),
        child_args=["--extra-path", args.extra_path, "--shim", args.shim,
                    "--autocast", args.autocast] + ["--channels-last"] * args.channels_last)
    model_sweep.report(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
