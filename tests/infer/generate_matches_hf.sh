#!/usr/bin/env bash
# tests/infer/generate_matches_hf.sh: `keel generate` against transformers. Greedy decoding of the
# two Hugging Face fixtures (hf_tiny: Llama 2-style, untied head; hf_tiny_llama3: llama3 RoPE,
# tied, a tokenizer.json) gives exactly the new tokens of transformers' greedy generate
# (tests/reference/generate_reference.py), the stop at EOS included: read straight from the
# directory with prompts batched on one KV cache, one prompt at a time, in bf16-free fp32, and
# on 2 processes (--nproc 2), and from the checkpoint `keel ckpt import` makes of it. The reference is run live where the venv of
# scripts/setup-torch.sh is, else read from its recorded output (generate_greedy.jsonl). Then
# what needs no reference: a text prompt is BOS + the tokenizer's ids; the streamed text is the
# JSON completion; a sample is the same for one seed on 1 or 2 threads, batched or alone, on 3
# processes, and
# another seed gives another; --stop cuts before the string; bf16 runs. Bad input — a prompt
# longer than the context, temperature < 0, top-p outside (0, 1], an unknown stop token, a
# prompts line without "prompt", an id outside the vocabulary — exits 2 with one line naming it.
source "$KEEL_SRC/tests/lib.sh"
K=$KEEL_BIN
FIX=$KEEL_SRC/tests/reference/fixtures
torch_python="${KEEL_TORCH_VENV:-/opt/keel-torch}/bin/python"
mkdir "$TMP/l3"
cp "$FIX"/hf_tiny_llama3/{config.json,model.safetensors,generation_config.json} \
   "$FIX"/hf_tiny_llama3_tokenizer/{tokenizer.json,tokenizer_config.json} "$TMP/l3/"

# same_ids NAME KEEL_JSONL REF_JSONL: every prompt's new ids equal
same_ids() {
  python3 - "$2" "$3" <<'PY' || fail "$1: keel's greedy tokens are not transformers'"
import json, sys
keel = {j["prompt"]: j for j in map(json.loads, open(sys.argv[1]))}
ref = [json.loads(l) for l in open(sys.argv[2])]
assert len(keel) == len(ref), (len(keel), len(ref))
for r in ref:
    k = keel[r["prompt"]]
    assert k["ids"] == r["ids"], (r["prompt"], k["ids"], r["ids"])
print(sum(len(r["ids"]) for r in ref), "tokens of", len(ref), "prompts")
PY
}

for model in hf_tiny:12 hf_tiny_llama3:40; do
  name=${model%:*} n=${model#*:}
  dir=$FIX/$name prompts=$FIX/$name/generate_prompts.jsonl ref=$FIX/$name/generate_greedy.jsonl
  if [ -x "$torch_python" ] && "$torch_python" -c "import transformers" 2>/dev/null; then
    "$torch_python" "$KEEL_SRC/tests/reference/generate_reference.py" "$dir" "$prompts" "$n" >"$TMP/$name.live" \
      2>"$TMP/ref.err" || fail "$name: transformers: $(tail -n 3 "$TMP/ref.err")"
    cmp -s "$TMP/$name.live" "$ref" || fail "$name: transformers now gives other tokens than $ref records"
    ref=$TMP/$name.live
    how="transformers $("$torch_python" -c 'import transformers; print(transformers.__version__)') live"
  else
    how="transformers' recorded output (no $torch_python: SKIP of the live run)"
  fi
  "$K" generate "$dir" --prompts "$prompts" --max-new-tokens "$n" --json >"$TMP/$name.batched" 2>"$TMP/err" ||
    fail "$name: keel generate: $(cat "$TMP/err")"
  got=$(same_ids "$name batched" "$TMP/$name.batched" "$ref")
  "$K" generate "$dir" --prompts "$prompts" --max-new-tokens "$n" --json --batch 1 >"$TMP/$name.one" 2>"$TMP/err" ||
    fail "$name: keel generate --batch 1: $(cat "$TMP/err")"
  same_ids "$name one at a time" "$TMP/$name.one" "$ref" >/dev/null
  "$K" generate "$dir" --prompts "$prompts" --max-new-tokens "$n" --json --nproc 2 >"$TMP/$name.np2" 2>"$TMP/err" ||
    fail "$name: keel generate --nproc 2: $(cat "$TMP/err")"
  same_ids "$name on 2 processes" "$TMP/$name.np2" "$ref" >/dev/null
  "$K" ckpt import --from-hf "$dir" --out "$TMP/$name.ckpt" >/dev/null 2>&1 || fail "$name: import"
  "$K" generate "$TMP/$name.ckpt" --prompts "$prompts" --max-new-tokens "$n" --json >"$TMP/$name.ck" 2>"$TMP/err" ||
    fail "$name: keel generate CKPT: $(cat "$TMP/err")"
  same_ids "$name from the checkpoint" "$TMP/$name.ck" "$ref" >/dev/null
  pass "$name: greedy = $how ($got; batched, one at a time, on 2 processes, and from its imported checkpoint)"
done
# the EOS stop is exercised: hf_tiny_llama3's first prompt ends early on token 2
[ "$(head -1 "$TMP/hf_tiny_llama3.batched" | python3 -c 'import json,sys; print(json.load(sys.stdin)["finish_reason"])')" = stop ] ||
  fail "hf_tiny_llama3 prompt 0 should stop at EOS: $(head -1 "$TMP/hf_tiny_llama3.batched")"

# ---- text prompts, streaming --------------------------------------------------------------
text="the tokenizer travels"
ids=$(printf '%s\n' "$text" | "$K" tokenize --model "$TMP/l3/tokenizer.json" | tr ' ' ,)
echo "{\"prompt\": [1,$ids]}" >"$TMP/ids.jsonl"
"$K" generate "$TMP/l3" --prompt "$text" --max-new-tokens 30 --json >"$TMP/text.json" 2>/dev/null || fail "text prompt"
"$K" generate "$TMP/l3" --prompts "$TMP/ids.jsonl" --max-new-tokens 30 --json >"$TMP/ids.json" 2>/dev/null || fail "ids prompt"
python3 - "$TMP/text.json" "$TMP/ids.json" <<'PY' || fail "a text prompt is not BOS + its ids"
import json, sys
a, b = (json.loads(open(f).readline()) for f in sys.argv[1:])
assert a["ids"] == b["ids"] and a["prompt_tokens"] == b["prompt_tokens"], (a, b)
PY
"$K" generate "$TMP/l3" --prompt "$text" --max-new-tokens 30 >"$TMP/text.out" 2>/dev/null || fail "text output"
python3 - "$TMP/text.json" "$TMP/text.out" <<'PY' || fail "the streamed text is not the completion"
import json, sys
c = json.loads(open(sys.argv[1]).readline())["completion"]
assert open(sys.argv[2]).read() == c + "\n", (open(sys.argv[2]).read(), c)
PY
pass "--prompt TEXT = BOS + keel tokenize's ids; the text streamed = the JSON completion"

# ---- sampling: seeded, the same on any thread count and batch --------------------------------
s=(--prompts "$FIX/hf_tiny_llama3/generate_prompts.jsonl" --max-new-tokens 24 --json --temperature 0.9 --top-k 40 --top-p 0.95)
"$K" generate "$TMP/l3" "${s[@]}" --seed 5 --threads 1 >"$TMP/s1" 2>/dev/null || fail "sample, 1 thread"
"$K" generate "$TMP/l3" "${s[@]}" --seed 5 --threads 2 --batch 1 >"$TMP/s2" 2>/dev/null || fail "sample, 2 threads"
"$K" generate "$TMP/l3" "${s[@]}" --seed 6 >"$TMP/s3" 2>/dev/null || fail "sample, seed 6"
cmp -s "$TMP/s1" "$TMP/s2" || fail "seed 5 sampled differently on 1 thread batched and 2 threads one at a time"
"$K" generate "$TMP/l3" "${s[@]}" --seed 5 --nproc 3 >"$TMP/s4" 2>/dev/null || fail "sample, 3 processes"
cmp -s "$TMP/s1" "$TMP/s4" || fail "seed 5 sampled differently on 3 processes"
! cmp -s "$TMP/s1" "$TMP/s3" || fail "seeds 5 and 6 sampled the same"
pass "seed 5: the same samples on 1 thread batched, 2 threads alone and 3 processes; seed 6 others"

# ---- --stop cuts before the string; bf16 runs -------------------------------------------------
completion=$(json_line "$(head -1 "$TMP/text.json")" "j['completion']")
stop=${completion:8:3} later=${completion:14:3}
[ -n "$later" ] || fail "the greedy completion is too short to stop in: '$completion'"
# two stop strings: the one that comes first in the text cuts, whichever is listed first
"$K" generate "$TMP/l3" --prompt "$text" --max-new-tokens 30 --stop "$stop" --stop "$later" --json >"$TMP/stop.json" \
  2>/dev/null || fail "--stop"
python3 - "$TMP/stop.json" "$completion" "$stop" "$later" <<'PY' || fail "--stop '$stop' --stop '$later'"
import json, sys
j = json.loads(open(sys.argv[1]).readline())
full, a, b = sys.argv[2:5]
assert j["finish_reason"] == "stop" and j["completion"] == full[:min(full.index(a), full.index(b))], (j, full, a, b)
PY
"$K" generate "$TMP/l3" --prompt "$text" --max-new-tokens 30 --stop "$stop" >"$TMP/stop.out" 2>/dev/null
[ "$(cat "$TMP/stop.out")" = "${completion%%"$stop"*}" ] || fail "streamed --stop: '$(cat "$TMP/stop.out")'"
"$K" generate "$TMP/l3" --prompts "$FIX/hf_tiny_llama3/generate_prompts.jsonl" --max-new-tokens 16 --bf16 --json \
  --ignore-eos >"$TMP/bf16" 2>/dev/null || fail "--bf16"
[ "$(python3 -c 'import json,sys; print(sum(json.loads(l)["completion_tokens"] for l in open(sys.argv[1])))' "$TMP/bf16")" = 80 ] ||
  fail "--bf16 --ignore-eos: not 16 tokens a prompt: $(cat "$TMP/bf16")"
pass "--stop '$stop' --stop '$later' cut before the earlier (JSON), --stop '$stop' streamed; --bf16 --ignore-eos gives 5 x 16 tokens"

# ---- bad input ---------------------------------------------------------------------------------
python3 -c 'import json; print(json.dumps({"prompt": [1] + [5] * 140}))' >"$TMP/long.jsonl"
expect_input_error "a prompt past the context" "prompt 1 has 141 tokens: the model's context is 128" \
  "$K" generate "$TMP/l3" --prompts "$TMP/long.jsonl"
expect_input_error "temperature < 0" "^keel: error: --temperature '-0.5'" "$K" generate "$TMP/l3" --prompt x --temperature -0.5
expect_input_error "top-p 0" "^keel: error: --top-p 0: must be in \(0, 1\]" "$K" generate "$TMP/l3" --prompt x --top-p 0
expect_input_error "top-p 1.5" "^keel: error: --top-p '1.5'" "$K" generate "$TMP/l3" --prompt x --top-p 1.5
expect_input_error "an unknown stop token" "stop-token '<\|nope\|>': unknown stop token" \
  "$K" generate "$TMP/l3" --prompt x --stop-token '<|nope|>'
printf '{"prompt": "a"}\n{"text": "b"}\n' >"$TMP/bad.jsonl"
expect_input_error "a line without prompt" "bad.jsonl:2: no \"prompt\" key" "$K" generate "$TMP/l3" --prompts "$TMP/bad.jsonl"
echo '{"prompt": [1, 128]}' >"$TMP/oov.jsonl"
expect_input_error "an id past the vocabulary" "prompt 1: token id 128 is outside the vocabulary \[0, 128\)" \
  "$K" generate "$TMP/l3" --prompts "$TMP/oov.jsonl"
