#!/usr/bin/env bash
# Lose no step: in-memory snapshots (resilience.snapshot_every_steps 1, the
# default) under the supervisor, disk checkpoints every 50 steps.
# (1) kill -9 of a random rank at a random step, three times in one run (near
#     steps 12, 27 and 41): every relaunch resumes from memory, each failure
#     loses at most the step in flight, and the run ends with the undisturbed
#     run's params_xxh3; no segment is left in /dev/shm.
# (2) a damaged snapshot: both ranks are frozen holding the same two committed
#     steps, a byte of each of rank 1's two slots flipped, then both killed:
#     the checksum fails on rank 1 only, for both steps, and every rank falls
#     back together to the newest checkpoint on disk, same result.
# (3) a run that is given up (crash loop) leaves no segment either.
# (4) node loss: 4 ranks on 2 simulated nodes (KEEL_SIMULATED_NODES=2: ranks
#     0-1 and 2-3), each rank also keeping a replica of its buddy's snapshot
#     (rank r's buddy: r + 2 mod 4). Both ranks of node 1 are frozen, every
#     segment node 1 holds (its ranks' own, the replicas it keeps) removed,
#     and both killed: ranks 2 and 3 resume from their buddies' replicas on
#     node 0, and the run ends with the undisturbed 4-rank run's params_xxh3.
source "$KEEL_SRC/tests/lib.sh"
mpi_env
trap 'kill_leftovers; rm -rf "$TMP"' EXIT
CFG=$KEEL_SRC/tests/train/micro.json
args=(--set train.steps=60 --set checkpoint.every_steps=50 --set resilience.backoff_s=0.1 --nproc 2)
"$KEEL_BIN" train "$CFG" "${args[@]}" --run-dir "$TMP/ref" >"$TMP/ref.out" 2>&1 || { cat "$TMP/ref.out"; fail "reference run"; }
want=$(json "$TMP/ref/summary.json" "j['params_xxh3']")

[ -z "$(segments "$TMP/ref")" ] || fail "segments left after a completed run: $(segments "$TMP/ref")"

# (1) three kills, each of a random rank at a random step
"$KEEL_BIN" train "$CFG" "${args[@]}" --run-dir "$TMP/run" >"$TMP/run.out" 2>&1 &
sup=$!
prev=x killed=""
for base in 12 27 41; do
  rank=$(( RANDOM % 2 )) at=$(( base + RANDOM % 4 ))
  pid=$(wait_train_step "$TMP/run" "$rank" "$at" "$prev")
  [ -n "$(segments "$TMP/run")" ] || fail "no snapshot segment in /dev/shm while training"
  kill -9 "$pid"
  killed="$killed rank $rank at step $(hb step "$TMP/run" "$rank");"
  prev=$pid
done
rc=0; wait "$sup" || rc=$?
[ "$rc" = 0 ] || { tail -5 "$TMP/run.out"; fail "exit $rc after three kills, want 0"; }
python3 - "$TMP/run" <<'PY' || fail "the recoveries did not all come from memory with at most one step lost"
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1] + "/events.jsonl")]
fail = [e for e in ev if e["event"] == "failure"]
res = [e for e in ev if e["event"] == "resumed"]
lost = [e for e in ev if e["event"] == "lost_work"]
assert len(fail) == 3 and len(res) == 3 and len(lost) == 3, (len(fail), len(res), len(lost))
assert all("from memory" in e["detail"] for e in res), [e["detail"] for e in res]
# each failure in step s (the step in flight) resumes from step s-1, or s-2 if killed mid-copy
for f, r, l in zip(fail, res, lost):
    assert f["step"] - 2 <= r["step"] <= f["step"] - 1, (f, r)
    assert l.get("steps", 0) <= 1, l
s = json.load(open(sys.argv[1] + "/summary.json"))
assert s["lost_steps"] <= 3 and all(x["source"] == "memory" for x in s["recovery_s"]["split"]), s
print("ok   resumed from memory at steps", [r["step"] for r in res], "for failures in steps", [f["step"] for f in fail],
      "lost", [l.get("steps", 0) for l in lost], "recovery", [round(x, 2) for x in s["recovery_s"]["each"]], "s")
PY
got=$(json "$TMP/run/summary.json" "j['params_xxh3']")
[ "$got" = "$want" ] || fail "params_xxh3 $got after three kills, undisturbed run $want"
[ -z "$(segments "$TMP/run")" ] || fail "segments left after the run completed: $(segments "$TMP/run")"
pass "kill -9 of${killed%;}: same params_xxh3 $want, /dev/shm clean"

# (2) a flipped byte in both of rank 1's slots; damaged RUN EVERY: checkpoints every EVERY steps (0: none)
flip() { # flip FILE OFFSET: complement one byte in place
  local b; b=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')
  printf "\\$(printf %o $(( b ^ 255 )))" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}
# the steps of a segment's two slots, newest first, when both are committed (segment_header's slot[i].state
# at bytes 64 and 88 is SLOT_COMMITTED, 2; slot[i].step at 72 and 96: src/ckpt/segment.c); else nothing
slot_steps() {
  [ "$(od -An -tu4 -j 64 -N4 "$1" | tr -d ' ')" = 2 ] && [ "$(od -An -tu4 -j 88 -N4 "$1" | tr -d ' ')" = 2 ] &&
    { od -An -td8 -j 72 -N8 "$1"; od -An -td8 -j 96 -N8 "$1"; } | tr -d ' ' | sort -rn | tr '\n' ' '
}
segment_of() { # RUN rR: the run's segment of rank R (another run's segments may lie beside it, listed after it)
  local f
  for f in /dev/shm/keel-snap-*-"$2"; do grep -q -a -- "$(realpath "$1")" "$f" 2>/dev/null && echo "$f"; done
  return 0
}
damaged() {
  local run=$1 every=$2 sup p0 p1 seg0 seg1 steps size rc res got
  "$KEEL_BIN" train "$CFG" "${args[@]}" --set checkpoint.every_steps="$every" --run-dir "$run" >"$run.out" 2>&1 &
  sup=$!
  p1=$(wait_train_step "$run" 1 35) p0=$(wait_train_step "$run" 0 35)
  seg0=$(segment_of "$run" r0) seg1=$(segment_of "$run" r1)
  [ -n "$seg0" ] && [ -n "$seg1" ] || fail "no segment of rank 0 or 1"
  # Both ranks frozen holding the same two committed steps, so the relaunch tries both of rank 1's and finds
  # each damaged. A slot caught mid-copy is skipped as unfinished, not damaged, and a step only one rank holds
  # is never tried (each copies its snapshot beside the next step, so one rank can be a step ahead).
  for _ in $(seq 1 200); do
    kill -STOP "$p1" "$p0"
    steps=$(slot_steps "$seg1")
    [ -n "$steps" ] && [ "$steps" = "$(slot_steps "$seg0")" ] && break
    kill -CONT "$p1" "$p0"; steps=""
    sleep 0.02
  done
  [ -n "$steps" ] || fail "ranks 0 and 1 were never both stopped holding the same two committed steps"
  size=$(stat -c %s "$seg1")
  flip "$seg1" $(( 4096 + 100 )); flip "$seg1" $(( 4096 + (size - 4096) / 2 + 100 ))
  kill -9 "$p1" "$p0"
  rc=0; wait "$sup" || rc=$?
  [ "$rc" = 0 ] || { tail -5 "$run.out"; fail "exit $rc after a damaged snapshot, want 0"; }
  got=$(grep '"event":"snapshot_damaged"' "$run/events.jsonl" | sed -n 's/.*"step":\([0-9]*\),.*/\1/p' | tr '\n' ' ')
  [ "$got" = "$steps" ] || fail "want snapshot_damaged for steps $steps (both slots), newest first: $(grep snapshot_damaged "$run/events.jsonl")"
  grep '"snapshot_damaged"' "$run/events.jsonl" | grep -q "rank 1: .*keel-snap-.*-r1: the snapshot of step [0-9]* fails its checksum" ||
    fail "the damage is not named: $(grep snapshot_damaged "$run/events.jsonl" | head -1)"
  res=$(grep '"event":"resumed"' "$run/events.jsonl" || true)
  if [ "$every" -gt 0 ]; then
    echo "$res" | grep -q '"step":30,.*from .*checkpoints/step_00000030' || fail "did not fall back to the checkpoint at step 30: $res"
  else # nothing on disk: a fresh start, AdamW's state at zero again on every rank
    [ -z "$res" ] && [ "$(json "$run/summary.json" "j['recovery_s']['split'][0]['source']")" = none ] ||
      fail "want a fresh start with no checkpoint: $res"
  fi
  got=$(json "$run/summary.json" "j['params_xxh3']")
  [ "$got" = "$want" ] || fail "params_xxh3 $got after the fallback (checkpoints every $every), undisturbed run $want"
  [ -z "$(segments "$run")" ] || fail "segments left: $(segments "$run")"
}
damaged "$TMP/bad" 10
pass "flipped bytes in rank 1's snapshots: both caught, every rank resumed from the checkpoint at step 30, same params_xxh3"
damaged "$TMP/nodisk" 0
pass "the same with no checkpoint: every rank started over (rank 0's good snapshot discarded), same params_xxh3"

# (3) given up: a crash loop (rank 1 kills itself as it begins step 6, every launch)
rc=0
KEEL_FAULT=kill@6:1 "$KEEL_BIN" train "$CFG" "${args[@]}" --set resilience.crash_loop=2 --run-dir "$TMP/loop" \
  >"$TMP/loop.out" 2>&1 || rc=$?
[ "$rc" = 1 ] || { tail -5 "$TMP/loop.out"; fail "exit $rc for a crash loop, want 1"; }
grep '"event":"resumed"' "$TMP/loop/events.jsonl" | grep -Eq '"step":[45],.*from memory' ||
  fail "the relaunch did not resume from the snapshot of step 4 or 5: $(grep resumed "$TMP/loop/events.jsonl")"
[ -z "$(segments "$TMP/loop")" ] || fail "segments left after the run was given up: $(segments "$TMP/loop")"
pass "a run given up (crash loop in step 6, the relaunch from memory) leaves no segment in /dev/shm"

# (4) a node lost with its memory
export KEEL_SIMULATED_NODES=2
"$KEEL_BIN" train "$CFG" "${args[@]}" --nproc 4 --run-dir "$TMP/ref4" >"$TMP/ref4.out" 2>&1 || { cat "$TMP/ref4.out"; fail "4-rank reference run"; }
want4=$(json "$TMP/ref4/summary.json" "j['params_xxh3']")
[ "$(json "$TMP/ref4/summary.json" "[r['snapshot_bytes'] > 0 for r in j['ranks']]")" = "[True, True, True, True]" ] ||
  fail "no snapshot bytes in the 4-rank summary"
"$KEEL_BIN" train "$CFG" "${args[@]}" --nproc 4 --run-dir "$TMP/node" >"$TMP/node.out" 2>&1 &
sup=$!
p3=$(wait_train_step "$TMP/node" 3 $(( 20 + RANDOM % 10 ))) p2=$(hb pid "$TMP/node" 2)
kill -STOP "$p2" "$p3"
gone=""
for f in $(segments "$TMP/node"); do
  case $f in *-r2|*-r3|*-b0|*-b1) rm "$f"; gone="$gone ${f##*-}";; esac # node 1's: its ranks' own and the replicas it keeps
done
[ "$gone" = " b0 b1 r2 r3" ] || fail "node 1's segments: got$gone, want b0 b1 r2 r3"
kill -9 "$p2" "$p3"
rc=0; wait "$sup" || rc=$?
[ "$rc" = 0 ] || { tail -5 "$TMP/node.out"; fail "exit $rc after a node loss, want 0"; }
res=$(grep '"event":"resumed"' "$TMP/node/events.jsonl")
echo "$res" | grep -q "from memory (the snapshot of step [0-9]*) on 4 rank(s), 2 of them from their buddies' replicas" ||
  fail "ranks 2 and 3 did not resume from their buddies: $res"
got=$(json "$TMP/node/summary.json" "j['params_xxh3']")
[ "$got" = "$want4" ] || fail "params_xxh3 $got after the node loss, undisturbed 4-rank run $want4"
[ -z "$(segments "$TMP/node")" ] || fail "segments left: $(segments "$TMP/node")"
pass "node 1 lost with its memory: $(echo "$res" | grep -o 'from memory[^;]*'), same params_xxh3 $want4"
