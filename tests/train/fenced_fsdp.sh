#!/usr/bin/env bash
# FSDP reaches its shards, gathered units, gradient buffers and collectives
# only through the backend (keel/backend.h), as FSDP on GPUs over NCCL needs:
# on the fenced backend (KEEL_FENCED_BACKEND=1: memory that faults when the
# host touches it outside a backend call; its collectives staged through host
# buffers) every strategy trains to the CPU backend's parameters bit for bit —
# bf16 gathers and bf16 reduce-scatters, the replicas' all-reduce (NO_SHARD,
# HYBRID_SHARD), activation checkpointing, init_from, the final weights, disk
# checkpoints and in-memory snapshots with a rank killed and resumed from each;
# and no rank allocates backend memory in a step (what a GPU's cudaMalloc would
# cost), so keel needs no caching allocator.
source "$KEEL_SRC/tests/lib.sh"
mpi_env
trap 'kill_leftovers; rm -rf "$TMP"' EXIT
CFG=$KEEL_SRC/tests/train/micro.json
common=(--set train.steps=8 --set checkpoint.every_steps=3 --set resilience.backoff_s=0.1)
xxh() { json "$1/summary.json" 'j["params_xxh3"]'; }
train() { # DIR [ARGS...]: a run on the CPU backend
  local dir=$1; shift
  "$KEEL_BIN" train "$CFG" "${common[@]}" "$@" --run-dir "$dir" >"$dir.log" 2>&1 || { tail -20 "$dir.log"; fail "$dir: exit $?"; }
}
fenced() { KEEL_FENCED_BACKEND=1 train "$@"; }
same() { # NAME DIR: DIR's fenced twin ends with its parameters and weights
  [ "$(json "$TMP/$2-fenced/summary.json" 'j["device"]')" = fenced ] || fail "$1: the fenced backend was not used"
  [ "$(xxh "$TMP/$2-fenced")" = "$(xxh "$TMP/$2")" ] ||
    fail "$1: params_xxh3 $(xxh "$TMP/$2-fenced") on the fence, $(xxh "$TMP/$2") on the CPU"
  cmp -s "$TMP/$2-fenced/weights.bin" "$TMP/$2/weights.bin" || fail "$1: weights.bin differs"
  allocs=$(json "$TMP/$2-fenced/summary.json" '[r["backend_allocations_in_steps"] for r in j["ranks"]]')
  [[ "$allocs" =~ ^\[0(, 0)*\]$ ]] || fail "$1: backend allocations in steps, per rank: $allocs (want none)"
  pass "$1 on the fenced backend: params_xxh3 $(xxh "$TMP/$2") as on the CPU"
}

bf=(--set fsdp.mixed_precision=bf16 --set fsdp.reduce_dtype=bf16 --set fsdp.activation_checkpointing=true)
train "$TMP/full" --nproc 2 "${bf[@]}"
fenced "$TMP/full-fenced" --nproc 2 "${bf[@]}"
same "FULL_SHARD, 2 ranks, bf16 gathers and reduce-scatters, activation checkpointing" full

hy=(--nproc 4 --set fsdp.strategy=hybrid_shard --set fsdp.shard_group_size=2 --set fsdp.reduce_dtype=bf16)
train "$TMP/hybrid" "${hy[@]}"
fenced "$TMP/hybrid-fenced" "${hy[@]}"
same "HYBRID_SHARD, 4 ranks in shard groups of 2, bf16 all-reduce across replicas" hybrid

ck=$TMP/full/checkpoints/step_00000006
so=(--nproc 2 --set fsdp.strategy=shard_grad_op --set init_from="$ck")
train "$TMP/grad-op" "${so[@]}"
fenced "$TMP/grad-op-fenced" "${so[@]}"
grep -q "parameters from $ck" "$TMP/grad-op-fenced.log" || fail "init_from not used on the fence"
same "SHARD_GRAD_OP from init_from" grad-op

# A rank killed mid-run: the relaunch resumes from the in-memory snapshot (its
# copy out of and back into the fence), then, with snapshots off, from disk.
long=(--set train.steps=40 --set checkpoint.every_steps=10 --nproc 2)
train "$TMP/long" "${long[@]}"
for source in memory disk; do
  extra=(); [ "$source" = disk ] && extra=(--set resilience.snapshot_every_steps=0 --set fsdp.strategy=no_shard)
  [ "$source" = disk ] && train "$TMP/long-$source" "${long[@]}" "${extra[@]}"
  [ "$source" = memory ] && cp -r "$TMP/long" "$TMP/long-$source"
  run=$TMP/long-$source-fenced
  KEEL_FENCED_BACKEND=1 "$KEEL_BIN" train "$CFG" "${common[@]}" "${long[@]}" "${extra[@]}" --run-dir "$run" >"$run.log" 2>&1 &
  sup=$!
  kill -9 "$(wait_train_step "$run" 1 14)"
  rc=0; wait "$sup" || rc=$?
  [ "$rc" = 0 ] || { tail -20 "$run.log"; fail "fenced run with a kill: exit $rc"; }
  want="from memory"; [ "$source" = disk ] && want="from $run/checkpoints/step_"
  grep '"event":"resumed"' "$run/events.jsonl" | grep -q "$want" ||
    fail "no resume from $source: $(grep resumed "$run/events.jsonl")"
  same "rank 1 killed at step ~14, resumed from $source" "long-$source"
done
