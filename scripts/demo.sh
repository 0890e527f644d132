#!/usr/bin/env bash
# The demo behind `make demo`: real English text from Debian packages, a
# SentencePiece BPE tokenizer, token shards, and a Llama-architecture model
# that learns it. Everything but the training run is cached under .cache/demo.
#   scripts/demo.sh           ~300 steps (a few minutes on 2 cores)
#   scripts/demo.sh --long    3000 steps
set -euo pipefail
cd "$(dirname "$0")/.."
steps=300
case "${1:-}" in
  --long) steps=3000 ;;
  "") ;;
  *) echo "usage: scripts/demo.sh [--long]" >&2; exit 2 ;;
esac
cache=.cache/demo
keel=build/keel

echo "== 1/4 corpus: books and texts from Debian packages"
bash scripts/build_corpus.sh "$cache/corpus"
echo "== 2/4 tokenizer: SentencePiece BPE, 8000 pieces, byte fallback (spm_train)"
bash scripts/demo_tokenizer.sh "$cache/corpus" "$cache/tokenizer" 8000
echo "== 3/4 token shards (keel data prepare)"
if [ ! -e "$cache/data/.complete" ]; then
  rm -rf "$cache/data"
  "$keel" data prepare --model "$cache/tokenizer/tokenizer.model" --input "$cache"/corpus/*.txt \
    --out "$cache/data" --val-fraction 0.02
  touch "$cache/data/.complete"
else
  echo "cached in $cache/data"
fi
run=runs/demo-$(date +%Y%m%d-%H%M%S)
echo "== 4/4 training a Llama 2-architecture model (dim 288, 6 layers) for $steps steps -> $run"
echo "   (interrupted? this resumes from the last checkpoint: $keel train configs/demo.json --set train.steps=$steps --run-dir $run)"
"$keel" train configs/demo.json --set train.steps="$steps" --run-dir "$run"
echo
echo "validation loss of the final weights:"
"$keel" eval "$run" --data "$cache/data"
echo "run directory: $run (config.json, metrics.jsonl, summary.json, weights.bin, events.jsonl, checkpoints/)"
