#!/usr/bin/env bash
# `keel tokenize --model tokenizer.json` gives exactly the Hugging Face
# tokenizers library's ids and text (Tokenizer.encode without special tokens,
# decode keeping them), for tokenizer.json files built here with tokenizers
# itself (tests/data/hf_tokenizers.py; pinned below, in a venv cached under
# $KEEL_CACHE/venv-hf):
#   llama3           byte-level BPE trained on the text below with Llama 3's
#                    Split regex + ByteLevel, ignore_merges, merges written as
#                    "a b" strings, special and added tokens (lstrip/rstrip,
#                    single_word, a normalized one)
#   gpt2             byte-level BPE with GPT-2's ByteLevel pre-tokenizer
#                    (its own regex, add_prefix_space), merges as pairs
#   llama2           a SentencePiece BPE model (spm_train, byte fallback) as
#                    Llama 2's tokenizer.json: vocab and merges as transformers'
#                    LlamaConverter computes them, normalizer Prepend("▁") +
#                    Replace(" ", "▁"), byte_fallback, fuse_unk, decoder
#                    Replace + ByteFallback + Fuse + Strip
#   metaspace        the same model with the Metaspace pre-tokenizer
#                    (prepend_scheme first, no split), llama2's decoder
#   metaspace_split  Metaspace splitting at every "▁" (prepend_scheme
#                    always), Metaspace + ByteFallback + Fuse decoder
# Text: the lines tokenizer_matches_spm.sh gathers (license and copyright
# files, non-ASCII changelog and locale lines: accented Latin, Cyrillic,
# Greek, CJK, emoji) and hand-made edge cases (whitespace runs, tabs, CR,
# NUL, U+180E and NEL, combining marks, digits, contractions with the long
# s, special tokens inside text, invalid UTF-8 read as Python reads it with
# errors="replace"; U+180E lines repeated so that merges cross where
# PCRE2's \s and Oniguruma's would split differently). Decoding is checked on
# every 4th encoded line and on random ids over the whole vocabulary;
# decode(encode(x)) == x on every valid line (but those with <mask>, which
# strips spaces) of llama3 and on the valid lines without "▁" or special
# tokens of llama2. Then the refusals: WordPiece,
# Unigram and WordLevel models, an NFC normalizer, an invalid regex and a
# truncated file each exit 2 with one line naming the file and the cause.
set -euo pipefail
: "${KEEL_BIN:?set KEEL_BIN to the keel binary}"
: "${KEEL_SRC:?set KEEL_SRC to the source tree}"
TOKENIZERS_VERSION=0.23.3
for tool in spm_train spm_export_vocab; do
    command -v "$tool" >/dev/null \
        || { echo "FAIL: $tool not found (run scripts/install-deps.sh)"; exit 1; }
done
export LC_ALL=C RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false

work=$(mktemp -d /tmp/keel-test-tokenizer-hf-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
t0=$SECONDS

# ---- tokenizers, in a venv made once ------------------------------------------
venv="${KEEL_CACHE:-$KEEL_SRC/.cache}/venv-hf"
python="$venv/bin/python"
if ! "$python" -c "import tokenizers, sys; sys.exit(tokenizers.__version__ != '$TOKENIZERS_VERSION')" 2>/dev/null; then
    base=/usr/bin/python3
    [ -x "$base" ] || base=$(command -v python3)
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    "$base" -m venv "$venv" > "$work/venv.log" 2>&1 \
        || fail "cannot make a venv at $venv: $(tail -n 2 "$work/venv.log")"
    "$venv/bin/pip" install -q "tokenizers==$TOKENIZERS_VERSION" >> "$work/venv.log" 2>&1 \
        || fail "pip install tokenizers==$TOKENIZERS_VERSION failed: $(tail -n 2 "$work/venv.log")"
fi
hf() { "$python" "$KEEL_SRC/tests/data/hf_tokenizers.py" "$@"; }

# ---- text ---------------------------------------------------------------------
non_ascii() { grep -a -P '[^\x00-\x7F]' || true; }   # stdin: lines with non-ASCII bytes
{
    cat /usr/share/common-licenses/* 2>/dev/null || true
    find /usr/share/doc -name copyright -type f 2>/dev/null | sort | head -n 400 |
        xargs -r cat 2>/dev/null | head -n 40000 || true
    find /usr/share/doc -name 'changelog*.gz' -type f 2>/dev/null | sort |
        xargs -r zcat 2>/dev/null | non_ascii | head -n 4000 || true
    find /usr/share/i18n/locales -type f 2>/dev/null | sort |
        xargs -r cat 2>/dev/null | non_ascii | awk 'NR % 3 == 0' | head -n 4000 || true
    cat <<'TEXT'
Å Ç É Ñ Ö Ü ß à á â ã ä å æ ç è é ê ë ì í î ï ñ ò ó ô õ ö ø ù ú û ü ý ÿ Œ œ Š š Ÿ Ž ž
Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich.
Съешь же ещё этих мягких французских булок, да выпей чаю.
Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.
いろはにほへと ちりぬるを わかよたれそ つねならむ
天地玄黄，宇宙洪荒。日月盈昃，辰宿列张。
키스의 고유조건은 입술끼리 만나야 하고 특별한 기술은 필요치 않다.
Emoji: 😀 👍🏽 🎉 ❤️ 🇩🇪 👨‍👩‍👧 — “quoted” ‘text’ … ½ ① ﬁ ﬂ Ⅻ ㍻ ｶﾞ Ｆｕｌｌｗｉｄｔｈ　ｓｐａｃｅ
It's we're they've I'm you'll he'd IT'S WE'RE ſt x'ſ don't 'Ll 'D
<|begin_of_text|>Hello<|eot_id|> <|end_of_text|>  <mask>  x <mask>y keel keels akeel keel. [keel] Copyright  Copyright<mask>
<s>Hello</s> <s> <unk> <0x41> a<s>b </s>
combining: é ǻ नि  digits ١٢٣ Ⅳ ½ 1 12 123 1234 12345 1234567
TEXT
} > "$work/all.txt"
{
    printf '  leading and   inner   spaces   \n\ttab\tseparated\t\nwindows line\r\n\n   \n'
    printf 'nul\0byte\nbad \xff\xfe utf8 \xc3\x28 \xe2\x82 \xf0\x9f\x98\n\xed\xa0\x80 surrogate \xf4\x90\x80\x80 \xc0\xaf\n'
    printf 'zwsp\xe2\x80\x8bhere nbsp\xc2\xa0here ideo\xe3\x80\x80space mongolian\xe1\xa0\x8evs nel\xc2\x85x\n'
    # U+180E is White_Space to PCRE2's \s, not to Oniguruma's (tokenizers'): repeated, so that
    # the tokenizers learn merges across the places where the two would split differently
    for _ in $(seq 40); do
        printf 'mvs\xe1\xa0\x8e\xe1\xa0\x8e 1\xe1\xa0\x8e2 .\xe1\xa0\x8e, a \xe1\xa0\x8e\x62 \xe1\xa0\x8e.\n'
    done
    printf '\xe1\xa0\x8e\nx \xe1\xa0\x8e\n'
    printf '\xe2\x96\x81already\xe2\x96\x81escaped \xef\xbb\xbfbom\n'
    printf 'CR\rin\rthe middle\r\r  \r\n\t\t\t\n    x    \n \n'
    printf '%s\n' '1234567890 3.14159 2024-01-01 $100,000.00 user@example.com https://x.org/?b=c'
    head -c 20000 /usr/share/common-licenses/GPL-3 2>/dev/null | tr '\n' ' ' || true
    echo
} >> "$work/all.txt"
awk 'NR % 3 != 0' "$work/all.txt" > "$work/train.txt"
n_lines=$(wc -l < "$work/all.txt")
n_non_ascii=$(grep -a -c -P '[^\x00-\x7F]' "$work/all.txt" || true)
(( n_lines >= 3000 )) || fail "only $n_lines lines of text found on this machine"
(( n_non_ascii >= 100 )) || fail "only $n_non_ascii non-ASCII lines found on this machine"

# ---- tokenizers -----------------------------------------------------------------
spm_train --input="$work/train.txt" --model_prefix="$work/spm" --model_type=bpe --vocab_size=4000 \
    --byte_fallback=true --character_coverage=0.99995 --normalization_rule_name=identity \
    --remove_extra_whitespaces=false --split_digits=true --allow_whitespace_only_pieces=true \
    --num_threads=2 --minloglevel=1 > "$work/spm.log" 2>&1 \
    || fail "spm_train failed: $(tail -n 3 "$work/spm.log")"
spm_export_vocab --model="$work/spm.model" > "$work/spm.vocab"
hf make "$work/tok" "$work/train.txt" "$work/spm.vocab" || fail "building the tokenizer.json files failed"

# ---- comparison -------------------------------------------------------------
# same NAME INPUT WANT GOT: fail, showing the first differing lines, unless equal.
same() {
    local name=$1 input=$2 want=$3 got=$4
    cmp -s "$want" "$got" && return 0
    echo "FAIL: $name: keel's output differs from Hugging Face's; first differing lines:" >&2
    awk -v input="$input" -v got="$got" '
        { if ((getline in_line < input) <= 0) in_line = "?"
          if ((getline g < got) <= 0) g = "(no line)"
          if ($0 == g) next
          printf "line %d\n  input: %s\n  want:  %s\n  keel:  %s\n", NR, in_line, $0, g
          if (++shown == 5) exit }' "$want" >&2 || true
    printf '  (lines: want %s, keel %s)\n' "$(wc -l < "$want")" "$(wc -l < "$got")" >&2
    exit 1
}

# valid UTF-8 lines (for the round trip) but those with <mask> (it strips the spaces around
# it); sp: also without U+2581 and special tokens
perl -ne 'print if utf8::decode(my $s = $_) && !/<mask>/' "$work/all.txt" > "$work/valid.txt"
grep -a -v -e $'\xe2\x96\x81' -e '<s>' -e '</s>' -e '<unk>' "$work/valid.txt" > "$work/valid_sp.txt" || true
(( $(wc -l < "$work/valid.txt") >= 1000 )) || fail "only $(wc -l < "$work/valid.txt") valid lines"

names=(llama3 gpt2 llama2 metaspace metaspace_split)
# tokenizers' ids and text for all of them, on the other core while keel encodes
hf reference "$work/tok" "$work/all.txt" "${names[@]}" & reference=$!
for name in "${names[@]}"; do
    model="$work/tok/$name/tokenizer.json"
    "$KEEL_BIN" tokenize --model "$model" < "$work/all.txt" > "$work/$name.keel.ids" \
        || fail "$name: keel tokenize exited $?"
    # decode(encode(x)) == x where tokenizers has it (gpt2 keeps its add_prefix_space space,
    # the Metaspace forms lose leading spaces)
    [[ $name == llama3 || $name == llama2 ]] || continue
    valid="$work/valid.txt"
    [[ $name == llama3 ]] || valid="$work/valid_sp.txt"
    "$KEEL_BIN" tokenize --model "$model" < "$valid" |
        "$KEEL_BIN" tokenize --decode --model "$model" > "$work/$name.back"
    same "$name round trip" "$valid" "$valid" "$work/$name.back"
done
wait "$reference" || fail "tokenizers failed to encode or decode the text"
for name in "${names[@]}"; do
    model="$work/tok/$name/tokenizer.json"
    same "$name encode" "$work/all.txt" "$work/tok/$name.hf.ids" "$work/$name.keel.ids"
    # decode: every 4th encoded line, then random ids over the whole vocabulary
    awk 'NR % 4 == 1' "$work/$name.keel.ids" | cat - "$work/tok/$name.rand" > "$work/$name.dec.in"
    "$KEEL_BIN" tokenize --decode --model "$model" < "$work/$name.dec.in" > "$work/$name.keel.txt" \
        || fail "$name: keel tokenize --decode exited $?"
    same "$name decode" "$work/$name.dec.in" "$work/tok/$name.hf.txt" "$work/$name.keel.txt"
done

# ---- refusals: exit 2, one line naming the file and the cause -------------------
hf refusals "$work/bad" "$work/tok/llama3/tokenizer.json"
mkdir -p "$work/bad/truncated"
head -c 5000 "$work/tok/llama3/tokenizer.json" > "$work/bad/truncated/tokenizer.json"
refused() { # NAME PATTERN: keel must refuse bad/NAME/tokenizer.json saying PATTERN
    local name=$1 pattern=$2 file="$work/bad/$1/tokenizer.json" rc=0
    "$KEEL_BIN" tokenize --model "$file" < /dev/null > /dev/null 2> "$work/$name.err" || rc=$?
    [[ $rc == 2 ]] || fail "$name: keel exited $rc, want 2 ($(head -c 300 "$work/$name.err"))"
    [[ $(wc -l < "$work/$name.err") == 1 ]] || fail "$name: want one line, got: $(cat "$work/$name.err")"
    grep -q -F "$file" "$work/$name.err" || fail "$name: the message does not name the file: $(cat "$work/$name.err")"
    grep -q -E "$pattern" "$work/$name.err" || fail "$name: the message does not say '$pattern': $(cat "$work/$name.err")"
}
refused wordpiece 'model type WordPiece is not supported'
refused unigram 'model type Unigram is not supported'
refused wordlevel 'model type WordLevel is not supported'
refused nfc 'normalizer NFC is not supported'
refused bad_regex 'regex is invalid: PCRE2: .* at offset [0-9]+'
refused truncated 'not valid JSON'

echo "ok: ${#names[@]} tokenizer.json files, $n_lines lines ($n_non_ascii non-ASCII): ids and text equal" \
    "tokenizers $TOKENIZERS_VERSION's; 6 refusals ($((SECONDS - t0)) s)"
