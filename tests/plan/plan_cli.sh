#!/usr/bin/env bash
# keel plan from the outside: bad input is one line naming the option or the
# file, exit 2; --json has the schema of docs/planning.md (per strategy and for the
# recommendation: bytes by category adding up to peak_bytes, fits,
# scaling_efficiency in (0, 1]); a plan that cannot fit says so and exits 1;
# more ranks shrink the sharded state and a slower network costs scaling
# efficiency; with --memory between "nothing checkpointed" and "every block"
# the recommendation checkpoints a count of blocks, which keel train takes;
# the plan's memory on this machine is `keel train --dry-run`'s
# (one source); the shipped Llama 2 configs have Llama 2's published
# parameter counts; and the on-paper plan for Llama 2 7B on 16 nodes x 8 H100
# lands in the band of the published 87% (docs/planning.md, "On paper").
source "$KEEL_SRC/tests/lib.sh"
K=$KEEL_BIN
CFG=$KEEL_SRC/configs/tiny.json
plan() { "$K" plan "$@"; }

# --- bad input ----------------------------------------------------------------
expect_input_error "unknown device" "error: --device 'tpu': unknown device" plan "$CFG" --device tpu
expect_input_error "no nodes" "error: --nodes '0': expected a whole number" plan "$CFG" --nodes 0
expect_input_error "ranks per node not a number" "error: --per-node '8x'" plan "$CFG" --per-node 8x
expect_input_error "negative network" "error: --net '-5'" plan "$CFG" --device h100 --net -5
expect_input_error "MFU above 1" "error: --mfu '1.5'" plan "$CFG" --device h100 --mfu 1.5
expect_input_error "no memory" "error: --memory '0'" plan "$CFG" --device h100 --memory 0
echo "hello" >"$TMP/notes.json"
expect_input_error "a file that is not a config" "notes.json: invalid JSON" plan "$TMP/notes.json" --device h100
echo '[1, 2]' >"$TMP/list.json"
expect_input_error "JSON that is not a config" "list.json: the config must be a JSON object" plan "$TMP/list.json"
echo '{"model": {"dim": 66, "n_heads": 4}, "data": {"synthetic": {}}}' >"$TMP/shape.json"
expect_input_error "a model that cannot be" "shape.json: model.dim 66 is not divisible" plan "$TMP/shape.json" --device h100
expect_input_error "missing config" "nope.json: cannot open config" plan "$TMP/nope.json" --device h100
expect_input_error "bad --set" "unknown config key 'model.dimm'" plan "$CFG" --device h100 --set model.dimm=3

# --- the JSON schema, on a preset (nothing measured) ------------------------------
plan "$KEEL_SRC/configs/llama2-7b.json" --device h100 --nodes 2 --set fsdp.mixed_precision=bf16 --json >"$TMP/7b.json" ||
  fail "llama2-7b on 2 x 8 h100 should fit"
python3 - "$TMP/7b.json" <<'PY' || fail "schema"
import json, sys
p = json.load(open(sys.argv[1]))
cats = ["params", "grads", "optimizer", "gathered", "activations", "checkpoint_buffer", "snapshot",
        "accumulation", "workspaces", "runtime"]
assert p["cluster"]["ranks"] == 16 and p["cluster"]["device"] == "h100", p["cluster"]
assert [e["strategy"] for e in p["strategies"]] == ["full_shard", "shard_grad_op", "no_shard", "hybrid_shard"]
for e in p["strategies"] + [p["recommendation"]]:
    assert sorted(e["memory"]) == sorted(cats), e["memory"]
    assert sum(e["memory"].values()) == e["peak_bytes"], (e["strategy"], e["peak_bytes"])
    assert e["fits"] == (e["peak_bytes"] <= e["budget_bytes"]), e["strategy"]
    assert isinstance(e["fits"], bool) and 0 < e["scaling_efficiency"] <= 1, e
    t = e["time"]
    assert abs(t["exposed_s"] - sum(t["exposed"].values())) < 1e-9 * t["step_s"], t
    assert t["step_s"] >= t["compute_s"] + t["recompute_s"] + t["optimizer_s"], t
r = p["recommendation"]
assert p["fits"] is True and r["fits"] is True
assert r["micro_batch"] * r["grad_accum"] == 1, "the config's batch is kept"
hy = p["strategies"][3]
assert hy["shard_group"] == 8 and hy["replicas"] == 2, "hybrid_shard's group is a node"
print(f"ok   schema: 4 strategies + recommendation ({r['strategy']}, checkpointing {r['activation_checkpointing']}, "
      f"{r['peak_bytes'] / 2**30:.1f} GiB, efficiency {r['scaling_efficiency']:.3f})")
PY

# --- cannot fit: exit 1, and says so ------------------------------------------------
rc=0
plan "$KEEL_SRC/configs/llama2-70b.json" --device a100 --per-node 1 --json >"$TMP/70b.json" || rc=$?
[ "$rc" = 1 ] || fail "llama2-70b on one a100: exit $rc, want 1"
[ "$(json "$TMP/70b.json" 'j["fits"] is False and not j["recommendation"]["fits"] and j["recommendation"]["peak_bytes"] > j["recommendation"]["budget_bytes"]')" = True ] ||
  fail "llama2-70b on one a100 must say it does not fit"
rc=0
plan "$KEEL_SRC/configs/llama2-70b.json" --device a100 --per-node 1 >"$TMP/70b.txt" || rc=$?
[ "$rc" = 1 ] && grep -q "NO PLAN FITS" "$TMP/70b.txt" || fail "the text plan must say nothing fits (exit $rc)"
pass "llama2-70b on one a100: fits false, exit 1, in JSON and text"

# --- matrix units when no block plan fits --------------------------------------------
# five 70B-width layers at T 1024 on one h100: every block plan needs > 80 GB (an 856 M-parameter
# block's two slots and two gradient buffers are 12.8 GiB); gathering one matrix at a time fits
plan "$KEEL_SRC/configs/llama2-70b-slice.json" --device h100 --per-node 1 --set model.n_layers=5 \
  --set model.max_seq_len=1024 --json >"$TMP/wide.json" || fail "five 70B-width layers on one h100: no plan fits"
[ "$(json "$TMP/wide.json" 'j["recommendation"]["unit"] == "matrix" and j["recommendation"]["fits"] and not any(e["fits"] for e in j["strategies"]) and all(e["unit"] == "block" for e in j["strategies"])')" = True ] ||
  fail "five 70B-width layers on one h100: the recommendation must be matrix units, which alone fit"
plan "$KEEL_SRC/configs/llama2-70b-slice.json" --device h100 --per-node 1 --set model.n_layers=5 \
  --set model.max_seq_len=1024 | grep -q -- "--set fsdp.unit=matrix" || fail "the text plan must say --set fsdp.unit=matrix"
pass "five 70B-width layers on one h100: no block plan fits, matrix units do and are recommended"

# --- some blocks checkpointed: Llama 2 7B on one h200 with --memory ----------------------
# nothing checkpointed needs ~139 GiB, everything ~110: at 130 GiB the plan checkpoints the
# fewest blocks that fit, a count between, in JSON and in the text's --set line
for mem in 130 139.5 100; do
  rc=0
  plan "$KEEL_SRC/configs/llama2-7b.json" --device h200 --per-node 1 --set fsdp.mixed_precision=bf16 --memory $mem \
    --json >"$TMP/7b-$mem.json" || rc=$?
  echo "$rc" >"$TMP/7b-$mem.rc"
done
python3 - "$TMP" <<'PY' || fail "llama2-7b on one h200 with --memory"
import json, sys
d = sys.argv[1]
p = {m: json.load(open(f"{d}/7b-{m}.json")) for m in ("130", "139.5", "100")}
rc = {m: open(f"{d}/7b-{m}.rc").read().strip() for m in p}
mid, none = p["130"]["recommendation"], p["139.5"]["recommendation"]
assert rc == {"130": "0", "139.5": "0", "100": "1"}, rc
assert mid["budget_bytes"] == 130 * 2**30 and mid["fits"], mid["budget_bytes"]
k = mid["activation_checkpointing"]
assert type(k) is int and 1 < k < 32, f"at 130 GiB: checkpointing {k!r}, want a count of blocks"
assert none["activation_checkpointing"] is False, none["activation_checkpointing"]
assert none["time"]["recompute_s"] < mid["time"]["recompute_s"], "fewer checkpointed blocks, less recomputation"
assert not p["100"]["recommendation"]["fits"] and p["100"]["recommendation"]["activation_checkpointing"] is True
print(f"ok   7b on one h200: 139.5 GiB none, 130 GiB {k} of 32 blocks, 100 GiB nothing fits (exit 1)")
PY
k=$(json "$TMP/7b-130.json" 'j["recommendation"]["activation_checkpointing"]')
"$K" plan "$KEEL_SRC/configs/llama2-7b.json" --device h200 --per-node 1 --set fsdp.mixed_precision=bf16 --memory 130 |
  grep -q -- "--set fsdp.activation_checkpointing=$k " || fail "the text plan must say --set fsdp.activation_checkpointing=$k"
# the plan runs: keel train takes the count it prints (and --dry-run's activations match the plan's)
want=$(json "$TMP/7b-130.json" '"%.3f" % (j["recommendation"]["memory"]["activations"] / 2**30)')
got=$("$K" train "$KEEL_SRC/configs/llama2-7b.json" --set fsdp.mixed_precision=bf16 --set fsdp.activation_checkpointing=$k \
  --dry-run | awk '/^  activations/ {print $2}')
[ "$got" = "$want" ] || fail "activations at $k checkpointed blocks: dry-run $got GiB, plan $want GiB"
pass "llama2-7b on one h200: --memory 130 checkpoints $k of 32 blocks (the fewest that fit), $want GiB of activations"

# --- more ranks, slower network ---------------------------------------------------
per_rank() { plan "$KEEL_SRC/configs/llama2-13b.json" --device h100 "$@" --json |
  python3 -c "import json,sys; e=json.load(sys.stdin)['strategies'][0]; print(e['memory']['params'], e['scaling_efficiency'])"; }
read -r p2 e_fast <<<"$(per_rank --nodes 2)"
read -r p8 _ <<<"$(per_rank --nodes 8)"
read -r _ e_slow <<<"$(per_rank --nodes 2 --net 100)"
python3 -c "import sys; p2, p8, f, s = map(float, sys.argv[1:]); assert 3.9 < p2 / p8 < 4.1 and s < f, (p2, p8, f, s)" \
  "$p2" "$p8" "$e_fast" "$e_slow" || fail "13b: params per rank $p2 -> $p8 (2 -> 8 nodes); efficiency $e_fast at 3200 Gbit/s, $e_slow at 100"
pass "13b full_shard: 4x the ranks, 1/4 the parameters per rank; 100 Gbit/s costs efficiency ($e_fast -> $e_slow)"

# --- Llama 2's shapes ----------------------------------------------------------------
for m in 7b:6738415616 13b:13015864320 70b:68976648192; do
  n=$(plan "$KEEL_SRC/configs/llama2-${m%%:*}.json" --device h100 --nodes 16 --json | python3 -c "import json,sys; print(json.load(sys.stdin)['model']['n_params'])") || true
  [ "$n" = "${m##*:}" ] || fail "llama2-${m%%:*}: $n parameters, Llama 2 has ${m##*:}"
done
pass "llama2-7b/13b/70b have Llama 2's published parameter counts"
# Llama 3.x: GQA with 8 kv heads, a 128256-token vocabulary, tied embeddings in 3.2 1B
for m in 3.1-8b:8030261248 3.1-70b:70553706496 3.2-1b:1235814400; do
  n=$(plan "$KEEL_SRC/configs/llama${m%%:*}.json" --device h100 --nodes 16 --json | python3 -c "import json,sys; print(json.load(sys.stdin)['model']['n_params'])") || true
  [ "$n" = "${m##*:}" ] || fail "llama${m%%:*}: $n parameters, Llama ${m%%-*} has ${m##*:}"
done
pass "llama3.1-8b/70b and llama3.2-1b have Meta's published parameter counts"

# --- one source: the plan's memory is keel train --dry-run's ------------------------
for s in full_shard no_shard; do
  want=$("$K" train "$CFG" --set fsdp.strategy=$s --set checkpoint.every_steps=5 --dry-run --nproc 2 | awk '/^  total/ {print $2}')
  got=$(plan "$CFG" --set checkpoint.every_steps=5 --per-node 2 --mfu 0.5 --intra 10 --json |
    python3 -c "import json,sys; print('%.3f' % (next(e for e in json.load(sys.stdin)['strategies'] if e['strategy'] == '$s')['peak_bytes'] / 2**30))")
  [ "$got" = "$want" ] || fail "$s on 2 ranks: plan $got GiB, dry-run $want GiB"
done
pass "the cpu plan's peak per rank is keel train --dry-run's (full_shard, no_shard, with a checkpoint buffer)"

# --- on paper: Llama 2 7B on 16 nodes x 8 H100 --------------------------------------
eff=$(plan "$KEEL_SRC/configs/llama2-7b.json" --device h100 --nodes 16 --set fsdp.mixed_precision=bf16 --json |
  python3 -c "import json,sys; print('%.3f' % json.load(sys.stdin)['recommendation']['scaling_efficiency'])")
python3 -c "import sys; assert 0.80 <= float(sys.argv[1]) <= 0.95" "$eff" ||
  fail "llama2-7b on 16 x 8 h100: scaling efficiency $eff, outside the published 87%'s band [0.80, 0.95]"
pass "llama2-7b on 16 x 8 h100: scaling efficiency $eff (published: 87%)"
