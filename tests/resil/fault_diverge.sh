#!/usr/bin/env bash
# An absurd learning rate makes the loss run away within the first steps: the
# supervisor rolls back, then skips that step's data window once, then stops
# with a report and a non-zero exit (no endless restarts). Which step runs
# away depends on the CPU's arithmetic (step 2 on the machines seen so far,
# but rounding decides), so the test reads it from the run: the step of the
# first `diverged` event, which metrics.jsonl must show as the first step it
# never logged — and every later decision must name that same step.
source "$KEEL_SRC/tests/lib.sh"
mpi_env
CFG=$KEEL_SRC/tests/train/micro.json
rc=0
"$KEEL_BIN" train "$CFG" --set train.steps=50 --set checkpoint.every_steps=5 --set train.lr=10 \
  --set train.min_lr=10 --set train.warmup_steps=0 --set train.grad_clip=0 --set resilience.backoff_s=0.1 \
  --nproc 2 --run-dir "$TMP/run" >"$TMP/out" 2>"$TMP/err" || rc=$?
[ "$rc" = 1 ] || { tail "$TMP/err"; fail "exit $rc, want 1"; }
ev=$TMP/run/events.jsonl
S=$(python3 -c '
import json, sys
steps = [e["step"] for e in map(json.loads, open(sys.argv[1])) if e["event"] == "diverged"]
print(steps[0] if steps else "")' "$ev")
[ -n "$S" ] || fail "no diverged event: $(cat "$ev")"
# the step before it ran (metrics.jsonl logs a step only once it is good), the step itself did not
last=$(python3 -c 'import json, sys; print(max(json.loads(l)["step"] for l in open(sys.argv[1])))' \
  "$TMP/run/metrics.jsonl" 2>/dev/null || echo 0)
[ "$last" = $((S - 1)) ] || fail "diverged in step $S, but metrics.jsonl's last step is $last"
[ "$S" -le 10 ] || fail "lr 10 ran for $S steps before diverging"
[ "$(event_count "$TMP/run" diverged)" = 3 ] || fail "want 3 diverged events (rollback, skip, stop): $(grep -c diverged "$ev")"
grep -q "\"event\":\"rollback\",\"step\":$S," "$ev" || fail "no rollback event in step $S"
grep -q "\"event\":\"skip_data\",\"step\":$S," "$ev" || fail "no skip_data event in step $S"
grep -q '"event":"stop".*diverged again' "$ev" || fail "no stop event"
grep -q "keel: error: the loss diverged again in step [0-9]* after step $S's data window was skipped" "$TMP/err" \
  || fail "no one-line report: $(tail -2 "$TMP/err")"
[ "$(json "$TMP/run/summary.json" "j['status']")" = failed ] || fail "summary status $(json "$TMP/run/summary.json" "j['status']")"
[ "$(json "$TMP/run/supervisor.json" "j['skip_data_steps']")" = "[$S]" ] || fail "supervisor.json skip list"
[ "$(json "$TMP/run/summary.json" "j['restarts']")" = 2 ] || fail "want 2 restarts"
pass "divergence in step $S: rollback, skip of step $S's window, stop: $(tail -1 "$TMP/err")"
