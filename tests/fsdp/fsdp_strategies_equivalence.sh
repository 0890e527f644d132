#!/usr/bin/env bash
# Every FSDP strategy on 1-4 ranks (oversubscribed on 2 cores) follows the
# unsharded run for 10 steps: loss rel <= 1e-5 every step, parameters
# |dp|/|p| <= 1e-5; each rank's persistent state is exactly 16 bytes x padded
# params / (ranks in its shard group) — W for FULL_SHARD. Odd shapes make every
# unit need padding; tied heads run on 3 ranks. HYBRID_SHARD: groups of 2.
# Matrix units (fsdp.unit matrix: 5 per block), with activation checkpointing
# of no block, of the first 2 of 3 (block 0 recomputed, block 1's activations
# kept in place, block 2 not checkpointed) and of all (whose recomputation
# gathers a block's units again), follow too.
# Node windows (fsdp.node_windows, on by default: the gathered units in memory
# every rank maps) are used wherever a shard group has 2 ranks or more, and
# runs with them off end with bit-identical parameters.
source "$KEEL_SRC/tests/lib.sh"
prog=$KEEL_BUILD/tests/mpi_fsdp_equivalence
[ -x "$prog" ] || fail "$prog not built"
mpi_env
run() { # W TIED STRATEGY [GROUP [KEY=VALUE...]]
  timeout 300 mpirun --allow-run-as-root --oversubscribe -np "$1" "$prog" 10 "$2" "$3" "${4:-0}" "${@:5}" \
    >"$TMP/out" 2>&1 || { cat "$TMP/out"; fail "W=$1 tied=$2 $3 ${*:5}"; }
  grep -q "^PASSED" "$TMP/out" || { cat "$TMP/out"; fail "W=$1 tied=$2 $3 ${*:5}: no PASSED line"; }
  local want=yes
  { [ "$1" = 1 ] || [ "$3" = no_shard ] || [[ " ${*:5} " == *" fsdp.node_windows=false "* ]]; } && want=no
  grep -q "^node window: $want;" "$TMP/out" || { cat "$TMP/out"; fail "W=$1 $3 ${*:5}: node window should be $want"; }
  pass "$(grep "^W=$1 tied=$2" "$TMP/out") ${*:5}; node window $want"
}
same_params() { # W TIED STRATEGY GROUP [KEY=VALUE...]: node windows on and off end bit for bit the same
  run "$@" && cp "$TMP/out" "$TMP/on"
  run "$@" fsdp.node_windows=false
  local on off
  on=$(grep -o 'parameters fnv 0x[0-9a-f]*' "$TMP/on") off=$(grep -o 'parameters fnv 0x[0-9a-f]*' "$TMP/out")
  [ -n "$on" ] && [ "$on" = "$off" ] || fail "W=$1 $3 ${*:5}: node windows on ($on) and off ($off) differ"
  pass "W=$1 tied=$2 $3 ${*:5}: node windows on and off, the same parameters ($on)"
}
for strategy in full_shard shard_grad_op no_shard; do
  for W in 1 2 3 4; do run "$W" 0 "$strategy"; done
  run 3 1 "$strategy"
done
run 2 0 hybrid_shard 2
run 4 0 hybrid_shard 2
run 4 1 hybrid_shard 2
for ac in false 2 true; do
  run 2 0 full_shard 0 fsdp.unit=matrix fsdp.activation_checkpointing=$ac
  run 3 1 full_shard 0 fsdp.unit=matrix fsdp.activation_checkpointing=$ac
  run 2 0 shard_grad_op 0 fsdp.unit=matrix fsdp.activation_checkpointing=$ac
  run 4 0 hybrid_shard 2 fsdp.unit=matrix fsdp.activation_checkpointing=$ac
done
run 2 0 full_shard 0 fsdp.activation_checkpointing=true
run 3 0 full_shard 0 fsdp.activation_checkpointing=2
same_params 2 0 full_shard 0
same_params 3 1 shard_grad_op 0
same_params 4 0 hybrid_shard 2 fsdp.unit=matrix fsdp.activation_checkpointing=2
