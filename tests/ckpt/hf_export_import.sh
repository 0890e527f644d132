#!/usr/bin/env bash
# Hugging Face round trip through the CLI: a checkpoint exported with
# `keel ckpt export --format safetensors` (one file, and split with an index)
# and imported with `keel ckpt import --from-hf` holds bit-identical
# parameters; `keel eval` gives the same loss on the run, on its checkpoint and
# on the imported copy; `"init_from"` starts a run from the imported weights;
# bad requests exit 2 with one line. (Parity with transformers on a model
# saved by transformers: tests/hf/test_hf_parity.c.)
source "$KEEL_SRC/tests/lib.sh"
command -v spm_train >/dev/null || fail "spm_train not found (run scripts/install-deps.sh)"
CFG=$KEEL_SRC/tests/train/micro.json
cat /usr/share/common-licenses/* > "$TMP/text.txt"
spm_train --input="$TMP/text.txt" --model_prefix="$TMP/tok" --vocab_size=512 --model_type=bpe \
    --character_coverage=1.0 >"$TMP/spm.log" 2>&1 || fail "spm_train: $(tail -2 "$TMP/spm.log")"
"$KEEL_BIN" data prepare --model "$TMP/tok.model" --input "$TMP/text.txt" --out "$TMP/data" >/dev/null
real=(--set data.path="$TMP/data" --set data.tokenizer="$TMP/tok.model")
"$KEEL_BIN" train "$CFG" "${real[@]}" --set train.steps=40 --set checkpoint.every_steps=20 --run-dir "$TMP/run" \
    >/dev/null 2>&1 || fail "training run"
ckpt=$TMP/run/checkpoints/step_00000040

"$KEEL_BIN" ckpt export "$TMP/run" --format safetensors --out "$TMP/hf" >"$TMP/out" 2>&1 || { cat "$TMP/out"; fail "export"; }
"$KEEL_BIN" ckpt export "$ckpt" --format safetensors --out "$TMP/hf-split" --max-shard-mb 0.2 >/dev/null 2>&1 \
    || fail "split export"
for f in config.json model.safetensors tokenizer.model; do [ -s "$TMP/hf/$f" ] || fail "export lacks $f"; done
[ -s "$TMP/hf-split/model.safetensors.index.json" ] && [ "$(ls "$TMP/hf-split"/model-*.safetensors | wc -l)" -gt 1 ] \
    || fail "the split export has no index or one file: $(ls "$TMP/hf-split")"
cmp -s "$TMP/tok.model" "$TMP/hf/tokenizer.model" || fail "tokenizer.model is not the run's"
pass "exported: $(ls "$TMP/hf" | tr '\n' ' '); split: $(ls "$TMP/hf-split" | wc -l) files"

params() { # the parameter array of a one-file checkpoint (after the 64-byte header)
  python3 -c "
import struct, sys
b = open(sys.argv[1], 'rb').read(); n = struct.unpack('<Q', b[32:40])[0]
sys.stdout.buffer.write(b[64:64 + 4 * n])" "$1/shard-00000-of-00001.bin"
}
for src in hf hf-split; do
  "$KEEL_BIN" ckpt import --from-hf "$TMP/$src" --out "$TMP/imported-$src" >"$TMP/out" 2>&1 || { cat "$TMP/out"; fail "import $src"; }
  cmp -s <(params "$ckpt") <(params "$TMP/imported-$src") || fail "$src: imported parameters differ from the checkpoint's"
  "$KEEL_BIN" ckpt verify "$TMP/imported-$src" >/dev/null || fail "$src: the imported checkpoint does not verify"
done
pass "export -> import round trip (one file and split): parameters bit-identical"

l_run=$("$KEEL_BIN" eval "$TMP/run" --data "$TMP/data")
l_ckpt=$("$KEEL_BIN" eval "$ckpt" --data "$TMP/data")
l_imp=$("$KEEL_BIN" eval "$TMP/imported-hf" --data "$TMP/data")
[ "$l_run" = "$l_ckpt" ] && [ "$l_run" = "$l_imp" ] || fail "eval: run $l_run, checkpoint $l_ckpt, imported $l_imp"
pass "keel eval: run, checkpoint and imported copy all $l_run"

# fine-tune from the imported weights: the first step starts from a trained model
"$KEEL_BIN" train "$CFG" "${real[@]}" --set train.steps=2 --run-dir "$TMP/fresh" >/dev/null 2>&1 || fail "fresh run"
"$KEEL_BIN" train "$CFG" "${real[@]}" --set train.steps=2 --set init_from="$TMP/imported-hf" \
    --run-dir "$TMP/tuned" >"$TMP/out" 2>&1 || { cat "$TMP/out"; fail "init_from run"; }
grep -q "parameters from $TMP/imported-hf" "$TMP/out" || fail "init_from not logged"
python3 - "$TMP/fresh" "$TMP/tuned" "$l_run" <<'PY' || fail "init_from did not start from the imported weights"
import json, sys
first = lambda d: json.loads(open(f"{d}/metrics.jsonl").readline())["loss"]
fresh, tuned, ev = first(sys.argv[1]), first(sys.argv[2]), json.loads(sys.argv[3])["loss"]
print(f"ok   init_from: first-step loss {tuned:.3f} (trained weights; eval {ev:.3f}) vs {fresh:.3f} from random init")
assert tuned < fresh - 0.5 and abs(tuned - ev) < 0.5, (tuned, fresh, ev)
PY

# sharded: each of 2 ranks (the same global batch of 8) reads only its own ranges of the imported checkpoint
mpi_env
"$KEEL_BIN" train "$CFG" "${real[@]}" --set train.steps=2 --set init_from="$TMP/imported-hf" --nproc 2 \
    --set train.micro_batch_size=4 --set train.threads=1 \
    --run-dir "$TMP/tuned2" >"$TMP/out" 2>&1 || { cat "$TMP/out"; fail "init_from run on 2 ranks"; }
python3 - "$TMP/tuned" "$TMP/tuned2" <<'PY' || fail "init_from on 2 ranks does not start where one process does"
import json, sys
first = lambda d: json.loads(open(f"{d}/metrics.jsonl").readline())["loss"]
one, two = first(sys.argv[1]), first(sys.argv[2])
print(f"ok   init_from on 2 ranks: first-step loss {two:.6f}, one process {one:.6f}")
assert abs(one - two) <= 1e-5 * abs(one), (one, two)
PY

expect_input_error "import over an existing dir" "imported-hf already exists" \
  "$KEEL_BIN" ckpt import --from-hf "$TMP/hf" --out "$TMP/imported-hf"
expect_input_error "export format" "gguf: keel exports safetensors" \
  "$KEEL_BIN" ckpt export "$ckpt" --format gguf --out "$TMP/x"
expect_input_error "import without config.json" "config.json" \
  "$KEEL_BIN" ckpt import --from-hf "$TMP/data" --out "$TMP/y"
expect_input_error "init_from another model" "holds a model of .* parameters" \
  "$KEEL_BIN" train "$CFG" "${real[@]}" --set model.dim=96 --set init_from="$TMP/imported-hf" --run-dir "$TMP/z"
[ ! -e "$TMP/x" ] && [ ! -e "$TMP/y" ] && [ ! -e "$TMP/z" ] || fail "a refused command left files behind"
