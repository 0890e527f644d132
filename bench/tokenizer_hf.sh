#!/usr/bin/env bash
# tokenizer_hf.sh: encode throughput of keel's tokenizer.json support against
# the Hugging Face tokenizers library on one core, on the same text.
#
# Text: the first BENCH_MB MB (default 8) of the changelogs under
# /usr/share/doc (gzip'd, ~120 MB on Debian: English prose, names, code, some
# non-ASCII). Tokenizers, trained here on the first 4 MB of it:
#   llama3  byte-level BPE, 32000 merges-worth vocabulary, Llama 3's Split
#           regex + ByteLevel, ignore_merges, Llama 3's special tokens
#   llama2  a 16000-piece SentencePiece BPE model (spm_train) converted as
#           transformers' LlamaConverter does (Prepend + Replace normalizer,
#           byte_fallback, fuse_unk)
# keel: `keel tokenize --model tokenizer.json < text > /dev/null` (one
# thread; its time includes reading the text and printing every id as
# decimal text). Hugging Face: tokenizers (the version the tests pin) with
# RAYON_NUM_THREADS=1 and TOKENIZERS_PARALLELISM=false, timing encode_batch
# and encode_batch_fast (no offsets) over all lines and encode line by line
# (the lines already in memory, read with errors="replace" as keel reads
# them; the call alone is timed). Runs interleave keel and the HF modes
# BENCH_REPS times (default 5); the table has the medians, MB/s of text and
# tokens/s, and keel against the fastest HF mode. Before timing, keel's
# ids are checked equal to HF's on the whole text. Not a test.
#
#   bash bench/tokenizer_hf.sh
#   KEEL_BIN=build-rel/keel BENCH_MB=20 BENCH_REPS=3 bash bench/tokenizer_hf.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mb="${BENCH_MB:-8}"
reps="${BENCH_REPS:-5}"
TOKENIZERS_VERSION=0.23.3 # as tests/data/tokenizer_matches_hf.sh
if [ -z "${KEEL_BIN:-}" ]; then
    make -C "$root" keel >/dev/null
    KEEL_BIN="$root/build/keel"
fi
command -v spm_train >/dev/null || { echo "bench: spm_train not found (scripts/install-deps.sh)" >&2; exit 1; }
venv="$root/.cache/venv-hf"
if ! "$venv/bin/python" -c "import tokenizers, sys; sys.exit(tokenizers.__version__ != '$TOKENIZERS_VERSION')" 2>/dev/null; then
    rm -rf "$venv"
    python3 -m venv "$venv" && "$venv/bin/pip" install -q "tokenizers==$TOKENIZERS_VERSION" \
        || { echo "bench: cannot install tokenizers==$TOKENIZERS_VERSION into $venv" >&2; exit 1; }
fi
py="$venv/bin/python"
export RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false LC_ALL=C
tmp="$(mktemp -d "${BENCH_TMP:-/tmp}/keel-bench-tokenizer-hf.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

# ---- text and tokenizers
find /usr/share/doc -name 'changelog*.gz' -type f -print0 | sort -z \
    | while IFS= read -r -d '' f; do zcat -f "$f" 2>/dev/null || true; done \
    | head -c $((mb * 1000000)) > "$tmp/text.txt" || true
head -c 4000000 "$tmp/text.txt" > "$tmp/train.txt"
spm_train --input="$tmp/train.txt" --model_prefix="$tmp/spm" --model_type=bpe --vocab_size=16000 \
    --byte_fallback=true --character_coverage=0.9995 --normalization_rule_name=identity \
    --remove_extra_whitespaces=false --split_digits=true --allow_whitespace_only_pieces=true \
    --num_threads="$(nproc)" --minloglevel=1 >"$tmp/spm.log" 2>&1 \
    || { tail -3 "$tmp/spm.log" >&2; echo "bench: spm_train failed" >&2; exit 1; }
spm_export_vocab --model="$tmp/spm.model" > "$tmp/spm.vocab"
"$py" - "$root/tests/data" "$tmp" <<'PY'
import os, sys
sys.path.insert(0, sys.argv[1])
import hf_tokenizers as h
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
tmp = sys.argv[2]
tok = Tokenizer(models.BPE(ignore_merges=True))
tok.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(h.LLAMA3_PATTERN), behavior="isolated", invert=False),
    pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(h.read_lines(os.path.join(tmp, "train.txt")),
                        trainers.BpeTrainer(vocab_size=32000, show_progress=False,
                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in h.SPECIALS])
h.save(tok, os.path.join(tmp, "llama3"), legacy_merges=True)
h.spm_style(os.path.join(tmp, "spm.vocab"), os.path.join(tmp, "llama2"), "llama2")
PY

bytes=$(stat -c %s "$tmp/text.txt")
lines=$(wc -l < "$tmp/text.txt")
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load before $(cut -d' ' -f1-3 /proc/loadavg)"
echo "text: $(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1e6 }') MB, $lines lines of changelogs; tokenizers $TOKENIZERS_VERSION, one thread; $reps runs each, interleaved"

# ---- the same ids first
for name in llama3 llama2; do
    "$py" "$root/tests/data/hf_tokenizers.py" encode "$tmp/$name/tokenizer.json" "$tmp/text.txt" > "$tmp/$name.hf.ids"
    "$KEEL_BIN" tokenize --model "$tmp/$name/tokenizer.json" < "$tmp/text.txt" > "$tmp/$name.keel.ids"
    cmp -s "$tmp/$name.hf.ids" "$tmp/$name.keel.ids" \
        || { echo "bench: $name: keel's ids differ from tokenizers' on the text" >&2; exit 1; }
    echo "$name: $(wc -w < "$tmp/$name.keel.ids") tokens, keel's ids equal tokenizers'"
done

# ---- timing: one round = keel, HF encode_batch, HF per line, for each tokenizer
cat > "$tmp/hf_time.py" <<'PY'
import sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
lines = [l.decode("utf-8", errors="replace") for l in open(sys.argv[2], "rb").read().split(b"\n")]
t0 = time.perf_counter()  # the encoding only; the ids are counted after
if sys.argv[3] == "batch":
    encs = tok.encode_batch(lines, add_special_tokens=False)
elif sys.argv[3] == "batch_fast":
    encs = tok.encode_batch_fast(lines, add_special_tokens=False)
else:
    encs = [tok.encode(l, add_special_tokens=False) for l in lines]
dt = time.perf_counter() - t0
print(dt, sum(len(e.ids) for e in encs))
PY
: > "$tmp/runs"
for _ in $(seq "$reps"); do
    for name in llama3 llama2; do
        tokens=$(wc -w < "$tmp/$name.keel.ids")
        t0=$EPOCHREALTIME
        "$KEEL_BIN" tokenize --model "$tmp/$name/tokenizer.json" < "$tmp/text.txt" > /dev/null
        t1=$EPOCHREALTIME
        echo "$name keel $(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }') $tokens" >> "$tmp/runs"
        for mode in batch batch_fast line; do
            echo "$name hf_$mode $("$py" "$tmp/hf_time.py" "$tmp/$name/tokenizer.json" "$tmp/text.txt" "$mode")" >> "$tmp/runs"
        done
    done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
python3 - "$tmp/runs" "$bytes" <<'PY'
import statistics, sys
runs, nbytes = {}, int(sys.argv[2])
for line in open(sys.argv[1]):
    name, engine, secs, tokens = line.split()
    runs.setdefault((name, engine), []).append((float(secs), int(tokens)))
print("| tokenizer | encoder | MB/s (median) | Mtokens/s (median) | MB/s of each run | keel / fastest HF |")
print("|---|---|---|---|---|---|")
for name in ("llama3", "llama2"):
    engines = (("keel", "keel tokenize"), ("hf_batch", "HF encode_batch"),
               ("hf_batch_fast", "HF encode_batch_fast"), ("hf_line", "HF encode per line"))
    med = {e: statistics.median(nbytes / s / 1e6 for s, _ in runs[(name, e)]) for e, _ in engines}
    best_hf = max(v for e, v in med.items() if e != "keel")
    for engine, label in engines:
        rs = runs[(name, engine)]
        tok_s = statistics.median(t / s / 1e6 for s, t in rs)
        ratio = f"**{med[engine] / best_hf:.2f}×**" if engine == "keel" else ""
        print(f"| {name} | {label} | {med[engine]:.2f} | {tok_s:.2f} | "
              f"{' '.join(f'{nbytes / s / 1e6:.1f}' for s, _ in rs)} | {ratio} |")
PY
