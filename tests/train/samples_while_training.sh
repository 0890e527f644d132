#!/usr/bin/env bash
# tests/train/samples_while_training.sh: train.sample_every writes RUN/samples.jsonl — every 3
# steps, each prompt of train.sample_prompts with its completion — and changes nothing the
# training computes: params_xxh3 and every step's loss equal those of the same run without
# samples, on 1 rank and on 2 (FULL_SHARD, where every rank gathers the model to sample). The
# last step's samples are exactly what `keel generate` gives from the run's final weights with
# the same temperature, seed and prompts (the same decoder, generators seeded by (seed, i)).
# `keel status` shows the newest step's samples and its --json carries them (what the dashboard
# draws). Bad input — sampling without a tokenizer, a prompt longer than the context — exits 2
# with one line naming the key.
source "$KEEL_SRC/tests/lib.sh"
mpi_env
K=$KEEL_BIN
TOK=$KEEL_SRC/tests/reference/fixtures/hf_tiny_llama3_tokenizer/tokenizer.json
cat >"$TMP/cfg.json" <<EOF
{
  "model": {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 128,
            "multiple_of": 32, "norm_eps": 1e-5, "rope_theta": 10000, "max_seq_len": 64},
  "train": {"steps": 6, "micro_batch_size": 2, "grad_accum_steps": 1, "lr": 1e-2, "warmup_steps": 1,
            "threads": 1, "sample_every": 3, "sample_prompts": ["the tokenizer", "keel reads"],
            "sample_max_tokens": 12, "sample_temperature": 0.9, "sample_seed": 7},
  "data": {"synthetic": {"seed": 1, "branching": 4}, "tokenizer": "$TOK"}
}
EOF
# same_training A B: the same parameters and the same loss every step
same_training() {
  python3 - "$1" "$2" <<'PY' || fail "sampling changed the training: $1 against $2"
import json, sys
a, b = (json.load(open(f"{d}/summary.json")) for d in sys.argv[1:])
assert a["params_xxh3"] == b["params_xxh3"], (a["params_xxh3"], b["params_xxh3"])
la, lb = ([json.loads(l)["loss"] for l in open(f"{d}/metrics.jsonl") if '"loss"' in l] for d in sys.argv[1:])
assert la == lb and len(la) == 6, (la, lb)
print(a["params_xxh3"])
PY
}
for np in 1 2; do
  nproc=(); [ "$np" = 1 ] || nproc=(--nproc 2)
  "$K" train "$TMP/cfg.json" "${nproc[@]}" --run-dir "$TMP/s$np" >"$TMP/log" 2>&1 || fail "$np rank(s), sampling: $(tail -3 "$TMP/log")"
  "$K" train "$TMP/cfg.json" "${nproc[@]}" --set train.sample_every=0 --run-dir "$TMP/n$np" >"$TMP/log" 2>&1 ||
    fail "$np rank(s), no sampling: $(tail -3 "$TMP/log")"
  [ ! -e "$TMP/n$np/samples.jsonl" ] || fail "train.sample_every 0 wrote samples.jsonl"
  xxh=$(same_training "$TMP/s$np" "$TMP/n$np")
  python3 - "$TMP/s$np/samples.jsonl" <<'PY' || fail "$np rank(s): samples.jsonl"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert [(l["step"], l["prompt"]) for l in lines] == [(3, "the tokenizer"), (3, "keel reads"), (6, "the tokenizer"), (6, "keel reads")], lines
for l in lines:
    assert l["tokens"] >= 1 and l["finish_reason"] in ("stop", "length") and isinstance(l["completion"], str), l
PY
  pass "$np rank(s): samples at steps 3 and 6, params_xxh3 $xxh and every loss as without them"
done

# the last step's samples = keel generate on the final weights
printf '{"prompt": "the tokenizer"}\n{"prompt": "keel reads"}\n' >"$TMP/prompts.jsonl"
"$K" generate "$TMP/s1" --prompts "$TMP/prompts.jsonl" --temperature 0.9 --seed 7 --max-new-tokens 12 --json \
  >"$TMP/gen" 2>"$TMP/err" || fail "keel generate: $(cat "$TMP/err")"
python3 - "$TMP/s1/samples.jsonl" "$TMP/gen" <<'PY' || fail "the step-6 samples are not keel generate's"
import json, sys
last = [json.loads(l) for l in open(sys.argv[1])][-2:]
gen = [json.loads(l) for l in open(sys.argv[2])]
assert [l["completion"] for l in last] == [g["completion"] for g in gen], (last, gen)
PY
pass "step 6's samples = keel generate RUN --temperature 0.9 --seed 7"

"$K" status "$TMP/s1" >"$TMP/status" || fail "keel status"
grep -q "^samples at step 6:" "$TMP/status" && grep -q "^  \[keel reads\] " "$TMP/status" ||
  fail "keel status shows no samples: $(cat "$TMP/status")"
"$K" status "$TMP/s1" --json >"$TMP/status.json" || fail "keel status --json"
[ "$(json "$TMP/status.json" "len(j['samples'])")" = 4 ] || fail "keel status --json: no samples"
pass "keel status shows step 6's samples; --json carries all 4"

expect_input_error "sampling without a tokenizer" "train.sample_every 3 needs a tokenizer" \
  "$K" train "$TMP/cfg.json" --set data.tokenizer=null --run-dir "$TMP/bad1"
long=$(python3 -c 'print(" ".join(["tokenizer"] * 80))')
expect_input_error "a prompt past the context" "train.sample_prompts\[0\] is [0-9]+ tokens: no room" \
  "$K" train "$TMP/cfg.json" --set "train.sample_prompts=[\"$long\"]" --run-dir "$TMP/bad2"
