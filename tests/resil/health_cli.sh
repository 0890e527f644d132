#!/usr/bin/env bash
# keel health: every check reports, JSON is well-formed, real failures (an
# impossible GEMM floor, a read-only or too small checkpoint directory, a job
# that needs more memory than there is, an NVML that does not load) exit 1,
# bad arguments exit 2; the gpu check reads two GPUs through the NVML stand-in.
source "$KEEL_SRC/tests/lib.sh"
mpi_env
trap 'kill_leftovers; umount "$TMP/ro" "$TMP/small" 2>/dev/null || true; rm -rf "$TMP"' EXIT
"$KEEL_BIN" health --json --dir "$TMP/ck" >"$TMP/h.json" || fail "healthy machine: exit $?"
python3 - "$TMP/h.json" <<'PY' || fail "JSON report"
import json, sys
r = json.load(open(sys.argv[1]))
by = {c["name"]: c for c in r["checks"]}
assert r["ok"] is True and set(by) == {"gemm", "memory", "checkpoint_dir", "mpi", "gpu"}, r
assert by["gemm"]["status"] == "pass" and by["gemm"]["value"] > by["gemm"]["limit"] > 0, by["gemm"]
assert by["mpi"]["status"] == "pass" and "exact" in by["mpi"]["detail"] and by["mpi"]["value"] > 0, by["mpi"]
assert by["gpu"]["status"] == "skipped" and "no GPU" in by["gpu"]["detail"], by["gpu"]
assert by["checkpoint_dir"]["status"] == "pass", by["checkpoint_dir"]
PY
pass "healthy: $(python3 -c "import json,sys; print('; '.join(c['name']+' '+c['status'] for c in json.load(open(sys.argv[1]))['checks']))" "$TMP/h.json")"

# the gpu check reads NVML: here through the stand-in library of two GPUs,
# without its XID event (tests/resil/health_gpu.sh tests the limits)
printf 'xid_events=\n' >"$TMP/nvml-state"
KEEL_NVML_LIB="$KEEL_NVML_STAND_IN" KEEL_NVML_STAND_IN_STATE="$TMP/nvml-state" \
  "$KEEL_BIN" health --checks gpu --gpu-baseline "$TMP/gpu-baseline.json" >"$TMP/gpu" 2>&1 || fail "gpu check: $(cat "$TMP/gpu")"
grep -Eq 'gpu +pass +2 GPU\(s\) within limits: gpu0 61 C, SM 1980/1980 MHz, 87% busy; gpu1 38 C' "$TMP/gpu" ||
  fail "gpu check: $(cat "$TMP/gpu")"
pass "gpu check through NVML: $(grep -o '2 GPU.*busy;' "$TMP/gpu" | head -1)"

expect_fail() { # name pattern cmd...: exit 1 and the report shows pattern
  local name=$1 pattern=$2; shift 2
  local rc=0
  "$@" >"$TMP/out" 2>&1 || rc=$?
  [ "$rc" = 1 ] || fail "$name: exit $rc, want 1: $(cat "$TMP/out")"
  grep -Eq "$pattern" "$TMP/out" || fail "$name: report lacks /$pattern/: $(cat "$TMP/out")"
  pass "$name: $(grep -E "$pattern" "$TMP/out" | head -1 | sed 's/^ *//')"
}
expect_fail "impossible GEMM floor" "gemm +FAIL +one core does .* below the floor" "$KEEL_BIN" health --checks gemm --gemm-floor 1e9
# a busy machine is not a sick one: with two busy loops on every core the GEMM check measures what
# the core does while it runs, as on the quiet machine (before, it read a fraction and failed the node)
gflops() { "$KEEL_BIN" health --json --checks gemm | python3 -c 'import json,sys; print([c for c in json.load(sys.stdin)["checks"] if c["name"] == "gemm"][0]["value"])'; }
quiet=$(gflops)
busy=()
for _ in $(seq 1 $(( 2 * $(nproc) ))); do bash -c 'while :; do :; done' "$TMP/busy" & busy+=("$!"); done
loaded=$(gflops)
kill "${busy[@]}"; wait "${busy[@]}" 2>/dev/null || true
python3 -c "import sys; q, l = $quiet, $loaded; sys.exit(0 if l >= 0.5 * q else 1)" ||
  fail "gemm check on a busy machine: $loaded GFLOP/s against $quiet quiet"
pass "gemm check: $quiet GFLOP/s quiet, $loaded with $(( 2 * $(nproc) )) busy loops beside it"
mkdir -p "$TMP/ro" "$TMP/small"
mount -t tmpfs -o ro,size=1m tmpfs "$TMP/ro" || fail "cannot mount a tmpfs (needs root)"
expect_fail "read-only checkpoint directory" "checkpoint_dir +FAIL +.*not writable" "$KEEL_BIN" health --checks checkpoint_dir --dir "$TMP/ro"
mount -t tmpfs -o size=1m tmpfs "$TMP/small"
expect_fail "no room for two checkpoints" "checkpoint_dir +FAIL +.*free, two checkpoints need" \
  "$KEEL_BIN" health --checks checkpoint_dir --dir "$TMP/small" --config "$KEEL_SRC/configs/tiny.json"
expect_fail "not enough memory" "memory +FAIL +.*GiB available, the job's 4096 rank" \
  "$KEEL_BIN" health --checks memory --config "$KEEL_SRC/configs/small.json" --nproc 4096
"$KEEL_BIN" health --checks gemm --json | python3 -c "import json,sys; r=json.load(sys.stdin); assert r['ok'] and len(r['checks'])==1" \
  || fail "--checks gemm --json"
KEEL_NVML_LIB=/nonexistent/libnvidia-ml.so.1 expect_fail "NVML named but not loadable" \
  "gpu +FAIL +NVML does not answer: KEEL_NVML_LIB=/nonexistent" "$KEEL_BIN" health --checks gpu
expect_input_error "unknown check" "unknown check 'foo'" "$KEEL_BIN" health --checks gemm,foo
expect_input_error "bad --nproc" "nproc '0': expected" "$KEEL_BIN" health --nproc 0
expect_input_error "bad --gemm-floor" "gemm-floor 'x': expected" "$KEEL_BIN" health --gemm-floor x
expect_input_error "bad config" "nope.json: cannot open config" "$KEEL_BIN" health --config "$TMP/nope.json"
