"""tests/data/chat_reference.py: the Python side of data_prepare_chat.sh.

  corpus OUT.jsonl N SEED [plain]   N conversations as JSON Lines: with a system message or
                                    not, 1-4 turns, non-ASCII, whitespace at the ends of
                                    contents, empty contents, "[INST]" inside text; special
                                    tokens written inside contents unless `plain`
  reference TEMPLATE TOKDIR JSONL OUT
                                    each record rendered here (the template written out in
                                    Python, apart from keel's C) and encoded with the
                                    `tokenizers` library (TOKDIR/tokenizer.json): one line
                                    "ids|mask" a record, the mask from the encoding's offsets
                                    (the tokens from the one holding an answer's first
                                    character to the one holding its last)
  transformers TEMPLATE TOKDIR JSONL OUT
                                    the same from transformers: apply_chat_template(messages,
                                    tokenize=True) with the model's own chat_template, the
                                    mask from return_assistant_tokens_mask over the same
                                    template with {% generation %} around the answers; the
                                    rendered text must equal this file's
  check PREPARED_DIR REF [prefix]   the shards keel wrote (read over the documented layout,
                                    docs/checkpoints.md "Token shard") hold REF's records
                                    whole and in order, each in train or val, ids and mask
                                    equal (prefix: the first records of REF, at least one);
                                    prints "records train val tokens trained"
"""
import json
import os
import random
import struct
import sys

# The Hugging Face chat templates, as the models' tokenizer_config.json files hold them.
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
          "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
          "{{ content }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
LLAMA2 = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
          "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
          "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
          "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
          "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
          "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
          "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
          "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
          "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")
# The same templates with the answers marked for transformers' assistant mask.
LLAMA3_GEN = ("{% for message in messages %}{% set header = '<|start_header_id|>' + message['role'] + "
              "'<|end_header_id|>\n\n' %}{% if loop.index0 == 0 %}{% set header = bos_token + header %}"
              "{% endif %}{{ header }}{% if message['role'] == 'assistant' %}{% generation %}"
              "{{ message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}{% else %}"
              "{{ message['content'] | trim + '<|eot_id|>' }}{% endif %}{% endfor %}")
LLAMA2_GEN = LLAMA2.replace("{{ ' '  + content.strip() + ' ' + eos_token }}",
                            "{% generation %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endgeneration %}")
assert LLAMA2_GEN != LLAMA2

# ---- the conversations ---------------------------------------------------------------------

WORDS = ("the of and to a in is that for it as with was on be by this are or from at which "
         "license program software work copyright free terms code you may not any under "
         "conditions distribute modify source object version").split()
NON_ASCII = ["Grüße aus Köln — café", "Съешь же ещё этих булок", "Ξεσκεπάζω την ψυχοφθόρα",
             "天地玄黄，宇宙洪荒。", "いろはにほへと", "키스의 고유조건은", "😀 👍🏽 🎉 ❤️ 🇩🇪 👨‍👩‍👧",
             "naïve façade Œuvre ß", "combining é ǻ नि", "½ ① ﬁ Ⅻ ｶﾞ"]
# whitespace at the ends of a content: Python's (and so the templates') strip() takes all of
# these but U+180E and U+200B, which are not whitespace to it (\x1c: whitespace to Python, not
# to Unicode)
ENDS = ["", "", "", " ", "  ", "\n", "\n\n", "\t", " \r\n", "\u3000", "\u00a0", "\u2028", "\x1c",
        "\u180e", "\u200b", " \u2003 "]
SPECIAL_TEXT = ["<|eot_id|>", "<|begin_of_text|>", "</s>", "<s>", "<|start_header_id|>x<|end_header_id|>"]


def sentence(rng):
    words = [rng.choice(WORDS) for _ in range(rng.randint(1, 14))]
    if rng.random() < 0.3:
        words.insert(rng.randrange(len(words) + 1), rng.choice(NON_ASCII))
    s = " ".join(words)
    return s[0].upper() + s[1:] + rng.choice([".", "?", "!", ":", ""])


def content(rng, plain):
    r = rng.random()
    if r < 0.04:
        return ""
    if r < 0.07:
        return rng.choice(["  ", "\n", " \t\n ", "\u3000"])
    parts = [sentence(rng) for _ in range(rng.randint(1, 4))]
    text = rng.choice([" ", "\n", "\n\n", "  "]).join(parts)
    if rng.random() < 0.08:
        text = rng.choice(["[INST] ", "[/INST]", "<<SYS>>\n", "\n<</SYS>>", "[/INST] "]) + text
    if not plain and rng.random() < 0.05:
        text += " " + rng.choice(SPECIAL_TEXT) + " " + sentence(rng)
    return rng.choice(ENDS) + text + rng.choice(ENDS)


def conversation(rng, plain):
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": content(rng, plain)})
    for _ in range(rng.choice([1, 1, 2, 3, 4])):
        msgs.append({"role": "user", "content": content(rng, plain)})
        msgs.append({"role": "assistant", "content": content(rng, plain)})
    rec = {"messages": msgs}
    if rng.random() < 0.3:
        rec = {"id": rng.randrange(10**6), "messages": msgs, "source": "test"}
    if rng.random() < 0.2:
        for m in msgs:
            m["name"] = "x"  # other keys of a message are ignored
    return rec


def corpus(out, n, seed, plain):
    rng = random.Random(seed)
    with open(out, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps(conversation(rng, plain), ensure_ascii=rng.random() < 0.5) + "\n")
            if i % 37 == 5:
                f.write("  \n")  # a blank line is no record


def records(jsonl):
    return [json.loads(line)["messages"] for line in open(jsonl, encoding="utf-8") if line.strip()]


# ---- the templates, written out in Python ------------------------------------------------

def render(template, msgs, bos, eos):
    """The rendered text and the character spans the model must generate (the answers)."""
    text, spans = "", []
    if template == "llama3":
        text = bos
        for m in msgs:
            text += "<|start_header_id|>" + m["role"] + "<|end_header_id|>\n\n"
            start = len(text)
            text += m["content"].strip() + "<|eot_id|>"
            if m["role"] == "assistant":
                spans.append((start, len(text)))
        return text, spans
    system = msgs[0]["content"] if msgs[0]["role"] == "system" else None
    turns = msgs[1:] if system is not None else msgs
    for i in range(0, len(turns), 2):
        user, answer = turns[i]["content"], turns[i + 1]["content"]
        if i == 0 and system is not None:
            user = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + user
        text += bos + "[INST] " + user.strip() + " [/INST]"
        start = len(text)
        text += " " + answer.strip() + " " + eos
        spans.append((start, len(text)))
    return text, spans


def config_tokens(tokdir):
    cfg = json.load(open(os.path.join(tokdir, "tokenizer_config.json")))
    def content_of(v):
        return v["content"] if isinstance(v, dict) else v
    return content_of(cfg["bos_token"]), content_of(cfg["eos_token"])


def write(out, rows):
    with open(out, "w") as f:
        for ids, mask in rows:
            f.write(" ".join(map(str, ids)) + "|" + "".join(map(str, mask)) + "\n")


def reference(template, tokdir, jsonl, out):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(tokdir, "tokenizer.json"))
    bos, eos = config_tokens(tokdir)
    rows = []
    for msgs in records(jsonl):
        text, spans = render(template, msgs, bos, eos)
        enc = tok.encode(text, add_special_tokens=False)
        mask = [0] * len(enc.ids)
        for start, end in spans:
            first, last = enc.char_to_token(start), enc.char_to_token(end - 1)
            assert first is not None and last is not None, (text, start, end)
            for k in range(first, last + 1):
                mask[k] = 1
        rows.append((enc.ids, mask))
    write(out, rows)


def transformers_reference(template, tokdir, jsonl, out):
    from transformers import PreTrainedTokenizerFast
    bos, eos = config_tokens(tokdir)
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(tokdir, "tokenizer.json"), bos_token=bos,
                                  eos_token=eos)
    official, marked = (LLAMA3, LLAMA3_GEN) if template == "llama3" else (LLAMA2, LLAMA2_GEN)
    rows = []
    for n, msgs in enumerate(records(jsonl), 1):
        text = tok.apply_chat_template(msgs, chat_template=official, tokenize=False)
        mine, _ = render(template, msgs, bos, eos)
        if text != mine:
            sys.exit(f"record {n}: transformers renders {text!r}, this file {mine!r}")
        if tok.apply_chat_template(msgs, chat_template=marked, tokenize=False) != text:
            sys.exit(f"record {n}: the {{% generation %}} template renders another text")
        ids = tok.apply_chat_template(msgs, chat_template=official, tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        marks = tok.apply_chat_template(msgs, chat_template=marked, tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True)
        if list(marks["input_ids"]) != list(ids):
            sys.exit(f"record {n}: the {{% generation %}} template encodes to other ids")
        rows.append((list(ids), list(marks["assistant_masks"])))
    write(out, rows)


# ---- keel's shards ------------------------------------------------------------------------

def read_split(directory, split):
    """The ids and mask of DIR/SPLIT-NNNNN.bin, in order, checking each header."""
    names = sorted(f for f in os.listdir(directory) if f.startswith(split + "-") and f.endswith(".bin"))
    ids, mask = [], []
    for i, name in enumerate(names):
        assert name == f"{split}-{i:05d}.bin", names
        b = open(os.path.join(directory, name), "rb").read()
        magic, version, token_bytes, n, vocab, flags = struct.unpack_from("<8sIIQII", b, 0)
        assert magic == b"KEELTOK1", (name, magic)
        assert version == 2 and flags == 3, f"{name}: version {version}, flags {flags}: want a loss mask and document starts"
        assert token_bytes in (2, 4) and len(b) == 64 + n * token_bytes + 2 * ((n + 7) // 8), name
        ids += struct.unpack_from("<%d%s" % (n, "H" if token_bytes == 2 else "I"), b, 64)
        bits = b[64 + n * token_bytes:]
        mask += [(bits[i // 8] >> (i % 8)) & 1 for i in range(n)]
        assert all(x < vocab for x in ids)
    return ids, mask


def check(directory, ref, prefix=False):
    rows = []
    for line in open(ref):
        ids, mask = line.rstrip("\n").split("|")
        rows.append(([int(x) for x in ids.split()], [int(c) for c in mask]))
    streams = {s: read_split(directory, s) for s in ("train", "val")}
    at = {"train": 0, "val": 0}
    counts = {"train": 0, "val": 0}
    for n, (ids, mask) in enumerate(rows, 1):
        if prefix and n > 1 and all(at[s] == len(streams[s][0]) for s in at):
            rows = rows[:n - 1]
            break
        for s in ("train", "val"):
            got_ids, got_mask = streams[s]
            k = at[s]
            if got_ids[k:k + len(ids)] == ids:
                if got_mask[k:k + len(ids)] != mask:
                    sys.exit(f"record {n} ({s} tokens {k}..): mask\n  keel {got_mask[k:k + len(ids)]}\n"
                             f"  want {mask}\n  ids  {ids}")
                at[s] += len(ids)
                counts[s] += 1
                break
        else:
            sys.exit(f"record {n} is whole in neither split at train token {at['train']}, val token "
                     f"{at['val']}:\n  want  {ids}\n  train {streams['train'][0][at['train']:at['train'] + len(ids)]}\n"
                     f"  val   {streams['val'][0][at['val']:at['val'] + len(ids)]}")
    for s in ("train", "val"):
        if at[s] != len(streams[s][0]):
            sys.exit(f"{s} holds {len(streams[s][0]) - at[s]} tokens after the last record")
    total = at["train"] + at["val"]
    trained = sum(streams["train"][1]) + sum(streams["val"][1])
    print(len(rows), counts["train"], counts["val"], total, trained)


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "corpus":
        corpus(args[0], int(args[1]), int(args[2]), len(args) > 3 and args[3] == "plain")
    elif cmd == "reference":
        reference(*args)
    elif cmd == "transformers":
        transformers_reference(*args)
    elif cmd == "check":
        check(args[0], args[1], len(args) > 2 and args[2] == "prefix")
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
