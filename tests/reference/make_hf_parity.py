#!/usr/bin/env python3
"""make_hf_parity.py: a tiny Hugging Face Llama checkpoint for keel's importer.

Writes what tests/hf/test_hf_parity.c imports and compares against:

  fixtures/hf_tiny/config.json, model.safetensors, generation_config.json
        LlamaForCausalLM(hidden 64, 2 layers, 4 heads, 2 kv heads, vocab 128,
        intermediate 96, max_position_embeddings 32, untied head) as
        save_pretrained(safe_serialization=True) writes it, in bfloat16
  fixtures/hf_tiny/tokens.json    (2, 33) token ids: max_position_embeddings + 1
                                  per row, the (n_seqs, T+1) keel's forward takes
  fixtures/hf_tiny/expected.json  transformers' loss on them
  fixtures/hf_tiny_llama3/        the same for a Llama 3.x in small: rope_theta
                                  500000, rope_scaling of type llama3, tied
                                  embeddings (VARIANTS below)

intermediate_size 96 is below Llama's 8/3 * hidden rule (192 here), so the
import has to find keel's (multiple_of, ffn_dim_multiplier) for it, and the
file has no keel_* hints. The weights are drawn in float32, rounded to
bfloat16 and saved in bfloat16 (exact); the reference loss is the float32
model (eager attention) on those same rounded weights, so keel's float32
forward should match it to float32 rounding.

The loss is transformers' own: model(input_ids=tokens, labels=tokens).loss,
the mean cross-entropy of logits[:, :-1] against tokens[:, 1:] over the 2 * 32
predicted positions; causal attention makes the logits of positions 0..31
independent of the 33rd token, so this is exactly keel's loss on
inputs tokens[:, :32], targets tokens[:, 1:].

Run with the venv of scripts/setup-torch.sh (never needed by CI):

    /opt/keel-torch/bin/python tests/reference/make_hf_parity.py

With --check-export DIR it instead loads a directory written by
keel_hf_export with transformers and prints its loss on the fixture's tokens
(a manual check that keel's export loads in transformers).
"""
import argparse
import json
import os
import sys

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "hf_tiny"
CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
              rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
              attention_bias=False, mlp_bias=False, hidden_act="silu")
# Llama 3.x in small: rope_theta 500000, Llama 3's rope_scaling, tied embeddings (3.2 1B/3B).
# original_max_position_embeddings 64 with high_freq_factor 4 and low_freq_factor 1 puts RoPE's
# wavelengths (2 pi to 2 pi 500000^(7/8) at head size 16; 128 positions, as transformers wants the original
# context below max_position_embeddings) in all three of its bands: pair 0
# (6.3 < 64/4) kept, pair 1 (33) blended, pairs 2-7 (> 64) divided by factor.
VARIANTS = {
    NAME: CONFIG,
    "hf_tiny_llama3": dict(CONFIG, rope_theta=500000.0, tie_word_embeddings=True, max_position_embeddings=128,
                           rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                             high_freq_factor=4.0, original_max_position_embeddings=64)),
}
N_SEQS = 2
WEIGHT_STD = 0.2  # large enough that softmax, SiLU and RMSNorm all bend
NORM_STD = 0.1    # norm weights ~ N(1, 0.1)
SEED = 20240917
MAX_FIXTURE_BYTES = 200_000


def build(dtype, config):
    cfg = LlamaConfig(**config)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(dtype)
    assert model.config._attn_implementation == "eager"
    return model


def randomize(model):
    """Our own generator, rounded to bfloat16 so the bfloat16 file is exact."""
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            r = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            w = 1.0 + NORM_STD * r if p.dim() == 1 else WEIGHT_STD * r
            p.copy_(w.to(torch.bfloat16).to(p.dtype))


def hf_loss(model, tokens):
    with torch.no_grad():
        out = model(input_ids=tokens, labels=tokens)
        logits = model(input_ids=tokens[:, :-1]).logits
        V = logits.shape[-1]
        manual = torch.nn.functional.cross_entropy(logits.reshape(-1, V).double(),
                                                   tokens[:, 1:].reshape(-1))
    return out.loss.item(), manual.item()


def make(out_root, name):
    config = VARIANTS[name]
    out = os.path.join(out_root, name)
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        os.remove(os.path.join(out, f))

    model = build(torch.float32, config)
    randomize(model)
    gen = torch.Generator().manual_seed(SEED + 1)
    T = config["max_position_embeddings"]
    tokens = torch.randint(0, config["vocab_size"], (N_SEQS, T + 1), generator=gen,
                           dtype=torch.int64)
    loss, manual = hf_loss(model, tokens)

    model64 = build(torch.float64, config)
    model64.load_state_dict(model.state_dict())
    _, loss64 = hf_loss(model64, tokens)  # .loss upcasts logits to float32 only

    bf16 = build(torch.bfloat16, config)
    bf16.load_state_dict(model.state_dict())
    bf16.save_pretrained(out, safe_serialization=True)

    # The file must hold exactly the weights the loss was computed with.
    back = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
    ref = model.state_dict()
    for k, v in back.state_dict().items():
        assert torch.equal(v, ref[k]), k
    assert hf_loss(back, tokens)[0] == loss

    with open(os.path.join(out, "tokens.json"), "w") as f:
        json.dump(tokens.tolist(), f)
        f.write("\n")
    expected = {
        "generator": "tests/reference/make_hf_parity.py",
        "torch": torch.__version__, "transformers": transformers.__version__,
        "reference": "LlamaForCausalLM float32 (bf16-rounded weights), attn_implementation=eager",
        "n_seqs": N_SEQS, "T": T,
        "mean_loss": loss,
        "mean_loss_manual_fp64_xent": manual,
        "mean_loss_fp64_model_fp64_xent": loss64,
        # RoPE's inverse frequencies as transformers' rotary embedding holds them (float32, exact)
        "inv_freq": [float(x) for x in model.model.rotary_emb.inv_freq.float()],
    }
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(out, x)) for x in os.listdir(out))
    n = sum(p.numel() for p in model.parameters())
    print(f"{name}: {n} params, loss {loss:.7f} (manual {manual:.7f}, fp64 model {loss64:.7f}), "
          f"{size} bytes: {sorted(os.listdir(out))}")
    assert size < MAX_FIXTURE_BYTES, size


def check_export(path, out_root, name=NAME):
    with open(os.path.join(out_root, name, "tokens.json")) as f:
        tokens = torch.tensor(json.load(f), dtype=torch.int64)
    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    loss, manual = hf_loss(model, tokens)
    print(json.dumps({"dir": path, "mean_loss": loss, "mean_loss_manual_fp64_xent": manual,
                      "params": sum(p.numel() for p in model.parameters()),
                      "tied": model.config.tie_word_embeddings}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "fixtures"))
    ap.add_argument("--check-export", metavar="DIR")
    ap.add_argument("--variant", choices=sorted(VARIANTS), action="append",
                    help="the fixture(s) to write (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.check_export:
        check_export(args.check_export, args.out)
    else:
        for name in args.variant or sorted(VARIANTS):
            make(args.out, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
