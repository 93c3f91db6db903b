"""Backward-pass benchmark: eager PyTorch vs PyTorch's Compiled Autograd vs camlir (`python -m bench.run`)."""
