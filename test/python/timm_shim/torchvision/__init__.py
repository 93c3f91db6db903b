"""A stand-in for torchvision, for the timm sweep (test/python/timm_sweep.py) only.

Why it exists: timm's model modules import a few torchvision names at module level
(transforms, datasets, io, models, utils, ops.misc.FrozenBatchNorm2d), so `import timm` fails
without torchvision, and a torchvision wheel matching this torch (2.13) was not importable
on the machine the sweep was written on. The sweep builds models with `pretrained=False`
and never calls those names (no data loading, no transforms), so this package gives
dummies for them and a working FrozenBatchNorm2d. timm_sweep.py puts it on sys.path only
when a real torchvision cannot be imported (see --shim there).
"""

__version__ = "0.0-shim"
