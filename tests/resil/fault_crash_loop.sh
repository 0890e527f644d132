#!/usr/bin/env bash
# A crash loop is the same step failing again: rank 1 kills itself (SIGKILL)
# as it begins step 6 in every launch (KEEL_FAULT), no attempt gets further,
# and after resilience.crash_loop failures the supervisor stops with a report
# instead of burning the allocation; each relaunch resumes from an in-memory
# snapshot (step 4 or 5). The killed ranks' OpenMPI shared-memory
# files go with each launch (the supervisor's backing directory).
source "$KEEL_SRC/tests/lib.sh"
mpi_env
CFG=$KEEL_SRC/tests/train/micro.json
shm_before=$(ls /dev/shm | grep -c '^vader_segment' || true)
rc=0
KEEL_FAULT=kill@6:1 "$KEEL_BIN" train "$CFG" --set train.steps=50 --set checkpoint.every_steps=40 \
  --set resilience.crash_loop=3 --set resilience.max_restarts=10 --set resilience.backoff_s=0.1 --nproc 2 \
  --run-dir "$TMP/run" >"$TMP/out" 2>"$TMP/err" &
sup=$!
wait "$sup" || rc=$?
[ "$rc" = 1 ] || fail "exit $rc, want 1: $(tail -3 "$TMP/err")"
[ "$(event_count "$TMP/run" failure)" = 3 ] || fail "$(event_count "$TMP/run" failure) failures, want 3"
[ "$(event_count "$TMP/run" restart)" = 2 ] || fail "$(event_count "$TMP/run" restart) restarts, want 2"
[ "$(grep -c '"event":"failure","step":6,"cause":"crash","rank":1' "$TMP/run/events.jsonl")" = 3 ] ||
  fail "the failures are not all rank 1's crash in step 6: $(grep '"failure"' "$TMP/run/events.jsonl")"
# each relaunch resumed from memory: steps the failed attempt began, abandoned,
# never mix into the next one's snapshots
[ "$(grep -c '"event":"resumed".*from memory' "$TMP/run/events.jsonl")" = 2 ] ||
  fail "the relaunches did not both resume from memory: $(grep -E '"resumed"|"recovered"' "$TMP/run/events.jsonl")"
# the mpi health check of each relaunch runs on its ranks, as their first collective
[ "$(grep -c '"event":"health".*ranks 2: mpi pass: 2 rank(s): all-reduce of 16 MB exact' "$TMP/run/events.jsonl")" = 2 ] ||
  fail "no mpi check by each relaunch's ranks: $(grep '"health"' "$TMP/run/events.jsonl")"
grep -q '"event":"stop".*crash loop: 3 failures in a row in step 6 or before' "$TMP/run/events.jsonl" ||
  fail "no crash-loop stop event: $(grep '"stop"' "$TMP/run/events.jsonl")"
grep -q "keel: error: crash loop: 3 failures in a row" "$TMP/err" || fail "no report: $(tail -2 "$TMP/err")"
[ "$(json "$TMP/run/summary.json" "j['status']")" = failed ] || fail "summary status"
pass "crash loop stopped after 3 failures in step 6: $(grep 'keel: error' "$TMP/err")"
shm_after=$(ls /dev/shm | grep -c '^vader_segment' || true)
[ "$shm_after" -le "$shm_before" ] && [ ! -e "/dev/shm/keel-mpi-$sup" ] ||
  fail "OpenMPI shared memory left in /dev/shm: vader segments $shm_before -> $shm_after, $(ls -d /dev/shm/keel-mpi-$sup 2>/dev/null)"
pass "no OpenMPI shared memory left behind by 3 killed launches"

expect_input_error "bad KEEL_FAULT" "KEEL_FAULT=explode@3: expected kill@STEP, stop@STEP or hang@STEP" \
  env KEEL_FAULT=explode@3 "$KEEL_BIN" train "$CFG" --run-dir "$TMP/bad"
