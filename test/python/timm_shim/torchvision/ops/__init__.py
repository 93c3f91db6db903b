# stand-in (see torchvision/__init__.py): only ops.misc.FrozenBatchNorm2d
