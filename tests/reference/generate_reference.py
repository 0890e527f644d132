#!/usr/bin/env python3
"""generate_reference.py: transformers' greedy generate, the reference keel generate is held to.

    python generate_reference.py HF_DIR PROMPTS.jsonl MAX_NEW_TOKENS

PROMPTS.jsonl holds {"prompt": [token ids]} lines (keel generate --prompts reads the same file);
prints one JSON line per prompt: {"prompt": i, "ids": [new token ids]}, without the EOS that
ended it (as keel reports them). The model runs in float32 with eager attention, one prompt
at a time, do_sample=False: LlamaForCausalLM.generate's greedy search with its KV cache.
Run with the venv of scripts/setup-torch.sh (tests/infer/generate_matches_hf.sh does, when it is
there). fixtures/hf_tiny/generate_greedy.jsonl and fixtures/hf_tiny_llama3/generate_greedy.jsonl are
its output (transformers 5.25.0, torch 2.15.0) for the generate_prompts.jsonl beside them, with 12 and
40 new tokens: the test holds keel to them where no torch is installed.
"""
import json
import sys

import torch
from transformers import GenerationConfig, LlamaForCausalLM

hf_dir, prompts_path, max_new = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.manual_seed(0)
model = LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
eos = model.generation_config.eos_token_id
eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
cfg = GenerationConfig(do_sample=False, max_new_tokens=max_new, eos_token_id=sorted(eos) or None,
                       pad_token_id=0, bos_token_id=model.generation_config.bos_token_id)
for i, line in enumerate(l for l in open(prompts_path) if l.strip()):
    ids = json.loads(line)["prompt"]
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), generation_config=cfg, attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    new = out[0, len(ids):].tolist()
    if new and new[-1] in eos:
        new = new[:-1]
    print(json.dumps({"prompt": i, "ids": new}))
