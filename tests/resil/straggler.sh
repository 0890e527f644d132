#!/usr/bin/env bash
# A rank slowed for real: rank 1 is throttled as a CPU quota would (stopped
# 60 ms of every 80 ms: a quarter of the speed, whatever else the machine is
# doing). The supervisor names rank 1 (and its node) in a `straggler` event
# within straggler_steps + 2 steps, the metrics count it as
# keel_failures_total{cause="straggler"}, and the run goes on
# (straggler_action report). With straggler_action drain the node is taken
# out: on one machine there is no other node, so the run stops with a report
# that names the straggler.
source "$KEEL_SRC/tests/lib.sh"
mpi_env
throttle="" throttled=""
stop_throttle() { # the loop, then the rank it may have left stopped
  [ -n "$throttle" ] || return 0
  kill "$throttle" 2>/dev/null || true
  wait "$throttle" 2>/dev/null || true
  kill -CONT "$throttled" 2>/dev/null || true
  throttle="" throttled=""
}
cleanup() { stop_throttle; kill_leftovers; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT
K=3
CFG=$KEEL_SRC/tests/train/micro.json
# steps of ~0.5 s, long beside the throttle's 80 ms
args=(--set train.steps=16 --set model.dim=256 --set model.max_seq_len=128 --set train.threads=1
      --set resilience.straggler_steps=$K --set resilience.max_restarts=0
      --nproc 2)

# slow_rank_1 RUN: throttle rank 1 from step 2 on (in the background: $throttle); $from := the step it had done
slow_rank_1() {
  local p1
  wait_train_step "$1" 0 2 >/dev/null
  p1=$(wait_train_step "$1" 1 2)
  # a busy machine oversleeps both pauses alike: the running share stays well under 1/1.3
  bash -c 'while kill -STOP "$1" 2>/dev/null; do sleep 0.06; kill -CONT "$1" 2>/dev/null; sleep 0.02; done' \
    throttle "$p1" </dev/null >/dev/null 2>&1 &
  throttle=$! throttled=$p1
  from=$(hb step "$1" 1)
}

# report: an event naming rank 1, the run goes on and completes
run=$TMP/report
"$KEEL_BIN" train "$CFG" "${args[@]}" --run-dir "$run" >"$TMP/report.out" 2>&1 &
sup=$!
slow_rank_1 "$run"
for _ in $(seq 1 1200); do [ "$(event_count "$run" straggler)" -ge 1 ] && break; sleep 0.1; done
[ "$(event_count "$run" straggler)" -ge 1 ] || fail "no straggler event 120 s after slowing rank 1 (from step $from)"
line=$(grep '"event":"straggler"' "$run/events.jsonl" | head -1)
stop_throttle
python3 - "$line" "$from" "$K" "$(hostname)" <<'PY' || fail "straggler event: $line"
import json, sys
e, start, k = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
assert e["cause"] == "straggler" and e["rank"] == 1 and e["node"], e
assert e["step"] <= start + 1 + k + 2, f"named at step {e['step']}, slowed after step {start}: more than K+2 steps"
assert e["seconds"] > 0 and "rank 1 on" in e["detail"], e
PY
pass "rank 1 slowed after step $from: named at step $(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["step"])' "$line") ($K steps in a row over 1.3x): $(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["detail"])' "$line")"
grep -q '"event":"straggler".*"rank":0' "$run/events.jsonl" && fail "rank 0 was named too"
rc=0; wait "$sup" || rc=$?
[ "$rc" = 0 ] || { tail -5 "$TMP/report.out"; fail "report: keel train exit $rc, want 0 (a straggler is reported, not stopped)"; }
pass "straggler_action report: the run completed"

# drain: the node is out; one machine has no other node: stop with the reason
run=$TMP/drain
"$KEEL_BIN" train "$CFG" "${args[@]}" --set resilience.straggler_action=drain --set resilience.max_restarts=3 --run-dir "$run" >"$TMP/drain.out" 2>&1 &
sup=$!
slow_rank_1 "$run"
rc=0; wait "$sup" || rc=$?
stop_throttle
[ "$rc" = 1 ] || { tail -5 "$TMP/drain.out"; fail "drain: keel train exit $rc, want 1"; }
reason=$(json "$run/summary.json" "j['stop_reason']")
[[ "$reason" == "this machine ("*") failed the straggler health check"* ]] || fail "drain: stop_reason: $reason"
[ "$(grep -c '"cause":"straggler"' "$run/events.jsonl")" = 1 ] ||
  fail "drain: the straggler must count as one failure: $(grep cause "$run/events.jsonl")"
pass "straggler_action drain on one machine: stopped, $(json "$run/summary.json" "j['stop_reason']")"
