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
expect_input_error "model too big" "needs [0-9.]+ GiB on one rank" train "$KEEL_SRC/configs/llama2-70b.json"
[ ! -e "$RUN" ] || fail "a failed start created the run directory"
pass "no run directory was created by any failed start"

# --- an existing run is never touched --------------------------------------
"$K" train "$CFG" --set train.steps=2 --run-dir "$RUN" >/dev/null 2>&1
before=$(cd "$RUN" && sha256sum * | sha256sum)
expect_input_error "run dir not empty" "run directory already exists and is not empty" train "$CFG"
expect_input_error "bad config, existing run" "unknown config key" train "$CFG" --set train.nope=1
[ "$before" = "$(cd "$RUN" && sha256sum * | sha256sum)" ] || fail "existing run directory changed"
pass "existing run directory unchanged"
