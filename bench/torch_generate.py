#!/usr/bin/env python3
"""torch_generate.py: the model bench/generate.sh measures, and transformers' generate on it.

    python bench/torch_generate.py make CONFIG.json HF_DIR
        a LlamaForCausalLM of the config's model shape (keel's keys, its defaults) with
        transformers' random initialisation (seed 0), saved as safetensors in HF_DIR;
        skipped when HF_DIR already has a model.safetensors
    python bench/torch_generate.py prompts HF_DIR PROMPT_LEN COUNT OUT.jsonl
        COUNT prompts of PROMPT_LEN random token ids (seed 1), {"prompt": [ids]} lines
    OMP_WAIT_POLICY=PASSIVE python bench/torch_generate.py run HF_DIR PROMPTS.jsonl --batch B \
        --new N --threads T --reps R
        transformers' greedy generate (float32, its default attention) on the first B prompts
        at once; one JSON line: prefill and decode tokens/s (medians of R repeats) and the
        new ids of the first prompt

Prefill is timed as generate with one new token (the prompt's forward and its first token),
decode as the rest of a generate of N new tokens (min_new_tokens = N, so EOS cannot end it):
B * (N - 1) tokens in time(N) - time(1), as keel counts them (its first token comes from
the prefill's logits).
"""
import argparse
import json
import os
import random
import statistics
import sys
import time

# Spinning OpenMP workers steal the second core from the BLAS threads (shared/notes/cpu.md).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM  # noqa: E402

MODEL_DEFAULTS = dict(n_kv_heads=0, multiple_of=32, ffn_dim_multiplier=0, norm_eps=1e-5,
                      rope_theta=10000.0, tie_embeddings=False)


def ffn_hidden(m):
    """Llama 2's SwiGLU hidden size, as keel_model_ffn_hidden computes it."""
    hidden = 2 * (4 * m["dim"]) // 3
    if m["ffn_dim_multiplier"] > 0:
        hidden = int(m["ffn_dim_multiplier"] * hidden)
    return m["multiple_of"] * ((hidden + m["multiple_of"] - 1) // m["multiple_of"])


def make(config_path, out_dir):
    if os.path.exists(os.path.join(out_dir, "model.safetensors")):
        return
    m = dict(MODEL_DEFAULTS, **json.load(open(config_path))["model"])
    cfg = LlamaConfig(hidden_size=m["dim"], intermediate_size=ffn_hidden(m), num_hidden_layers=m["n_layers"],
                      num_attention_heads=m["n_heads"], num_key_value_heads=m["n_kv_heads"] or m["n_heads"],
                      vocab_size=m["vocab_size"], max_position_embeddings=m["max_seq_len"],
                      rms_norm_eps=m["norm_eps"], rope_theta=m["rope_theta"],
                      tie_word_embeddings=m["tie_embeddings"], bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(out_dir + ".tmp", safe_serialization=True)
    os.replace(out_dir + ".tmp", out_dir)


def prompts(hf_dir, length, count, out_path):
    vocab = json.load(open(os.path.join(hf_dir, "config.json")))["vocab_size"]
    rng = random.Random(1)
    with open(out_path, "w") as f:
        for _ in range(count):
            f.write(json.dumps({"prompt": [rng.randrange(3, vocab) for _ in range(length)]}) + "\n")


def run(args):
    torch.set_num_threads(args.threads)
    model = LlamaForCausalLM.from_pretrained(args.hf_dir, dtype=torch.float32).eval()
    rows = [json.loads(line)["prompt"] for line in open(args.prompts) if line.strip()][:args.batch]
    ids = torch.tensor(rows)
    mask = torch.ones_like(ids)

    def generate(new):
        cfg = GenerationConfig(do_sample=False, max_new_tokens=new, min_new_tokens=new, pad_token_id=0,
                               eos_token_id=model.generation_config.eos_token_id)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, generation_config=cfg)
        return time.perf_counter() - t0, out

    generate(2)  # warm-up: first-call allocations and kernel choices
    prefill_s, total_s = [], []
    for _ in range(args.reps):
        prefill_s.append(generate(1)[0])
        t, out = generate(args.new)
        total_s.append(t)
    B, P, N = ids.shape[0], ids.shape[1], args.new
    one, whole = statistics.median(prefill_s), statistics.median(total_s)
    print(json.dumps({"batch": B, "prompt_len": P, "new": N, "threads": args.threads,
                      "prefill_tokens_per_s": B * P / one, "decode_tokens_per_s": B * (N - 1) / (whole - one),
                      "prefill_s": prefill_s, "total_s": total_s, "ids": out[0, P:].tolist(),
                      "torch": torch.__version__}))


def main():
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "prompts":
        prompts(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    else:
        p = argparse.ArgumentParser()
        p.add_argument("cmd")
        p.add_argument("hf_dir")
        p.add_argument("prompts")
        p.add_argument("--batch", type=int, default=1)
        p.add_argument("--new", type=int, default=64)
        p.add_argument("--threads", type=int, default=2)
        p.add_argument("--reps", type=int, default=3)
        run(p.parse_args())


if __name__ == "__main__":
    main()
