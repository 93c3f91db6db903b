"""Kernels with the same code are compiled once.

A network that repeats a block at one size (ResNet's second block of each stage, the
inverted residuals of MobileNet with equal widths) gets one kernel per repetition, the
same function under another name. LLVM compiled each of them; on the bench's dumped
`split` stages, 7 of ResNet18's 21 kernels (34% of the kernel lines) and 9 of
MobileNetV3's 52 (16%) were copies. After `split`, each kernel that prints the same as an
earlier one, its name aside, is dropped from the kernel module, and the runtime calls the
earlier one's entry point for it (`abi.Kernel(symbol=...)`). The host function is not
changed: it still calls every kernel by its own name, so profiles, logs and the kernel
choices stay per call site.
"""

from torch_mlir import ir

from camlir.dialects.ca.ir_helpers import func_name, funcs


def merge_identical(kernel_module: ir.Module) -> dict:
    """Erases from `kernel_module` every function whose text, with its name replaced, equals
    an earlier one's; returns {erased name: the kept name}."""
    kept: dict = {}
    aliases: dict = {}
    for fn in funcs(kernel_module):
        name = func_name(fn)
        # The name appears once, in the signature (a kernel calls no kernel); "@name(" is
        # replaced so that a longer name that starts with it is not touched.
        text = fn.get_asm(assume_verified=True).replace(f"@{name}(", "@_(", 1)
        first = kept.setdefault(text, name)
        if first != name:
            aliases[name] = first
            fn.erase()
    return aliases
