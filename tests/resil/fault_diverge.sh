#!/usr/bin/env bash
# An absurd learning rate makes the loss run away in step 2: the supervisor
# rolls back, then skips that step's data window once, then stops with a
# report and a non-zero exit (no endless restarts).
source "$KEEL_SRC/tests/lib.sh"
mpi_env
CFG=$KEEL_SRC/tests/train/micro.json
rc=0
"$KEEL_BIN" train "$CFG" --set train.steps=50 --set checkpoint.every_steps=5 --set train.lr=10 \
  --set train.min_lr=10 --set train.warmup_steps=0 --set train.grad_clip=0 --set resilience.backoff_s=0.1 \
  --nproc 2 --run-dir "$TMP/run" >"$TMP/out" 2>"$TMP/err" || rc=$?
[ "$rc" = 1 ] || { tail "$TMP/err"; fail "exit $rc, want 1"; }
ev=$TMP/run/events.jsonl
[ "$(event_count "$TMP/run" diverged)" = 3 ] || fail "want 3 diverged events (rollback, skip, stop): $(grep -c diverged "$ev")"
grep -q '"event":"rollback","step":2' "$ev" || fail "no rollback event"
grep -q '"event":"skip_data","step":2' "$ev" || fail "no skip_data event"
grep -q '"event":"stop".*diverged again' "$ev" || fail "no stop event"
grep -q "keel: error: the loss diverged again in step 2 after step 2's data window was skipped" "$TMP/err" \
  || fail "no one-line report: $(tail -2 "$TMP/err")"
[ "$(json "$TMP/run/summary.json" "j['status']")" = failed ] || fail "summary status $(json "$TMP/run/summary.json" "j['status']")"
[ "$(json "$TMP/run/supervisor.json" "j['skip_data_steps']")" = "[2]" ] || fail "supervisor.json skip list"
[ "$(json "$TMP/run/summary.json" "j['restarts']")" = 2 ] || fail "want 2 restarts"
pass "divergence: rollback, skip of step 2's window, stop: $(tail -1 "$TMP/err")"
