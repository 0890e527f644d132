#!/usr/bin/env bash
# `keel tokenize` gives exactly spm_encode's ids and spm_decode's text on real
# text, for real BPE models trained here with Debian's spm_train:
#   bpe1k     vocab 1000, default nmt_nfkc normalization, byte fallback, low
#             character coverage (many characters fall back to bytes)
#   bpe8k     vocab 8000, identity normalization, byte fallback
#   llama     Llama 2's settings: identity, no whitespace removal, split digits,
#             whitespace-only pieces, byte fallback
#   nobytes   no byte fallback (runs of unknowns -> one <unk>), nmt_nfkc_cf,
#             user-defined and control symbols
# Text: license and copyright files, non-ASCII lines from changelogs and locale
# definitions (accented Latin, Cyrillic, Greek, CJK, emoji), the keel corpus
# ($KEEL_CACHE/corpus) when it has been built, and hand-made edge cases
# (whitespace runs, tabs, CR, NUL, malformed UTF-8, fullwidth forms). Every
# third line is held out of training. Decoding is checked on the encoded lines
# and on random id sequences (control, unk and byte ids included).
set -euo pipefail
: "${KEEL_BIN:?set KEEL_BIN to the keel binary}"
for tool in spm_train spm_encode spm_decode spm_export_vocab; do
    command -v "$tool" >/dev/null \
        || { echo "FAIL: $tool not found (run scripts/install-deps.sh)"; exit 1; }
done
export LC_ALL=C

work=$(mktemp -d /tmp/keel-test-tokenizer-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
t0=$SECONDS

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
    if [[ -n ${KEEL_CACHE:-} && -f $KEEL_CACHE/corpus/.complete ]]; then
        for f in "$KEEL_CACHE"/corpus/*.txt; do
            awk 'NR % 50 == 1' "$f" | head -n 3000 || true
        done
    fi
    cat <<'TEXT'
Å Ç É Ñ Ö Ü ß à á â ã ä å æ ç è é ê ë ì í î ï ñ ò ó ô õ ö ø ù ú û ü ý ÿ Œ œ Š š Ÿ Ž ž
Crème brûlée, façade, naïve coöperation, jalapeño, Ångström, smörgåsbord, Æsir.
Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich.
Příliš žluťoučký kůň úpěl ďábelské ódy. Pchnąć w tę łódź jeża lub ośm skrzyń fig.
Съешь же ещё этих мягких французских булок, да выпей чаю.
Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Γαζέες καὶ μυρτιὲς δὲν θὰ βρῶ πιὰ στὸ χρυσαφὶ ξέφωτο.
いろはにほへと ちりぬるを わかよたれそ つねならむ
天地玄黄，宇宙洪荒。日月盈昃，辰宿列张。
키스의 고유조건은 입술끼리 만나야 하고 특별한 기술은 필요치 않다.
Emoji: 😀 👍🏽 🎉 ❤️ 🇩🇪 👨‍👩‍👧 — “quoted” ‘text’ … ½ ① ﬁ ﬂ Ⅻ ㍻ ｶﾞ Ｆｕｌｌｗｉｄｔｈ　ｓｐａｃｅ
TEXT
} > "$work/all.txt"
# edge cases: runs of spaces, tabs, CR, NUL, U+3000, NBSP, U+2581, BOM, malformed UTF-8
{
    printf '  leading and   inner   spaces   \n\ttab\tseparated\t\nwindows line\r\n\n   \n'
    printf 'nul\0byte\nbad \xff\xfe utf8 \xc3\x28 \xe2\x82 \xf0\x9f\x98\n'
    printf 'zwsp\xe2\x80\x8bhere nbsp\xc2\xa0here ideo\xe3\x80\x80space\n'
    printf '\xe2\x96\x81already\xe2\x96\x81escaped \xef\xbb\xbfbom <s> </s> <unk> <0x41>\n'
    printf '%s\n' '1234567890 3.14159 2024-01-01 $100,000.00 user@example.com https://x.org/?b=c'
    # one long line (20 kB)
    head -c 20000 /usr/share/common-licenses/GPL-3 2>/dev/null | tr '\n' ' ' || true
    echo
} >> "$work/all.txt"

awk 'NR % 3 != 0' "$work/all.txt" > "$work/train.txt"
n_lines=$(wc -l < "$work/all.txt")
n_non_ascii=$(grep -a -c -P '[^\x00-\x7F]' "$work/all.txt" || true)
(( n_lines >= 3000 )) || fail "only $n_lines lines of text found on this machine"
(( n_non_ascii >= 100 )) || fail "only $n_non_ascii non-ASCII lines found on this machine"

# ---- models -------------------------------------------------------------------
train() { # NAME OPTIONS...
    local name=$1; shift
    spm_train --input="$work/train.txt" --model_prefix="$work/$name" --model_type=bpe \
        --hard_vocab_limit=false --num_threads=4 --minloglevel=1 "$@" > "$work/$name.log" 2>&1 \
        || fail "spm_train $name failed: $(tail -n 3 "$work/$name.log")"
}
train bpe1k --vocab_size=1000 --byte_fallback=true --character_coverage=0.98 &
train bpe8k --vocab_size=8000 --byte_fallback=true --character_coverage=0.9995 \
    --normalization_rule_name=identity &
train llama --vocab_size=4000 --byte_fallback=true --character_coverage=0.99995 \
    --normalization_rule_name=identity --remove_extra_whitespaces=false --split_digits=true \
    --allow_whitespace_only_pieces=true &
train nobytes --vocab_size=2000 --character_coverage=0.98 --normalization_rule_name=nmt_nfkc_cf \
    --user_defined_symbols='<sep>,<mask>,foo' --control_symbols='<ctl>' &
for job in $(jobs -p); do wait "$job" || fail "training failed"; done

# ---- comparison -------------------------------------------------------------
# same NAME INPUT WANT GOT: fail, showing the first differing lines, unless equal.
same() {
    local name=$1 input=$2 want=$3 got=$4
    cmp -s "$want" "$got" && return 0
    echo "FAIL: $name: keel's output differs from the expected; first differing lines:" >&2
    awk -v input="$input" -v got="$got" '
        { if ((getline in_line < input) <= 0) in_line = "?"
          if ((getline g < got) <= 0) g = "(no line)"
          if ($0 == g) next
          printf "line %d\n  input: %s\n  want:  %s\n  keel:  %s\n", NR, in_line, $0, g
          if (++shown == 5) exit }' "$want" >&2 || true
    printf '  (lines: want %s, keel %s)\n' "$(wc -l < "$want")" "$(wc -l < "$got")" >&2
    exit 1
}

# random_ids V: 3000 lines of 1-12 ids below V, weighted to the first 259
# (unk, control and byte pieces in these models).
random_ids() {
    awk -v V="$1" 'BEGIN {
        srand(7)
        for (i = 0; i < 3000; i++) {
            n = 1 + int(rand() * 12); line = ""
            for (j = 0; j < n; j++) {
                r = rand()
                id = r < 0.1 ? int(rand() * 3) : r < 0.4 ? 3 + int(rand() * 256) : int(rand() * V)
                if (id >= V) id = V - 1
                line = line (j ? " " : "") id
            }
            print line
        } }'
}

for name in bpe1k bpe8k llama nobytes; do
    model="$work/$name.model"
    spm_encode --model="$model" --output_format=id < "$work/all.txt" > "$work/$name.spm.ids"
    "$KEEL_BIN" tokenize --model "$model" < "$work/all.txt" > "$work/$name.keel.ids" \
        || fail "$name: keel tokenize exited $?"
    same "$name encode" "$work/all.txt" "$work/$name.spm.ids" "$work/$name.keel.ids"

    # decode: the encoded lines, then random ids over the whole vocabulary
    vocab=$(spm_export_vocab --model="$model" | wc -l)
    cat "$work/$name.spm.ids" <(random_ids "$vocab") > "$work/$name.dec.in"
    spm_decode --model="$model" --input_format=id < "$work/$name.dec.in" > "$work/$name.spm.txt"
    "$KEEL_BIN" tokenize --decode --model "$model" < "$work/$name.dec.in" > "$work/$name.keel.txt" \
        || fail "$name: keel tokenize --decode exited $?"
    same "$name decode" "$work/$name.dec.in" "$work/$name.spm.txt" "$work/$name.keel.txt"
done

# A byte-fallback model with identity normalization loses nothing: valid UTF-8
# lines without control characters, U+2581 or extra spaces come back exactly.
perl -ne 'print if utf8::decode(my $s = $_)
                   && !/[\x00-\x09\x0b-\x1f\x7f]|\xe2\x96\x81|  |^ | $|^$/' "$work/all.txt" \
    > "$work/clean.txt"
(( $(wc -l < "$work/clean.txt") >= 1000 )) || fail "only $(wc -l < "$work/clean.txt") clean lines"
"$KEEL_BIN" tokenize --model "$work/bpe8k.model" < "$work/clean.txt" |
    "$KEEL_BIN" tokenize --decode --model "$work/bpe8k.model" > "$work/clean.back"
same "bpe8k round trip" "$work/clean.txt" "$work/clean.txt" "$work/clean.back"

echo "ok: 4 models, $n_lines lines ($n_non_ascii non-ASCII): ids and text equal" \
    "spm_encode's and spm_decode's ($((SECONDS - t0)) s)"
