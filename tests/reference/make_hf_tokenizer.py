#!/usr/bin/env python3
"""make_hf_tokenizer.py: a tokenizer.json for the hf_tiny_llama3 fixture's 128-token vocabulary.

Writes fixtures/hf_tiny_llama3_tokenizer/tokenizer.json and tokenizer_config.json: a byte-level
BPE laid out as Llama 3's (Split with Llama 3's regex + ByteLevel, ignore_merges, merges
written as "a b" strings, a ByteLevel decoder, a post-processor that puts BOS first), trained with the tokenizers library on the
text below to 120 tokens — <|reserved_special_token_0|>, <|begin_of_text|> and
<|end_of_text|> first, so BOS and EOS are ids 1 and 2 as the fixture's config.json and
generation_config.json say — then <|eot_id|> and reserved special tokens added up to
the fixture's vocab_size of 128, as Llama 3's 256 added specials fill its 128256.
tokenizer_config.json is shaped as Meta's Llama 3.x one (added_tokens_decoder, bos_token,
eos_token, PreTrainedTokenizerFast).

tests/hf/hf_roundtrip_llama3.sh imports a directory made of the fixture and these two files
and exports it again. Run with the venv tests/data/tokenizer_matches_hf.sh makes
(tokenizers 0.23.3; never needed by CI, the files are checked in):

    .cache/venv-hf/bin/python tests/reference/make_hf_tokenizer.py
"""
import json
import os

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "hf_tiny_llama3_tokenizer")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|reserved_special_token_0|>", "<|begin_of_text|>", "<|end_of_text|>"]
TEXT = """The quick brown fox jumps over the lazy dog.
A checkpoint is written as a temporary directory and renamed once every file is durable.
Llama models read tokens, and the tokenizer turns text into the tokens they read.
keel trains the model, and the tokenizer travels with the weights from import to export.
"""


def main():
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    # Llama 3's post-processor: BOS before every sequence when special tokens are added
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", 1)])])
    trainer = trainers.BpeTrainer(vocab_size=120, show_progress=False, special_tokens=SPECIALS)
    tok.train_from_iterator(TEXT.splitlines(), trainer)
    # Llama 3's added specials fill its vocabulary to vocab_size exactly (128000 + 256): here to 128
    added = ["<|eot_id|>"] + [f"<|reserved_special_token_{i}|>" for i in range(1, 128 - 120)]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in added])
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "tokenizer.json")
    tok.save(path)
    j = json.load(open(path, encoding="utf-8"))
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, indent=2)
        f.write("\n")
    decoder = {str(tok.token_to_id(s)): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": True}
               for s in SPECIALS + added}
    config = {"added_tokens_decoder": decoder, "bos_token": "<|begin_of_text|>", "clean_up_tokenization_spaces": True,
              "eos_token": "<|end_of_text|>", "model_input_names": ["input_ids", "attention_mask"],
              "model_max_length": 131072, "tokenizer_class": "PreTrainedTokenizerFast"}
    with open(os.path.join(OUT, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    size = tok.get_vocab_size(with_added_tokens=True)
    assert size == 128 and tok.token_to_id("<|begin_of_text|>") == 1 and tok.token_to_id("<|end_of_text|>") == 2, size
    text = "the tokenizer travels<|eot_id|>"  # hf_roundtrip_llama3.sh pins keel tokenize's ids for it
    print(f"{OUT}: {size} tokens; {text!r} -> {tok.encode(text, add_special_tokens=False).ids}")


if __name__ == "__main__":
    main()
