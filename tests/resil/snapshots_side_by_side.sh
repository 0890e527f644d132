#!/usr/bin/env bash
# Two runs on one machine never touch each other's in-memory snapshots: while
# run A trains under its supervisor (segments in /dev/shm), run B starts and
# ends beside it — once in the same mount namespace, once in one where A's
# run directory cannot be seen (a private mount over this test's directory,
# as a `keel cluster` node has its own /tmp). Each supervisor sweeps /dev/shm
# for stale segments as it starts and removes its own as it ends; A's
# segments must be the same files (inodes) afterwards, and B's gone. Before
# segments were judged by their creator's mount namespace, B in its own
# namespace took A's for stale (their run directory "gone") and removed them.
source "$KEEL_SRC/tests/lib.sh"
mpi_env
[ "$(id -u)" = 0 ] || fail "needs root (unshare -m for the second mount namespace)"
trap 'kill_leftovers; rm -f $(segments "$TMP/a"); rm -rf "$TMP"' EXIT
CFG=$KEEL_SRC/tests/train/micro.json
seg_inodes() { for f in $(segments "$1"); do stat -c %i "$f"; done | sort | tr '\n' ' '; }

"$KEEL_BIN" train "$CFG" --nproc 2 --set train.steps=1000000 --set train.threads=1 --run-dir "$TMP/a" \
  >"$TMP/a.out" 2>&1 &
a=$!
wait_train_step "$TMP/a" 0 3 >/dev/null
wait_train_step "$TMP/a" 1 3 >/dev/null
before=$(seg_inodes "$TMP/a")
[ "$(wc -w <<<"$before")" = 2 ] || fail "run A: want 2 segments (one a rank), got: $(segments "$TMP/a")"

# B beside A, same namespace
"$KEEL_BIN" train "$CFG" --nproc 2 --set train.steps=3 --set train.threads=1 --run-dir "$TMP/b" >"$TMP/b.out" 2>&1 ||
  { tail -5 "$TMP/b.out"; fail "run B (same namespace)"; }
[ "$(seg_inodes "$TMP/a")" = "$before" ] || fail "run B removed or replaced run A's segments: $before -> $(seg_inodes "$TMP/a")"
[ -z "$(segments "$TMP/b")" ] || fail "run B left segments: $(segments "$TMP/b")"
pass "a second run in the same namespace left run A's segments alone"

# B where A's run directory cannot be seen: a private tmpfs over this test's directory
unshare -m bash -c '
  mount -t tmpfs keel-test "$1" && mkdir "$1/c" &&
  exec "$2" train "$3" --nproc 2 --set train.steps=3 --set train.threads=1 --run-dir "$1/c"' \
  _ "$TMP" "$KEEL_BIN" "$CFG" >"$TMP/c.out" 2>&1 || { tail -5 "$TMP/c.out"; fail "run C (private mount namespace)"; }
[ "$(seg_inodes "$TMP/a")" = "$before" ] ||
  fail "a run in another mount namespace removed run A's segments: $before -> $(seg_inodes "$TMP/a"): $(grep -i stale "$TMP/c.out")"
pass "a run that cannot see run A's directory left its segments alone"

# A still trains on them
step=$(hb step "$TMP/a" 0)
wait_train_step "$TMP/a" 0 $((step + 2)) >/dev/null
[ "$(seg_inodes "$TMP/a")" = "$before" ] || fail "run A's segments changed while it trained"
pass "run A trained on past step $((step + 2)) with its own segments throughout"
kill -TERM "$a"
wait "$a" || true
[ -z "$(segments "$TMP/a")" ] || fail "run A, stopped, left segments: $(segments "$TMP/a")"
