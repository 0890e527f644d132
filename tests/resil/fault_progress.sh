#!/usr/bin/env bash
# Attempts that fail further on each time are progress, not a crash loop:
# disk checkpoints every 50 steps, a rank killed (kill -9) at steps 12, 27 and
# 41 — three failures in a row with no new checkpoint between them — and the
# run completes with resilience.crash_loop 3.
source "$KEEL_SRC/tests/lib.sh"
mpi_env
trap 'kill_leftovers; rm -rf "$TMP"' EXIT
CFG=$KEEL_SRC/tests/train/micro.json
"$KEEL_BIN" train "$CFG" --set train.steps=60 --set checkpoint.every_steps=50 --set resilience.crash_loop=3 \
  --set resilience.backoff_s=0.1 --nproc 2 --run-dir "$TMP/run" >"$TMP/out" 2>"$TMP/err" &
sup=$!
last=x
for at in 12 27 41; do
  last=$(wait_train_step "$TMP/run" 1 "$at" "$last")
  kill -9 "$last"
done
rc=0; wait "$sup" || rc=$?
[ "$rc" = 0 ] || fail "exit $rc, want 0 (completed): $(tail -3 "$TMP/err")"
[ "$(event_count "$TMP/run" failure)" = 3 ] || fail "$(event_count "$TMP/run" failure) failures, want 3"
[ "$(json "$TMP/run/summary.json" "j['status']")" = completed ] || fail "summary status"
steps=$(grep -o '"event":"failure","step":[0-9]*' "$TMP/run/events.jsonl" | grep -o '[0-9]*$' | tr '\n' ' ')
pass "3 kills (failures in steps ${steps% }) with no checkpoint between them: the run completed"
