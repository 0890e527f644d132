#!/usr/bin/env bash
# `keel data prepare` end to end on real text with a real SentencePiece model:
# token counts equal spm_encode's plus one BOS and one EOS per document, the
# files are valid shards, --val-fraction makes a val split of about that size,
# output is deterministic, nothing is overwritten without --force, and bad
# input exits 2 with one line.
set -euo pipefail
: "${KEEL_BIN:?set KEEL_BIN to the keel binary}"
for tool in spm_train spm_encode od; do
    command -v "$tool" >/dev/null || { echo "FAIL: $tool not found (run scripts/install-deps.sh)"; exit 1; }
done

work=$(mktemp -d /tmp/keel-test-prepare-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# ---- inputs: license texts (paragraphs separated by blank lines) -----------
inputs=()
for f in GPL-3 Apache-2.0 LGPL-2.1 MPL-2.0; do
    [[ -f /usr/share/common-licenses/$f ]] && inputs+=("/usr/share/common-licenses/$f")
done
(( ${#inputs[@]} >= 2 )) || fail "need at least two texts from /usr/share/common-licenses"
# A file with CRLF line ends, whitespace-only separator lines, and no final newline.
printf 'First line of a document.\r\nIts second line.\r\n \t \r\nA second document\r\n\r\n\r\nThird one, unterminated' \
    > "$work/crlf.txt"
inputs+=("$work/crlf.txt")

spm_train --input="$(IFS=,; echo "${inputs[*]}")" --model_prefix="$work/tok" --vocab_size=600 \
    --model_type=bpe --character_coverage=1.0 > "$work/spm_train.log" 2>&1 \
    || fail "spm_train failed: $(tail -3 "$work/spm_train.log")"
model="$work/tok.model"

# ---- the expected count: spm_encode per line, plus BOS + EOS per document ---
# A document is a block of non-blank lines (blank: only spaces, tabs, CRs);
# the end of a file ends one. spm_train's defaults: bos_id 1, eos_id 2.
expected_tokens=0
expected_docs=0
for f in "${inputs[@]}"; do
    tr -d '\r' < "$f" > "$work/plain.txt"          # keel strips CR; spm_encode would keep it
    spm_encode --model="$model" --output_format=id < "$work/plain.txt" > "$work/ids.txt"
    [[ $(wc -l < "$work/ids.txt") -eq $(awk 'END { print NR }' "$work/plain.txt") ]] \
        || fail "spm_encode output is not one line per input line for $f"
    read -r tokens docs < <(awk '
        NR == FNR { n[FNR] = NF; next }
        /^[ \t]*$/ { in_doc = 0; next }
        { if (!in_doc) { docs++; in_doc = 1 } tokens += n[FNR] }
        END { print tokens + 0, docs + 0 }' "$work/ids.txt" "$work/plain.txt")
    expected_tokens=$((expected_tokens + tokens + 2 * docs))
    expected_docs=$((expected_docs + docs))
done
(( expected_docs > 100 )) || fail "too few documents in the inputs ($expected_docs)"

# Reads a shard: n_tokens from the header, all ids one per line (the bitmaps after them left out).
shard_n_tokens() { od -An -t u8 -j 16 -N 8 "$1" | tr -d ' '; }
shard_ids() { od -An -v -t u2 -j 64 -N $((2 * $(shard_n_tokens "$1"))) "$1" | tr -s ' ' '\n' | sed '/^$/d'; }
count_line() { grep -E "^$1: " "$2" | awk '{ print $2 }'; }

# ---- default: everything to train -----------------------------------------
"$KEEL_BIN" data prepare --model "$model" --input "${inputs[@]}" --out "$work/d1" > "$work/out1.txt" \
    || fail "prepare failed"
cat "$work/out1.txt"
[[ $(count_line train "$work/out1.txt") == "$expected_tokens" ]] \
    || fail "train tokens $(count_line train "$work/out1.txt"), expected $expected_tokens (spm_encode + BOS/EOS per document)"
grep -q "^train: $expected_tokens tokens in 1 file$" "$work/out1.txt" || fail "train line"
grep -q "^val: 0 tokens in 0 files$" "$work/out1.txt" || fail "no val by default"
grep -q "^total: $expected_tokens tokens from $expected_docs documents in " "$work/out1.txt" || fail "total line"
[[ $(ls "$work/d1") == "train-00000.bin" ]] || fail "d1 holds: $(ls "$work/d1")"
shard="$work/d1/train-00000.bin"
[[ $(head -c 8 "$shard") == KEELTOK1 ]] || fail "magic"
[[ $(shard_n_tokens "$shard") == "$expected_tokens" ]] || fail "header n_tokens"
[[ $(stat -c %s "$shard") == $((64 + 2 * expected_tokens + (expected_tokens + 7) / 8)) ]] \
    || fail "size: uint16 ids for a 600-token vocabulary and a bitmap of document starts"
# version 2, the document-start bitmap only, its bits exactly on the BOS of each document
python3 - "$shard" "$expected_docs" <<'PY' || fail "the document starts"
import struct, sys
b = open(sys.argv[1], "rb").read()
version, tb, n = struct.unpack_from("<IIQ", b, 8)
stored = struct.unpack_from("<I", b, 28)[0]
assert (version, stored) == (2, 2), (version, stored)
ids = struct.unpack_from(f"<{n}H", b, 64)
starts = [i for i in range(n) if b[64 + 2 * n + i // 8] >> (i % 8) & 1]
assert len(starts) == int(sys.argv[2]) and all(ids[i] == 1 for i in starts), (len(starts), sys.argv[2])
PY
shard_ids "$shard" > "$work/ids1.txt"
[[ $(head -1 "$work/ids1.txt") == 1 ]] || fail "the stream starts with BOS"
[[ $(tail -1 "$work/ids1.txt") == 2 ]] || fail "the stream ends with EOS"
[[ $(grep -cx 1 "$work/ids1.txt") == "$expected_docs" ]] || fail "one BOS per document"
[[ $(grep -cx 2 "$work/ids1.txt") == "$expected_docs" ]] || fail "one EOS per document"
# The first document's ids are BOS + spm_encode of its lines + EOS.
first_doc=$(awk '/^[ \t]*$/ { if (started) exit; next } { started = 1; print }' "${inputs[0]}" \
    | spm_encode --model="$model" --output_format=id | tr ' ' '\n' | sed '/^$/d')
n_first=$(printf '%s\n' "$first_doc" | wc -l)
diff <(printf '1\n%s\n2\n' "$first_doc") <(head -n $((n_first + 2)) "$work/ids1.txt") > /dev/null \
    || fail "first document's ids differ from BOS + spm_encode + EOS"

# ---- a line longer than a read block (256 KiB) is never cut ----------------
# One document of two lines, over 65536 tokens: two chunks, one BOS, one EOS.
for _ in $(seq 10); do tr '\n' ' ' < "${inputs[0]}"; done > "$work/long-line.txt"
printf '\nthe same document goes on\n' >> "$work/long-line.txt"
(( $(stat -c %s "$work/long-line.txt") > 262144 )) || fail "long-line.txt is too short"
long_expected=$(( $(spm_encode --model="$model" --output_format=id < "$work/long-line.txt" | wc -w) + 2 ))
"$KEEL_BIN" data prepare --model "$model" --input "$work/long-line.txt" --out "$work/dl" \
    > "$work/outl.txt" || fail "prepare of a long line failed"
grep -q "^train: $long_expected tokens in 1 file$" "$work/outl.txt" \
    || fail "long line: $(head -1 "$work/outl.txt"), expected $long_expected tokens"
grep -q "^split: 0 of 2 document chunks to val" "$work/outl.txt" || fail "long line: $(grep split: "$work/outl.txt")"
shard_ids "$work/dl/train-00000.bin" > "$work/idsl.txt"
[[ $(grep -cx 1 "$work/idsl.txt") == 1 && $(grep -cx 2 "$work/idsl.txt") == 1 ]] || fail "long line: BOS/EOS"

# ---- the prepared data trains, and a vocabulary mismatch is one line --------
tiny="${KEEL_SRC:-$(dirname "$0")/../..}/configs/tiny.json"
if [[ -f $tiny ]]; then
    small=(--set "data.path=$work/d1" --set "data.tokenizer=$model" --set model.max_seq_len=32
           --set model.n_layers=1 --set model.dim=64 --set model.n_heads=2 --set model.n_kv_heads=2
           --set train.steps=2)
    "$KEEL_BIN" train "$tiny" --run-dir "$work/run1" "${small[@]}" --set model.vocab_size=600 \
        > "$work/train.log" 2>&1 || fail "training on prepared data failed: $(tail -3 "$work/train.log")"
    set +e
    err=$("$KEEL_BIN" train "$tiny" --run-dir "$work/run2" "${small[@]}" --set model.vocab_size=601 2>&1 > /dev/null)
    rc=$?
    set -e
    [[ $rc == 2 && $(printf '%s\n' "$err" | wc -l) == 1 && $err == *model.vocab_size* && $err == *600* ]] \
        || fail "vocab mismatch: exit $rc: $err"
    echo "ok (vocab mismatch): $err"
fi

# ---- val split and small shards -------------------------------------------
"$KEEL_BIN" data prepare --model "$model" --input "${inputs[@]}" --out "$work/d2" \
    --val-fraction 0.1 --shard-tokens 5000 > "$work/out2.txt" || fail "prepare with val failed"
cat "$work/out2.txt"
train=$(count_line train "$work/out2.txt")
val=$(count_line val "$work/out2.txt")
(( train + val == expected_tokens )) || fail "train $train + val $val != $expected_tokens"
# Each document goes to val with chance 0.1 (a hash of its text), so val's
# share is a sample: over these ~300 documents its standard deviation is about
# 2.5 points. data_split_by_hash.sh checks the split itself on a big corpus.
(( val * 100 >= expected_tokens * 4 && val * 100 <= expected_tokens * 20 )) \
    || fail "val has $val of $expected_tokens tokens, not 4-20% (--val-fraction 0.1)"
sum_train=0; n_train=0; sum_val=0; n_val=0
for f in "$work"/d2/*.bin; do
    n=$(shard_n_tokens "$f")
    (( n >= 1 && n <= 5000 )) || fail "$f has $n tokens (limit 5000)"
    case $(basename "$f") in
        train-*) sum_train=$((sum_train + n)); n_train=$((n_train + 1)) ;;
        val-*) sum_val=$((sum_val + n)); n_val=$((n_val + 1)) ;;
        *) fail "unexpected file $f" ;;
    esac
done
(( sum_train == train && sum_val == val )) || fail "file token sums $sum_train/$sum_val != $train/$val"
grep -qE "^train: $train tokens in $n_train files?$" "$work/out2.txt" || fail "train file count"
grep -qE "^val: $val tokens in $n_val files?$" "$work/out2.txt" || fail "val file count"
[[ -f "$work/d2/val-00000.bin" && -f "$work/d2/train-$(printf %05d $((n_train - 1))).bin" ]] \
    || fail "file numbering"
# Every document sits whole in one split: each split's stream holds as many BOS as EOS.
for split in train val; do
    ids=$(for f in "$work"/d2/$split-*.bin; do shard_ids "$f"; done)
    [[ $(grep -cx 1 <<< "$ids") == $(grep -cx 2 <<< "$ids") ]] || fail "$split splits a document"
done

# ---- deterministic ---------------------------------------------------------
"$KEEL_BIN" data prepare --model "$model" --input "${inputs[@]}" --out "$work/d3" \
    --val-fraction 0.1 --shard-tokens 5000 > /dev/null || fail "second prepare failed"
diff -r "$work/d2" "$work/d3" > /dev/null || fail "two runs on the same input differ"

# ---- no overwrite without --force ------------------------------------------
sums_before=$(cd "$work/d2" && md5sum ./*.bin)
set +e
err=$("$KEEL_BIN" data prepare --model "$model" --input "${inputs[0]}" --out "$work/d2" 2>&1 > /dev/null)
rc=$?
set -e
[[ $rc == 2 ]] || fail "prepare into a directory with shards exited $rc, expected 2"
[[ $(printf '%s\n' "$err" | wc -l) == 1 && $err == *--force* ]] || fail "refusal message: $err"
[[ $(cd "$work/d2" && md5sum ./*.bin) == "$sums_before" ]] || fail "refused prepare changed files"

# --force replaces the dataset, old extra shards included.
"$KEEL_BIN" data prepare --model "$model" --input "${inputs[0]}" --out "$work/d2" --force \
    > "$work/out4.txt" || fail "--force failed"
[[ $(ls "$work/d2") == "train-00000.bin" ]] || fail "after --force d2 holds: $(ls "$work/d2" | tr '\n' ' ')"
grep -q "^train: .* tokens in 1 file$" "$work/out4.txt" || fail "--force output"
# A --force prepare that fails half-way — its second input is gone by the time it is read,
# after shards of the first were written — leaves the dataset that was there as it was.
sums_before=$(cd "$work/d2" && md5sum ./*.bin)
for _ in $(seq 1 100); do cat "${inputs[0]}"; done > "$work/big.txt" # megabytes: seconds to encode
cp "${inputs[1]}" "$work/second.txt"
"$KEEL_BIN" data prepare --model "$model" --input "$work/big.txt" --input "$work/second.txt" \
    --shard-tokens 1000 --threads 1 --out "$work/d2" --force > /dev/null 2> "$work/half.err" &
prep=$!
for _ in $(seq 1 600); do [[ -n $(find "$work/d2" -name train-00002.bin) ]] && break; sleep 0.05; done
rm "$work/second.txt"
rc=0; wait "$prep" || rc=$?
[[ $rc == 2 ]] && grep -q "second.txt" "$work/half.err" || fail "a prepare whose input vanished: exit $rc: $(cat "$work/half.err")"
[[ $(cd "$work/d2" && md5sum ./*.bin) == "$sums_before" && $(ls -A "$work/d2") == "train-00000.bin" ]] ||
    fail "a failed --force prepare changed the dataset: $(ls -A "$work/d2" | tr '\n' ' ')"

# ---- bad input: exit 2 and exactly one line --------------------------------
expect_usage_error() {
    local what=$1; shift
    set +e
    local err
    err=$("$KEEL_BIN" data "$@" 2>&1 > /dev/null)
    local rc=$?
    set -e
    [[ $rc == 2 ]] || fail "$what: exit $rc, expected 2 ($err)"
    [[ $(printf '%s\n' "$err" | wc -l) == 1 && -n $err ]] || fail "$what: not one line: $err"
    echo "ok ($what): $err"
}
printf 'not a sentencepiece model\n' > "$work/bad.model"
expect_usage_error "missing input" prepare --model "$model" --input "$work/nope.txt" --out "$work/e1"
expect_usage_error "missing model" prepare --model "$work/nope.model" --input "${inputs[0]}" --out "$work/e2"
expect_usage_error "unreadable model" prepare --model "$work/bad.model" --input "${inputs[0]}" --out "$work/e3"
expect_usage_error "fraction too big" prepare --model "$model" --input "${inputs[0]}" --out "$work/e4" --val-fraction 1.5
expect_usage_error "fraction not a number" prepare --model "$model" --input "${inputs[0]}" --out "$work/e5" --val-fraction abc
expect_usage_error "negative fraction" prepare --model "$model" --input "${inputs[0]}" --out "$work/e6" --val-fraction -0.1
expect_usage_error "zero shard tokens" prepare --model "$model" --input "${inputs[0]}" --out "$work/e7" --shard-tokens 0
expect_usage_error "no --out" prepare --model "$model" --input "${inputs[0]}"
expect_usage_error "no --input" prepare --model "$model" --out "$work/e8"
expect_usage_error "unknown option" prepare --model "$model" --input "${inputs[0]}" --out "$work/e9" --bogus
expect_usage_error "zero threads" prepare --model "$model" --input "${inputs[0]}" --out "$work/e10" --threads 0
expect_usage_error "too many threads" prepare --model "$model" --input "${inputs[0]}" --out "$work/e11" --threads 257
expect_usage_error "threads not a number" prepare --model "$model" --input "${inputs[0]}" --out "$work/e12" --threads 2x
expect_usage_error "negative seed" prepare --model "$model" --input "${inputs[0]}" --out "$work/e13" --split-seed -1
expect_usage_error "seed not a number" prepare --model "$model" --input "${inputs[0]}" --out "$work/e14" --split-seed abc
expect_usage_error "unknown subcommand" frobnicate
for d in e1 e2 e3 e4 e5 e6 e7 e8 e9 e10 e11 e12 e13 e14; do
    [[ ! -e "$work/$d" ]] || [[ -z $(ls "$work/$d") ]] || fail "failed prepare left files in $d"
done
# the help read whole first: `grep -q` on the pipe would quit early and SIGPIPE keel (pipefail)
"$KEEL_BIN" data prepare --help > "$work/help.txt" || fail "data prepare --help failed"
for opt in --val-fraction --split-seed --threads; do
    grep -q -- "$opt" "$work/help.txt" || fail "--help lacks $opt"
done
echo "data_prepare_cli: ok"
