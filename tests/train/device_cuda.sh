#!/usr/bin/env bash
# "device": "cuda" on a machine where it cannot run — no GPU, no driver, or a
# keel built without the CUDA backend — is one line saying which and how to
# train instead, exit 2, nothing made; so is cuda with more --nproc ranks than
# the machine has GPUs (FSDP over NCCL: one rank per GPU); a bad device name is refused the same way; the default is
# cpu. (The kernels themselves: tests/cuda/gpu_parity.c; training on a GPU:
# scripts/gpu-check.sh; the same code path on the CPU: fenced_backend.sh.)
source "$KEEL_SRC/tests/lib.sh"
CFG=$KEEL_SRC/tests/train/micro.json
if nvidia-smi -L >/dev/null 2>&1; then
  n=$(( $(nvidia-smi -L | grep -c '^GPU') + 1 ))
  expect_input_error "--device cuda --nproc $n" "device cuda with --nproc $n: this machine has $(( n - 1 )) GPU\(s\)" \
    "$KEEL_BIN" train "$CFG" --device cuda --nproc "$n" --run-dir "$TMP/run"
else
  want='device cuda: (no GPU the CUDA runtime can use|this keel was built without the CUDA backend).*"device": "cpu"'
  expect_input_error "--device cuda" "$want" "$KEEL_BIN" train "$CFG" --device cuda --run-dir "$TMP/run"
  expect_input_error "--set device=cuda" "$want" "$KEEL_BIN" train "$CFG" --set device=cuda --run-dir "$TMP/run"
  expect_input_error "--device cuda --nproc 2" "$want" "$KEEL_BIN" train "$CFG" --device cuda --nproc 2 --run-dir "$TMP/run"
fi
[ ! -e "$TMP/run" ] || fail "a refused device made the run directory"
expect_input_error "a device keel does not know" "device 'gpu' is not one of cpu, cuda" \
  "$KEEL_BIN" train "$CFG" --device gpu --run-dir "$TMP/run"
"$KEEL_BIN" config show "$CFG" | grep -Eq '"device":[[:space:]]*"cpu"' || fail "the default device is not cpu: $("$KEEL_BIN" config show "$CFG")"
pass "device defaults to cpu"
