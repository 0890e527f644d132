#!/usr/bin/env python3
"""make_lora_golden.py: a LoRA fine-tuning trajectory from Hugging Face PEFT on transformers.

On the llama_micro fixture (make_golden.py's weights and tokens), PEFT's LoRA on every
projection of every block (r 4, alpha 8, no dropout) trains 10 AdamW steps with keel's
recipe: the fixture's schedule (keel_lr_at), weight decay on every adapter, the global norm
clipped, the same batch each step. The adapters start from keel's own initialisation
(keel_lora_init_range, src/model/layout.c, reimplemented below: A uniform in +-1/sqrt(in) from
a splitmix64 counter of the seed, B zero), so the two runs begin from the same numbers.
tests/model/test_lora.c compares keel with what this writes:

  fixtures/llama_micro/lora.json        the LoRA config, seed, and the trajectory
  fixtures/llama_micro/lora_init.f32    the initial adapters in keel's layout (fp32)
  fixtures/llama_micro/lora_final.f32   the adapters after the 10 steps

Run with the venv of scripts/setup-torch.sh plus peft (never needed by CI):

    /opt/keel-torch/bin/pip install peft
    /opt/keel-torch/bin/python tests/reference/make_lora_golden.py
"""
import json
import math
import os
import sys

import numpy as np
import peft
import torch
from peft import LoraConfig, get_peft_model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden as g  # noqa: E402

FIX = os.path.join(g.HERE, "fixtures", "llama_micro")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
MODULE = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
          "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
LORA = dict(rank=4, alpha=8, dropout=0.0, targets=TARGETS)
SEED = 1337
M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def hash64(z):
    """keel_hash64 (include/keel/core.h): splitmix64's finalizer."""
    z &= M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def keel_init(shapes, seed):
    """keel_lora_init_range over a whole adapter layout: tensor i's element j."""
    out = []
    for i, (name, rows, cols) in enumerate(shapes):
        if "lora_B" in name:
            out.append(np.zeros(rows * cols, np.float32))
            continue
        key = (hash64(seed ^ 0x4C6F5241) + GOLDEN * (i + 1)) & M64
        bound = 1.0 / math.sqrt(cols)
        u = [(hash64(key + GOLDEN * j) >> 11) / 9007199254740992.0 for j in range(rows * cols)]
        out.append(np.array([(2 * x - 1) * bound for x in u], np.float64).astype(np.float32))
    return out


def main():
    torch.set_num_threads(1)
    m, t = g.MODEL, dict(g.TRAIN)
    model = g.build_model(False, torch.float32)
    weights = np.fromfile(os.path.join(FIX, "weights.f32"), "<f4")
    named, at = dict(model.named_parameters()), 0
    with torch.no_grad():
        for name in g.canonical_names(m["n_layers"], False):
            p = named[name]
            p.copy_(torch.from_numpy(weights[at:at + p.numel()].copy()).reshape(p.shape))
            at += p.numel()
    tokens = torch.from_numpy(np.fromfile(os.path.join(FIX, "tokens.i32"), "<i4").astype(np.int64))
    tokens = tokens.reshape(t["micro_batch_size"], m["max_seq_len"] + 1)

    cfg = LoraConfig(r=LORA["rank"], lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"],
                     target_modules=TARGETS, bias="none")
    model = get_peft_model(model, cfg)
    # keel's adapter layout: per layer, per target in block order, A (r, in) then B (out, r)
    lp = dict(model.named_parameters())
    shapes, params = [], []
    for l in range(m["n_layers"]):
        for tgt in TARGETS:
            for ab in ("lora_A", "lora_B"):
                name = f"base_model.model.model.layers.{l}.{MODULE[tgt]}.{tgt}.{ab}.default.weight"
                p = lp[name]
                shapes.append((name, p.shape[0], p.shape[1]))
                params.append(p)
    init = keel_init(shapes, SEED)
    with torch.no_grad():
        for p, v in zip(params, init):
            p.copy_(torch.from_numpy(v).reshape(p.shape))
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert len(trainable) == len(params) and all(any(p is q for q in trainable) for p in params)

    opt = torch.optim.AdamW(params, lr=t["lr"], betas=(t["beta1"], t["beta2"]), eps=t["adam_eps"],
                            weight_decay=t["weight_decay"])
    losses, norms, lrs = [], [], []
    for step in range(t["steps"]):
        lr = g.lr_at(t, step)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad(set_to_none=True)
        loss, _ = g.mean_loss(model, tokens)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, t["grad_clip"])
        opt.step()
        losses.append(loss.item())
        norms.append(norm.item())
        lrs.append(lr)

    np.concatenate(init).astype("<f4").tofile(os.path.join(FIX, "lora_init.f32"))
    final = np.concatenate([p.detach().numpy().reshape(-1) for p in params])
    final.astype("<f4").tofile(os.path.join(FIX, "lora_final.f32"))
    with open(os.path.join(FIX, "lora.json"), "w") as f:
        json.dump({"generator": "tests/reference/make_lora_golden.py", "torch": torch.__version__,
                   "peft": peft.__version__, "seed": SEED, "lora": LORA, "n_adapter_params": int(final.size),
                   "trajectory": {"note": "same batch every step; loss is before that step's update",
                                  "loss": losses, "grad_norm": norms, "lr": lrs}}, f, indent=1)
        f.write("\n")
    print(f"PEFT {peft.__version__}: {final.size} adapter parameters, loss {losses[0]:.6f} -> {losses[-1]:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
