#!/usr/bin/env bash
# `keel data prepare` reads Parquet as pyarrow writes it (pinned below, in a venv
# cached under $KEEL_CACHE/venv-parquet): one corpus of rows (license paragraphs,
# non-ASCII, empty and blank strings, nulls, rows of many lines with blank lines
# and CRLFs inside, runs of equal, null and empty rows, a row bigger than a read
# block) written with every codec keel reads {none, snappy, gzip, zstd} x
# dictionary {on (falling back to PLAIN mid-chunk), off} x data page {1.0, 2.0}
# in many row groups of small pages, with DELTA_LENGTH_BYTE_ARRAY and
# DELTA_BYTE_ARRAY, as large_string, binary and required, and after int, struct
# and list columns, prepares into shards bit-identical to the same rows as
# .jsonl, on 1, 2 and 3 threads; the rows line counts the empty and null rows;
# --column picks the column; directories and globs find .parquet files among
# others; --max-tokens cuts where it cuts the .jsonl; --strict-utf8 names the
# row and byte of a string that is not UTF-8. Each kind of bad file (a missing
# column, listed against those present; a non-string, a struct and a list
# column; a truncated, a damaged, an empty, a compressed and a not-Parquet file;
# a FIFO; LZ4 and BROTLI pages) exits 2 with one line naming the file, the
# column and the fix, and leaves the dataset in --out as it was. Hand-built
# hostile files are tests/data/test_parquet_hostile.c.
source "$KEEL_SRC/tests/lib.sh"
PYARROW_VERSION=23.0.1
for tool in spm_train python3 mkfifo; do
    command -v "$tool" >/dev/null || fail "$tool not found (run scripts/install-deps.sh)"
done

# ---- pyarrow, in a venv made once ------------------------------------------------------
venv="${KEEL_CACHE:-$KEEL_SRC/.cache}/venv-parquet"
python="$venv/bin/python"
pinned_venv "$venv" pyarrow "$PYARROW_VERSION"

# ---- the corpus, written by pyarrow every way, and its rows as JSON Lines ---------------
licenses=()
for f in GPL-3 Apache-2.0 LGPL-2.1 MPL-2.0; do
    [ -f "/usr/share/common-licenses/$f" ] && licenses+=("/usr/share/common-licenses/$f")
done
[ ${#licenses[@]} -ge 2 ] || fail "need at least two texts from /usr/share/common-licenses"
spm_train --input="$(IFS=,; echo "${licenses[*]}")" --model_prefix="$TMP/tok" --vocab_size=600 \
    --model_type=bpe --character_coverage=1.0 --byte_fallback=true >"$TMP/spm.log" 2>&1 \
    || fail "spm_train: $(tail -2 "$TMP/spm.log")"
cd "$TMP"
# python write.py LICENSES...: the files below; prints rows, empty rows and null rows
cat > write.py <<'PY'
import json, os, sys
import pyarrow as pa, pyarrow.parquet as pq
rows = []
for rnd in range(3):
    for path in sys.argv[1:]:
        for para in open(path, encoding="utf-8").read().split("\n\n"):
            if para.strip():
                rows.append(para if rnd != 1 else para.replace("\n", "\r\n"))
n = len(rows)
for i in range(0, n, 11): rows[i] = None                                  # nulls
for i in range(3, n, 17): rows[i] = ""                                    # empty
for i in range(5, n, 29): rows[i] = " \t\r\n\n  "                         # blank: empty too
for i in range(7, n, 23): rows[i] = "Gr\u00fc\u00dfe aus K\u00f6ln \u2014 caf\u00e9 \U0001F600\n\n  \nzweite Zeile"
for i in range(9, n, 31): rows[i] = "same row, again and again"          # a dictionary's favourite
rows[13] = "\n".join(open(sys.argv[1], encoding="utf-8").read().split("\n\n")) * 9  # > 256 KiB, one row
rows[100:140] = ["same row, again and again"] * 40                          # runs: of one value,
rows[200:260] = [None] * 60                                                 #   of nulls,
rows[300:340] = [""] * 40                                                   #   of empty strings
with open("rows.jsonl", "w") as f:
    for r in rows:
        if r is not None: f.write(json.dumps({"id": 0, "text": r}) + "\n")
def table(text_type=pa.string(), extra=True, text=rows):
    cols = {}
    if extra:
        cols["id"] = pa.array(range(len(text)), pa.int64())
        cols["meta"] = pa.array([{"n": i} for i in range(len(text))])
        cols["tags"] = pa.array([["a", "b"][: i % 3] for i in range(len(text))])
    cols["text"] = pa.array(text, text_type)
    return pa.table(cols)
t = table()
small = dict(row_group_size=150, data_page_size=2048, write_batch_size=64, dictionary_pagesize_limit=8192)
os.makedirs("m", exist_ok=True)
for comp in ["none", "snappy", "gzip", "zstd"]:
    for dic in [True, False]:
        for v in ["1.0", "2.0"]:
            pq.write_table(t, f"m/{comp}-{'dict' if dic else 'plain'}-v{v[0]}.parquet", compression=comp,
                           use_dictionary=dic, data_page_version=v, **small)
for enc, comp, v in [("DELTA_LENGTH_BYTE_ARRAY", "zstd", "1.0"), ("DELTA_LENGTH_BYTE_ARRAY", "snappy", "2.0"),
                     ("DELTA_BYTE_ARRAY", "gzip", "1.0"), ("DELTA_BYTE_ARRAY", "none", "2.0")]:
    pq.write_table(t, f"m/{enc.lower()}-{comp}-v{v[0]}.parquet", compression=comp, use_dictionary=False,
                   column_encoding={"text": enc}, data_page_version=v, **small)
pq.write_table(table(pa.large_string(), extra=False), "m/large_string.parquet", compression="zstd", **small)
pq.write_table(table(pa.binary(), extra=False), "m/binary.parquet", compression="snappy", **small)
present = [r for r in rows if r is not None]
req = pa.table({"text": pa.array(present)}, schema=pa.schema([pa.field("text", pa.string(), nullable=False)]))
pq.write_table(req, "m/required.parquet", compression="zstd", **small)
# another column named text, the document in "content"; one file in three parts, a .jsonl among them
pq.write_table(pa.table({"text": ["not this one"] * len(rows), "content": rows}), "content.parquet", **small)
os.makedirs("dir/sub", exist_ok=True)
third = len(rows) // 3
pq.write_table(table(text=rows[:third]), "dir/part-0.parquet", compression="snappy", **small)
with open("dir/part-1.jsonl", "w") as f:
    for r in rows[third:2 * third]:
        if r is not None: f.write(json.dumps({"text": r}) + "\n")
pq.write_table(table(text=rows[2 * third:]), "dir/sub/part-2.parquet", compression="zstd", **small)
open("dir/README.md", "w").write("not an input\n")
# bad files
pq.write_table(t, "lz4.parquet", compression="lz4")
pq.write_table(t, "brotli.parquet", compression="brotli")
pq.write_table(pa.table({"text": pa.array([b"fine", None, b"x\xe2\x82 y", b"ok"], pa.binary())}), "latin.parquet")
empty = sum(1 for r in rows if r is not None and not r.strip(" \t\r\n"))
print(len(rows), empty, rows.count(None))
PY
read -r n_rows n_empty n_null < <("$python" write.py "${licenses[@]}") || fail "write.py failed"
[ "$n_rows" -gt 500 ] && [ "$n_empty" -gt 20 ] && [ "$n_null" -gt 20 ] || fail "corpus: $n_rows rows, $n_empty empty, $n_null null"
[ "$(stat -c %s rows.jsonl)" -gt 400000 ] || fail "the corpus is under 400 KB: it must span read blocks (256 KiB)"
"$python" - <<'PY' || fail "the files are not written the ways this test means"
import pyarrow.parquet as pq
def encodings(f):
    m = pq.ParquetFile(f).metadata
    return m, {e for g in range(m.num_row_groups) for e in m.row_group(g).column(m.num_columns - 1).encodings}
m, e = encodings("m/zstd-dict-v2.parquet")
assert m.num_row_groups >= 5 and {"RLE_DICTIONARY", "PLAIN"} <= e, (m.num_row_groups, e)  # a fallback to PLAIN
assert "DELTA_BYTE_ARRAY" in encodings("m/delta_byte_array-gzip-v1.parquet")[1]
assert "DELTA_LENGTH_BYTE_ARRAY" in encodings("m/delta_length_byte_array-zstd-v1.parquet")[1]
assert pq.ParquetFile("m/snappy-plain-v1.parquet").metadata.row_group(0).column(3).total_compressed_size > 2 * 2048
PY

prepare() { # NAME ARGS...: prepare into $TMP/prep/NAME (2 threads unless told), the summary in NAME.txt
    local out=$TMP/prep/$1; shift
    "$KEEL_BIN" data prepare --model "$TMP/tok.model" --out "$out" --val-fraction 0.1 --shard-tokens 20000 \
        --threads 2 "$@" >"$out.txt" 2>"$out.err" || fail "prepare $*: exit $? ($(cat "$out.err"))"
    [ ! -s "$out.err" ] || fail "prepare $*: stderr: $(cat "$out.err")"
}
same() { # A B: the two prepared directories hold the same files, bit for bit
    [ "$(ls "$TMP/prep/$1")" = "$(ls "$TMP/prep/$2")" ] || fail "$2 holds $(ls "$TMP/prep/$2" | tr '\n' ' '), $1 $(ls "$TMP/prep/$1" | tr '\n' ' ')"
    for f in "$TMP/prep/$1"/*.bin; do
        cmp -s "$f" "$TMP/prep/$2/$(basename "$f")" || fail "$2/$(basename "$f") differs from $1's"
    done
}
mkdir prep

# ---- every way of writing the rows = the rows as .jsonl -----------------------------------
prepare jsonl --input rows.jsonl --threads 1
cat prep/jsonl.txt
[ "$(ls prep/jsonl | grep -c '^train-')" -ge 3 ] && [ -f prep/jsonl/val-00000.bin ] || fail "the reference holds $(ls prep/jsonl | tr '\n' ' ')"
n=0
for f in m/*.parquet; do
    name=$(basename "$f" .parquet)
    prepare "$name" --input "$f" --threads $((n % 3 + 1))
    same jsonl "$name"
    n=$((n + 1))
done
pass "$n Parquet files (4 codecs x dictionary x page v1/v2, delta encodings, large_string, binary, required) = .jsonl, on 1-3 threads"
grep -q "^rows: $n_rows Parquet rows, $n_empty of them empty and $n_null null (skipped)$" prep/zstd-dict-v2.txt \
    || fail "rows line: $(grep rows: prep/zstd-dict-v2.txt) (want $n_rows, $n_empty empty, $n_null null)"
grep -q '^inputs: 1 file: 1 Parquet$' prep/zstd-dict-v2.txt || fail "inputs line: $(grep inputs: prep/zstd-dict-v2.txt)"
grep -q "^total: .* from $(grep -c . rows.jsonl | awk -v e="$n_empty" '{print $1 - e}') documents in " prep/zstd-dict-v2.txt \
    || fail "documents: $(grep total: prep/zstd-dict-v2.txt)"
pass "the rows line: $(grep rows: prep/zstd-dict-v2.txt)"

prepare content --input content.parquet --column content --text-key body
same jsonl content
prepare dir --input dir
same jsonl dir
grep -q '^inputs: 3 files: 1 JSON Lines, 2 Parquet; 1 other file in directories ignored$' prep/dir.txt \
    || fail "inputs line: $(grep inputs: prep/dir.txt)"
cp -r dir globbed && rm globbed/part-1.jsonl && "$python" -c "
import json, pyarrow as pa, pyarrow.parquet as pq
rows = [json.loads(l)['text'] for l in open('dir/part-1.jsonl')]
pq.write_table(pa.table({'text': rows}), 'globbed/part-1.parquet', row_group_size=40)"
mv globbed/sub/part-2.parquet globbed/part-2.parquet
prepare glob --input 'globbed/part-*.parquet' --threads 3
same jsonl glob
pass "--column, a directory of .parquet and .jsonl, a glob of .parquet = .jsonl"

# ---- --max-tokens cuts where it cuts the .jsonl -------------------------------------------
total=$(awk '/^total:/ { print $2 }' prep/jsonl.txt)
cap=$((total / 3))
prepare cap_jsonl --input rows.jsonl --max-tokens $cap --threads 1
prepare cap1 --input m/gzip-dict-v1.parquet --max-tokens $cap --threads 1
prepare cap3 --input m/gzip-dict-v1.parquet --max-tokens $cap --threads 3
same cap_jsonl cap1
same cap_jsonl cap3
got=$(awk '/^total:/ { print $2 }' prep/cap1.txt)
grep -q "^cap: --max-tokens $cap reached at the end of a document ($got tokens)" prep/cap1.txt \
    || fail "cap line: $(grep cap: prep/cap1.txt)"
[ "$got" -ge "$cap" ] && [ "$got" -lt "$total" ] || fail "--max-tokens $cap wrote $got of $total tokens"
pass "--max-tokens $cap: $got tokens, as from the .jsonl, on 1 and 3 threads"

# ---- --strict-utf8 ---------------------------------------------------------------------------
prepare latin --input latin.parquet --val-fraction 0
prepare strict --input m/snappy-dict-v2.parquet --strict-utf8
same jsonl strict
pass "--strict-utf8 on valid text changes nothing; without it, invalid UTF-8 is read"

# ---- bad files: exit 2, one line naming the file, the column and the fix; --out as it was ----
bad() { # NAME PATTERN ARGS...: prepare --force into prep/keep must fail with one line
    local name=$1 pattern=$2; shift 2
    expect_input_error "$name" "$pattern" "$KEEL_BIN" data prepare --model "$TMP/tok.model" --out "$TMP/prep/keep" \
        --force "$@"
    [ "$(cd prep/keep && md5sum ./*.bin)" = "$keep_sums" ] && [ "$(ls -A prep/keep)" = "$keep_files" ] \
        || fail "$name: the dataset in --out changed: $(ls -A prep/keep | tr '\n' ' ')"
}
prepare keep --input m/none-plain-v1.parquet --val-fraction 0
keep_sums=$(cd prep/keep && md5sum ./*.bin)
keep_files=$(ls -A prep/keep)
f=m/zstd-dict-v1.parquet
bad "missing column" "input m/zstd-dict-v1\.parquet has no column \"body\" \(its columns: \"id\", \"meta\", \"tags\", \"text\"\); name the column that holds the text with --column$" \
    --input $f --column body
bad "int column" "input m/zstd-dict-v1\.parquet has column \"id\" of type INT64, not a string .*--column \(its string columns: \"text\"\)$" \
    --input $f --column id
bad "struct column" "input m/zstd-dict-v1\.parquet has column \"meta\" that is a group of 1 field \(a struct\), not a string .*--column .*table\.flatten" \
    --input $f --column meta
bad "list column" "input m/zstd-dict-v1\.parquet has column \"tags\" that is a group of 1 field \(a list\), not a string .*--column" \
    --input $f --column tags
bad "LZ4" 'input lz4\.parquet uses the LZ4_RAW codec \(column "text", row group 1\); .*SNAPPY, GZIP or ZSTD: rewrite it' --input lz4.parquet
bad "BROTLI" 'input brotli\.parquet uses the BROTLI codec \(column "text", row group 1\); .*compression="zstd"' --input brotli.parquet
head -c $(( $(stat -c %s $f) / 2 )) $f > cut.parquet
bad "truncated" 'input cut\.parquet is truncated: it starts as a Parquet file but does not end with .*download it again' \
    --input rows.jsonl --input cut.parquet
"$python" -c "
import pyarrow.parquet as pq
m = pq.ParquetFile('$f').metadata.row_group(2).column(3)
start = m.dictionary_page_offset or m.data_page_offset
b = bytearray(open('$f', 'rb').read()); b[start + 40:start + 104] = bytes(64)
open('damaged.parquet', 'wb').write(b)"
bad "damaged page" 'input damaged\.parquet is corrupt: row group 3 of [0-9]+, column "text", page at byte [0-9]+: .*copy or write the file again' \
    --input damaged.parquet
cp rows.jsonl fake.parquet
bad "not Parquet" 'input fake\.parquet is not a Parquet file \(it does not start or end with PAR1\)' --input fake.parquet
: > empty.parquet
bad "empty file" 'input empty\.parquet is not a Parquet file' --input empty.parquet
gzip -c $f > zipped.parquet.gz
bad "compressed Parquet" 'input zipped\.parquet\.gz is a compressed Parquet file \(\.gz\); .*decompress it first' --input zipped.parquet.gz
mkfifo fifo.parquet
bad "a FIFO" 'input fifo\.parquet cannot be read: is a FIFO, not a regular file \(Parquet is read from its end' --input fifo.parquet
bad "strict UTF-8" 'latin\.parquet: row 3, column "text": invalid UTF-8 at byte 2 of its value \(bytes from there: 0xe2 0x82 0x20 0x79\); .*--strict-utf8' \
    --input latin.parquet --strict-utf8
bad "empty --column" 'prepare: --column is empty' --input $f --column ''
[ -z "$(ls -A prep/keep | grep -v '\.bin$')" ] || fail "a staging directory was left in --out: $(ls -A prep/keep)"
pass "bad files: exit 2 with one line each, the dataset left as it was"
# the help read whole first: `grep -q` on the pipe would quit early and SIGPIPE keel (pipefail)
"$KEEL_BIN" data prepare --help > "$TMP/help.txt" || fail "data prepare --help failed"
for opt in --column --strict-utf8 .parquet; do
    grep -q -- "$opt" "$TMP/help.txt" || fail "--help lacks $opt"
done
echo "data_prepare_parquet: ok"
