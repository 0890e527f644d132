#!/usr/bin/env bash
# `keel data prepare` reads datasets as users have them: one corpus as .txt,
# as JSON Lines (.jsonl: one record a document; blank lines between records,
# extra keys, \u escapes, empty records), .jsonl.gz, .jsonl.zst, a directory
# of shards (sorted, other files ignored), a glob, a pipe and another
# --text-key all give bit-identical shard files; 1 and 2 threads too; blank
# lines inside a record do not end its document; --strict-utf8 changes
# nothing on valid text and names the line and byte of invalid UTF-8 in a
# text line or a record's text; --max-tokens stops at a
# document's end; on a terminal a progress line shows, elsewhere nothing; and
# each kind of bad input exits 2 with one line naming the file (and line),
# leaving the dataset that was there as it was.
source "$KEEL_SRC/tests/lib.sh"
for tool in spm_train gzip zstd python3 script; do
    command -v "$tool" >/dev/null || fail "$tool not found (run scripts/install-deps.sh)"
done

# ---- the corpus: license texts (paragraphs) four times over, CRLF and non-ASCII included
licenses=()
for f in GPL-3 Apache-2.0 LGPL-2.1 MPL-2.0; do
    [ -f "/usr/share/common-licenses/$f" ] && licenses+=("/usr/share/common-licenses/$f")
done
[ ${#licenses[@]} -ge 2 ] || fail "need at least two texts from /usr/share/common-licenses"
{
    for round in 1 2 3 4; do
        for f in "${licenses[@]}"; do cat "$f"; printf '\n  \t\n'; done
        printf 'Round %s: Gr\xc3\xbc\xc3\x9fe aus K\xc3\xb6ln \xe2\x80\x94 caf\xc3\xa9 \xf0\x9f\x98\x80\r\nzweite Zeile\r\n\r\n' "$round"
    done
    printf 'last document, no final newline'
} > "$TMP/corpus.txt"
[ "$(stat -c %s "$TMP/corpus.txt")" -gt 300000 ] || fail "the corpus is under 300 KB: it must span read blocks (256 KiB)"
spm_train --input="$(IFS=,; echo "${licenses[*]}")" --model_prefix="$TMP/tok" --vocab_size=600 \
    --model_type=bpe --character_coverage=1.0 --byte_fallback=true >"$TMP/spm.log" 2>&1 \
    || fail "spm_train: $(tail -2 "$TMP/spm.log")"

# The .txt's documents (blocks of non-blank lines; blank: only spaces, tabs, CRs), each as a
# JSON Lines record of its lines joined with "\n" (their CRs kept: keel cuts a line's CRs in
# both formats), with an "id" and a "meta" object before the text, ASCII-escaped (\u00fc, a
# surrogate pair for the emoji); among them empty records and blank lines, which add nothing.
# python3 jsonl.py OUT KEY [PARTS]: OUT, or OUT-00.jsonl ... OUT-<PARTS-1>.jsonl
cat >"$TMP/jsonl.py" <<'PY'
import json, sys
out, key, parts = sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0
docs, cur = [], []
for line in open(sys.argv[4] if len(sys.argv) > 4 else "corpus.txt", "rb").read().split(b"\n"):
    if line.strip(b" \t\r") == b"":
        if cur: docs.append(b"\n".join(cur)); cur = []
    else:
        cur.append(line)
if cur: docs.append(b"\n".join(cur))
records = []
for i, d in enumerate(docs):
    rec = {"id": i, "meta": {"source": "licenses", "text": 5}, key: d.decode("utf-8")}
    if key != "text": rec["text"] = "not this one"
    records.append(json.dumps(rec))
    if i % 50 == 7: records.append(json.dumps({key: ""}))         # empty records: skipped
    if i % 50 == 8: records.append(json.dumps({key: " \n\t\r\n"}))
    if i % 70 == 9: records.append("   ")                         # a blank line: no record
def write(path, recs):
    with open(path, "w") as f: f.write("".join(r + "\n" for r in recs))
if parts:
    n = (len(records) + parts - 1) // parts
    for p in range(parts): write(f"{out}-{p:02d}.jsonl", records[p * n:(p + 1) * n])
else:
    write(out, records)
print(len(docs))
PY
cd "$TMP"
mkdir prep
n_docs=$(python3 jsonl.py corpus.jsonl text)
python3 jsonl.py content.jsonl content >/dev/null
n_empty=$(python3 - <<'PY'
import json
print(sum(1 for l in open("corpus.jsonl") if l.strip() and not json.loads(l)["text"].strip(" \t\r\n")))
PY
)
[ "$n_docs" -gt 300 ] && [ "$n_empty" -gt 5 ] || fail "corpus: $n_docs documents, $n_empty empty records"
gzip -k corpus.jsonl
zstd -q -k corpus.jsonl
# a directory of shards: sorted by path, sub/ after part-*; other files ignored
mkdir -p dir/sub glob
python3 jsonl.py part text 4 >/dev/null
zstd -q --rm part-00.jsonl -o dir/part-00.jsonl.zst
gzip -c part-01.jsonl > dir/part-01.jsonl.gz && rm part-01.jsonl
mv part-02.jsonl dir/part-02.json
mv part-03.jsonl dir/sub/part-03.jsonl
echo "not an input" > dir/README.md
echo "neither" > dir/sub/notes.jsonl.bak
python3 jsonl.py glob/shard text 4 >/dev/null
zstd -q --rm glob/shard-*.jsonl
echo "a file the pattern does not match" > glob/shard-99.txt

prepare() { # NAME ARGS...: prepare into $TMP/prep/NAME (2 threads unless told), the summary in NAME.txt
    local out=$TMP/prep/$1; shift
    "$KEEL_BIN" data prepare --model "$TMP/tok.model" --out "$out" --val-fraction 0.1 --shard-tokens 20000 \
        --threads 2 "$@" >"$out.txt" 2>"$out.err" || fail "prepare $*: exit $? ($(cat "$out.err"))"
    [ ! -s "$out.err" ] || fail "prepare $*: stderr without a terminal: $(cat "$out.err")"
}
same() { # A B: the two prepared directories hold the same files, bit for bit
    [ "$(ls "$TMP/prep/$1")" = "$(ls "$TMP/prep/$2")" ] || fail "$2 holds $(ls "$TMP/prep/$2" | tr '\n' ' '), $1 $(ls "$TMP/prep/$1" | tr '\n' ' ')"
    for f in "$TMP/prep/$1"/*.bin; do
        cmp -s "$f" "$TMP/prep/$2/$(basename "$f")" || fail "$2/$(basename "$f") differs from $1's"
    done
}

# ---- the same shards from every layout ------------------------------------------------
prepare txt --input corpus.txt --threads 1
cat prep/txt.txt
[ "$(ls prep/txt | grep -c '^train-')" -ge 3 ] && [ -f prep/txt/val-00000.bin ] || fail "the reference holds $(ls prep/txt | tr '\n' ' ')"
grep -q "^total: .* from $n_docs documents in " prep/txt.txt || fail "the .txt is not $n_docs documents: $(grep total: prep/txt.txt)"
grep -q '^inputs: 1 file: 1 text$' prep/txt.txt || fail "inputs line: $(grep inputs: prep/txt.txt)"
prepare jsonl --input corpus.jsonl --threads 1
same txt jsonl
grep -q "^records: $((n_docs + n_empty)) JSON records, $n_empty of them empty (skipped)$" prep/jsonl.txt \
    || fail "records line: $(grep records: prep/jsonl.txt) (want $((n_docs + n_empty)), $n_empty empty)"
pass ".jsonl (one thread) = .txt (one thread)"
prepare jsonl2 --input corpus.jsonl
same txt jsonl2
prepare txt2 --input corpus.txt
same txt txt2
pass "2 threads = 1 thread (.txt and .jsonl)"
prepare gz --input corpus.jsonl.gz
same txt gz
prepare zst --input corpus.jsonl.zst --threads 1
same txt zst
grep -q '^inputs: 1 file: 1 JSON Lines; 1 zstd$' prep/zst.txt || fail "inputs line: $(grep inputs: prep/zst.txt)"
pass ".jsonl.gz and .jsonl.zst = .txt"
prepare dir --input dir
same txt dir
grep -q '^inputs: 4 files: 4 JSON Lines; 1 zstd, 1 gzip; 2 other files in directories ignored$' prep/dir.txt \
    || fail "inputs line: $(grep inputs: prep/dir.txt)"
prepare dir_slash --input dir/ --threads 1
same txt dir_slash
pass "a directory of .jsonl.zst, .jsonl.gz, .json and sub/*.jsonl = .txt (README.md, .bak ignored)"
prepare glob --input 'glob/shard-*.jsonl.zst'
same txt glob
grep -q '^inputs: 4 files: 4 JSON Lines; 4 zstd$' prep/glob.txt || fail "inputs line: $(grep inputs: prep/glob.txt)"
prepare glob_abs --input "$TMP/glob/shard-0[0-3].jsonl.z*" --threads 1
same txt glob_abs
pass "a glob (sorted) = .txt"
prepare content --input content.jsonl --text-key content
same txt content
pass "--text-key content = .txt"
prepare pipe --input <(cat corpus.txt)
same txt pipe
zstd -q -c corpus.txt > corpus.txt.zst
gzip -c corpus.txt > notes.gz
prepare txtzst --input corpus.txt.zst --threads 1
same txt txtzst
prepare txtgz --input notes.gz
same txt txtgz
pass "a pipe, .txt.zst and a named .gz of text = .txt"

# ---- blank lines inside a record do not end its document ---------------------------------
printf 'first line\nsecond line\nthird\n\nan other document\n' > blank.txt
printf '{"text": "first line\\n\\n  \\t\\nsecond line\\r\\n\\r\\nthird\\n"}\n{"text": "an other document"}\n' > blank.jsonl
prepare blank_txt --input blank.txt --val-fraction 0
prepare blank_jsonl --input blank.jsonl --val-fraction 0
same blank_txt blank_jsonl
grep -q "^total: .* from 2 documents" prep/blank_jsonl.txt || fail "blank lines in a record: $(grep total: prep/blank_jsonl.txt)"
pass "a record's blank lines do not end its document"

# ---- --strict-utf8 ------------------------------------------------------------------------
prepare strict_txt --input corpus.txt --strict-utf8 --threads 1
same txt strict_txt
prepare strict_jsonl --input corpus.jsonl.zst --strict-utf8
same txt strict_jsonl
# invalid UTF-8 past the first read block (the line number counts across blocks), in a record's
# text after unescaping; read as the tokenizer reads bytes without --strict-utf8
{ cat corpus.txt; printf '\nok line\ncaf\xc3\xa9 and \xe9t\xe9\n'; } > latin.txt
latin_line=$(( $(wc -l < corpus.txt) + 3 ))
printf '{"text": "a"}\n{"id": 1, "text": "ok \\u00e9 \xff\xfe"}\n' > latin.jsonl
prepare latin_txt --input latin.txt
prepare latin_jsonl --input latin.jsonl --val-fraction 0
pass "--strict-utf8 on valid UTF-8 (non-ASCII included) changes nothing; without it invalid UTF-8 is read"

# ---- --max-tokens -------------------------------------------------------------------------
ids() { od -An -v -t u2 -j 64 -N $((2 * $(od -An -t u8 -j 16 -N 8 "$1" | tr -d ' '))) "$1" | tr -s ' ' '\n' | sed '/^$/d'; }
prepare all --input corpus.jsonl.zst --val-fraction 0 --shard-tokens 100000000
total=$(awk '/^total:/ { print $2 }' prep/all.txt)
! grep -q '^cap:' prep/all.txt || fail "a cap line without --max-tokens"
cap=$((total / 3))
prepare cap1 --input corpus.jsonl.zst --val-fraction 0 --shard-tokens 100000000 --max-tokens $cap --threads 1
prepare cap2 --input corpus.jsonl.zst --val-fraction 0 --shard-tokens 100000000 --max-tokens $cap
same cap1 cap2
got=$(awk '/^total:/ { print $2 }' prep/cap1.txt)
grep -q "^cap: --max-tokens $cap reached at the end of a document ($got tokens); the rest of the inputs was not read$" prep/cap1.txt \
    || fail "cap line: $(grep cap: prep/cap1.txt)"
ids prep/all/train-00000.bin > all.ids
ids prep/cap1/train-00000.bin > cap.ids
[ "$(wc -l < cap.ids)" = "$got" ] && [ "$got" -ge "$cap" ] && [ "$got" -lt "$total" ] || fail "--max-tokens $cap wrote $got of $total tokens"
cmp -s cap.ids <(head -n "$got" all.ids) || fail "--max-tokens did not write a prefix of the whole stream"
[ "$(tail -1 cap.ids)" = 2 ] || fail "--max-tokens stopped inside a document (last id $(tail -1 cap.ids), not EOS)"
last_bos=$(grep -nx 1 cap.ids | tail -1 | cut -d: -f1)
[ $((last_bos - 1)) -lt "$cap" ] || fail "--max-tokens went on past the document that reached $cap"
prepare nocap --input corpus.jsonl.zst --val-fraction 0 --shard-tokens 100000000 --max-tokens $((total * 2))
same all nocap
pass "--max-tokens $cap: $got tokens, a prefix ending at a document's end; 1 = 2 threads"

# ---- progress on a terminal only -----------------------------------------------------------
# about 3 s of text at the speed the first prepare measured (one thread), so that a line is due
rate=$(sed -n 's/^text: .* s: \([0-9.]*\) MB\/s on 1 thread$/\1/p' prep/txt.txt)
copies=$(python3 -c "import math, os; print(max(2, math.ceil(3 * float('$rate') * 1e6 / os.path.getsize('corpus.txt'))))")
for _ in $(seq "$copies"); do cat corpus.txt; printf '\n'; done > big.txt
size_mb=$(python3 -c "import os; print('%.1f' % (os.path.getsize('big.txt') / 1e6))")
script -qec "'$KEEL_BIN' data prepare --model '$TMP/tok.model' --input big.txt --out '$TMP/prep/tty' --threads 1" \
    /dev/null > tty.log < /dev/null || fail "prepare on a terminal: $(tail -3 tty.log)"
grep -aEq "prepare: [0-9]+ documents, [0-9.]+ of $size_mb MB read, [0-9.]+ MB/s, [0-9]+:[0-9]{2}:[0-9]{2} left" tty.log \
    || fail "no progress line on a terminal: $(tr '\r' '\n' < tty.log | head -5)"
grep -aq '^train: ' tty.log || fail "no summary on a terminal"
pass "a progress line on a terminal ($(tr '\r' '\n' < tty.log | grep -a -m1 'prepare: ' | sed 's/\x1b\[K//g'))"

# ---- bad input: exit 2, one line naming the file (and line), nothing overwritten ------------
bad() { # NAME PATTERN ARGS...: prepare --force into prep/keep must fail with one line
    local name=$1 pattern=$2; shift 2
    expect_input_error "$name" "$pattern" "$KEEL_BIN" data prepare --model "$TMP/tok.model" --out "$TMP/prep/keep" \
        --force "$@"
    [ "$(cd prep/keep && md5sum ./*.bin)" = "$keep_sums" ] && [ "$(ls -A prep/keep)" = "$keep_files" ] \
        || fail "$name: the dataset in --out changed: $(ls -A prep/keep | tr '\n' ' ')"
}
prepare keep --input blank.txt --val-fraction 0
keep_sums=$(cd prep/keep && md5sum ./*.bin)
keep_files=$(ls -A prep/keep)
n_lines=$(wc -l < corpus.jsonl)
bad_line=$((n_lines + 1))
cp corpus.jsonl late.jsonl && echo '{"text": "unterminated' >> late.jsonl
bad "malformed record (after a block)" "late\.jsonl:$bad_line: malformed JSON record at byte [0-9]+ of 22 " --input late.jsonl
printf '{"text": "a"}\n{"text": "b",}\n' > comma.jsonl
bad "malformed record" "comma\.jsonl:2: malformed JSON record .*JSON Lines" --input corpus.txt --input comma.jsonl
printf '{"text": "a"}\n\n{"body": "b", "id": 7}\n' > nokey.jsonl
bad "no text key" 'nokey\.jsonl:3: the record has no "text" key \(its keys: "body", "id"\); .*--text-key' --input nokey.jsonl
bad "no such --text-key" 'corpus\.jsonl:1: the record has no "body" key .*--text-key' --input corpus.jsonl --text-key body
for v in '5|a number' 'null|null' '["a"]|an array' '{"a": 1}|an object' 'true|a boolean'; do
    printf '{"text": "a"}\n{"text": %s}\n' "${v%%|*}" > type.jsonl
    bad "text is ${v#*|}" "type\.jsonl:2: \"text\" is ${v#*|}, not a string" --input type.jsonl
done
printf '{"text": "a"}\n"just a string"\n' > notobj.jsonl
bad "record not an object" 'notobj\.jsonl:2: the record is a string, not a JSON object' --input notobj.jsonl
printf '  \n[{"text": "a"},\n {"text": "b"}]\n' > array.json
bad "a JSON array" 'array\.json holds a JSON array; .*JSON Lines' --input array.json
head -c $(( $(stat -c %s corpus.jsonl.zst) / 2 )) corpus.jsonl.zst > cut.jsonl.zst
bad "truncated .zst" 'cut\.jsonl\.zst is truncated: its zstd data ends mid-frame' --input corpus.jsonl.zst --input cut.jsonl.zst
head -c $(( $(stat -c %s corpus.jsonl.gz) / 2 )) corpus.jsonl.gz > cut.txt.gz
bad "truncated .gz" 'cut\.txt\.gz is truncated: its gzip data ends mid-stream' --input cut.txt.gz
python3 -c "
import sys; b = bytearray(open('corpus.jsonl.gz', 'rb').read()); b[len(b) // 3:len(b) // 3 + 64] = bytes(64)
open('bad.jsonl.gz', 'wb').write(b)"
bad "corrupt .gz" 'bad\.jsonl\.gz is corrupt: gzip data error' --input bad.jsonl.gz
python3 -c "
b = bytearray(open('corpus.jsonl.zst', 'rb').read()); b[len(b) // 3:len(b) // 3 + 64] = bytes(64)
open('bad.jsonl.zst', 'wb').write(b)"
bad "corrupt .zst" 'bad\.jsonl\.zst is corrupt: zstd data error' --input bad.jsonl.zst
printf 'plain text, not zstd\n' > fake.jsonl.zst
bad "not zstd at all" 'fake\.jsonl\.zst is corrupt: zstd data error' --input fake.jsonl.zst
: > empty.txt.gz
bad "empty .gz" 'empty\.txt\.gz is truncated' --input empty.txt.gz
mkdir -p nothing/deeper && echo x > nothing/deeper/a.md && echo y > nothing/b.csv
bad "directory without inputs" 'directory nothing holds no \.txt, \.jsonl, \.json or \.parquet file .*only 2 other files' --input nothing
bad "glob without a match" "pattern 'glob/\*\.jsonl' matches no file" --input 'glob/*.jsonl'
bad "missing file" 'input nope\.jsonl: No such file or directory' --input nope.jsonl
bad "empty --text-key" 'prepare: --text-key is empty' --input corpus.jsonl --text-key ''
bad "zero --max-tokens" 'prepare: --max-tokens needs a positive integer' --input corpus.jsonl --max-tokens 0
bad "invalid UTF-8 in text" "latin\.txt:$latin_line: invalid UTF-8 at byte 11 of the line \(bytes from there: 0xe9 0x74 0xe9\); .*--strict-utf8" \
    --input latin.txt --strict-utf8
bad "invalid UTF-8 in a record" 'latin\.jsonl:2: invalid UTF-8 at byte 7 of the record.s "text" value \(bytes from there: 0xff 0xfe\); .*--strict-utf8' \
    --input latin.jsonl --strict-utf8
# A record of 1 GiB or more is refused, naming its line, before it is held whole (a .zst of 1 GiB
# of zero bytes is tiny; the record is refused before anything parses it)
{ printf '{"text": "a"}\n{"text": "'; head -c $((1024 * 1024 * 1024 + 16)) /dev/zero; printf '"}\n'; } \
    | zstd -q -1 > huge.jsonl.zst
bad "a record of 1 GiB" 'huge\.jsonl\.zst:2: a record of 1 GiB or more' --input huge.jsonl.zst --threads 1
[ -z "$(ls -A prep/keep | grep -v '\.bin$')" ] || fail "a staging directory was left in --out: $(ls -A prep/keep)"
# A file of any other name is text, as before
cp blank.txt notes.md
prepare md --input notes.md --val-fraction 0
same blank_txt md
pass "bad input: exit 2 with one line each, the dataset left as it was"
# the help read whole first: `grep -q` on the pipe would quit early and SIGPIPE keel (pipefail)
"$KEEL_BIN" data prepare --help > "$TMP/help.txt" || fail "data prepare --help failed"
for opt in --text-key --max-tokens --strict-utf8 .jsonl .zst directories; do
    grep -q -- "$opt" "$TMP/help.txt" || fail "--help lacks $opt"
done
echo "data_prepare_formats: ok"
