#!/usr/bin/env bash
# Resume from sharded checkpoints:
# - a rank killed with SIGKILL while the 2-rank run writes a checkpoint (async)
#   ends the run; the next `keel train` with the same command cleans the .tmp,
#   resumes from the previous committed checkpoint and finishes with the
#   uninterrupted run's params_xxh3 and losses, bit for bit;
# - resharded resumes from a real mid-run checkpoint (step 4 of 12) — 2 -> 1,
#   2 -> 3 and 4 -> 2 ranks, full_shard -> no_shard — keep the global batch
#   (accumulation is adjusted when needed) and follow the uninterrupted run
#   within 1e-5 relative loss; so do resumes across fsdp.unit (a checkpoint
#   saved with block units read into matrix units and the reverse);
# - resuming with a different model is refused with one line naming the key.
source "$KEEL_SRC/tests/lib.sh"
mpi_env

# ---- kill -9 of a rank in the middle of a save, same world size ----------------
TINY=$KEEL_SRC/configs/tiny.json
# restarts off: this test resumes by hand (tests/resil/ covers the supervisor's own resume)
args=(--set train.steps=6 --set checkpoint.every_steps=2 --set checkpoint.keep_last=0
      --set train.micro_batch_size=2 --set train.threads=1 --set resilience.max_restarts=0 --nproc 2)
"$KEEL_BIN" train "$TINY" "${args[@]}" --run-dir "$TMP/ref" >"$TMP/out" 2>&1 || { cat "$TMP/out"; fail "reference run"; }
for attempt in 1 2 3; do
  rm -rf "$TMP/killed"
  "$KEEL_BIN" train "$TINY" "${args[@]}" --run-dir "$TMP/killed" >"$TMP/killed.log" 2>&1 &
  launcher=$!
  # the second save (step 4) is in flight once its .tmp appears: kill rank 1 then
  for _ in $(seq 1 6000); do
    [ -d "$TMP/killed/checkpoints/step_00000004.tmp" ] && break
    kill -0 "$launcher" 2>/dev/null || break
    sleep 0.005
  done
  pkill -9 -f "keel worker $TMP/killed" -n || true
  rc=0; wait "$launcher" || rc=$?
  [ -d "$TMP/killed/checkpoints/step_00000004.tmp" ] && [ ! -d "$TMP/killed/checkpoints/step_00000004" ] && break
  echo "attempt $attempt: the kill missed the save window (rc $rc); again"
done
[ -d "$TMP/killed/checkpoints/step_00000004.tmp" ] || fail "could not kill a rank in the middle of a save"
[ "$rc" != 0 ] || fail "keel train exited 0 after a rank was killed"
[ "$(cat "$TMP/killed/checkpoints/LATEST")" = step_00000002 ] || fail "LATEST moved to a half-written save"
pass "rank killed mid-save: keel train exit $rc, LATEST still step_00000002, step_00000004.tmp left"
"$KEEL_BIN" train "$TINY" "${args[@]}" --run-dir "$TMP/killed" >"$TMP/out" 2>&1 || { cat "$TMP/out"; fail "resume"; }
grep -q "resuming from .*step_00000002" "$TMP/out" || { cat "$TMP/out"; fail "did not resume from step 2"; }
[ ! -e "$TMP/killed/checkpoints/step_00000004.tmp" ] || fail "the .tmp of the killed save was not cleaned"
python3 - "$TMP/ref" "$TMP/killed" <<'PY' || fail "resumed run differs from the uninterrupted one"
import json, sys
ref, run = sys.argv[1:]
a = {r["step"]: r["loss"] for r in map(json.loads, open(f"{ref}/metrics.jsonl"))}
b = {r["step"]: r["loss"] for r in map(json.loads, open(f"{run}/metrics.jsonl"))}  # later lines win
assert a == b, (a, b)
x, y = (json.load(open(f"{d}/summary.json"))["params_xxh3"] for d in (ref, run))
assert x == y, (x, y)
ev = [json.loads(l)["event"] for l in open(f"{run}/events.jsonl")]
assert "resumed" in ev, ev
print(f"ok   resumed at the same world size: losses and params_xxh3 {y} bit-identical")
PY

# ---- resharded resumes ---------------------------------------------------------------
CFG=$KEEL_SRC/tests/train/micro.json
common=(--set train.steps=12 --set train.threads=1 --set checkpoint.every_steps=4 --set checkpoint.keep_last=0)
run() { # NAME W B STRATEGY [RUN_DIR [UNIT]]
  timeout 300 "$KEEL_BIN" train "$CFG" "${common[@]}" --nproc "$2" --set train.micro_batch_size="$3" \
    --set fsdp.strategy="$4" --set fsdp.unit="${6:-block}" --run-dir "${5:-$TMP/$1}" >"$TMP/out" 2>&1 ||
    { cat "$TMP/out"; fail "$1"; }
}
run ref2 2 6 full_shard
run ref4 4 3 full_shard
run ref2m 2 6 full_shard "$TMP/ref2m" matrix
# from step 4 of a reference: copy the run as it stood after that commit
from_step4() { # SRC DST
  mkdir -p "$2/checkpoints"
  cp "$1/config.json" "$2/"
  cp -r "$1/checkpoints/step_00000004" "$2/checkpoints/"
  echo step_00000004 >"$2/checkpoints/LATEST"
}
for spec in ref2:1:12:full_shard ref2:3:4:full_shard ref4:2:6:full_shard ref2:2:6:no_shard \
            ref2:3:4:full_shard:matrix ref2m:2:6:full_shard:block ref2:1:6:full_shard; do
  IFS=: read -r src W B strategy unit <<<"$spec"
  dst="$TMP/$src-to-$W-$B-$strategy-${unit:-block}"
  from_step4 "$TMP/$src" "$dst"
  run "$spec" "$W" "$B" "$strategy" "$dst" "${unit:-block}"
  grep -q "resuming from .*step_00000004" "$TMP/out" || { cat "$TMP/out"; fail "$spec did not resume from step 4"; }
  python3 - "$TMP/$src" "$dst" "$spec" <<'PY' || fail "$spec differs from the uninterrupted run"
import json, sys
ref, run, spec = sys.argv[1:]
a = {r["step"]: r["loss"] for r in map(json.loads, open(f"{ref}/metrics.jsonl"))}
b = {r["step"]: r["loss"] for r in map(json.loads, open(f"{run}/metrics.jsonl"))}
assert sorted(b) == list(range(5, 13)), sorted(b)
worst = max(abs(a[s] - b[s]) / a[s] for s in b)
print(f"ok   resharded {spec} (source:ranks:micro-batch:strategy[:unit]) from step 4: steps 5-12 loss rel {worst:.1e}")
assert worst <= 1e-5, worst
PY
done
grep -q "grad_accum_steps 2 (was 1)" "$TMP/out" || fail "the last resume did not keep the global batch by accumulation"
pass "1 rank x micro-batch 6 resumed a 12-sequence global batch with grad_accum_steps 2"

# ---- a different model cannot resume the run --------------------------------------
expect_input_error "resume with another model" "ref2: this run directory holds a run whose model.dim differs" \
  "$KEEL_BIN" train "$CFG" "${common[@]}" --set model.dim=96 --run-dir "$TMP/ref2"
