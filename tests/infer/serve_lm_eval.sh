#!/usr/bin/env bash
# tests/infer/serve_lm_eval.sh: `keel serve` on the hf_tiny_llama3 fixture (with its tokenizer.json),
# on a free port (--port 0), held to what clients need of it:
#   - the real lm-evaluation-harness from PyPI (`lm_eval --model local-completions`, pinned below)
#     scores the 24-question task file of eval_matches_hf through it and reports the acc and acc_norm
#     that `keel eval --task` reports, each choice's log-likelihood within 1e-5 relative and its
#     is_greedy the same — once with token-id prompts batched 8 to a request
#     (tokenized_requests=True, lm-eval's default) and once with text prompts one at a time
#     (tokenized_requests=False). Both pass add_bos_token=True: keel eval puts the model's BOS first,
#     as lm-eval's own Hugging Face backend does for Llama (its tokenizer adds BOS), while
#     local-completions encodes without special tokens unless told (docs/inference.md, "keel serve");
#   - greedy completions are `keel generate`'s; a seeded sample is the same twice; stop strings cut;
#     8 requests that decode alike, waiting behind a long one, run 4 to a batch (--batch 4; the
#     batch is read from their ids) and answer what each answers alone (logprobs within 1e-5);
#   - bad input is a 400 naming the field and the server keeps serving: malformed JSON, temperature
#     -1, top_p 0 and 1.5, a prompt past the model's context (129 ids; 128 with a token to generate),
#     stream and n; a body over 4 MiB is a 413; a full queue is a 503 naming --queue (provoked by a
#     long request running and another waiting, with --batch 1 --queue 1, made longer until /health
#     shows both still there after the refused one);
#   - stdout holds the URL alone; SIGTERM stops it with exit 0; no PATH, a --host that is not an
#     IP address, a model without a tokenizer and a port in use exit 2 with one line.
# Why this venv: lm-eval[api] and transformers (for the tokenizer local-completions loads) from
# PyPI, cached in $KEEL_CACHE/venv-lm-eval — the whole install, not a --no-deps subset, so that
# the lm_eval that runs is the one users get; transformers does not need torch to tokenize, and
# lm-eval pulls no torch, so the venv is standalone (about 1 GB, two minutes the first time) and
# works the same where scripts/setup-torch.sh's venv is absent.
source "$KEEL_SRC/tests/lib.sh"
LM_EVAL_VERSION=0.4.13 TRANSFORMERS_VERSION=5.25.0
K=$KEEL_BIN
FIX=$KEEL_SRC/tests/reference/fixtures
task=$FIX/hf_tiny_llama3/task.jsonl
mkdir "$TMP/l3"
cp "$FIX"/hf_tiny_llama3/{config.json,model.safetensors,generation_config.json} \
   "$FIX"/hf_tiny_llama3_tokenizer/{tokenizer.json,tokenizer_config.json} "$TMP/l3/"

# ---- servers: started here, stopped by pid ----
pids=()
stop_servers() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap 'stop_servers; rm -rf "$TMP"' EXIT
# start NAME ARGS...: keel serve on a free port; sets URL (the base, .../v1) and PID
start() {
  local name=$1; shift
  "$K" serve "$TMP/l3" --port 0 "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" &
  PID=$!
  pids+=("$PID")
  for _ in $(seq 1 600); do
    [ -s "$TMP/$name.out" ] && break
    kill -0 "$PID" 2>/dev/null || fail "keel serve $*: exited: $(cat "$TMP/$name.err")"
    sleep 0.1
  done
  URL=$(head -n 1 "$TMP/$name.out")
  [[ $URL =~ ^http://127\.0\.0\.1:[0-9]+/v1$ ]] || fail "keel serve printed '$URL', not its URL"
}
# http METHOD URL [BODY]: prints the status code, a space, and the body
http() {
  python3 - "$@" <<'PY'
import sys, urllib.request, urllib.error
method, url = sys.argv[1], sys.argv[2]
data = sys.argv[3].encode() if len(sys.argv) > 3 else None
req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=600) as r:
        print(r.status, r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
PY
}
post() { http POST "$URL/completions" "$1"; }
# expect_error NAME CODE PARAM PATTERN BODY: the answer is CODE, an OpenAI error naming PARAM whose message matches PATTERN
expect_error() {
  local name=$1 code=$2 param=$3 pattern=$4 got
  got=$(post "$5")
  [ "${got%% *}" = "$code" ] || fail "$name: want HTTP $code, got: $got"
  python3 - "${got#* }" "$param" "$pattern" <<'PY' || fail "$name: $got"
import json, re, sys
e = json.loads(sys.argv[1])["error"]
assert e["type"] in ("invalid_request_error", "server_busy"), e
assert (e["param"] or "") == sys.argv[2], e
assert re.search(sys.argv[3], e["message"]) and "\n" not in e["message"], e
PY
  pass "$name: $code $(json_line "${got#* }" "j['error']['message']")"
}

expect_input_error "no PATH" "usage: keel serve PATH" "$K" serve
expect_input_error "a host that is not an IP address" 'host "localhost:80" is not a numeric IP address' \
  "$K" serve "$TMP/l3" --host localhost:80 --port 0
mkdir "$TMP/notok" && cp "$FIX"/hf_tiny_llama3/{config.json,model.safetensors} "$TMP/notok/"
expect_input_error "a model without a tokenizer" "keel serve needs the model's tokenizer" "$K" serve "$TMP/notok" --port 0
start main --batch 4
port=${URL##*:} port=${port%/v1}
expect_input_error "a port in use" "127.0.0.1:$port: cannot listen: Address already in use" "$K" serve "$TMP/l3" --port "$port"
out=$(http GET "$URL/models")
[ "$(json_line "${out#* }" "j['data'][0]['id']")" = "$TMP/l3" ] || fail "GET /v1/models: $out"
[ "$(json_line "$(http GET "${URL%/v1}/health" | cut -d' ' -f2-)" "j['status']")" = ok ] || fail "GET /health"
python3 - "$URL" <<'PY' || fail "methods, paths and the Host check"
import sys, urllib.request, urllib.error
url = sys.argv[1]
def code(method, path, host=None):
    req = urllib.request.Request(url + path, method=method, data=b"{}" if method == "POST" else None)
    if host: req.add_header("Host", host)
    try:
        return urllib.request.urlopen(req, timeout=60).status
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Allow")
assert code("DELETE", "/completions") == (405, "POST"), code("DELETE", "/completions")
assert code("POST", "/models") == (405, "GET, HEAD"), code("POST", "/models")
assert code("GET", "/nothing")[0] == 404 and code("GET", "/models", "localhost:1") == 200
assert code("GET", "/models", "evil.example")[0] == 421, "a Host that is not loopback (DNS rebinding)"
print("ok   405 naming the method a path takes, 404 elsewhere, 421 for a Host that is not loopback")
PY

# ---- bad input: 400 naming the field, and the server goes on ----
expect_error "malformed JSON" 400 "" "not valid JSON \(at byte" '{"prompt": "every keel", "max_tokens": 4,'
ok=$(post '{"prompt": "every keel", "max_tokens": 4, "temperature": 0}')
[ "${ok%% *}" = 200 ] || fail "the request after a malformed one: $ok"
pass "the next request is answered: $(json_line "${ok#* }" "repr(j['choices'][0]['text'])")"
expect_error "temperature -1" 400 temperature "must be 0 \(greedy\) or more" '{"prompt": "a", "temperature": -1}'
expect_error "top_p 0" 400 top_p "must be in \(0, 1\]" '{"prompt": "a", "top_p": 0}'
expect_error "top_p 1.5" 400 top_p "must be in \(0, 1\]" '{"prompt": "a", "top_p": 1.5}'
expect_error "max_tokens -1" 400 max_tokens "must be from 0" '{"prompt": "a", "max_tokens": -1}'
expect_error "a prompt of the wrong shape" 400 prompt "must be a string, a list of strings" '{"prompt": {"a": 1}}'
ids129=$(python3 -c 'print(",".join(["5"] * 129))') ids128=$(python3 -c 'print(",".join(["5"] * 128))')
expect_error "a prompt past the context" 400 prompt "has 129 tokens: the model's context is 128 tokens.*nothing is cut" \
  "{\"prompt\": [$ids129], \"max_tokens\": 0, \"echo\": true, \"logprobs\": 0}"
expect_error "a prompt that fills the context, a token asked" 400 prompt "has 128 tokens.*room for at least one new token" \
  "{\"prompt\": [$ids128], \"max_tokens\": 1}"
full=$(post "{\"prompt\": [$ids128], \"max_tokens\": 0, \"echo\": true, \"logprobs\": 1}")
[ "${full%% *}" = 200 ] && [ "$(json_line "${full#* }" "len(j['choices'][0]['logprobs']['tokens'])")" = 128 ] ||
  fail "a prompt of exactly the context, scored (echo, max_tokens 0): ${full:0:300}"
pass "a prompt of exactly the context is scored (echo, max_tokens 0): 128 tokens"
expect_error "an id outside the vocabulary" 400 prompt "prompt 2 of 2: token id 128 is outside the vocabulary" \
  '{"prompt": [[1, 2], [1, 128]]}'
expect_error "stream" 400 stream "streaming is not supported" '{"prompt": "a", "stream": true}'
expect_error "n 2" 400 n "only 1 completion a prompt" '{"prompt": "a", "n": 2}'
expect_error "logprobs 6" 400 logprobs "from 0 to 5" '{"prompt": "a", "logprobs": 6}'
python3 -c 'import json; print(json.dumps({"prompt": "a" * (5 << 20)}))' >"$TMP/big.json"
big=$(python3 - "$URL/completions" "$TMP/big.json" <<'PY'
import sys, urllib.request, urllib.error
try:
    urllib.request.urlopen(urllib.request.Request(sys.argv[1], data=open(sys.argv[2], "rb").read()), timeout=60)
    print(200)
except urllib.error.HTTPError as e:
    print(e.code)
except (ConnectionError, urllib.error.URLError) as e:  # the server may close before the whole body is sent
    print("closed", e)
PY
)
[[ $big == 413 || $big == closed* ]] || fail "a 5 MiB body: $big"
[ "$(post '{"prompt": "a", "max_tokens": 1}' | cut -d' ' -f1)" = 200 ] || fail "the request after a 5 MiB body"
pass "a 5 MiB body is refused ($big) and the server goes on"

# ---- what it generates ----
"$K" generate "$TMP/l3" --prompt "every keel" --max-new-tokens 12 --json >"$TMP/gen.json" 2>/dev/null || fail "keel generate"
got=$(post '{"prompt": "every keel", "max_tokens": 12, "temperature": 0, "logprobs": 2}')
python3 - "${got#* }" "$TMP/gen.json" <<'PY' || fail "greedy completion against keel generate: $got"
import json, sys
a, g = json.loads(sys.argv[1]), json.loads(open(sys.argv[2]).read())
c = a["choices"][0]
assert a["object"] == "text_completion" and c["text"] == g["completion"], (c["text"], g["completion"])
assert c["finish_reason"] == g["finish_reason"], (c, g)
lp = c["logprobs"]
n = g["completion_tokens"] + (g["finish_reason"] == "stop")  # the stop token is in logprobs, not in the text
assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == n, lp
for tok, x, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
    assert x <= 0 and abs(max(top.values()) - x) < 1e-9, (tok, x, top)  # greedy: the token is the top one
assert a["usage"]["prompt_tokens"] == g["prompt_tokens"] and a["usage"]["completion_tokens"] == n, a["usage"]
print(f"ok   greedy = keel generate: {c['text']!r} ({c['finish_reason']}), each token the top one of its logprobs")
PY
s1=$(post '{"prompt": ["every keel", "the"], "max_tokens": 10, "temperature": 1.0, "top_p": 0.9, "seed": 7}')
s2=$(post '{"prompt": ["every keel", "the"], "max_tokens": 10, "temperature": 1.0, "top_p": 0.9, "seed": 7}')
[ "${s1%% *}" = 200 ] || fail "seeded sampling: $s1"
[ "$(json_line "${s1#* }" "[c['text'] for c in j['choices']]")" = "$(json_line "${s2#* }" "[c['text'] for c in j['choices']]")" ] ||
  fail "the same seed gave other samples: $s1 / $s2"
pass "seeded sampling gives the same text twice: $(json_line "${s1#* }" "[c['text'] for c in j['choices']]")"
# a stop string: the greedy text's second character, which cuts it before its first occurrence
stop_body=$(json_line "${ok#* }" "json.dumps({'prompt': 'every keel', 'max_tokens': 4, 'temperature': 0, 'stop': [j['choices'][0]['text'][1:2] or 'x']})")
cut=$(post "$stop_body")
python3 - "${ok#* }" "${cut#* }" <<'PY' || fail "stop: $stop_body: $cut"
import json, sys
text, cut = json.loads(sys.argv[1])["choices"][0]["text"], json.loads(sys.argv[2])["choices"][0]
stop = text[1:2] or "x"
want = text[:text.index(stop)] if stop in text else text
assert cut["text"] == want and cut["finish_reason"] == ("stop" if stop in text else "length"), (text, stop, cut)
print(f"ok   stop {stop!r} cuts {text!r} to {want!r} ({cut['finish_reason']})")
PY

# ---- requests batched: 8 that decode alike wait behind a long one, and run 4 to a batch (--batch 4) ----
python3 - "$URL" <<'PY' || fail "batched requests"
import json, sys, threading, time, urllib.request
url = sys.argv[1]
def call(method, path, body=None):
    req = urllib.request.Request((url[:-len("/v1")] if path == "/health" else url) + path, data=json.dumps(body).encode() if body else None, method=method)
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())
health = lambda: call("GET", "/health")
prompts = ["every keel", "the", "writes text", "reads", "keel rank", "with every", "travels and", "shards"]
ask = lambda p: {"prompt": p, "max_tokens": 6, "temperature": 0, "logprobs": 2, "echo": True}
solo = [call("POST", "/completions", ask(p)) for p in prompts]
for n in (16, 64, 256, 1024):  # the long request: made longer until the 8 are seen waiting behind it
    slow = threading.Thread(target=call, args=("POST", "/completions", {"prompt": ["a"] * n, "max_tokens": 100,
                                                                       "temperature": 1, "ignore_eos": True}))
    slow.start()
    while slow.is_alive() and health()["running"] == 0: time.sleep(0.01)
    got = [None] * len(prompts)
    def one(i): got[i] = call("POST", "/completions", ask(prompts[i]))
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads: t.start()
    waiting = False
    while slow.is_alive() and not waiting: waiting = health()["queued"] == len(prompts); time.sleep(0.005)
    waiting = waiting and slow.is_alive()
    for t in threads + [slow]: t.join()
    if waiting: break
assert waiting, "no request ran long enough for 8 to wait behind it"
batches = {}
for a in got: batches.setdefault(a["id"].rsplit("-", 1)[0], []).append(a)  # cmpl-START-BATCH-i
assert sorted(len(b) for b in batches.values()) == [4, 4], [a["id"] for a in got]
worst = 0
for a, b in zip(got, solo):
    x, y = a["choices"][0], b["choices"][0]
    assert x["text"] == y["text"] and x["logprobs"]["tokens"] == y["logprobs"]["tokens"], (x, y)
    for p, q in zip(x["logprobs"]["token_logprobs"][1:], y["logprobs"]["token_logprobs"][1:]):
        worst = max(worst, abs(p - q))
assert worst < 1e-5, worst
print(f"ok   8 requests that waited ran 4 to a batch: the same texts and tokens as alone, logprobs within {worst:.1e}")
PY

# ---- lm-evaluation-harness against it ----
venv="${KEEL_CACHE:-$KEEL_SRC/.cache}/venv-lm-eval"
if ! "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('lm_eval') != '$LM_EVAL_VERSION' or m.version('transformers') != '$TRANSFORMERS_VERSION')" 2>/dev/null; then
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  base=/usr/bin/python3
  [ -x "$base" ] || base=$(command -v python3)
  "$base" -m venv "$venv" >"$TMP/venv.log" 2>&1 || fail "cannot make a venv at $venv: $(tail -n 2 "$TMP/venv.log")"
  "$venv/bin/pip" install -q "lm_eval[api]==$LM_EVAL_VERSION" "transformers==$TRANSFORMERS_VERSION" >>"$TMP/venv.log" 2>&1 ||
    fail "pip install lm_eval[api]==$LM_EVAL_VERSION transformers==$TRANSFORMERS_VERSION failed: $(tail -n 2 "$TMP/venv.log")"
fi
mkdir "$TMP/tasks"
cat >"$TMP/tasks/keel_tiny_mc.yaml" <<EOF
task: keel_tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: $task
test_split: test
output_type: multiple_choice
doc_to_text: "{{context}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{answer}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
EOF
"$K" eval "$TMP/l3" --task "$task" --samples "$TMP/keel_samples.jsonl" --json >"$TMP/keel_eval.json" 2>"$TMP/err" ||
  fail "keel eval: $(cat "$TMP/err")"
# lm_eval_run NAME TOKENIZED BATCH: lm_eval through the server; checks its numbers against keel eval's
lm_eval_run() {
  local name=$1 tokenized=$2 batch=$3
  HF_HOME=$TMP/hf HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
    "$venv/bin/lm_eval" --model local-completions \
    --model_args "model=keel,base_url=$URL/completions,tokenizer=$TMP/l3,tokenizer_backend=huggingface,tokenized_requests=$tokenized,add_bos_token=True,max_length=128" \
    --batch_size "$batch" --tasks keel_tiny_mc --include_path "$TMP/tasks" --output_path "$TMP/lm_$name" --log_samples \
    >"$TMP/lm_$name.log" 2>&1 || fail "lm_eval ($name): $(tail -n 5 "$TMP/lm_$name.log")"
  python3 - "$TMP/lm_$name" "$TMP/keel_eval.json" "$TMP/keel_samples.jsonl" "$name" <<'PY' || fail "lm_eval ($name) against keel eval"
import glob, json, sys
out, keel, samples, name = sys.argv[1:]
res = json.load(open(glob.glob(f"{out}/*/results_*.json")[0]))["results"]["keel_tiny_mc"]
k = json.load(open(keel))
assert res["acc,none"] == k["acc"] and res["acc_norm,none"] == k["acc_norm"], (res, k)
lm = sorted((json.loads(l) for l in open(glob.glob(f"{out}/*/samples_*.jsonl")[0])), key=lambda d: d["doc_id"])
ke = [json.loads(l) for l in open(samples)]
assert len(lm) == len(ke) == k["samples"] == 24, (len(lm), len(ke))
worst = 0
for a, b in zip(lm, ke):
    for r, ll, greedy in zip(a["resps"], b["loglik"], b["greedy"]):
        worst = max(worst, abs(float(r[0][0]) - ll) / abs(ll))
        assert (r[0][1] == "True") == greedy, (a["doc_id"], r, greedy)
assert worst < 1e-5, worst
print(f"ok   lm_eval {name}: acc {res['acc,none']:.4f}, acc_norm {res['acc_norm,none']:.4f} = keel eval's; "
      f"70 choices' log-likelihoods within {worst:.1e} relative, is_greedy the same")
PY
}
lm_eval_run "token ids, 8 a request" True 8
lm_eval_run "text, one a request" False 1

# ---- stdout and SIGTERM ----
[ "$(wc -l <"$TMP/main.out")" = 1 ] || fail "stdout holds more than the URL: $(cat "$TMP/main.out")"
kill -TERM "$PID"
rc=0
wait "$PID" || rc=$?
[ "$rc" = 0 ] || fail "keel serve exited $rc on SIGTERM: $(tail -n 3 "$TMP/main.err")"
grep -q "stopping" "$TMP/main.err" || fail "no line about stopping: $(cat "$TMP/main.err")"
pass "SIGTERM: keel serve stopped, exit 0; stdout held its URL alone"

# ---- a full queue: one request running, one waiting (--batch 1 --queue 1), a third refused ----
start queue --batch 1 --queue 1
health() { http GET "${URL%/v1}/health" | cut -d' ' -f2-; }
refused=""
for n in 16 64 256 1024; do
  body=$(python3 -c 'import json,sys; print(json.dumps({"prompt": ["a"] * int(sys.argv[1]), "max_tokens": 100, "temperature": 1, "ignore_eos": True, "seed": 1}))' "$n")
  post "$body" >"$TMP/r1" &
  r1=$!
  while kill -0 "$r1" 2>/dev/null && [ "$(json_line "$(health)" "j['running']")" != 1 ]; do sleep 0.02; done
  post '{"prompt": "a", "max_tokens": 1}' >"$TMP/r2" &
  r2=$!
  while kill -0 "$r2" 2>/dev/null && [ "$(json_line "$(health)" "j['queued']")" != 1 ]; do sleep 0.02; done
  r3=$(post '{"prompt": "b", "max_tokens": 1}')
  h=$(health)
  wait "$r1" "$r2"
  if [ "$(json_line "$h" "j['running'], j['queued']")" = "1 1" ]; then refused=$r3; break; fi
done
[ -n "$refused" ] || fail "no request ran long enough to fill the queue (up to 1024 prompts of 100 tokens)"
[ "${refused%% *}" = 503 ] || fail "a third request with one running and one queued (--queue 1): $refused"
json_line "${refused#* }" "j['error']['message']" | grep -q -- "--queue 1" || fail "the 503 does not name --queue: $refused"
[ "$(cut -d' ' -f1 "$TMP/r1")" = 200 ] && [ "$(cut -d' ' -f1 "$TMP/r2")" = 200 ] || fail "the running and the queued request: $(cut -c1-200 "$TMP/r1") / $(cat "$TMP/r2")"
[ "$(post '{"prompt": "c", "max_tokens": 1}' | cut -d' ' -f1)" = 200 ] || fail "a request once the queue emptied"
pass "a full queue: 503 $(json_line "${refused#* }" "j['error']['message']"); the running and the waiting one answered, the next one too"
kill -TERM "$PID"
rc=0
wait "$PID" || rc=$?
[ "$rc" = 0 ] || fail "the second keel serve exited $rc on SIGTERM: $(tail -n 5 "$TMP/queue.err")"
