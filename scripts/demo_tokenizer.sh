#!/usr/bin/env bash
# Train the demo's SentencePiece BPE tokenizer on a corpus (scripts/build_corpus.sh):
#
#   scripts/demo_tokenizer.sh CORPUS_DIR OUT_DIR [VOCAB]     (VOCAB: default 8000)
#
# Writes OUT_DIR/tokenizer.model and OUT_DIR/tokenizer.vocab; spm_train's output goes
# to OUT_DIR/spm_train.log. Cached: does nothing if the model is newer than every
# CORPUS_DIR/*.txt and was trained with the same options. Prints one line.
set -euo pipefail

if [ $# -lt 2 ] || [ $# -gt 3 ] || [ -z "$1" ] || [ -z "$2" ]; then
    echo "usage: $0 CORPUS_DIR OUT_DIR [VOCAB]" >&2
    exit 2
fi
corpus=$1 out=$2 vocab=${3:-8000}
if ! [[ $vocab =~ ^[0-9]+$ ]] || [ "$vocab" -lt 300 ]; then
    echo "tokenizer: ERROR: VOCAB must be an integer >= 300, got '$vocab'" >&2
    exit 2
fi
command -v spm_train >/dev/null \
    || { echo "tokenizer: ERROR: spm_train not found (run scripts/install-deps.sh)" >&2; exit 1; }

inputs=()
for f in "$corpus"/*.txt; do [ -f "$f" ] && inputs+=("$f"); done
[ ${#inputs[@]} -gt 0 ] || { echo "tokenizer: ERROR: no $corpus/*.txt (run scripts/build_corpus.sh)" >&2; exit 1; }
input=$(IFS=,; echo "${inputs[*]}")
[[ $input == *[[:space:]]* ]] && { echo "tokenizer: ERROR: corpus paths must not contain spaces" >&2; exit 1; }

# BPE with byte fallback (no unknown bytes), every character seen kept (coverage 1.0),
# digits split one per piece (as Llama's); spm's defaults for normalization (nmt_nfkc)
# and ids (unk 0, bos 1, eos 2, no pad). Lines are sampled (shuffled, at most 2M) for
# speed on big corpora; long paragraphs (an Austen letter is 15 kB) are kept, not skipped.
opts=(--model_type=bpe --vocab_size="$vocab" --byte_fallback=true --character_coverage=1.0
      --split_digits=true --input_sentence_size=2000000 --shuffle_input_sentence=true
      --max_sentence_length=32768 --num_threads=2)
model="$out/tokenizer.model"
stamp="${opts[*]}"

fresh=1
if [ -f "$model" ] && [ -f "$out/tokenizer.vocab" ] && [ "$(cat "$out/.options" 2>/dev/null)" = "$stamp" ]; then
    for f in "${inputs[@]}"; do [ "$f" -nt "$model" ] && fresh=0; done
else
    fresh=0
fi
if [ $fresh = 1 ]; then
    echo "tokenizer: up to date: $model ($vocab pieces)"
    exit 0
fi

mkdir -p "$out"
rm -f "$out/.options"
tmp="$out/.tokenizer.tmp"
t0=$(date +%s.%N)
if ! spm_train --input="$input" --model_prefix="$tmp" "${opts[@]}" > "$out/spm_train.log" 2>&1; then
    echo "tokenizer: ERROR: spm_train failed (log: $out/spm_train.log):" >&2
    tail -n 5 "$out/spm_train.log" >&2
    rm -f "$tmp.model" "$tmp.vocab"
    exit 1
fi
mv -f "$tmp.vocab" "$out/tokenizer.vocab"
mv -f "$tmp.model" "$model"
echo "$stamp" > "$out/.options"
bytes=$(cat "${inputs[@]}" | wc -c)
printf 'tokenizer: trained BPE, %d pieces, on %d files (%.1f MB) in %.0f s -> %s\n' \
    "$vocab" "${#inputs[@]}" "$(echo "$bytes" | awk '{print $1/1e6}')" \
    "$(echo "$t0 $(date +%s.%N)" | awk '{print $2-$1}')" "$model"
