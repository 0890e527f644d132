#!/usr/bin/env bash
# summary.json's peak_rss_bytes is each rank's real peak at exit: at least the
# VmHWM read from /proc while the rank ran, up to its goodbye heartbeat (saving
# the final weights included), on a 134M-parameter model over 2 ranks — where a
# whole-model gather at the end would add half a gigabyte after the number was
# taken (that gather is +30%; the check allows 5% because under ASan freeing
# memory at the end touches its shadow pages). No rank holds the whole model
# at any time: each stays within 384 MiB (libraries, MPI, data, ASan's shadow)
# of the per-rank plan of `--dry-run --nproc 2`, while one fp32 copy of the
# model is 512 MiB.
source "$KEEL_SRC/tests/lib.sh"
mpi_env
args=(--set train.steps=2 --set model.max_seq_len=64 --set train.threads=1 --set checkpoint.every_steps=0)
"$KEEL_BIN" train "$KEEL_SRC/configs/small.json" "${args[@]}" --nproc 2 --run-dir "$TMP/run" >"$TMP/out" 2>&1 &
sup=$!
declare -A seen
while kill -0 "$sup" 2>/dev/null; do
  for r in 0 1; do
    pid=$(hb pid "$TMP/run" "$r")
    [ -n "$pid" ] || continue
    kb=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
    # a reading counts if the rank had not yet said goodbye after it was taken
    # (what runs after that — MPI_Finalize, LeakSanitizer's exit scan — is not training)
    [ -n "$kb" ] && [ "$(hb phase "$TMP/run" "$r")" != exit ] && seen[$r]=$kb
  done
  sleep 0.02
done
wait "$sup" || { cat "$TMP/out"; fail "run failed"; }
[ -n "${seen[0]:-}" ] && [ -n "${seen[1]:-}" ] || fail "never saw the ranks' VmHWM"
"$KEEL_BIN" train "$KEEL_SRC/configs/small.json" "${args[@]}" --dry-run --nproc 2 >"$TMP/plan"
python3 - "$TMP/run/summary.json" "${seen[0]}" "${seen[1]}" "$TMP/plan" <<'PY' || fail "peak_rss_bytes"
import json, re, sys
s = json.load(open(sys.argv[1]))
sampled = [int(sys.argv[2]) * 1024, int(sys.argv[3]) * 1024]
plan = float(re.search(r"total +([0-9.]+) GiB", open(sys.argv[4]).read()).group(1)) * 2**30
for r, o in enumerate(s["ranks"]):
    rep = o["peak_rss_bytes"]
    print(f"ok   rank {r}: summary peak {rep / 2**20:.0f} MiB >= 95% of the last VmHWM sampled {sampled[r] / 2**20:.0f} MiB; "
          f"plan {plan / 2**20:.0f} MiB + 384")
    assert rep >= 0.95 * sampled[r], (r, rep, sampled[r])
    assert rep < plan + 384 * 2**20, (r, rep, plan)
PY
pass "summary.json's peak is the ranks' real peak, and no rank holds the whole model"
