#!/usr/bin/env python3
"""torch_gpu.py: PyTorch's training throughput on one GPU for a keel config,
the anchor scripts/gpu-check.sh compares `keel train --device cuda` with.

A plain PyTorch Llama 2 (no Hugging Face): RMSNorm, RoPE (rotate-half),
grouped-query attention through scaled_dot_product_attention (causal), SwiGLU,
untied lm_head; bf16 autocast over fp32 parameters, fp32 AdamW (fused) with
keel's decay mask, clip_grad_norm_, optionally activation checkpointing of
every block or of the first K (keel's fsdp.activation_checkpointing=K); random tokens. Same shapes, batch and FLOPs formula as keel
(keel_model_flops_per_token). Prints one JSON line: median tokens/s and MFU
against --peak (default: an H100/H200's 989.4 TFLOP/s dense bf16).

    python3 bench/torch_gpu.py CONFIG.json [--set model.max_seq_len=2048 ...] \
        [--steps 10] [--warmup 3] [--checkpoint-activations | --checkpoint-blocks K]
        (--set train.grad_accum_steps=N: N micro-batches per optimizer step, as keel)
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

MODEL_DEFAULTS = dict(n_kv_heads=0, multiple_of=32, ffn_dim_multiplier=0, norm_eps=1e-5,
                      rope_theta=10000.0, tie_embeddings=False)
TRAIN_DEFAULTS = dict(micro_batch_size=4, grad_accum_steps=1, lr=3e-4, weight_decay=0.1, beta1=0.9, beta2=0.95,
                      adam_eps=1e-8, grad_clip=1.0)


def ffn_hidden(m):
    hidden = 2 * (4 * m["dim"]) // 3
    if m["ffn_dim_multiplier"] > 0:
        hidden = int(m["ffn_dim_multiplier"] * hidden)
    return m["multiple_of"] * ((hidden + m["multiple_of"] - 1) // m["multiple_of"])


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Block(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        C, self.nh = m["dim"], m["n_heads"]
        self.nkv = m["n_kv_heads"] or m["n_heads"]
        self.hs = C // self.nh
        self.norm1 = RMSNorm(C, m["norm_eps"])
        self.q = torch.nn.Linear(C, self.nh * self.hs, bias=False)
        self.k = torch.nn.Linear(C, self.nkv * self.hs, bias=False)
        self.v = torch.nn.Linear(C, self.nkv * self.hs, bias=False)
        self.o = torch.nn.Linear(self.nh * self.hs, C, bias=False)
        self.norm2 = RMSNorm(C, m["norm_eps"])
        F_ = ffn_hidden(m)
        self.gate = torch.nn.Linear(C, F_, bias=False)
        self.up = torch.nn.Linear(C, F_, bias=False)
        self.down = torch.nn.Linear(F_, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        h = self.norm1(x)
        q = self.q(h).view(B, T, self.nh, self.hs).transpose(1, 2)
        k = self.k(h).view(B, T, self.nkv, self.hs).transpose(1, 2)
        v = self.v(h).view(B, T, self.nkv, self.hs).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.nkv != self.nh:  # grouped-query: each kv head serves nh / nkv query heads
            k = k.repeat_interleave(self.nh // self.nkv, dim=1)
            v = v.repeat_interleave(self.nh // self.nkv, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, self.nh * self.hs))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(torch.nn.Module):
    def __init__(self, m, ckpt):
        super().__init__()
        self.ckpt = ckpt
        self.embed = torch.nn.Embedding(m["vocab_size"], m["dim"])
        self.blocks = torch.nn.ModuleList(Block(m) for _ in range(m["n_layers"]))
        self.norm = RMSNorm(m["dim"], m["norm_eps"])
        self.head = torch.nn.Linear(m["dim"], m["vocab_size"], bias=False)
        hs, T = m["dim"] // m["n_heads"], m["max_seq_len"]
        inv = 1.0 / (m["rope_theta"] ** (torch.arange(0, hs, 2).float() / hs))
        ang = torch.outer(torch.arange(T).float(), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos()[None, None], persistent=False)
        self.register_buffer("sin", ang.sin()[None, None], persistent=False)

    def forward(self, idx, targets):
        x = self.embed(idx)
        for i, b in enumerate(self.blocks):
            x = checkpoint(b, x, self.cos, self.sin, use_reentrant=False) if i < self.ckpt else b(x, self.cos, self.sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--set", action="append", default=[], help="key=value, as keel train --set")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--checkpoint-activations", action="store_true", help="every block")
    ap.add_argument("--checkpoint-blocks", type=int, default=None, help="the first K blocks")
    ap.add_argument("--peak", type=float, default=989.4e12)
    ap.add_argument("--device", default="cuda", help="cuda; cpu only to try the script out")
    a = ap.parse_args()
    cfg = json.load(open(a.config))
    m = {**MODEL_DEFAULTS, **cfg["model"]}
    t = {**TRAIN_DEFAULTS, **cfg.get("train", {})}
    for kv in a.set:
        key, val = kv.split("=", 1)
        sect, name = key.split(".", 1)
        (m if sect == "model" else t)[name] = json.loads(val)
    torch.manual_seed(0)
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    ckpt = a.checkpoint_blocks if a.checkpoint_blocks is not None else m["n_layers"] if a.checkpoint_activations else 0
    model = Llama(m, ckpt).to(dev)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t["weight_decay"]},
                             {"params": rest, "weight_decay": 0.0}], lr=t["lr"],
                            betas=(t["beta1"], t["beta2"]), eps=t["adam_eps"], fused=dev.type == "cuda")
    B, T, accum = t["micro_batch_size"], m["max_seq_len"], t["grad_accum_steps"]
    matmul = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n)
    flops_tok = 6.0 * matmul + 12.0 * m["n_layers"] * m["dim"] * T
    times = []
    for step in range(a.warmup + a.steps):
        toks = [torch.randint(0, m["vocab_size"], (B, T + 1), device=dev) for _ in range(accum)]
        sync()
        t0 = time.perf_counter()
        for tok in toks:
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = model(tok[:, :-1], tok[:, 1:]) / accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        sync()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    tps = accum * B * T / statistics.median(times)
    print(json.dumps({"tokens_per_s": tps, "mfu": tps * flops_tok / a.peak, "step_s_median": statistics.median(times),
                      "params": sum(p.numel() for p in model.parameters()), "batch": B, "grad_accum": accum, "seq": T,
                      "checkpoint_blocks": ckpt,
                      "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else None, "torch": torch.__version__}))


if __name__ == "__main__":
    sys.exit(main())
