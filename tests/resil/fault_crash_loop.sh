#!/usr/bin/env bash
# A crash loop: rank 1 dies soon after every launch and no new checkpoint is
# made in between; after resilience.crash_loop failures the supervisor stops
# with a report instead of burning the allocation.
source "$KEEL_SRC/tests/lib.sh"
mpi_env
CFG=$KEEL_SRC/tests/train/micro.json
"$KEEL_BIN" train "$CFG" --set train.steps=5000 --set checkpoint.every_steps=4000 --set resilience.crash_loop=3 \
  --set resilience.max_restarts=10 --set resilience.backoff_s=0.1 --nproc 2 --run-dir "$TMP/run" \
  >"$TMP/out" 2>"$TMP/err" &
sup=$!
last=x
for k in 1 2 3; do
  last=$(wait_train_step "$TMP/run" 1 5 "$last")
  kill -9 "$last"
  for _ in $(seq 1 400); do [ "$(event_count "$TMP/run" failure)" -ge "$k" ] && break; sleep 0.05; done
done
rc=0; wait "$sup" || rc=$?
[ "$rc" = 1 ] || fail "exit $rc, want 1"
[ "$(event_count "$TMP/run" failure)" = 3 ] || fail "$(event_count "$TMP/run" failure) failures, want 3"
[ "$(event_count "$TMP/run" restart)" = 2 ] || fail "$(event_count "$TMP/run" restart) restarts, want 2"
grep -q '"event":"stop".*crash loop: 3 failures in a row' "$TMP/run/events.jsonl" || fail "no crash-loop stop event"
grep -q "keel: error: crash loop: 3 failures in a row" "$TMP/err" || fail "no report: $(tail -2 "$TMP/err")"
[ "$(json "$TMP/run/summary.json" "j['status']")" = failed ] || fail "summary status"
pass "crash loop stopped after 3 failures: $(grep 'keel: error' "$TMP/err")"
