#!/usr/bin/env bash
# train.profile_steps: the backend's calls of the steps after the launch's
# first, timed one by one, in RUN/profile.json and a table on the console.
# The counts are the model's own (7 GEMMs a block and the head, per
# micro-batch; attention once a block, again for each recomputed block),
# the times add up to the steps', the profiled steps are marked in the metrics
# and left out of the median, and profiling changes no parameter. FSDP's
# collectives and bf16 GEMMs show under --nproc 2. Bad values are refused.
source "$KEEL_SRC/tests/lib.sh"
mpi_env
trap 'kill_leftovers; rm -rf "$TMP"' EXIT
CFG=$KEEL_SRC/tests/train/micro.json
L=$(json "$CFG" 'j["model"]["n_layers"]')
train() { # DIR ARGS...
  local dir=$1; shift
  "$KEEL_BIN" train "$CFG" --set train.steps=5 "$@" --run-dir "$dir" >"$dir.log" 2>&1 ||
    { tail -20 "$dir.log"; fail "$dir: exit $?"; }
}
calls() { json "$1/profile.json" "sum(o['calls'] for o in j['ops'] if o['op'] == '$2')"; }
want_calls() { # NAME DIR OP N
  local got
  got=$(calls "$2" "$3")
  [ "$got" = "$4" ] || fail "$1: $3 called $got times in the profile, want $4"
}

# ---- one process, fp32, 2 micro-batches a step: steps 2 and 3 of 5 ----
train "$TMP/plain" --set train.grad_accum_steps=2
train "$TMP/prof" --set train.grad_accum_steps=2 --set train.profile_steps=2
P=$TMP/prof
[ "$(json "$P/profile.json" '(j["first_step"], j["steps"], j["device"], j["calls_waited_for"])')" = "(2, 2, 'cpu', False)" ] ||
  fail "profile.json: first_step, steps, device, calls_waited_for: $(json "$P/profile.json" '(j["first_step"], j["steps"], j["device"], j["calls_waited_for"])')"
gemms=$(( 2 * 2 * (7 * L + 1) )) # 2 steps x 2 micro-batches x (7 per block + the head)
want_calls "fp32" "$P" matmul_forward $gemms
want_calls "fp32" "$P" matmul_backward $gemms
want_calls "fp32" "$P" attention_forward $(( 2 * 2 * L ))
want_calls "fp32" "$P" attention_backward $(( 2 * 2 * L ))
want_calls "fp32" "$P" rmsnorm_forward $(( 2 * 2 * (2 * L + 1) ))
pass "fp32: $gemms GEMMs forward and backward, $(( 4 * L )) attention calls each way, as the model makes them"
# the times: every op's within the steps', and the parts add up to the whole
python3 - "$P/profile.json" "$P/metrics.jsonl" <<'PY' || fail "profile.json's times (above)"
import json, sys
p = json.load(open(sys.argv[1]))
m = {r["step"]: r for r in map(json.loads, open(sys.argv[2]))}
steps = m[2]["step_s"] + m[3]["step_s"]
ops = sum(o["seconds"] for o in p["ops"])
assert abs(p["step_s"] - steps) <= 1e-6 * steps, (p["step_s"], steps)
assert abs(p["in_calls_s"] - ops) <= 1e-9 + 1e-9 * ops, (p["in_calls_s"], ops)
assert 0 < ops <= p["step_s"] and abs(p["in_calls_s"] + p["outside_calls_s"] - p["step_s"]) < 1e-9, p
assert abs(sum(o["share"] for o in p["ops"]) - ops / p["step_s"]) < 1e-9
assert [o["seconds"] for o in p["ops"]] == sorted((o["seconds"] for o in p["ops"]), reverse=True), "most time first"
for o in p["ops"]:
    gemm = o["op"].startswith(("matmul", "attention"))
    assert ("flops" in o) == gemm and (not gemm or o["tflops_per_s"] > 0), o
print(f"ok   times: {ops:.3f} s in {len(p['ops'])} kinds of call, of {p['step_s']:.3f} s")
PY
# the metrics: steps 2 and 3 marked, and the median of the others
python3 - "$P/metrics.jsonl" "$P/summary.json" <<'PY' || fail "metrics and summary (above)"
import json, statistics, sys
rows = list(map(json.loads, open(sys.argv[1])))
assert [r["step"] for r in rows if r.get("profiled")] == [2, 3], rows
s = json.load(open(sys.argv[2]))
others = sorted(r["tokens_per_s"] for r in rows if not r.get("profiled"))
assert s["tokens_per_s_median"] == others[len(others) // 2], (s["tokens_per_s_median"], others)
print("ok   metrics: steps 2 and 3 profiled, tokens_per_s_median over steps 1, 4, 5")
PY
grep -q '^profile of steps 2-3 (rank 0, cpu): ' "$P.log" || fail "no table on the console: $(cat "$P.log")"
grep -Eq '^  matmul_backward +[0-9]+ ' "$P.log" || fail "the table lacks matmul_backward: $(cat "$P.log")"
[ "$(json "$P/summary.json" 'j["params_xxh3"]')" = "$(json "$TMP/plain/summary.json" 'j["params_xxh3"]')" ] ||
  fail "profiling changed the parameters"
[ ! -e "$TMP/plain/profile.json" ] && ! grep -q profiled "$TMP/plain/metrics.jsonl" && ! grep -q '^profile of' "$TMP/plain.log" ||
  fail "a run without train.profile_steps profiled"
pass "profiled parameters equal the unprofiled run's; no profile without the key"

# activation checkpointing of every block: the backward runs each block's
# forward again but the last's (whose activations it takes at once)
train "$TMP/ac" --set train.profile_steps=1 --set fsdp.activation_checkpointing=true
want_calls "recomputation" "$TMP/ac" attention_forward $(( 2 * L - 1 ))
want_calls "recomputation" "$TMP/ac" attention_backward "$L"
pass "activation checkpointing: attention forward $(( 2 * L - 1 )) times a step, backward $L"

# the window: cut at the last step; a launch of one step profiles it
train "$TMP/cut" --set train.steps=3 --set train.profile_steps=10
[ "$(json "$TMP/cut/profile.json" '(j["first_step"], j["steps"])')" = "(2, 2)" ] || fail "window past the end"
train "$TMP/one" --set train.steps=1 --set train.profile_steps=1
[ "$(json "$TMP/one/profile.json" '(j["first_step"], j["steps"])')" = "(1, 1)" ] || fail "a one-step launch"
pass "the window ends with the run; a launch of one step profiles that step"

# ---- FSDP: 2 ranks, bf16 GEMMs and collectives ----
train "$TMP/fsdp" --nproc 2 --set fsdp.mixed_precision=bf16 --set train.profile_steps=2
want_calls "bf16 FSDP" "$TMP/fsdp" gemm_bf16 $(( 2 * 3 * (7 * L + 1) )) # forward, d_in, d_w
for op in all_gather reduce_scatter collective_wait attention_forward_bf16; do
  [ "$(calls "$TMP/fsdp" $op)" -gt 0 ] || fail "bf16 FSDP: no $op in the profile"
done
[ "$(json "$TMP/fsdp/profile.json" '(j["rank"], j["world_size"])')" = "(0, 2)" ] || fail "FSDP: rank and world size"
# the comm thread beside the calls: at least every gradient reduce-scattered in fp32 each step
python3 - "$TMP/fsdp/profile.json" "$TMP/fsdp/summary.json" <<'PY' || fail "the comm thread's line in profile.json (above)"
import json, sys
p, s = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
c = p["comm_thread"]
assert 0 < c["transfer_s"] < p["step_s"] and c["peer_wait_s"] >= 0, c
# its CPU time is inside its wall time (waits included), and it moved something
assert 0 < c["cpu_s"] <= 1.01 * (c["transfer_s"] + c["peer_wait_s"]) + 0.01, c
assert c["bytes"] >= 4 * s["n_params"] * p["steps"], (c, s["n_params"])
PY
grep -Eq '^  comm thread, beside them: [0-9.]+ s \([0-9.]+%\) moving [0-9.]+ GB, [0-9.]+ s waiting for peers, [0-9.]+ s \([0-9.]+%\) on a core$' "$TMP/fsdp.log" ||
  fail "no comm thread line on the console: $(cat "$TMP/fsdp.log")"
! grep -q comm_thread "$P/profile.json" || fail "one process without the supervisor has no comm thread to report"
pass "FSDP, 2 ranks, bf16: $(( 6 * (7 * L + 1) )) bf16 GEMMs, the all-gathers, reduce-scatters and their waits, the comm thread's time, CPU time and bytes"

expect_input_error "a negative profile_steps" "train.profile_steps.*-1" \
  "$KEEL_BIN" train "$CFG" --set train.profile_steps=-1 --run-dir "$TMP/bad"
[ ! -e "$TMP/bad" ] || fail "a refused run left $TMP/bad"
