"""Which inputs of a backward the compiled backends pass as contiguous permutations.

Kernels take contiguous buffers; saved tensors such as `W.t()` are transposed views.
Copying them would cost as much as a matmul, and ignoring their strides gives silently
wrong gradients (seen in the e2e probe). So an input that is a permutation of a contiguous
tensor (any dense layout) is passed as `t.permute(p)`, a view with no copy, and
`ca-specialize-layouts` permutes it back in the IR, where the compiler folds the permute
into its user. Layouts are part of what a compiled variant assumes: the kernel boundary
re-checks contiguity on every call and copies if a later call differs, so a changed layout
costs time, never correctness.
"""

from typing import Optional

import torch


def dense_permutation(t: torch.Tensor) -> Optional[tuple]:
    """`p` such that `t.permute(p)` is contiguous, or None when no permutation does."""
    if t.dim() < 2:
        return None
    p = tuple(sorted(range(t.dim()), key=lambda d: (-t.stride(d), d)))
    if p == tuple(range(t.dim())):
        return None
    # From sizes and strides alone: `t.permute(p)` would check them against the storage,
    # which FSDP2 frees between forward and backward (a resharded parameter's storage has
    # size 0 until its all-gather, inside the backward).
    expected = 1
    for d in reversed(p):
        if t.shape[d] != 1 and t.stride(d) != expected:
            return None
        expected *= t.shape[d]
    return p


def input_permutations(arg_types: list, args: list, runtime_sizes: bool = False) -> list:
    """Per argument, the permutation to pass it with (None: as it is). Only statically
    shaped value tensors that are not contiguous qualify; with `runtime_sizes` (a program
    compiled with dynamic dims) value tensors with `?` dims too."""
    perms = []
    for t, value in zip(arg_types, args):
        text = str(t)
        ok = (isinstance(value, torch.Tensor) and not value.is_contiguous()
              and text.startswith("!torch.vtensor<[") and (runtime_sizes or "?" not in text))
        perms.append(dense_permutation(value) if ok else None)
    return perms + [None] * (len(arg_types) - len(perms))
