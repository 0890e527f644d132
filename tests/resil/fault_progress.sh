#!/usr/bin/env bash
# Attempts that fail further on each time are progress, not a crash loop:
# disk checkpoints every 50 steps, a rank killed (kill -9) at steps 12, 27 and
# 41 — three failures in a row with no new checkpoint between them — and the
# run completes with resilience.crash_loop 3. In-memory snapshots are off
# here: every relaunch starts over (fault_snapshot.sh has them on).
source "$KEEL_SRC/tests/lib.sh"
mpi_env
trap 'kill_leftovers; rm -rf "$TMP"' EXIT
CFG=$KEEL_SRC/tests/train/micro.json
"$KEEL_BIN" train "$CFG" --set train.steps=60 --set checkpoint.every_steps=50 --set resilience.crash_loop=3 \
  --set resilience.snapshot_every_steps=0 --set resilience.backoff_s=0.1 --nproc 2 --run-dir "$TMP/run" >"$TMP/out" 2>"$TMP/err" &
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
# where each recovery's time went: the parts add up to it, and no state was on disk yet
python3 - "$TMP/run/summary.json" <<'PY' || fail "recovery split: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["recovery_s"])' "$TMP/run/summary.json")"
import json, sys
r = json.load(open(sys.argv[1]))["recovery_s"]
assert len(r["each"]) == 3 and len(r["split"]) == 3, r
for total, x in zip(r["each"], r["split"]):
    parts = [x[k] for k in ("detect", "health", "backoff", "launch", "restore", "first_step")]
    assert all(p >= 0 for p in parts) and abs(sum(parts) - total) < 0.5, (total, x)
    assert x["source"] == "none", x
print(r["split"][0])
PY
pass "recovery split: detect, health, backoff, launch, restore (fresh starts: source none) and first step add up to each recovery"
