#!/usr/bin/env python3
"""torch_train.py: PyTorch's CPU training throughput for a keel config, the
anchor keel is compared with in bench/train_throughput.sh.

Same model shape (transformers' LlamaForCausalLM, fp32, eager attention by
default), batch, sequence length and optimizer (AdamW with keel's decay mask,
clip_grad_norm_) as `keel train CONFIG`, in a plain single-process loop on
random tokens; --batch sets the sequences a step, --bf16 runs the forward under
bf16 autocast (fp32 weights and optimizer, as bench/torch_fsdp.py's ddp bf16).
Prints one JSON line: the median tokens/s after warm-up.

    OMP_WAIT_POLICY=PASSIVE /opt/keel-torch/bin/python bench/torch_train.py \
        configs/tiny.json --threads 2 --steps 12 --warmup 2
"""
import argparse
import json
import os
import statistics
import sys
import time

# Spinning OpenMP workers steal the second core from the BLAS threads: 5x slower
# on this 2-core machine by default (shared/notes/cpu.md). Must precede import.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

# keel's defaults for keys a config may leave out (src/core/config.c).
MODEL_DEFAULTS = dict(n_kv_heads=0, multiple_of=32, ffn_dim_multiplier=0, norm_eps=1e-5,
                      rope_theta=10000.0, tie_embeddings=False)
TRAIN_DEFAULTS = dict(micro_batch_size=4, grad_accum_steps=1, lr=3e-4, weight_decay=0.1,
                      beta1=0.9, beta2=0.95, adam_eps=1e-8, grad_clip=1.0)


def ffn_hidden(m):
    """Llama 2's SwiGLU hidden size, as keel_model_ffn_hidden computes it."""
    hidden = 2 * (4 * m["dim"]) // 3
    if m["ffn_dim_multiplier"] > 0:
        hidden = int(m["ffn_dim_multiplier"] * hidden)
    return m["multiple_of"] * ((hidden + m["multiple_of"] - 1) // m["multiple_of"])


def flops_per_token(m, model):
    """keel_model_flops_per_token: 6 x matmul params (lm_head included, embedding
    lookup excluded) + 12 x L x C x T."""
    matmul = sum(p.numel() for n, p in model.named_parameters()
                 if p.dim() == 2 and n != "model.embed_tokens.weight")
    if m["tie_embeddings"]:
        matmul += m["vocab_size"] * m["dim"]
    return 6.0 * matmul + 12.0 * m["n_layers"] * m["dim"] * m["max_seq_len"]


def build(m, attn):
    cfg = LlamaConfig(vocab_size=m["vocab_size"], hidden_size=m["dim"],
                      intermediate_size=ffn_hidden(m), num_hidden_layers=m["n_layers"],
                      num_attention_heads=m["n_heads"],
                      num_key_value_heads=m["n_kv_heads"] or m["n_heads"],
                      max_position_embeddings=m["max_seq_len"], rms_norm_eps=m["norm_eps"],
                      rope_theta=m["rope_theta"], tie_word_embeddings=m["tie_embeddings"],
                      attention_bias=False, mlp_bias=False, hidden_act="silu",
                      attn_implementation=attn, use_cache=False)
    cfg._attn_implementation = attn
    return LlamaForCausalLM(cfg).float().train()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", help="keel config JSON (model and train sections are read)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the median")
    ap.add_argument("--attn", default="eager", choices=["eager", "sdpa"])
    ap.add_argument("--batch", type=int, default=0, help="sequences a step (default: the config's micro_batch_size)")
    ap.add_argument("--bf16", action="store_true", help="forward under torch.autocast('cpu', bfloat16)")
    args = ap.parse_args()

    with open(args.config) as f:
        keel_cfg = json.load(f)
    m = dict(MODEL_DEFAULTS, **keel_cfg.get("model", {}))
    t = dict(TRAIN_DEFAULTS, **keel_cfg.get("train", {}))
    B, T, V = args.batch or t["micro_batch_size"], m["max_seq_len"], m["vocab_size"]

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = build(m, args.attn)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.dim() == 1 or name == "model.embed_tokens.weight" else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=t["lr"], betas=(t["beta1"], t["beta2"]), eps=t["adam_eps"])
    params = decay + no_decay
    gen = torch.Generator().manual_seed(1)
    tokens_per_step = B * t["grad_accum_steps"] * T

    step_tps, losses = [], []
    for step in range(args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for _ in range(t["grad_accum_steps"]):
            tokens = torch.randint(0, V, (B, T + 1), generator=gen)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                logits = model(input_ids=tokens[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, V),
                                                     tokens[:, 1:].reshape(-1))
            (loss / t["grad_accum_steps"]).backward()
            loss_sum += loss.item()
        if t["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(params, t["grad_clip"])
        opt.step()
        step_tps.append(tokens_per_step / (time.perf_counter() - t0))
        losses.append(loss_sum / t["grad_accum_steps"])
    measured = step_tps[args.warmup:] or step_tps
    print(json.dumps({
        "config": args.config, "threads": args.threads, "attn": args.attn, "batch": B, "bf16": args.bf16,
        "steps": args.steps, "warmup": args.warmup,
        "tokens_per_s_median": statistics.median(measured),
        "tokens_per_s": step_tps, "loss_first": losses[0], "loss_last": losses[-1],
        "n_params": sum(p.numel() for p in model.parameters()),
        "flops_per_token": flops_per_token(m, model),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
