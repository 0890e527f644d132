#!/usr/bin/env bash
# `keel train --nproc N` (mpirun, oversubscribed on 2 cores) follows the
# single-process run at the same global batch: 10-step losses within 1e-5
# relative and final parameters within 1e-5 (relative L2) for N = 1..4 and
# every fsdp.strategy; only the leader writes metrics; every rank logs; bad
# fsdp settings are refused before launch; a rank killed mid-run makes keel
# train fail within seconds, naming the rank.
source "$KEEL_SRC/tests/lib.sh"
CFG=$KEEL_SRC/tests/train/micro.json
KEEL_MPI_LEAKS=1 mpi_env # the leak check of every rank (tests/lib.sh)
common=(--set train.steps=10 --set train.threads=1 --set train.eval_every=5)  # eval: forward-only passes
"$KEEL_BIN" train "$CFG" "${common[@]}" --set train.micro_batch_size=12 --run-dir "$TMP/ref" >/dev/null 2>&1
# W:strategy — every strategy through the real CLI (hybrid: groups of 2).
# W:strategy:accum — the 3-rank full_shard run also recomputes activations
# (fsdp.activation_checkpointing), the hybrid run gathers without prefetch;
# accum 2 reduces once per step after two micro-batches.
for spec in 1:full_shard:1 2:full_shard:1 3:full_shard:1 4:full_shard:1 2:no_shard:1 3:shard_grad_op:1 \
            4:hybrid_shard:1 2:full_shard:2 3:shard_grad_op:2; do
  IFS=: read -r W strategy accum <<<"$spec"
  ckpt=false; [ "$spec" = 3:full_shard:1 ] && ckpt=true
  prefetch=true; [ "$spec" = 4:hybrid_shard:1 ] && prefetch=false
  timeout 300 "$KEEL_BIN" train "$CFG" "${common[@]}" --set train.micro_batch_size=$((12 / W / accum)) \
    --set train.grad_accum_steps="$accum" --set fsdp.strategy="$strategy" --set fsdp.shard_group_size=2 \
    --set fsdp.activation_checkpointing=$ckpt --set fsdp.prefetch=$prefetch \
    --nproc "$W" --run-dir "$TMP/w$W-$strategy-$accum" >"$TMP/out" 2>&1 || { cat "$TMP/out"; fail "--nproc $W $strategy"; }
  python3 - "$TMP/ref" "$TMP/w$W-$strategy-$accum" "$W" "$strategy" "$accum" <<'PY' || fail "--nproc $W $strategy differs from one process"
import array, json, math, sys
ref, run, W, strategy, accum = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
a = [json.loads(l)["loss"] for l in open(f"{ref}/metrics.jsonl")]
b = [json.loads(l)["loss"] for l in open(f"{run}/metrics.jsonl")]
assert len(a) == len(b) == 10, (len(a), len(b))
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
assert worst <= 1e-5, f"loss rel diff {worst}"
va = [json.loads(l)["val_loss"] for l in open(f"{ref}/metrics.jsonl") if "val_loss" in l]
vb = [json.loads(l)["val_loss"] for l in open(f"{run}/metrics.jsonl") if "val_loss" in l]
assert len(va) == len(vb) == 2 and all(abs(x - y) <= 1e-5 * x for x, y in zip(va, vb)), (va, vb)
def weights(d):
    w = array.array("f"); raw = open(f"{d}/weights.bin", "rb").read()[64:]; w.frombytes(raw); return w
p, q = weights(ref), weights(run)
rel = math.sqrt(sum((x - y) ** 2 for x, y in zip(p, q)) / sum(x * x for x in p))
assert rel <= 1e-5, f"params rel L2 {rel}"
s = json.load(open(f"{run}/summary.json"))
assert s["world_size"] == W and s["status"] == "completed", s
# Persistent fp32 state per rank = 16 bytes x padded params / ranks in the shard group,
# with units padded to a multiple of (shard ranks x 16) — from the model's shape alone.
m = json.load(open(f"{run}/config.json"))["model"]
C, L, NH, NKV, V = m["dim"], m["n_layers"], m["n_heads"], m["n_kv_heads"], m["vocab_size"]
F = 2 * (4 * C) // 3
if m["ffn_dim_multiplier"] > 0: F = int(m["ffn_dim_multiplier"] * F)
F = m["multiple_of"] * ((F + m["multiple_of"] - 1) // m["multiple_of"])
HS = C // NH
units = [V * C] + [2 * C + 2 * C * NH * HS + 2 * C * NKV * HS + 3 * C * F] * L + [C + (0 if m["tie_embeddings"] else V * C)]
shard_ranks = {"no_shard": 1, "hybrid_shard": 2}.get(strategy, W)
q = 16 * shard_ranks
padded = sum((u + q - 1) // q * q for u in units)
assert len(s["ranks"]) == W, s["ranks"]
for r in s["ranks"]:
    persistent = r["params_bytes"] + r["grads_bytes"] + r["optimizer_bytes"]
    assert persistent * shard_ranks == 16 * padded, (r, padded, shard_ranks)
    assert r["peak_rss_bytes"] > persistent
print(f"ok   --nproc {W} {strategy} accum {accum}: loss rel diff <= {worst:.1e}, params |dp|/|p| = {rel:.1e}; "
      f"persistent bytes/rank {persistent} = 16 x {padded} / {shard_ranks}")
PY
  for r in $(seq 0 $((W - 1))); do
    [ -s "$TMP/w$W-$strategy-$accum/logs/rank-$r.log" ] || fail "no log for rank $r of $W"
  done
done
pass "every rank wrote RUN/logs/rank-R.log"
# Tied embeddings (unit 0 pinned) with accumulation on 2 ranks against one process.
tied=(--set model.tie_embeddings=true --set train.steps=6)
"$KEEL_BIN" train "$CFG" "${common[@]}" "${tied[@]}" --set train.micro_batch_size=12 --run-dir "$TMP/tref" >/dev/null 2>&1
timeout 300 "$KEEL_BIN" train "$CFG" "${common[@]}" "${tied[@]}" --set train.micro_batch_size=3 \
  --set train.grad_accum_steps=2 --nproc 2 --run-dir "$TMP/tied" >"$TMP/out" 2>&1 || { cat "$TMP/out"; fail "tied"; }
python3 - "$TMP/tref" "$TMP/tied" <<'PY' || fail "tied + accumulation differs from one process"
import json, sys
a = [json.loads(l)["loss"] for l in open(f"{sys.argv[1]}/metrics.jsonl")]
b = [json.loads(l)["loss"] for l in open(f"{sys.argv[2]}/metrics.jsonl")]
worst = max(abs(x - y) / x for x, y in zip(a, b))
assert len(a) == len(b) == 6 and worst <= 1e-5, worst
print(f"ok   tied embeddings, --nproc 2, accum 2: loss rel diff <= {worst:.1e}")
PY
expect_input_error "unknown strategy" "fsdp.strategy 'zero3' is not one of" \
  "$KEEL_BIN" train "$CFG" --set fsdp.strategy=zero3 --nproc 2 --run-dir "$TMP/bad1"
expect_input_error "hybrid group must divide nproc" "fsdp.shard_group_size 2 does not divide --nproc 3" \
  "$KEEL_BIN" train "$CFG" --set fsdp.strategy=hybrid_shard --set fsdp.shard_group_size=2 --nproc 3 --run-dir "$TMP/bad2"
[ ! -e "$TMP/bad1" ] && [ ! -e "$TMP/bad2" ] || fail "a refused launch created its run directory"

# A rank killed mid-run with restarts off: keel train exits non-zero within seconds and names it.
"$KEEL_BIN" train "$CFG" --set train.steps=100000 --set train.threads=1 --set train.micro_batch_size=4 \
  --set resilience.max_restarts=0 --nproc 2 --run-dir "$TMP/kill" >"$TMP/kill.out" 2>"$TMP/kill.err" &
launcher=$!
for _ in $(seq 100); do
  pid=$(sed -n 's/.*rank 1 of 2 (pid \([0-9]*\)).*/\1/p' "$TMP/kill/logs/rank-1.log" 2>/dev/null || true)
  [ -n "$pid" ] && break
  sleep 0.2
done
[ -n "$pid" ] || { kill $launcher; fail "rank 1 never started"; }
sleep 1
t0=$(date +%s%N)
kill -9 "$pid"
rc=0
timeout 60 tail --pid=$launcher -f /dev/null || true
wait $launcher || rc=$?
dt_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
[ "$rc" != 0 ] || fail "keel train exited 0 after a rank was killed"
grep -Eq "keel: error: .*rank 1 \(pid $pid\) died" "$TMP/kill.err" || fail "no line naming rank 1: $(tail -3 "$TMP/kill.err")"
[ "$dt_ms" -lt 15000 ] || fail "took ${dt_ms} ms to notice"
pass "killed rank 1: exit $rc after ${dt_ms} ms: $(grep 'keel: error: ' "$TMP/kill.err")"
