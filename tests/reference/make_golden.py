#!/usr/bin/env python3
"""make_golden.py: golden fixtures from Hugging Face transformers' LlamaForCausalLM.

Writes, for a micro Llama 2 (GQA, untied and tied heads), everything that
tests/model/test_golden_pytorch.c compares keel against:

  fixtures/<name>/config.json   keel config (model + train + synthetic data)
  fixtures/<name>/weights.f32   parameters, keel's canonical order, little-endian fp32
  fixtures/<name>/tokens.i32    (B, T+1) little-endian int32
  fixtures/<name>/logits.f32    (B, T, V) logits of inputs tokens[:, :T]
  fixtures/<name>/grads.f32     d(mean loss)/d(params), canonical order
  fixtures/<name>/expected.json loss, tensor table, 10-step AdamW trajectory

Run with the venv of scripts/setup-torch.sh (never needed by CI):

    /opt/keel-torch/bin/python tests/reference/make_golden.py

The reference is transformers in float32 with eager attention, the model CI's
users actually load. The trajectory replays keel's optimizer exactly as
documented in keel/optim.h: PyTorch AdamW, no weight decay on norm weights
and the embedding, clip_grad_norm_, and keel_lr_at's schedule.
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))

MODEL = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, multiple_of=32,
             norm_eps=1e-5, rope_theta=10000.0, max_seq_len=64)
TRAIN = dict(steps=10, micro_batch_size=2, grad_accum_steps=1, lr=1e-2, min_lr=1e-3,
             warmup_steps=3, weight_decay=0.1, beta1=0.9, beta2=0.95, adam_eps=1e-8,
             grad_clip=1.0, threads=2)
WEIGHT_STD = 0.2  # large enough that softmax, SiLU and RMSNorm all bend
NORM_STD = 0.1    # norm weights ~ N(1, 0.1)
SEED = 20240601


def ffn_hidden(m):
    """Llama 2's SwiGLU hidden size; must equal keel_model_ffn_hidden."""
    hidden = 2 * (4 * m["dim"]) // 3
    return m["multiple_of"] * ((hidden + m["multiple_of"] - 1) // m["multiple_of"])


def canonical_names(n_layers, tied):
    """keel's parameter order (include/keel/model.h), with Hugging Face names."""
    names = ["model.embed_tokens.weight"]
    for l in range(n_layers):
        for s in ["input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                  "self_attn.o_proj", "post_attention_layernorm", "mlp.gate_proj",
                  "mlp.up_proj", "mlp.down_proj"]:
            names.append(f"model.layers.{l}.{s}.weight")
    names.append("model.norm.weight")
    if not tied:
        names.append("lm_head.weight")
    return names


def is_norm_or_embedding(name):
    return name.endswith("norm.weight") or name == "model.embed_tokens.weight"


def build_model(tied, dtype):
    m = MODEL
    cfg = LlamaConfig(vocab_size=m["vocab_size"], hidden_size=m["dim"],
                      intermediate_size=ffn_hidden(m), num_hidden_layers=m["n_layers"],
                      num_attention_heads=m["n_heads"], num_key_value_heads=m["n_kv_heads"],
                      max_position_embeddings=m["max_seq_len"], rms_norm_eps=m["norm_eps"],
                      rope_theta=m["rope_theta"], tie_word_embeddings=tied,
                      attention_bias=False, mlp_bias=False, hidden_act="silu",
                      attn_implementation="eager", torch_dtype=torch.float32)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(dtype)
    assert model.config._attn_implementation == "eager", model.config._attn_implementation
    if tied:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    # rope_theta's spelling moved between transformers versions: check it took.
    HS = m["dim"] // m["n_heads"]
    inv_freq = 1.0 / m["rope_theta"] ** (torch.arange(0, HS, 2, dtype=torch.float64) / HS)
    assert torch.allclose(model.model.rotary_emb.inv_freq.double(), inv_freq, rtol=1e-6)
    return model


def randomize(model, tied):
    """Deterministic weights from our own generator, independent of HF's init."""
    gen = torch.Generator().manual_seed(SEED + tied)
    named = dict(model.named_parameters())
    with torch.no_grad():
        for name in canonical_names(MODEL["n_layers"], tied):
            p = named[name]
            r = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            p.copy_(1.0 + NORM_STD * r if p.dim() == 1 else WEIGHT_STD * r)


def flat(model, tied, grads=False):
    named = dict(model.named_parameters())
    parts = []
    for name in canonical_names(MODEL["n_layers"], tied):
        t = named[name].grad if grads else named[name]
        parts.append(t.detach().to(torch.float64).reshape(-1))
    return torch.cat(parts)


def mean_loss(model, tokens):
    logits = model(input_ids=tokens[:, :-1]).logits
    V = logits.shape[-1]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), tokens[:, 1:].reshape(-1))
    return loss, logits


def lr_at(t, step):
    """keel_lr_at (src/optim/optim.c), line for line."""
    if step < t["warmup_steps"]:
        return t["lr"] * (step + 1) / t["warmup_steps"]
    decay_steps = t["steps"] - t["warmup_steps"]
    if decay_steps <= 1:
        return t["lr"]
    progress = min(1.0, (step - t["warmup_steps"]) / (decay_steps - 1))
    return t["min_lr"] + 0.5 * (t["lr"] - t["min_lr"]) * (1.0 + math.cos(math.pi * progress))


def trajectory(model, tokens, tied):
    t = TRAIN
    decay, no_decay = [], []
    named = dict(model.named_parameters())
    for name in canonical_names(MODEL["n_layers"], tied):
        (no_decay if is_norm_or_embedding(name) else decay).append(named[name])
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=t["lr"], betas=(t["beta1"], t["beta2"]), eps=t["adam_eps"])
    params = decay + no_decay
    losses, norms, lrs = [], [], []
    for step in range(t["steps"]):
        lr = lr_at(t, step)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        loss, _ = mean_loss(model, tokens)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, t["grad_clip"])
        opt.step()
        losses.append(loss.item())
        norms.append(norm.item())
        lrs.append(lr)
    return losses, norms, lrs


def write(path, array, dtype):
    np.ascontiguousarray(array, dtype=dtype).tofile(path)


def make(name, tied, out_root):
    m, t = MODEL, TRAIN
    B, T, V = t["micro_batch_size"], m["max_seq_len"], m["vocab_size"]
    out = os.path.join(out_root, name)
    os.makedirs(out, exist_ok=True)

    model = build_model(tied, torch.float32)
    randomize(model, tied)
    gen = torch.Generator().manual_seed(SEED + 100)
    tokens = torch.randint(0, V, (B, T + 1), generator=gen, dtype=torch.int64)

    # Float64 twin: how far float32 torch itself is from exact, for context.
    model64 = build_model(tied, torch.float64)
    model64.load_state_dict(model.state_dict())

    weights = flat(model, tied)
    loss, logits = mean_loss(model, tokens)
    loss.backward()
    grads = flat(model, tied, grads=True)
    loss64, logits64 = mean_loss(model64, tokens)
    loss64.backward()
    grads64 = flat(model64, tied, grads=True)

    named = dict(model.named_parameters())
    tensors, offset = [], 0
    fp32_err = {"logits": (logits.double() - logits64).abs().max().item()
                / logits64.abs().max().item(),
                "loss": abs(loss.item() - loss64.item()) / abs(loss64.item()), "grads": 0.0}
    for tname in canonical_names(m["n_layers"], tied):
        p = named[tname]
        rows, cols = (p.shape[0], 1) if p.dim() == 1 else tuple(p.shape)
        n = rows * cols
        g32, g64 = grads[offset:offset + n], grads64[offset:offset + n]
        fp32_err["grads"] = max(fp32_err["grads"],
                                (g32 - g64).abs().max().item() / g64.abs().max().item())
        tensors.append({"name": tname, "rows": rows, "cols": cols})
        offset += n

    write(os.path.join(out, "weights.f32"), weights.numpy(), "<f4")
    write(os.path.join(out, "grads.f32"), grads.numpy(), "<f4")
    write(os.path.join(out, "logits.f32"), logits.detach().numpy(), "<f4")
    write(os.path.join(out, "tokens.i32"), tokens.numpy(), "<i4")

    losses, norms, lrs = trajectory(model, tokens, tied)

    keel_cfg = {"model": dict(m, tie_embeddings=tied), "train": dict(t),
                "data": {"synthetic": {"seed": 1, "branching": 4}}}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(keel_cfg, f, indent=2)
        f.write("\n")
    expected = {
        "generator": "tests/reference/make_golden.py",
        "torch": torch.__version__, "transformers": transformers.__version__,
        "reference": "LlamaForCausalLM float32, attn_implementation=eager",
        "B": B, "T": T, "V": V, "n_params": int(weights.numel()), "tied": tied,
        "mean_loss": loss.item(),
        "mean_loss_fp64": loss64.item(),
        "torch_fp32_vs_fp64_rel_err": fp32_err,
        "tensors": tensors,
        "trajectory": {"note": "same batch every step; loss is before that step's update",
                       "loss": losses, "grad_norm": norms, "lr": lrs},
    }
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(out, x)) for x in os.listdir(out))
    print(f"{name}: {weights.numel()} params, loss {loss.item():.6f}, "
          f"trajectory {losses[0]:.4f} -> {losses[-1]:.4f}, {size} bytes; "
          f"torch fp32 vs fp64: {fp32_err}")
    return size


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "fixtures"))
    args = ap.parse_args()
    torch.set_num_threads(1)  # reductions in a fixed order
    total = make("llama_micro", False, args.out) + make("llama_micro_tied", True, args.out)
    print(f"total {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
