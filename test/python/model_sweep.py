"""Differential sweep over Hugging Face `transformers` architectures (a long run, not CI).

    nice -n 10 .venv/bin/python test/python/model_sweep.py [--models A,B] [--backend cpu|eager]
        [--timeout 300] [--json out.json] [--keep-cache] [--threads 1]

Each architecture is built from a tiny random config (2 layers, width 32, vocabulary 99,
nothing downloaded), seeded, and copied. One copy runs its backward with PyTorch's engine,
the other inside `camlir.enable(backend=...)`. Every parameter gradient is compared with
`torch.testing.assert_close(rtol=1e-4, atol=1e-5)` and the largest difference is recorded.

Per model, in this order:
  - 3 steps in eval mode (dropout off); the inputs change every step and, after each step,
    both copies take the same SGD step (with the eager gradients), so parameter values
    change too;
  - 1 step in train mode with the config's dropout on: the RNG is re-seeded before each
    copy's forward, so both draw the same dropout masks (the forward is eager in both).

Every model runs in its own subprocess with a timeout, one at a time, so a crash or a hang
is recorded instead of ending the sweep. Results:
  ok          every gradient matches
  WRONG       a gradient differs beyond the tolerance (or is missing on one side)
  CRASH       the camlir run raised, or the subprocess died
  HANG        the subprocess passed the timeout
  eager-failed  the model did not build or its eager backward failed (not camlir's fault)
  skip        the architecture is not in this transformers version

Also recorded: camlir's counters after the run (native = every backward compiled, no
fallback, nothing interpreted), the first backward's seconds (capture + compile; the
compiled-program cache is a fresh temporary directory unless --keep-cache), and the steady
backward time relative to eager: after the eval steps, 12 more backwards on each side (one
input, alternating), the fastest camlir backward over the fastest eager one, the first call
of each left out (the fastest, because the machine is shared; camlir's per-kernel choice
alternates native code and torch ops over these calls and keeps the faster).

The functions `build`, `run_model` and `MODELS` are used by test_model_sweep.py.
"""

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time

RTOL, ATOL = 1e-4, 1e-5
VOCAB = 99
BATCH, SEQ = 2, 12
STEPS = 3
TIMING_CALLS = 12  # camlir backwards per structure stay under graph_choice's 16


# ----------------------------------------------------------------------------- configs

def _text_common():
    return dict(vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _bert_like(cfg_cls, model_cls, **extra):
    def make(t):
        kw = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64,
                  max_position_embeddings=64, type_vocab_size=2, **_text_common())
        kw.update(extra)
        return getattr(t, model_cls)(getattr(t, cfg_cls)(**kw))
    return make, "mlm"


def _decoder(cfg_cls, model_cls, **extra):
    def make(t):
        kw = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64,
                  max_position_embeddings=64, **_text_common())
        kw.update(extra)
        return getattr(t, model_cls)(getattr(t, cfg_cls)(**kw))
    return make, "clm"


def _explicit(model_cls, cfg_cls, kind, **kw):
    def make(t):
        return getattr(t, model_cls)(getattr(t, cfg_cls)(**kw))
    return make, kind


_T = _text_common()
_VISION = dict(image_size=32, num_channels=3, num_labels=5)

# name -> (builder(transformers) -> model, input kind)
MODELS = {
    # encoders (masked LM)
    "BERT": _bert_like("BertConfig", "BertForMaskedLM"),
    "RoBERTa": _bert_like("RobertaConfig", "RobertaForMaskedLM"),
    "DistilBERT": _explicit("DistilBertForMaskedLM", "DistilBertConfig", "mlm", n_layers=2, dim=32,
                            n_heads=4, hidden_dim=64, max_position_embeddings=64, vocab_size=VOCAB,
                            pad_token_id=0),
    "ALBERT": _bert_like("AlbertConfig", "AlbertForMaskedLM", embedding_size=16),
    "ELECTRA": _bert_like("ElectraConfig", "ElectraForMaskedLM", embedding_size=16),
    "DeBERTa-v2": _bert_like("DebertaV2Config", "DebertaV2ForMaskedLM", relative_attention=True,
                             position_buckets=8, pos_att_type=["p2c", "c2p"]),
    "MPNet": _bert_like("MPNetConfig", "MPNetForMaskedLM"),
    "BERT-cls": _explicit("BertForSequenceClassification", "BertConfig", "cls", num_hidden_layers=2,
                          hidden_size=32, num_attention_heads=4, intermediate_size=64,
                          max_position_embeddings=64, num_labels=3, **_T),
    # decoders (causal LM)
    "GPT-2": _explicit("GPT2LMHeadModel", "GPT2Config", "clm", n_layer=2, n_embd=32, n_head=4,
                       n_positions=64, **_T),
    "GPT-Neo": _explicit("GPTNeoForCausalLM", "GPTNeoConfig", "clm", num_layers=2, hidden_size=32,
                         num_heads=4, attention_types=[[["global", "local"], 1]], window_size=4,
                         max_position_embeddings=64, **_T),
    "GPT-J": _explicit("GPTJForCausalLM", "GPTJConfig", "clm", n_layer=2, n_embd=32, n_head=4,
                       rotary_dim=4, n_positions=64, **_T),
    "GPT-NeoX": _decoder("GPTNeoXConfig", "GPTNeoXForCausalLM"),
    "CodeGen": _explicit("CodeGenForCausalLM", "CodeGenConfig", "clm", n_layer=2, n_embd=32,
                         n_head=4, rotary_dim=4, n_positions=64, n_ctx=64, **_T),
    "OPT": _explicit("OPTForCausalLM", "OPTConfig", "clm", num_hidden_layers=2, hidden_size=32,
                     num_attention_heads=4, ffn_dim=64, word_embed_proj_dim=32,
                     max_position_embeddings=64, **_T),
    "BLOOM": _explicit("BloomForCausalLM", "BloomConfig", "clm", n_layer=2, hidden_size=32,
                       n_head=4, **_T),
    "Falcon": _explicit("FalconForCausalLM", "FalconConfig", "clm", num_hidden_layers=2,
                        hidden_size=32, num_attention_heads=4, new_decoder_architecture=False,
                        multi_query=True, alibi=False, **_T),
    "MPT": _explicit("MptForCausalLM", "MptConfig", "clm", n_layers=2, d_model=32, n_heads=4,
                     max_seq_len=64, vocab_size=VOCAB, pad_token_id=0),
    "Llama": _decoder("LlamaConfig", "LlamaForCausalLM", num_key_value_heads=2),
    "Mistral": _decoder("MistralConfig", "MistralForCausalLM", num_key_value_heads=2,
                        sliding_window=8),
    "Mixtral": _decoder("MixtralConfig", "MixtralForCausalLM", num_key_value_heads=2,
                        num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
    "Qwen2": _decoder("Qwen2Config", "Qwen2ForCausalLM", num_key_value_heads=2),
    "Qwen2-MoE": _decoder("Qwen2MoeConfig", "Qwen2MoeForCausalLM", num_key_value_heads=2,
                          num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                          shared_expert_intermediate_size=32),
    "Phi": _decoder("PhiConfig", "PhiForCausalLM", partial_rotary_factor=0.5),
    "Phi-3": _decoder("Phi3Config", "Phi3ForCausalLM", num_key_value_heads=2),
    "Gemma": _decoder("GemmaConfig", "GemmaForCausalLM", num_key_value_heads=2, head_dim=8),
    "Gemma2": _decoder("Gemma2Config", "Gemma2ForCausalLM", num_key_value_heads=2, head_dim=8,
                       sliding_window=8),
    "StableLM": _decoder("StableLmConfig", "StableLmForCausalLM", num_key_value_heads=2),
    # encoder-decoders (seq2seq LM)
    "T5": _explicit("T5ForConditionalGeneration", "T5Config", "s2s", num_layers=2,
                    num_decoder_layers=2, d_model=32, d_kv=8, d_ff=64, num_heads=4,
                    relative_attention_num_buckets=8, decoder_start_token_id=0, **_T),
    "BART": _explicit("BartForConditionalGeneration", "BartConfig", "s2s", encoder_layers=2,
                      decoder_layers=2, d_model=32, encoder_attention_heads=4,
                      decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                      max_position_embeddings=64, decoder_start_token_id=2, **_T),
    "Marian": _explicit("MarianMTModel", "MarianConfig", "s2s", encoder_layers=2, decoder_layers=2,
                        d_model=32, encoder_attention_heads=4, decoder_attention_heads=4,
                        encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                        decoder_start_token_id=0, decoder_vocab_size=VOCAB, **_T),
    "Pegasus": _explicit("PegasusForConditionalGeneration", "PegasusConfig", "s2s",
                         encoder_layers=2, decoder_layers=2, d_model=32,
                         encoder_attention_heads=4, decoder_attention_heads=4,
                         encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                         decoder_start_token_id=0, **_T),
    # vision (image classification)
    "ViT": _explicit("ViTForImageClassification", "ViTConfig", "image", patch_size=8,
                     num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                     intermediate_size=64, **_VISION),
    "DeiT": _explicit("DeiTForImageClassification", "DeiTConfig", "image", patch_size=8,
                      num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                      intermediate_size=64, **_VISION),
    "BEiT": _explicit("BeitForImageClassification", "BeitConfig", "image", patch_size=8,
                      num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                      intermediate_size=64, use_relative_position_bias=True, **_VISION),
    "Swin": _explicit("SwinForImageClassification", "SwinConfig", "image", patch_size=4,
                      embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4, **_VISION),
    "ConvNeXt": _explicit("ConvNextForImageClassification", "ConvNextConfig", "image",
                          hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, **_VISION),
    "ResNet": _explicit("ResNetForImageClassification", "ResNetConfig", "image", embedding_size=16,
                        hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic",
                        num_channels=3, num_labels=5),
    "MobileViT": _explicit("MobileViTForImageClassification", "MobileViTConfig", "image",
                           image_size=32, patch_size=2, hidden_sizes=[16, 24, 32],
                           neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64], num_attention_heads=2,
                           num_channels=3, num_labels=5),
    # audio, multimodal
    "Wav2Vec2": _explicit("Wav2Vec2ForCTC", "Wav2Vec2Config", "ctc", num_hidden_layers=2,
                          hidden_size=32, num_attention_heads=4, intermediate_size=64,
                          conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 8),
                          num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4,
                          vocab_size=12, pad_token_id=0, ctc_loss_reduction="mean",
                          mask_time_prob=0.0),
    "Whisper": _explicit("WhisperForConditionalGeneration", "WhisperConfig", "whisper",
                         encoder_layers=2, decoder_layers=2, d_model=32, encoder_attention_heads=4,
                         decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                         num_mel_bins=8, max_source_positions=8, max_target_positions=32,
                         decoder_start_token_id=1, vocab_size=VOCAB, pad_token_id=0,
                         bos_token_id=1, eos_token_id=2),
    "CLIP": _explicit("CLIPModel", "CLIPConfig", "clip",
                      text_config=dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                       intermediate_size=64, vocab_size=VOCAB,
                                       max_position_embeddings=32),
                      vision_config=dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                         intermediate_size=64, image_size=32, patch_size=8),
                      projection_dim=16),
}


def build(name):
    """The model `name` (random weights from a seed, eager attention) and `inputs(step)`, a
    function returning the keyword arguments of step `step` (seeded by the step: every call
    with the same step gives the same tensors). The forward's output has `.loss`."""
    import torch
    import transformers

    make, kind = MODELS[name]
    torch.manual_seed(0)
    model = make(transformers)
    try:
        model.config._attn_implementation = "eager"
    except Exception:
        pass
    model.float()

    def inputs(step):
        g = torch.Generator().manual_seed(1000 + step)
        ids = lambda *shape: torch.randint(3, VOCAB, shape, generator=g)  # noqa: E731
        if kind == "mlm":
            x = ids(BATCH, SEQ)
            masked = torch.rand(BATCH, SEQ, generator=g) < 0.3
            masked[:, 1] = True
            labels = torch.where(masked, x, torch.full_like(x, -100))
            attention = torch.ones(BATCH, SEQ, dtype=torch.long)
            attention[1, -3:] = 0  # padding in the second row
            return dict(input_ids=x, attention_mask=attention, labels=labels)
        if kind == "cls":
            x = ids(BATCH, SEQ)
            return dict(input_ids=x, labels=torch.randint(0, 3, (BATCH,), generator=g))
        if kind == "clm":
            x = ids(BATCH, SEQ)
            return dict(input_ids=x, labels=x)
        if kind == "s2s":
            return dict(input_ids=ids(BATCH, SEQ), labels=ids(BATCH, SEQ - 4))
        if kind == "image":
            return dict(pixel_values=torch.randn(BATCH, 3, 32, 32, generator=g),
                        labels=torch.randint(0, 5, (BATCH,), generator=g))
        if kind == "ctc":
            return dict(input_values=torch.randn(BATCH, 800, generator=g),
                        labels=torch.randint(1, 12, (BATCH, 5), generator=g))
        if kind == "whisper":  # 16 frames -> 8 after the stride-2 conv = max_source_positions
            return dict(input_features=torch.randn(BATCH, 8, 16, generator=g),
                        labels=ids(BATCH, 6))
        if kind == "clip":
            return dict(input_ids=ids(BATCH, SEQ), pixel_values=torch.randn(BATCH, 3, 32, 32,
                                                                            generator=g),
                        return_loss=True)
        raise ValueError(kind)

    return model, inputs


# ----------------------------------------------------------------------------- one model

def _compare(eager_model, camlir_model):
    """(max abs error, list of mismatch messages) over every parameter gradient."""
    import torch

    worst, bad = 0.0, []
    expected = dict(eager_model.named_parameters())
    for pname, p in camlir_model.named_parameters():
        e = expected[pname].grad
        if (p.grad is None) != (e is None):
            bad.append(f"{pname}: grad is None on {'camlir' if p.grad is None else 'eager'} only")
            continue
        if e is None:
            continue
        if p.grad.shape == e.shape and p.grad.numel():
            diff = (p.grad.double() - e.double()).abs()
            worst = max(worst, float(diff.nan_to_num(float("inf")).max()))
        try:
            torch.testing.assert_close(p.grad, e, rtol=RTOL, atol=ATOL)
        except AssertionError as err:
            bad.append(f"{pname}: {str(err).splitlines()[0:4]}")
    return worst, bad


def run_model(name, backend="cpu", steps=STEPS, train_step=True, timing_calls=TIMING_CALLS):
    """Runs the comparison for `name` in this process; returns a dict (see the module doc).
    Exceptions from camlir's side are reported as result CRASH, not raised."""
    import torch

    import camlir

    record = dict(model=name, backend=backend, result=None, max_err=0.0, mismatches=[],
                  counters={}, first_backward_s=None, steady_ratio=None, error=None)
    try:
        model, inputs = build(name)
        twin = copy.deepcopy(model)
    except Exception as err:  # the model itself does not build here
        record.update(result="eager-failed", error=f"build: {type(err).__name__}: {err}"[:2000])
        return record

    params = [p for p in model.parameters() if p.requires_grad]
    twin_params = [p for p in twin.parameters() if p.requires_grad]
    eager_times, camlir_times = [], []
    camlir.reset()

    def one_step(step, train):
        for m in (model, twin):
            m.train(train)
            for p in m.parameters():
                p.grad = None
        kwargs = inputs(step)
        try:
            torch.manual_seed(step)
            loss = model(**kwargs).loss
            t0 = time.perf_counter()
            loss.backward()
            eager_times.append(time.perf_counter() - t0)
        except Exception as err:
            record.update(result="eager-failed", error=f"eager step {step}: {type(err).__name__}: {err}"[:2000])
            return False
        try:
            torch.manual_seed(step)
            loss2 = twin(**kwargs).loss
            t0 = time.perf_counter()
            with camlir.enable(backend=backend):
                loss2.backward()
            camlir_times.append(time.perf_counter() - t0)
        except Exception as err:
            import traceback

            record.update(result="CRASH", error=f"step {step}: {type(err).__name__}: {err}\n"
                          f"{traceback.format_exc()[-3000:]}"[:5000])
            return False
        if not torch.allclose(loss.detach(), loss2.detach(), rtol=1e-6, atol=1e-6):
            record["mismatches"].append(f"step {step}: forward losses differ "
                                        f"({float(loss)} vs {float(loss2)})")
        worst, bad = _compare(model, twin)
        record["max_err"] = max(record["max_err"], worst)
        record["mismatches"] += [f"step {step}{' (train)' if train else ''}: {b}" for b in bad]
        with torch.no_grad():  # the same update on both copies: values change between steps
            for p, q in zip(params, twin_params):
                if p.grad is not None:
                    p -= 1e-2 * p.grad
                    q.copy_(p)
        return True

    def timing(calls):
        """Backward seconds of eager and camlir on one more input, `calls` times each: the
        fastest of the last few, after camlir's per-kernel speed choice has settled
        (docs/speed.md). Fewer calls than graph_choice needs to start comparing with eager."""
        for m in (model, twin):
            m.eval()
        kwargs = inputs(steps + 1)
        times = {"eager": [], "camlir": []}
        for _ in range(calls):
            for side, m in (("eager", model), ("camlir", twin)):
                for p in m.parameters():
                    p.grad = None
                loss = m(**kwargs).loss
                t0 = time.perf_counter()
                if side == "camlir":
                    with camlir.enable(backend=backend):
                        loss.backward()
                else:
                    loss.backward()
                times[side].append(time.perf_counter() - t0)
        # The fastest after the first (the machine is shared, so the median is noise; the
        # fastest of camlir's alternating native/torch-ops timings is what its choice keeps).
        return min(times["camlir"][1:]) / min(times["eager"][1:])

    for step in range(steps):
        if not one_step(step, train=False):
            break
    else:
        if timing_calls > 1:
            try:
                record["steady_ratio"] = round(timing(timing_calls), 2)
            except Exception as err:
                record.update(result="CRASH", error=f"timing: {type(err).__name__}: {err}")
        if train_step and record["result"] is None:
            one_step(steps, train=True)

    record["counters"] = {k: int(v) for k, v in camlir.counters.items()}
    if camlir_times:
        record["first_backward_s"] = round(camlir_times[0], 3)
    c = record["counters"]
    if c.get("fallbacks") or c.get("interpreted"):
        try:
            record["explain"] = camlir.explain_text()[-4000:]
        except Exception as err:
            record["explain"] = f"explain_text failed: {err}"
    if record["result"] is None:
        record["result"] = "WRONG" if record["mismatches"] else "ok"
    record["mismatches"] = record["mismatches"][:20]
    return record


# ----------------------------------------------------------------------------- the sweep

def native(record):
    c = record.get("counters") or {}
    return bool(c.get("compiles", 0) + c.get("disk_cache_hits", 0)) and not c.get("fallbacks") \
        and not c.get("interpreted")


def _child(args):
    import torch
    import transformers

    # One intra-op thread for both sides: on a shared machine OpenMP's spinning threads made
    # single calls (eager's or camlir's) ~300x slower whenever another process ran.
    torch.set_num_threads(args.threads)

    if args.one not in MODELS:
        raise SystemExit(f"unknown model {args.one}")
    name = args.one
    record = run_model(name, backend=args.backend)
    record["transformers"] = transformers.__version__
    with open(args.out, "w") as f:
        json.dump(record, f)


def sweep(names, backend="cpu", timeout=300, keep_cache=False, threads=1, log=print):
    results = []
    cache = None if keep_cache else tempfile.mkdtemp(prefix="camlir-sweep-cache-")
    for name in names:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out = f.name
        env = dict(os.environ)
        if cache:
            env["CAMLIR_CACHE_DIR"] = cache
        cmd = ["nice", "-n", "10", sys.executable, os.path.abspath(__file__), "--one", name,
               "--backend", backend, "--out", out, "--threads", str(threads)]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
            wall = time.perf_counter() - t0
            try:
                with open(out) as f:
                    record = json.load(f)
            except (OSError, ValueError):
                record = dict(model=name, backend=backend, result="CRASH", counters={},
                              error=f"subprocess exit {proc.returncode}: "
                                    f"{(proc.stderr or '')[-3000:]}")
        except subprocess.TimeoutExpired:
            wall = time.perf_counter() - t0
            record = dict(model=name, backend=backend, result="HANG", counters={},
                          error=f"no result after {timeout} s")
        finally:
            if os.path.exists(out):
                os.unlink(out)
        record["wall_s"] = round(wall, 1)
        results.append(record)
        log(_row(record))
    return results


def _row(r):
    c = r.get("counters") or {}
    where = "native" if native(r) else ",".join(
        f"{k}={c[k]}" for k in ("fallbacks", "interpreted") if c.get(k)) or "-"
    err = r.get("max_err")
    return (f"| {r['model']} | {r['result']} | {where} | {c.get('compiles', '-')} | "
            f"{'-' if err is None else f'{err:.1e}'} | {r.get('first_backward_s') or '-'} | "
            f"{r.get('steady_ratio') or '-'} | {r.get('wall_s', '-')} |")


HEADER = ("| model | result | counters | compiles | max grad error | first backward s | "
          "steady / eager | wall s |\n|---|---|---|---|---|---|---|---|")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", help="comma-separated subset of: " + ",".join(MODELS))
    ap.add_argument("--backend", default="cpu", choices=["cpu", "eager"])
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--json", help="write every record here")
    ap.add_argument("--keep-cache", action="store_true",
                    help="use the usual compiled-program cache (default: a fresh one)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        return _child(args)
    names = args.models.split(",") if args.models else list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        ap.error(f"unknown models: {unknown}")
    print(HEADER, flush=True)
    results = sweep(names, args.backend, args.timeout, args.keep_cache, args.threads,
                    log=lambda line: print(line, flush=True))
    counts = {}
    for r in results:
        counts[r["result"]] = counts.get(r["result"], 0) + 1
    print("\n" + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())),
          f"native: {sum(native(r) for r in results)}/{len(results)}")
    for r in results:
        if r["result"] != "ok" or not native(r):
            print(f"\n## {r['model']}: {r['result']}")
            for m in r.get("mismatches") or []:
                print("  ", m)
            if r.get("error"):
                print(r["error"][-1500:])
            if r.get("explain"):
                print(r["explain"][-1500:])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
