#!/usr/bin/env bash
# The trainer's one-process path reaches the model's and optimizer's tensors
# only through the backend (keel/backend.h), as a GPU needs: on the fenced
# backend (KEEL_FENCED_BACKEND=1: the CPU kernels on memory that faults when
# the host touches it outside a backend call) a run with a checkpoint, a
# kill and a resume, init_from, bf16 GEMMs with activation checkpointing and
# the final weights all finish, with the CPU backend's parameters bit for bit.
source "$KEEL_SRC/tests/lib.sh"
CFG=$KEEL_SRC/tests/train/micro.json
common=(--set train.steps=6 --set checkpoint.every_steps=3)
xxh() { json "$1/summary.json" 'j["params_xxh3"]'; }
train() { # DIR [ARGS...]: a run on the CPU backend
  local dir=$1; shift
  "$KEEL_BIN" train "$CFG" "${common[@]}" "$@" --run-dir "$dir" >"$dir.log" 2>&1 || { cat "$dir.log"; fail "$dir: exit $?"; }
}
fenced() { KEEL_FENCED_BACKEND=1 train "$@"; }

train "$TMP/cpu"
fenced "$TMP/fenced"
grep -q 'KEEL_FENCED_BACKEND=1: the CPU backend on fenced memory' "$TMP/fenced.log" || fail "the fenced backend was not used"
[ "$(json "$TMP/fenced/summary.json" 'j["device"]')" = fenced ] || fail "summary.json's device is not fenced"
[ "$(json "$TMP/cpu/summary.json" 'j["device"]')" = cpu ] || fail "summary.json's device is not cpu"
[ "$(xxh "$TMP/fenced")" = "$(xxh "$TMP/cpu")" ] || fail "fenced run: params_xxh3 $(xxh "$TMP/fenced"), cpu $(xxh "$TMP/cpu")"
cmp -s "$TMP/fenced/weights.bin" "$TMP/cpu/weights.bin" || fail "fenced run: weights.bin differs"
allocs=$(json "$TMP/fenced/summary.json" 'j["ranks"][0]["backend_allocations_in_steps"]')
[ "$allocs" = 0 ] || fail "fenced run: $allocs backend allocations in steps 2-6 (want none)"
pass "6 steps with a checkpoint on the fenced backend: params_xxh3 $(xxh "$TMP/cpu") as on the CPU backend"

# killed after the step-3 checkpoint, then resumed from it: both on the fence
KEEL_FAULT=kill@5 KEEL_FENCED_BACKEND=1 "$KEEL_BIN" train "$CFG" "${common[@]}" --run-dir "$TMP/resumed" \
  >"$TMP/killed.log" 2>&1 && fail "KEEL_FAULT=kill@5 did not kill the run"
fenced "$TMP/resumed"
grep -q 'resuming from .*step_00000003' "$TMP/resumed.log" || fail "no resume from step 3: $(cat "$TMP/resumed.log")"
[ "$(xxh "$TMP/resumed")" = "$(xxh "$TMP/cpu")" ] || fail "resumed on the fence: params_xxh3 $(xxh "$TMP/resumed")"
pass "killed at step 5, resumed from step 3 on the fenced backend: the same parameters"

# init_from a checkpoint, on both backends
ck=$TMP/cpu/checkpoints/step_00000006
train "$TMP/cpu-init" --set init_from="$ck"
fenced "$TMP/fenced-init" --set init_from="$ck"
grep -q "parameters from $ck" "$TMP/fenced-init.log" || fail "init_from not used on the fence"
[ "$(xxh "$TMP/fenced-init")" = "$(xxh "$TMP/cpu-init")" ] || fail "init_from on the fence: params differ"
pass "init_from on the fenced backend: the same parameters as on the CPU"

# bf16 GEMMs (own-parameter bf16 copy) and activation checkpointing
bf=(--set fsdp.mixed_precision=bf16 --set fsdp.activation_checkpointing=true)
train "$TMP/cpu-bf16" "${bf[@]}"
fenced "$TMP/fenced-bf16" "${bf[@]}"
[ "$(xxh "$TMP/fenced-bf16")" = "$(xxh "$TMP/cpu-bf16")" ] || fail "bf16 on the fence: params differ"
[ "$(xxh "$TMP/cpu-bf16")" != "$(xxh "$TMP/cpu")" ] || fail "bf16 run equals the fp32 run: the option did nothing"
pass "bf16 GEMMs with activation checkpointing on the fenced backend: the same parameters"
