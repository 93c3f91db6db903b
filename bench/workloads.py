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

Real models (third-party architectures, random init, nothing downloaded). The Hugging Face ones
need the `bench` extra (`transformers`); a workload whose package is missing is skipped by the
driver (see `missing`). All use 2 layers, width 128, 4 heads, vocabulary 1000, dropout 0 and
`attn_implementation="eager"`, tokens (4, 64), loss = the model's own loss:
- GPT2: GPT2LMHeadModel, causal-LM loss (labels = input ids)
- Llama: LlamaForCausalLM (2 key/value heads, MLP 256), causal-LM loss
- BERT: BertForMaskedLM (MLP 512), masked-LM loss on ~15% of the positions (the others -100)
- T5: T5ForConditionalGeneration (2 encoder + 2 decoder layers, d_kv 32, MLP 256),
      seq2seq loss; decoder inputs are the labels shifted right
- GPT2-bf16: GPT2 with its forward under `torch.autocast("cpu", dtype=torch.bfloat16)`
      (float32 parameters, bf16 matmuls and activations: mixed-precision training); its
      gradients are checked at bf16's tolerance (`TOLERANCE`)
- ResNet18, MobileNetV3: bench/vision_models.py (written from the papers; torchvision does not
      import beside this torch), 10 classes, cross-entropy; images (8, 3, 64, 64), BatchNorm
      in training mode
"""

from dataclasses import dataclass
from typing import Any, Callable, Tuple

# Nothing here imports torch at module level: the driver (bench.run) reads NAMES without it.
NAMES = ("W1", "W2", "W3", "W4", "W5", "CNN", "Transformer",
         "GPT2", "Llama", "BERT", "T5", "ResNet18", "MobileNetV3", "GPT2-bf16")
REAL_MODELS = ("GPT2", "Llama", "BERT", "T5", "ResNet18", "MobileNetV3", "GPT2-bf16")
DEFAULT = NAMES[:7]  # what `python -m bench.run` runs without --workloads: the real models are opt-in
REQUIRES = {name: "transformers" for name in ("GPT2", "Llama", "BERT", "T5", "GPT2-bf16")}  # beyond torch
# (rtol, atol, atol as a fraction of the gradient's largest entry) of the first-step check
# where float32's (bench.run's RTOL, ATOL) does not apply: bf16 matmuls round their outputs,
# and eager's bf16 kernels and camlir's (f32 matmuls of the bf16 operands) round differently.
TOLERANCE = {"GPT2-bf16": (1.6e-2, 1e-5, 2e-2)}
INSTALL_HINT = "pip install -e '.[bench]' (see bench/README.md)"
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


def missing(name: str):
    """Why `name` cannot be built here (a package it needs is not installed), or None.
    Does not import torch or the package itself."""
    import importlib.util

    package = REQUIRES.get(name)
    if package and importlib.util.find_spec(package) is None:
        return f"{name} needs the package {package!r}, which is not installed: {INSTALL_HINT}"
    return None


def _hf_loss(model, inputs):
    input_ids, labels = inputs
    return model(input_ids=input_ids, labels=labels).loss


def _autocast_bf16(forward):
    import torch

    def under_autocast(model, inputs):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return forward(model, inputs)
    return under_autocast


def _hf_model(name: str):
    """A small Hugging Face model with random weights, built from a config (no download)."""
    import transformers

    common = dict(vocab_size=1000, attn_implementation="eager", pad_token_id=0, bos_token_id=1,
                  eos_token_id=2)
    if name == "GPT2":
        config = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, n_positions=128,
                                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common)
        return transformers.GPT2LMHeadModel(config)
    if name == "Llama":
        config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=4,
                                          num_key_value_heads=2, intermediate_size=256,
                                          max_position_embeddings=128, attention_dropout=0.0, **common)
        return transformers.LlamaForCausalLM(config)
    if name == "BERT":
        config = transformers.BertConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=4,
                                         intermediate_size=512, max_position_embeddings=128,
                                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                         **common)
        return transformers.BertForMaskedLM(config)
    if name == "T5":
        config = transformers.T5Config(num_layers=2, num_decoder_layers=2, d_model=128, d_kv=32, d_ff=256,
                                       num_heads=4, dropout_rate=0.0, decoder_start_token_id=0, **common)
        return transformers.T5ForConditionalGeneration(config)
    raise ValueError(name)


def build(name: str) -> Workload:
    import torch
    from torch import nn

    if name not in NAMES:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(NAMES)}")
    reason = missing(name)
    if reason:
        raise ModuleNotFoundError(reason)

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
    elif name in REQUIRES:  # Hugging Face language models
        model = _hf_model(name.split("-")[0])
        tokens = randint(1000, (4, 64))
        labels = randint(1000, (4, 64))
        if name in ("GPT2", "Llama", "GPT2-bf16"):
            labels = tokens  # next-token prediction; the model shifts the labels itself
        elif name == "BERT":  # masked LM: ~15% of positions masked (token 3) and scored
            masked = torch.rand(4, 64, generator=generator) < 0.15
            labels = torch.where(masked, tokens, torch.full_like(tokens, -100))
            tokens = torch.where(masked, torch.full_like(tokens, 3), tokens)
        inputs = (tokens, labels)
        forward = _hf_loss if name != "GPT2-bf16" else _autocast_bf16(_hf_loss)
    elif name in ("ResNet18", "MobileNetV3"):
        from bench import vision_models

        model = vision_models.ResNet18(10) if name == "ResNet18" else vision_models.MobileNetV3Small(10)
        inputs = (randn(8, 3, 64, 64), randint(10, (8,)))
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
