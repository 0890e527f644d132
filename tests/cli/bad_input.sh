#!/usr/bin/env bash
# Every kind of bad input gets exit code 2, one stderr line naming the
# file/key/value, and leaves an existing run directory untouched.
source "$KEEL_SRC/tests/lib.sh"
CFG=$KEEL_SRC/tests/train/micro.json
K=$KEEL_BIN
RUN=$TMP/run
train() { "$K" train "$@" --run-dir "$RUN"; }

# --- config ---------------------------------------------------------------
expect_input_error "unknown key via --set" "unknown config key 'train.lrr'.*did you mean 'train.lr'" train "$CFG" --set train.lrr=1
echo '{"model": {"dim": 64, "n_layerz": 2}}' >"$TMP/typo.json"
expect_input_error "unknown key in file" "typo.json: unknown config key 'model.n_layerz'" train "$TMP/typo.json"
echo '{"train": {"steps": "ten"}}' >"$TMP/type.json"
expect_input_error "wrong type" "type.json: key 'train.steps' must be an integer, got \"ten\"" train "$TMP/type.json"
expect_input_error "wrong type via --set" "key 'train.lr' must be a number" train "$CFG" --set 'train.lr="fast"'
expect_input_error "out of range" "key 'train.micro_batch_size' must be in \[1," train "$CFG" --set train.micro_batch_size=0
expect_input_error "unknown health check" "resilience.health_checks entry 'gpus' is not one of gemm, memory, checkpoint_dir, mpi, gpu" \
  train "$CFG" --set resilience.health_checks=gemm,gpus --nproc 2
expect_input_error "negative spares" "key 'resilience.spares' must be in \[0," train "$CFG" --set resilience.spares=-1
expect_input_error "fractional int" "key 'model.dim' must be an integer, got 64.5" train "$CFG" --set model.dim=64.5
expect_input_error "dim % n_heads" "model.dim 66 is not divisible by model.n_heads 4" train "$CFG" --set model.dim=66
expect_input_error "n_heads % n_kv_heads" "model.n_heads 4 is not a multiple of model.n_kv_heads 3" train "$CFG" --set model.n_kv_heads=3
echo '{"model": ' >"$TMP/broken.json"
expect_input_error "invalid JSON" "broken.json: invalid JSON near line" train "$TMP/broken.json"
expect_input_error "missing config" "nope.json: cannot open config" train "$TMP/nope.json"
expect_input_error "bad --set syntax" "expected key=value" train "$CFG" --set train.steps
expect_input_error "min_lr above lr" "train.min_lr 0.1 exceeds train.lr" train "$CFG" --set train.min_lr=0.1
expect_input_error "no data" "no training data" train "$CFG" --set data.synthetic=false
expect_input_error "unknown command" "unknown command 'trian'" "$K" trian
expect_input_error "model too big" "this run needs [0-9.]+ GiB \(1 rank\(s\) here\)" train "$KEEL_SRC/configs/llama2-70b.json"
[ ! -e "$RUN" ] || fail "a failed start created the run directory"
pass "no run directory was created by any failed start"

# --- data and tokenizer --------------------------------------------------------
spm_train --input=/usr/share/common-licenses/GPL-3 --model_prefix="$TMP/tok" --vocab_size=600 \
  --model_type=bpe --byte_fallback=true >"$TMP/spm.log" 2>&1 || fail "spm_train: $(tail -2 "$TMP/spm.log")"
"$K" data prepare --model "$TMP/tok.model" --input /usr/share/common-licenses/GPL-3 --out "$TMP/data" >/dev/null
SHARD=$TMP/data/train-00000.bin
real=(--set data.path="$TMP/data" --set model.vocab_size=600 --set model.max_seq_len=32)
expect_input_error "missing data path" "$TMP/none.*keel data prepare" train "$CFG" --set data.path="$TMP/none"
head -c 1000 "$SHARD" >"$TMP/trunc.bin"
expect_input_error "truncated shard" "trunc.bin.*(truncated|expected)" train "$CFG" "${real[@]}" --set data.path="$TMP/trunc.bin"
cp /usr/share/common-licenses/GPL-3 "$TMP/foreign.bin"
expect_input_error "foreign file" "foreign.bin: not a keel token shard" train "$CFG" "${real[@]}" --set data.path="$TMP/foreign.bin"
expect_input_error "data vocab != model vocab" "600.*model.vocab_size.*512|512.*600" train "$CFG" --set data.path="$TMP/data" --set model.max_seq_len=32
expect_input_error "tokenizer vocab != model vocab" "tok.model.*600.*|600.*tok.model" \
  train "$CFG" --set data.synthetic.seed=1 --set data.tokenizer="$TMP/tok.model"
echo "not a model" >"$TMP/bad.model"
expect_input_error "unreadable tokenizer" "bad.model" train "$CFG" "${real[@]}" --set data.tokenizer="$TMP/bad.model"
# A shard whose header says vocab 600 but holds id 600: rewrite one id and the checksum.
python3 - "$SHARD" "$TMP/badid.bin" <<'PY'
import struct, subprocess, sys
b = bytearray(open(sys.argv[1], "rb").read())
struct.pack_into("<H", b, 64 + 2 * 5, 600)           # token 5 := 600 (vocab is 600)
h = subprocess.run(["xxhsum", "-H3"], input=bytes(b[64:]), capture_output=True).stdout.split()[-1]
struct.pack_into("<Q", b, 32, int(h, 16))
open(sys.argv[2], "wb").write(b)
PY
expect_input_error "token id >= vocab" "badid.bin.*600" train "$CFG" "${real[@]}" --set data.path="$TMP/badid.bin"
# Not regular files: refused at once (a FIFO nobody writes to used to block open() forever).
mkfifo "$TMP/fifo"
expect_input_error "FIFO as a token shard" "fifo.*is a FIFO, not a regular file" \
  timeout 20 "$K" train "$CFG" "${real[@]}" --set data.path="$TMP/fifo" --run-dir "$RUN"
expect_input_error "FIFO as the tokenizer" "fifo.*is a FIFO, not a regular file" \
  timeout 20 "$K" data prepare --model "$TMP/fifo" --input /usr/share/common-licenses/GPL-3 --out "$TMP/fifo-data"
mkdir -p "$TMP/dir.model"
expect_input_error "directory as the tokenizer" "dir.model.*is a directory" \
  timeout 20 "$K" data prepare --model "$TMP/dir.model" --input /usr/share/common-licenses/GPL-3 --out "$TMP/dir-data"
[ ! -e "$TMP/fifo-data" ] && [ ! -e "$TMP/dir-data" ] || fail "a refused prepare created its --out"
# A charsmap whose trie leaves fewer than 4 bytes (the replacement length
# underflowed and encoding read past the model): refused at load.
cp "$KEEL_SRC/tests/fuzz/regressions/tokenizer_model/charsmap_trie_leaves_under_4_bytes.model" "$TMP/trie.model"
expect_input_error "charsmap trie past its blob" "trie.model: normalizer charsmap trie size [0-9]+ does not fit" \
  sh -c 'echo hello | "$1" tokenize --model "$2"' sh "$K" "$TMP/trie.model"
# A prepare that fails removes what it made: its shards and the --out directories it created.
: >"$TMP/empty.txt"
expect_input_error "prepare of no text" "the inputs hold no text" \
  "$K" data prepare --model "$TMP/tok.model" --input "$TMP/empty.txt" --out "$TMP/new/deeper/data"
[ ! -e "$TMP/new" ] || fail "a failed prepare left $(find "$TMP/new")"
pass "a failed prepare leaves no --out directory"
"$K" train "$CFG" "${real[@]}" --set train.steps=2 --run-dir "$TMP/realrun" >/dev/null 2>&1
"$K" eval "$TMP/realrun" --data "$TMP/data" >"$TMP/eval.json"
n_tokens=$(od -An -t u8 -j 16 -N 8 "$SHARD" | tr -d ' ')   # header: u64 token count at byte 16
json "$TMP/eval.json" "5 < j['loss'] < 7.5 and j['tokens'] == ($n_tokens - 1) // 32 * 32" | grep -q True \
  || fail "keel eval on real data: $(cat "$TMP/eval.json")"
pass "keel eval on real data: $(cat "$TMP/eval.json")"
expect_input_error "eval: foreign data" "foreign.bin: not a keel token shard" "$K" eval "$TMP/realrun" --data "$TMP/foreign.bin"
expect_input_error "eval: no run" "none-run: no such checkpoint or run directory" "$K" eval "$TMP/none-run" --data "$TMP/data"
[ ! -e "$RUN" ] || fail "a failed start created the run directory"

# --- an existing run is never touched --------------------------------------
"$K" train "$CFG" --set train.steps=2 --run-dir "$RUN" >/dev/null 2>&1
tree_hash() { (cd "$1" && find . -type f -exec sha256sum {} + | sort | sha256sum); }
before=$(tree_hash "$RUN")
expect_input_error "finished run, no checkpoints" "run directory already exists and holds a finished run without checkpoints" train "$CFG"
mkdir -p "$TMP/other" && touch "$TMP/other/x"
expect_input_error "run dir not empty" "run directory already exists and is not empty" "$K" train "$CFG" --run-dir "$TMP/other"
expect_input_error "bad config, existing run" "unknown config key" train "$CFG" --set train.nope=1
[ "$before" = "$(tree_hash "$RUN")" ] || fail "existing run directory changed"
pass "existing run directory unchanged"

# --- numbers on the command line are whole numbers, or an error ------------
expect_input_error "--nproc junk" "nproc '2x': expected a whole number from 1 to 4096" "$K" train "$CFG" --nproc 2x
expect_input_error "--nproc 0" "nproc '0': expected a whole number from 1 to 4096" "$K" train "$CFG" --nproc 0
expect_input_error "--gemm-floor junk" "gemm-floor 'fast': expected a number" "$K" health --checks gemm --gemm-floor fast
expect_input_error "--max-shard-mb junk" "max-shard-mb 'junk': expected a number" \
  "$K" ckpt export "$RUN" --format safetensors --out "$TMP/hf" --max-shard-mb junk
[ ! -e "$TMP/hf" ] || fail "a rejected export wrote $TMP/hf"
