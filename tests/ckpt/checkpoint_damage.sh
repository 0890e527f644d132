#!/usr/bin/env bash
# Damaged checkpoints and failing saves never cost committed work:
# - a flipped byte, a truncated shard and a deleted manifest in the newest
#   checkpoint are each caught by `keel ckpt verify` (exit 1) and at resume
#   (a log line and a checkpoint_damaged event); the run resumes from the
#   previous checkpoint and ends bit-identical to the uninterrupted run;
# - a save that hits a file-size limit (ulimit -f) or a full filesystem (a
#   small tmpfs) is an error line and a checkpoint_failed event, the .tmp is
#   removed, training finishes, and the older checkpoints still verify;
# - checkpoint.keep_last keeps that many committed checkpoints, and
#   checkpoint.every_seconds saves by time.
source "$KEEL_SRC/tests/lib.sh"
CFG=$KEEL_SRC/tests/train/micro.json
common=(--set train.steps=12 --set checkpoint.every_steps=4 --set checkpoint.keep_last=0)
"$KEEL_BIN" train "$CFG" "${common[@]}" --run-dir "$TMP/ref" >"$TMP/out" 2>&1 || { cat "$TMP/out"; fail "reference"; }
"$KEEL_BIN" ckpt verify "$TMP/ref" >"$TMP/verify" || { cat "$TMP/verify"; fail "a good run does not verify"; }
[ "$(grep -c '^ok ' "$TMP/verify")" = 3 ] || fail "want 3 verified checkpoints: $(cat "$TMP/verify")"
pass "keel ckpt verify: 3 checkpoints ok"
"$KEEL_BIN" ckpt list "$TMP/ref" >"$TMP/list"
grep -q "^step_00000012 .*LATEST, committed" "$TMP/list" && [ "$(grep -c committed "$TMP/list")" = 3 ] \
  || fail "keel ckpt list: $(cat "$TMP/list")"
pass "keel ckpt list: $(grep -c committed "$TMP/list") committed, LATEST step_00000012"

# A run as it stood after step 8's commit, with step 8 damaged by $2.
damaged_run() { # DIR HOW
  mkdir -p "$1/checkpoints"
  cp "$TMP/ref/config.json" "$1/"
  cp -r "$TMP/ref/checkpoints/step_00000004" "$TMP/ref/checkpoints/step_00000008" "$1/checkpoints/"
  echo step_00000008 >"$1/checkpoints/LATEST"
  local shard="$1/checkpoints/step_00000008/shard-00000-of-00001.bin"
  case $2 in
    flip) python3 -c "import sys; f=open(sys.argv[1],'r+b'); f.seek(5000); b=f.read(1); f.seek(5000); f.write(bytes([b[0]^1]))" "$shard" ;;
    truncate) truncate -s $(( $(stat -c %s "$shard") / 2 )) "$shard" ;;
    manifest) rm "$1/checkpoints/step_00000008/manifest.json" ;;
  esac
}
for how in flip truncate manifest; do
  d="$TMP/$how"
  damaged_run "$d" "$how"
  rc=0; "$KEEL_BIN" ckpt verify "$d/checkpoints/step_00000008" >"$TMP/verify" 2>&1 || rc=$?
  [ "$rc" = 1 ] || fail "$how: keel ckpt verify exit $rc, want 1: $(cat "$TMP/verify")"
  "$KEEL_BIN" train "$CFG" "${common[@]}" --run-dir "$d" >"$TMP/out" 2>&1 || { cat "$TMP/out"; fail "$how: resume"; }
  grep -q "checkpoint .*step_00000008 is not usable" "$TMP/out" || { cat "$TMP/out"; fail "$how: no log line"; }
  grep -q "resuming from .*step_00000004" "$TMP/out" || { cat "$TMP/out"; fail "$how: did not fall back"; }
  grep -q '"event":"checkpoint_damaged","step":8' "$d/events.jsonl" || fail "$how: no checkpoint_damaged event"
  [ "$(json "$d/summary.json" 'j["params_xxh3"]')" = "$(json "$TMP/ref/summary.json" 'j["params_xxh3"]')" ] \
    || fail "$how: the resumed run differs from the uninterrupted one"
  pass "$how: verify says $(head -c 60 "$TMP/verify")...; resumed from step 4, params bit-identical"
done

# ---- a save that cannot be written ---------------------------------------------------
check_failed_saves() { # NAME DIR LOG
  grep -q "checkpoint write failed" "$3" || { cat "$3"; fail "$1: no error line"; }
  grep -q '"event":"checkpoint_failed","step":12' "$2/events.jsonl" || fail "$1: no checkpoint_failed event"
  ls -d "$2"/checkpoints/*.tmp >/dev/null 2>&1 && fail "$1: a .tmp was left"
  [ "$(json "$2/summary.json" 'j["status"]')" = completed ] || fail "$1: the run did not finish"
  "$KEEL_BIN" ckpt verify "$2" >"$TMP/verify" || { cat "$TMP/verify"; fail "$1: older checkpoints damaged"; }
  [ "$(cat "$2/checkpoints/LATEST")" = step_00000008 ] || fail "$1: LATEST moved"
  pass "$1: '$(grep -o 'checkpoint write failed.*' "$3" | head -1 | cut -c1-90)...'; steps 4, 8 still verify"
}
# file-size limit: the run's first 8 steps are saved, then shard files may not exceed 1 MB
damaged_run "$TMP/fsize" none
shard_kb=$(( $(stat -c %s "$TMP/ref/checkpoints/step_00000004/shard-00000-of-00001.bin") / 1024 ))
[ "$shard_kb" -gt 1024 ] || fail "the micro model's shard ($shard_kb kB) is too small for a 1 MB limit"
( ulimit -f 1024; "$KEEL_BIN" train "$CFG" "${common[@]}" --set train.steps=16 --run-dir "$TMP/fsize" ) \
  >"$TMP/fsize.log" 2>&1 || { cat "$TMP/fsize.log"; fail "file-size limit: the run failed"; }
check_failed_saves "file-size limit" "$TMP/fsize" "$TMP/fsize.log"

# full filesystem: a tmpfs with room for two checkpoints and the run's other files
mnt="$TMP/mnt"
mkdir -p "$mnt"
size_kb=$(( shard_kb * 2 + shard_kb / 2 + 256 ))  # two checkpoints + weights.bin (1/3 shard), not three
as_root=(); [ "$(id -u)" = 0 ] || as_root=(unshare --user --map-root-user --mount)
"${as_root[@]}" bash -c '
  mount -t tmpfs -o size='"$size_kb"'k tmpfs "$1" || { echo "FAIL: cannot mount a tmpfs"; exit 3; }
  mkdir -p "$1/run/checkpoints"
  cp "$2/config.json" "$1/run/"
  cp -r "$2/checkpoints/step_00000004" "$2/checkpoints/step_00000008" "$1/run/checkpoints/"
  echo step_00000008 > "$1/run/checkpoints/LATEST"
  "$3" train "$4" '"${common[*]}"' --set train.steps=16 --run-dir "$1/run" > "$5" 2>&1; rc=$?
  cp -r "$1/run" "$6"; umount "$1"; exit $rc' _ "$mnt" "$TMP/ref" "$KEEL_BIN" "$CFG" "$TMP/full.log" "$TMP/full" \
  || { cat "$TMP/full.log"; fail "full filesystem: the run failed"; }
grep -q "No space left on device" "$TMP/full.log" || { cat "$TMP/full.log"; fail "full filesystem: no ENOSPC"; }
check_failed_saves "full filesystem" "$TMP/full" "$TMP/full.log"

# ---- retention ------------------------------------------------------------------------
"$KEEL_BIN" train "$CFG" --set train.steps=12 --set checkpoint.every_steps=2 --set checkpoint.keep_last=2 \
  --run-dir "$TMP/keep" >/dev/null 2>&1 || fail "retention run"
[ "$(ls "$TMP/keep/checkpoints" | tr '\n' ' ')" = "LATEST step_00000010 step_00000012 " ] \
  || fail "keep_last 2 left: $(ls "$TMP/keep/checkpoints")"
pass "checkpoint.keep_last 2: $(ls "$TMP/keep/checkpoints" | tr '\n' ' ')"
"$KEEL_BIN" train "$CFG" --set train.steps=5 --set checkpoint.every_seconds=0.001 --set checkpoint.keep_last=0 \
  --run-dir "$TMP/seconds" >/dev/null 2>&1 || fail "every_seconds run"
[ "$(ls -d "$TMP/seconds"/checkpoints/step_* | wc -l)" = 5 ] || fail "every_seconds: $(ls "$TMP/seconds/checkpoints")"
pass "checkpoint.every_seconds 0.001: a checkpoint after each of 5 steps"
