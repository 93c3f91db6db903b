"""The benchmark's workloads. `build(name)` returns a fresh, seeded `Workload`.

Every call with the same name builds the same parameters and inputs (fixed seeds), so each
variant, running in its own process, gets an identical copy of the model and the same inputs.
`forward(model, inputs)` returns the scalar loss; only the backward of that loss is timed.

- W1: nn.Linear(10, 10), input (1, 10), loss = out.sum()  (overhead-bound)
- W2: MLP, 4 x (Linear(1024, 1024) + GELU), batch 64, loss = out.sum()
- W3: nn.TransformerEncoderLayer(256, 4, dim_feedforward=1024, dropout=0.0, batch_first=True),
      input (8, 128, 256), loss = out.sum()
- W4: W2 with the tensor hook `lambda g: g * 0.5` on every parameter
- W5: W2 whose forward is torch.compile'd (backend FORWARD_BACKEND) with one
      torch._dynamo.graph_break() between layers 2 and 3; compiled for every variant
- CNN: conv 3->16 3x3 pad 1, BatchNorm2d, ReLU, max_pool2d 2, flatten, Linear -> 10,
       cross-entropy; input (32, 3, 32, 32)
- Transformer: Embedding(1000, 128), 2 x TransformerEncoderLayer(128, 4, 512, dropout=0,
       batch_first=True), Linear head -> 1000, cross-entropy; tokens (8, 64)
"""

from dataclasses import dataclass
from typing import Any, Callable, Tuple

# Nothing here imports torch at module level: the driver (bench.run) reads NAMES without it.
NAMES = ("W1", "W2", "W3", "W4", "W5", "CNN", "Transformer")
FORWARD_BACKEND = "aot_eager"  # backend of W5's compiled forward, the same for every variant


@dataclass
class Workload:
    name: str
    model: Any  # torch.nn.Module
    inputs: Tuple[Any, ...]  # tensors
    forward: Callable  # forward(model, inputs) -> scalar loss


def _sum_of_output(model, inputs):
    return model(*inputs).sum()


def _cross_entropy(model, inputs):
    from torch.nn.functional import cross_entropy

    x, target = inputs
    logits = model(x)
    return cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def build(name: str) -> Workload:
    import torch
    from torch import nn

    if name not in NAMES:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(NAMES)}")

    def mlp():
        return nn.Sequential(*[nn.Sequential(nn.Linear(1024, 1024), nn.GELU()) for _ in range(4)])

    def mlp_with_graph_break(model, inputs):
        # Unrolled: a graph break inside a loop makes dynamo skip the whole frame.
        (x,) = inputs
        x = model[1](model[0](x))
        torch._dynamo.graph_break()
        x = model[3](model[2](x))
        return x.sum()

    def encoder_layer(dim, heads, ff):
        return nn.TransformerEncoderLayer(dim, heads, dim_feedforward=ff, dropout=0.0,
                                          batch_first=True)

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    randn = lambda *shape: torch.randn(*shape, generator=generator)  # noqa: E731
    randint = lambda high, shape: torch.randint(0, high, shape, generator=generator)  # noqa: E731
    forward = _sum_of_output
    if name == "W1":
        model = nn.Linear(10, 10)
        inputs = (randn(1, 10),)
    elif name in ("W2", "W4", "W5"):
        model = mlp()
        inputs = (randn(64, 1024),)
    elif name == "W3":
        model = encoder_layer(256, 4, 1024)
        inputs = (randn(8, 128, 256),)
    elif name == "CNN":
        model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                              nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 16 * 16, 10))
        inputs = (randn(32, 3, 32, 32), randint(10, (32,)))
        forward = _cross_entropy
    else:  # Transformer: a tiny language model
        model = nn.Sequential(nn.Embedding(1000, 128), encoder_layer(128, 4, 512),
                              encoder_layer(128, 4, 512), nn.Linear(128, 1000))
        inputs = (randint(1000, (8, 64)), randint(1000, (8, 64)))
        forward = _cross_entropy
    if name == "W4":
        for p in model.parameters():
            p.register_hook(lambda g: g * 0.5)
    if name == "W5":
        forward = torch.compile(mlp_with_graph_break, backend=FORWARD_BACKEND)
    model.train()
    return Workload(name, model, inputs, forward)
