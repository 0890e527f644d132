#!/usr/bin/env bash
# data.sources: training on a weighted mixture of two prepared datasets.
# - metrics.jsonl's source_tokens (per source, since the run began) add up to
#   "tokens" on every line and grow; summary.json's sources carry path, weight
#   and tokens, in the weights' proportion (3:1) over the run;
# - a run killed as it begins step 11 and resumed from its step-10 checkpoint
#   ends bit-identical (params_xxh3) with the same per-source counts as the
#   uninterrupted run;
# - on 2 ranks (--nproc 2) each source gives the same sequences: the same
#   per-source counts and losses within 1e-5 of 1 rank's;
# - validation uses the sources that have a val split;
# - bad input exits 2 with one line: weights summing to 0, a source that does
#   not exist, a source with another vocabulary, data.path beside
#   data.sources, an entry without a weight or with an unknown member.
source "$KEEL_SRC/tests/lib.sh"
mpi_env
command -v spm_train >/dev/null || fail "spm_train not found (run scripts/install-deps.sh)"

lic=/usr/share/common-licenses
for f in GPL-3 Apache-2.0 LGPL-2.1 MPL-2.0; do [ -f "$lic/$f" ] || fail "$lic/$f missing"; done
spm_train --input="$lic/GPL-3,$lic/Apache-2.0,$lic/LGPL-2.1,$lic/MPL-2.0" --model_prefix="$TMP/tok" \
  --vocab_size=600 --model_type=bpe --character_coverage=1.0 >"$TMP/spm.log" 2>&1 ||
  fail "spm_train: $(tail -2 "$TMP/spm.log")"
"$KEEL_BIN" data prepare --model "$TMP/tok.model" --input "$lic/GPL-3" "$lic/Apache-2.0" --out "$TMP/a" \
  --val-fraction 0.2 >/dev/null || fail "prepare a"
"$KEEL_BIN" data prepare --model "$TMP/tok.model" --input "$lic/LGPL-2.1" "$lic/MPL-2.0" --out "$TMP/b" \
  >/dev/null || fail "prepare b"
[ -f "$TMP/a/val-00000.bin" ] && [ ! -f "$TMP/b/val-00000.bin" ] || fail "want a val split in a only"

cat >"$TMP/mix.json" <<EOF
{
  "model": {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 600,
            "multiple_of": 32, "max_seq_len": 32},
  "train": {"steps": 20, "micro_batch_size": 4, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 2,
            "threads": 1, "eval_every": 5, "eval_batches": 2},
  "checkpoint": {"every_steps": 5, "keep_last": 0, "async": false},
  "resilience": {"max_restarts": 0},
  "data": {"sources": [{"path": "$TMP/a", "weight": 3}, {"path": "$TMP/b", "weight": 1}]}
}
EOF
train() { "$KEEL_BIN" train "$TMP/mix.json" --run-dir "$@"; }

train "$TMP/straight" >"$TMP/straight.log" 2>&1 || { cat "$TMP/straight.log"; fail "the mixture run"; }
python3 - "$TMP/straight" "$TMP/a" "$TMP/b" <<'EOF' || fail "per-source tokens"
import json, sys
run, a, b = sys.argv[1:]
lines = [json.loads(l) for l in open(f"{run}/metrics.jsonl") if '"step"' in l]
assert len(lines) == 20, len(lines)
prev = [0, 0]
for m in lines:
    st = m["source_tokens"]
    assert sum(st) == m["tokens"], (m["step"], st, m["tokens"])
    assert st[0] >= prev[0] and st[1] >= prev[1], (prev, st)
    prev = st
assert any("val_loss" in m for m in lines), "no validation loss: the val split of a was not used"
s = json.load(open(f"{run}/summary.json"))
src = s["sources"]
assert [x["path"] for x in src] == [a, b] and [x["weight"] for x in src] == [3, 1], src
ta, tb = src[0]["tokens"], src[1]["tokens"]
assert ta + tb == s["tokens"] == 20 * 4 * 32, (ta, tb, s["tokens"])
assert tb > 0 and 2.0 <= ta / tb <= 4.5, f"a:b = {ta}:{tb}, want about 3:1"
print(f"ok   20 steps: a {ta} tokens, b {tb} (weights 3:1), source_tokens add up to tokens on every line")
EOF

# ---- resume: killed as it begins step 11, resumed from step 10 -----------------
KEEL_FAULT=kill@11 train "$TMP/resumed" >"$TMP/killed.log" 2>&1 && fail "the run with kill@11 exited 0"
[ "$(cat "$TMP/resumed/checkpoints/LATEST")" = step_00000010 ] || fail "no step-10 checkpoint to resume from"
train "$TMP/resumed" >"$TMP/resumed.log" 2>&1 || { cat "$TMP/resumed.log"; fail "the resumed run"; }
same=$(python3 -c "
import json, sys
a, b = (json.load(open(f'{r}/summary.json')) for r in sys.argv[1:])
print(a['params_xxh3'] == b['params_xxh3'] and a['sources'] == b['sources'])" "$TMP/straight" "$TMP/resumed")
[ "$same" = True ] || fail "the resumed run differs from the uninterrupted one: $(json "$TMP/resumed/summary.json" "j['params_xxh3'], j['sources']") vs $(json "$TMP/straight/summary.json" "j['params_xxh3'], j['sources']")"
pass "killed at step 11 and resumed from step 10: params_xxh3 $(json "$TMP/straight/summary.json" "j['params_xxh3']") and per-source tokens as uninterrupted"

# ---- 2 ranks of 2 sequences (the same global batch): the same sequences from each source ----
train "$TMP/two" --nproc 2 --set train.micro_batch_size=2 >"$TMP/two.log" 2>&1 || { cat "$TMP/two.log"; fail "the 2-rank run"; }
python3 - "$TMP/straight" "$TMP/two" <<'EOF' || fail "2 ranks against 1"
import json, sys
one, two = sys.argv[1:]
load = lambda r: [json.loads(l) for l in open(f"{r}/metrics.jsonl") if '"step"' in l]
a, b = load(one), load(two)
assert [m["source_tokens"] for m in a] == [m["source_tokens"] for m in b], "per-source tokens differ"
worst = max(abs(x["loss"] - y["loss"]) / x["loss"] for x, y in zip(a, b))
assert worst <= 1e-5, f"losses differ by {worst:.2e} relative"
print(f"ok   2 ranks: per-source tokens as 1 rank's on every step, losses within {worst:.1e}")
EOF

# ---- bad input ---------------------------------------------------------------------
spm_train --input="$lic/MPL-2.0" --model_prefix="$TMP/tok2" --vocab_size=300 --model_type=bpe \
  --character_coverage=1.0 >"$TMP/spm2.log" 2>&1 || fail "spm_train 2"
"$KEEL_BIN" data prepare --model "$TMP/tok2.model" --input "$lic/MPL-2.0" --out "$TMP/v300" >/dev/null ||
  fail "prepare v300"
src() { echo "data.sources=$1"; }
expect_input_error "weights summing to 0" 'weights sum to 0' \
  train "$TMP/bad1" --set "$(src "[{\"path\": \"$TMP/a\", \"weight\": 0}, {\"path\": \"$TMP/b\", \"weight\": 0}]")"
expect_input_error "a missing source" "$TMP/nowhere" \
  train "$TMP/bad2" --set "$(src "[{\"path\": \"$TMP/a\", \"weight\": 1}, {\"path\": \"$TMP/nowhere\", \"weight\": 1}]")"
expect_input_error "another vocabulary" "$TMP/v300.*vocab_size 300" \
  train "$TMP/bad3" --set "$(src "[{\"path\": \"$TMP/a\", \"weight\": 1}, {\"path\": \"$TMP/v300\", \"weight\": 1}]")"
expect_input_error "data.path beside data.sources" 'data.path and data.sources' \
  train "$TMP/bad4" --set "data.path=$TMP/a"
expect_input_error "an entry without a weight" '"weight"' \
  train "$TMP/bad5" --set "$(src "[{\"path\": \"$TMP/a\"}]")"
expect_input_error "an unknown member" '"wieght"' \
  train "$TMP/bad6" --set "$(src "[{\"path\": \"$TMP/a\", \"wieght\": 1, \"weight\": 1}]")"
for r in bad1 bad2 bad3 bad4 bad5 bad6; do
  [ ! -e "$TMP/$r/checkpoints" ] || fail "$r: a refused run left checkpoints"
done
