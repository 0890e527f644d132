#!/usr/bin/env bash
# fsdp.mixed_precision bf16 (oneDNN bf16 GEMMs, fp32 master weights):
# - on real text (Debian's license texts and copyright files, a 512-piece BPE
#   tokenizer from spm_train) a bf16 run follows the fp32 run for 200 steps:
#   every step's loss within 5% relative, every 20-step mean within 1%, the
#   validation losses within 1%, while the losses are not bit-identical (it
#   really ran bf16) and fall by more than 1.5 nats. bf16 rounding of the GEMM
#   and attention inputs sends the run down its own path, so single steps
#   drift most; measured (Release / the ASan build, whose code rounds a little
#   differently): worst step 1.7e-2 / 2.8e-2, worst 20-step mean 2.2e-3 /
#   4.1e-3, validation 1.8e-3 / 4.2e-3. The bounds are about twice that; a
#   wrong kernel is far outside them (its exactness is test_attention_bf16's
#   and test_gemm_bf16's job);
# - under FSDP (full_shard on 2 ranks, no_shard on 2, shard_grad_op with
#   accumulation on 3, full_shard with tied embeddings on 3, with
#   fsdp.reduce_dtype fp32 and bf16) bf16 runs follow the
#   one-process bf16 run within 1e-4 relative for 10 steps, and reduce_dtype
#   bf16 changes the numbers (the bf16 reduction really ran);
# - with oneDNN's bf16 instructions hidden (ONEDNN_MAX_CPU_ISA=AVX512_CORE) a
#   bf16 run says so in one log line and trains exactly as fp32.
source "$KEEL_SRC/tests/lib.sh"
mpi_env
command -v spm_train >/dev/null || fail "spm_train not found (run scripts/install-deps.sh)"

# ---- real text --------------------------------------------------------------
{
    cat /usr/share/common-licenses/*
    find /usr/share/doc -name copyright -type f | sort | head -n 300 | xargs -r cat
} 2>/dev/null | head -c 1500000 > "$TMP/text.txt" || true
[ "$(wc -c <"$TMP/text.txt")" -gt 500000 ] || fail "too little text under /usr/share (need 500 kB)"
spm_train --input="$TMP/text.txt" --model_prefix="$TMP/tok" --vocab_size=512 --model_type=bpe \
    --character_coverage=1.0 >"$TMP/spm.log" 2>&1 || fail "spm_train: $(tail -2 "$TMP/spm.log")"
"$KEEL_BIN" data prepare --model "$TMP/tok.model" --input "$TMP/text.txt" --out "$TMP/data" \
    --val-fraction 0.05 >/dev/null || fail "keel data prepare"
cat >"$TMP/text.json" <<EOF
{
  "model": {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 512,
            "multiple_of": 32, "max_seq_len": 64},
  "train": {"steps": 200, "micro_batch_size": 8, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 10,
            "threads": 2, "eval_every": 100, "eval_batches": 4},
  "data": {"path": "$TMP/data", "tokenizer": "$TMP/tok.model"}
}
EOF

# ---- 200 steps: bf16 follows fp32 ------------------------------------------------
"$KEEL_BIN" train "$TMP/text.json" --run-dir "$TMP/fp32" >"$TMP/out" 2>&1 || { cat "$TMP/out"; fail "fp32 run"; }
"$KEEL_BIN" train "$TMP/text.json" --set fsdp.mixed_precision=bf16 --run-dir "$TMP/bf16" >"$TMP/out" 2>&1 \
    || { cat "$TMP/out"; fail "bf16 run"; }
python3 - "$TMP/fp32" "$TMP/bf16" <<'PY' || fail "bf16 does not follow fp32 on real text"
import json, statistics, sys
rows = [[json.loads(l) for l in open(f"{d}/metrics.jsonl")] for d in sys.argv[1:]]
a, b = ([r["loss"] for r in x] for x in rows)
assert len(a) == len(b) == 200, (len(a), len(b))
assert [json.load(open(f"{d}/summary.json"))["mixed_precision"] for d in sys.argv[1:]] == ["fp32", "bf16"]
assert a != b, "bf16 losses are bit-identical to fp32: bf16 GEMMs did not run"
step = max(abs(x - y) / x for x, y in zip(a, b))
window = max(abs(statistics.mean(a[i:i + 20]) - statistics.mean(b[i:i + 20])) / statistics.mean(a[i:i + 20])
             for i in range(0, 200, 20))
va, vb = ([r["val_loss"] for r in x if "val_loss" in r] for x in rows)
val = max(abs(x - y) / x for x, y in zip(va, vb))
drop = statistics.mean(a[:10]) - statistics.mean(a[-10:])
print(f"ok   200 steps of real text: loss {a[0]:.3f} -> {a[-1]:.3f} (fp32), {b[-1]:.3f} (bf16); "
      f"worst step rel {step:.2e}, worst 20-step mean rel {window:.2e}, val rel {val:.2e}")
assert step <= 0.05 and window <= 0.01 and len(va) == 2 and val <= 0.01, (step, window, va, vb)
assert drop > 1.5, f"the loss only fell by {drop:.2f}"
PY

# ---- FSDP: bf16 on 2-3 ranks follows one bf16 process ----------------------------
CFG=$KEEL_SRC/tests/train/micro.json
common=(--set train.steps=10 --set train.threads=1 --set fsdp.mixed_precision=bf16)
for tied in false true; do
  "$KEEL_BIN" train "$CFG" "${common[@]}" --set model.tie_embeddings=$tied --set train.micro_batch_size=12 \
    --run-dir "$TMP/one-$tied" >/dev/null 2>&1 || fail "one-process bf16 run"
done
for spec in 2:full_shard:1:fp32:false 2:no_shard:1:fp32:false 2:no_shard:1:bf16:false \
            3:shard_grad_op:2:bf16:false 3:full_shard:1:bf16:true; do
  IFS=: read -r W strategy accum reduce tied <<<"$spec"
  timeout 300 "$KEEL_BIN" train "$CFG" "${common[@]}" --set train.micro_batch_size=$((12 / W / accum)) \
    --set train.grad_accum_steps="$accum" --set fsdp.strategy="$strategy" --set fsdp.reduce_dtype="$reduce" \
    --set model.tie_embeddings=$tied --nproc "$W" --run-dir "$TMP/$W-$strategy-$reduce-$tied" >"$TMP/out" 2>&1 \
    || { cat "$TMP/out"; fail "--nproc $W $strategy bf16"; }
  python3 - "$TMP/one-$tied" "$TMP/$W-$strategy-$reduce-$tied" "$spec" <<'PY' || fail "$spec differs from one bf16 process"
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(f"{d}/metrics.jsonl")] for d in sys.argv[1:3])
assert len(a) == len(b) == 10 and json.load(open(f"{sys.argv[2]}/summary.json"))["mixed_precision"] == "bf16"
worst = max(abs(x - y) / x for x, y in zip(a, b))
print(f"ok   bf16 W:strategy:accum:reduce:tied {sys.argv[3]} follows one bf16 process: loss rel {worst:.2e}")
assert worst <= 1e-4, worst
PY
done
cmp -s "$TMP/2-no_shard-fp32-false/metrics.jsonl" "$TMP/2-no_shard-bf16-false/metrics.jsonl" \
    && fail "fsdp.reduce_dtype bf16 changed nothing"
pass "fsdp.reduce_dtype bf16 changes the reduction"

# ---- no bf16 instructions: a log line, then exactly fp32 --------------------------
"$KEEL_BIN" train "$CFG" --set train.steps=5 --run-dir "$TMP/plain" >/dev/null 2>&1 || fail "fp32 run"
ONEDNN_MAX_CPU_ISA=AVX512_CORE "$KEEL_BIN" train "$CFG" --set train.steps=5 --set fsdp.mixed_precision=bf16 \
    --run-dir "$TMP/fallback" >"$TMP/out" 2>&1 || { cat "$TMP/out"; fail "fallback run"; }
grep -q "fsdp.mixed_precision bf16: this CPU has no bf16 instructions.*trains in fp32" "$TMP/out" \
    || { cat "$TMP/out"; fail "no fallback log line"; }
[ "$(json "$TMP/fallback/summary.json" 'j["mixed_precision"]')" = fp32 ] || fail "fallback summary"
diff <(json "$TMP/plain/summary.json" 'j["params_xxh3"]') <(json "$TMP/fallback/summary.json" 'j["params_xxh3"]') \
    >/dev/null || fail "the fallback run is not the fp32 run"
pass "without bf16 instructions: '$(grep -o 'fsdp.mixed_precision bf16: this CPU.*' "$TMP/out" | head -1)', fp32 bit for bit"
