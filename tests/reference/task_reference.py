#!/usr/bin/env python3
"""task_reference.py: per-choice log-likelihoods and rolling perplexity with transformers, the
reference keel eval --task / --text is held to.

    python task_reference.py HF_DIR task TASK.jsonl      # one line per question: {"item", "loglik": [...]}
    python task_reference.py HF_DIR text DOCS.jsonl      # one line: {"loglikelihood", "tokens"}

Each choice is scored as lm-evaluation-harness's _encode_pair and loglikelihood do it: the
context's trailing whitespace moves onto the continuation (" " + choice), the continuation's ids
are those of context + continuation past the context's own (tokenizer.encode without special
tokens), the model's BOS goes first, and the log-likelihood is the sum of log_softmax(logits) at
the continuation's ids. Text: lm-eval's get_rolling_token_windows with context_len 1 over
BOS + the document's ids, windows of max_position_embeddings. float32, eager attention. Run with
the venv of scripts/setup-torch.sh (tests/infer/eval_matches_hf.sh does, when it is there);
fixtures/hf_tiny_llama3/task_loglik.jsonl and text_loglik.json are its output for task.jsonl and
docs.jsonl beside them (transformers 5.25.0, torch 2.15.0).
"""
import json
import sys

import torch
from transformers import AutoTokenizer, LlamaForCausalLM

hf_dir, mode, path = sys.argv[1:4]
model = LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
tok = AutoTokenizer.from_pretrained(hf_dir)
bos = model.config.bos_token_id
T = model.config.max_position_embeddings


def logprobs(ids):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    return torch.log_softmax(logits, dim=-1)


def enc(s):
    return tok.encode(s, add_special_tokens=False)


if mode == "task":
    for i, line in enumerate(l for l in open(path) if l.strip()):
        q = json.loads(line)
        out = []
        for choice in q["choices"]:
            ctx, cont = q["context"], " " + choice
            n = len(ctx) - len(ctx.rstrip())
            if n:
                ctx, cont = ctx[:-n], ctx[-n:] + cont
            whole, c = enc(ctx + cont), enc(ctx)
            ids = [bos] + whole
            frm = 1 + len(c)
            lp = logprobs(ids[:-1])
            out.append(sum(lp[t - 1, ids[t]].item() for t in range(frm, len(ids))))
        print(json.dumps({"item": i, "loglik": out}))
else:
    total, tokens = 0.0, 0
    for line in (l for l in open(path) if l.strip()):
        seq = [bos] + enc(json.loads(line)["text"])
        p0 = 1
        while p0 < len(seq):
            p1 = min(p0 + T - 1, len(seq) - 1)
            a = max(0, p1 - T)
            lp = logprobs(seq[a:p1])
            total += sum(lp[t - a - 1, seq[t]].item() for t in range(p0, p1 + 1))
            tokens += p1 - p0 + 1
            p0 += T
    print(json.dumps({"loglikelihood": total, "tokens": tokens}))
