#!/usr/bin/env bash
# prepare.sh: `keel data prepare` speed in MB/s of text at 1 and 2 threads on
# the biggest text this machine holds offline: every changelog under
# /usr/share/doc (Debian's and upstream's, gzip'd; ~120 MB), plus the demo
# corpus when `make demo` has built it. An 8000-piece SentencePiece BPE model
# is trained on a sample. The same corpus is read as one .txt and as one
# .jsonl.zst (each document a record, as `keel data prepare` documents it),
# which must give the same files. Each input and thread count runs BENCH_REPS
# times; the table has the median and best MB/s of the corpus's text (its
# .txt bytes over keel's own seconds from its summary line: read, decompress,
# parse, encode and write, fsync included; on a shared machine the best is
# the closest to a quiet one), the median wall and CPU seconds, and whether
# the files equal those of the first run. Not a test.
#
#   bash bench/prepare.sh
#   BENCH_THREADS="1 2 4" BENCH_REPS=5 BENCH_INPUTS="txt jsonl.zst" bash bench/prepare.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
threads_list="${BENCH_THREADS:-1 2}"
inputs_list="${BENCH_INPUTS:-txt jsonl.zst}"
reps="${BENCH_REPS:-3}"
if [ -z "${KEEL_BIN:-}" ]; then
    make -C "$root" keel >/dev/null
    KEEL_BIN="$root/build/keel"
fi
for tool in spm_train /usr/bin/time zstd; do
    command -v "$tool" >/dev/null || { echo "bench: $tool not found (scripts/install-deps.sh; apt install time)" >&2; exit 1; }
done
tmp="$(mktemp -d "${BENCH_TMP:-/tmp}/keel-bench-prepare.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

# ---- the corpus: one file, a blank line between sources (a file ends a document)
find /usr/share/doc -name 'changelog*.gz' -type f -print0 | sort -z \
    | while IFS= read -r -d '' f; do zcat -f "$f" 2>/dev/null || true; echo; done > "$tmp/corpus.txt"
for f in "$root"/.cache/demo/corpus/*.txt; do
    [ -f "$f" ] && { cat "$f"; echo; } >> "$tmp/corpus.txt"
done
bytes=$(stat -c %s "$tmp/corpus.txt")
# the same documents as JSON Lines records (blocks of non-blank lines, each joined with "\n")
python3 - "$tmp/corpus.txt" "$tmp/corpus.jsonl" <<'PY'
import json, sys
# bytes that are not UTF-8 go into the JSON strings as they are (cJSON keeps them), like the .txt's
def record(lines):
    text = b"\n".join(lines).decode("utf-8", "surrogateescape")
    return json.dumps({"text": text}, ensure_ascii=False).encode("utf-8", "surrogateescape") + b"\n"
with open(sys.argv[1], "rb") as f, open(sys.argv[2], "wb") as out:
    cur = []
    for line in f.read().split(b"\n") + [b""]:
        if line.strip(b" \t\r"):
            cur.append(line)
        elif cur:
            out.write(record(cur))
            cur = []
PY
zstd -q -3 --rm "$tmp/corpus.jsonl" -o "$tmp/corpus.jsonl.zst"
spm_train --input="$tmp/corpus.txt" --model_prefix="$tmp/tok" --vocab_size=8000 --model_type=bpe \
    --character_coverage=1.0 --byte_fallback=true --input_sentence_size=300000 \
    --shuffle_input_sentence=true --num_threads="$(nproc)" >"$tmp/spm.log" 2>&1 \
    || { tail -3 "$tmp/spm.log" >&2; echo "bench: spm_train failed" >&2; exit 1; }

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load before $(cut -d' ' -f1-3 /proc/loadavg)"
echo "corpus: $(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1e6 }') MB of changelogs$(ls "$root"/.cache/demo/corpus/*.txt >/dev/null 2>&1 && echo ' + the demo corpus') ($(awk -v b="$(stat -c %s "$tmp/corpus.jsonl.zst")" 'BEGIN { printf "%.1f", b / 1e6 }') MB as .jsonl.zst); $reps runs per input and thread count, interleaved"
# Rounds alternate the thread counts, so that a change in the machine's load
# falls on all of them alike.
: > "$tmp/runs"
for _ in $(seq "$reps"); do
    for input in $inputs_list; do
        for t in $threads_list; do
            rm -rf "$tmp/out"
            /usr/bin/time -f '%e %U %S' -o "$tmp/time" "$KEEL_BIN" data prepare --model "$tmp/tok.model" \
                --input "$tmp/corpus.$input" --out "$tmp/out" --val-fraction 0.01 --threads "$t" > "$tmp/log" \
                || { cat "$tmp/log" >&2; echo "bench: prepare failed" >&2; exit 1; }
            seconds=$(sed -n 's/^text: .* MB in \([0-9.]*\) s: .*/\1/p' "$tmp/log")
            mbs=$(awk -v b="$bytes" -v s="$seconds" 'BEGIN { printf "%.2f", b / 1e6 / s }')
            echo "$input $t $mbs $(cat "$tmp/time") $(cd "$tmp/out" && cat ./*.bin | md5sum | cut -c1-32)" >> "$tmp/runs"
        done
    done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
python3 - "$tmp/runs" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    inp, t, mbs, wall, user, sys_s, md5 = line.split()
    runs.setdefault((inp, int(t)), []).append((float(mbs), float(wall), float(user) + float(sys_s), md5))
base = None
print("| input | threads | MB/s median | MB/s best | wall s median | CPU s median | speedup (median, best) | files | MB/s of each run |")
print("|---|---|---|---|---|---|---|---|---|")
for (inp, t), rs in runs.items():
    med = lambda i: statistics.median(r[i] for r in rs)
    best = max(r[0] for r in rs)
    sums = {r[3] for r in rs}
    if base is None:
        base = (med(0), best, sums)
    files = "reference" if base[2] is sums else ("identical" if sums == base[2] else "DIFFERENT")
    if len(sums) > 1:
        files = "DIFFERENT between runs"
    print(f"| .{inp} | {t} | {med(0):.2f} | {best:.2f} | {med(1):.1f} | {med(2):.1f} | "
          f"{med(0) / base[0]:.2f}x, {best / base[1]:.2f}x | {files} | "
          f"{' '.join(f'{r[0]:.1f}' for r in rs)} |")
PY
echo
echo "tokens: $(grep '^total:' "$tmp/log" | cut -d' ' -f2) ($(grep '^split:' "$tmp/log" | cut -d' ' -f2-))"
