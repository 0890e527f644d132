"""tests/data/hf_tokenizers.py: the Hugging Face side of tokenizer_matches_hf.sh.

Builds tokenizer.json files with the tokenizers library (no transformers) and
prints its ids and text for keel to be compared with:

  make DIR TRAIN_TXT SPM_VOCAB   write DIR/<name>/tokenizer.json (+ tokenizer_config.json)
  make_chat DIR TRAIN_TXT SPM_VOCAB  only llama3 and llama2 (data_prepare_chat.sh)
  encode TOKENIZER_JSON TEXT     one line of ids per line of TEXT (read as Python
                                 reads it: bytes split on b"\\n", decoded with
                                 errors="replace"), no special tokens added
  decode TOKENIZER_JSON IDS      one line of text per line of ids
                                 (decode(ids, skip_special_tokens=False))
  reference DIR TEXT NAME...     all of it at once for DIR/NAME/tokenizer.json (see reference())
  refusals DIR LLAMA3_JSON       write tokenizer.json files keel must refuse
"""
import json
import os
import random
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]


def read_lines(path):
    data = open(path, "rb").read()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [line.decode("utf-8", errors="replace") for line in lines]


def save(tok, directory, config=None, legacy_merges=False):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "tokenizer.json")
    tok.save(path)
    if legacy_merges:  # Llama 3's own file writes merges as "a b" strings
        j = json.load(open(path, encoding="utf-8"))
        j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
        json.dump(j, open(path, "w", encoding="utf-8"), ensure_ascii=False, indent=2)
    if config is not None:
        json.dump(config, open(os.path.join(directory, "tokenizer_config.json"), "w"), indent=2)


def byte_level(train_txt, directory, llama3):
    """Llama 3's layout (Split regex + ByteLevel, ignore_merges) or GPT-2's (ByteLevel with its regex)."""
    tok = Tokenizer(models.BPE(ignore_merges=llama3))
    if llama3:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000 if llama3 else 1500, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(read_lines(train_txt), trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    # added tokens of every kind: lstrip / rstrip / single_word, and one normalized (not special)
    tok.add_tokens([AddedToken("<mask>", lstrip=True, rstrip=True, special=True, normalized=False),
                    AddedToken("keel", single_word=True, normalized=False),
                    AddedToken(" Copyright", normalized=True)])
    config = {"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|end_of_text|>", "lstrip": False}}
    save(tok, directory, config, legacy_merges=llama3)


def spm_vocab_merges(spm_vocab):
    """vocab and merges of a SentencePiece BPE model as transformers' LlamaConverter
    (SentencePieceExtractor) computes them, from spm_export_vocab's piece<TAB>score lines."""
    scores = []
    for line in open(spm_vocab, "rb").read().decode("utf-8").split("\n"):  # pieces may hold CR or tabs
        if line:
            piece, score = line.rsplit("\t", 1)
            scores.append((piece, float(score)))
    vocab = {piece: i for i, (piece, _) in enumerate(scores)}
    merges = []
    for merge, score in scores:
        local = [(merge[:k], merge[k:], score) for k in range(1, len(merge))
                 if merge[:k] in vocab and merge[k:] in vocab]
        merges.extend(sorted(local, key=lambda x: (vocab[x[0]], vocab[x[1]])))
    merges = sorted(merges, key=lambda m: m[2], reverse=True)
    return vocab, [(a, b) for a, b, _ in merges]


def spm_style(spm_vocab, directory, flavour):
    vocab, merges = spm_vocab_merges(spm_vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, fuse_unk=True, unk_token="<unk>"))
    if flavour == "llama2":  # Llama 2 / Mistral's tokenizer.json
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    elif flavour == "metaspace":  # the Metaspace form (prepend on the first piece, no split)
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    else:  # Metaspace splitting at every "▁"
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
        tok.decoder = decoders.Sequence([decoders.Metaspace(replacement="▁", prepend_scheme="always"),
                                         decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in ("<unk>", "<s>", "</s>")])
    save(tok, directory, {"bos_token": {"content": "<s>"}, "eos_token": "</s>"})


def make(out, train_txt, spm_vocab):
    byte_level(train_txt, os.path.join(out, "llama3"), llama3=True)
    byte_level(train_txt, os.path.join(out, "gpt2"), llama3=False)
    for flavour in ("llama2", "metaspace", "metaspace_split"):
        spm_style(spm_vocab, os.path.join(out, flavour), flavour)


def refusals(out, llama3_json):
    """Files keel must refuse, each in its own directory."""
    def write(name, j):
        os.makedirs(os.path.join(out, name), exist_ok=True)
        path = os.path.join(out, name, "tokenizer.json")
        if isinstance(j, Tokenizer):
            j.save(path)
        else:
            json.dump(j, open(path, "w", encoding="utf-8"), ensure_ascii=False)
    write("wordpiece", Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]")))
    write("unigram", Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0), ("b", -2.0)], 0)))
    write("wordlevel", Tokenizer(models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>")))
    nfc = Tokenizer(models.BPE({"a": 0, "b": 1, "ab": 2}, [("a", "b")]))
    nfc.normalizer = normalizers.NFC()
    write("nfc", nfc)
    j = json.load(open(llama3_json, encoding="utf-8"))
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"(?i:'s|\p{L}+|(unclosed"
    write("bad_regex", j)


def random_ids(tok, n):
    """n lines of 1-12 random ids over the whole vocabulary, a third of them from its ends
    (byte tokens, specials, added tokens)."""
    rng = random.Random(7)
    V = tok.get_vocab_size(with_added_tokens=True)
    out = []
    for _ in range(n):
        out.append([rng.randrange(V) if rng.random() < 0.67 else
                    rng.choice([rng.randrange(min(V, 300)), V - 1 - rng.randrange(min(V, 10))])
                    for _ in range(rng.randint(1, 12))])
    return out


def reference(out, text, names):
    """For each tokenizer DIR/NAME/tokenizer.json (out = DIR): NAME.hf.ids (every line of text
    encoded), NAME.rand (random ids) and NAME.hf.txt (every 4th encoded line, then the random
    ids, decoded)."""
    lines = read_lines(text)
    for name in names:
        tok = Tokenizer.from_file(os.path.join(out, name, "tokenizer.json"))
        ids = [e.ids for e in tok.encode_batch(lines, add_special_tokens=False)]
        rand = random_ids(tok, 3000)
        with open(os.path.join(out, name + ".hf.ids"), "w") as f:
            f.writelines(" ".join(map(str, i)) + "\n" for i in ids)
        with open(os.path.join(out, name + ".rand"), "w") as f:
            f.writelines(" ".join(map(str, i)) + "\n" for i in rand)
        texts = tok.decode_batch(ids[::4] + rand, skip_special_tokens=False)
        with open(os.path.join(out, name + ".hf.txt"), "wb") as f:
            f.writelines(t.encode("utf-8") + b"\n" for t in texts)


def main():
    cmd = sys.argv[1]
    if cmd == "make":
        make(sys.argv[2], sys.argv[3], sys.argv[4])
    elif cmd == "make_chat":
        byte_level(sys.argv[3], os.path.join(sys.argv[2], "llama3"), llama3=True)
        spm_style(sys.argv[4], os.path.join(sys.argv[2], "llama2"), "llama2")
    elif cmd == "refusals":
        refusals(sys.argv[2], sys.argv[3])
    elif cmd == "reference":
        reference(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif cmd == "encode":
        tok = Tokenizer.from_file(sys.argv[2])
        for enc in tok.encode_batch(read_lines(sys.argv[3]), add_special_tokens=False):
            sys.stdout.write(" ".join(map(str, enc.ids)) + "\n")
    elif cmd == "decode":
        tok = Tokenizer.from_file(sys.argv[2])
        ids = [[int(x) for x in line.split()] for line in open(sys.argv[3])]
        for text in tok.decode_batch(ids, skip_special_tokens=False):
            sys.stdout.buffer.write(text.encode("utf-8") + b"\n")
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
