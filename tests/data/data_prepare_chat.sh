#!/usr/bin/env bash
# `keel data prepare --format chat` gives, for Llama 3 Instruct's and Llama 2 chat's
# templates, the ids of transformers' apply_chat_template(messages, tokenize=True) with
# the same tokenizer.json, and a loss mask that is 1 exactly on the answers: on 300
# conversations (a system message or not, 1-4 turns, non-ASCII, whitespace at the ends of
# contents that the templates strip, empty contents, "[INST]" and special tokens written
# inside contents) over tokenizer.json files built with `tokenizers` (tests/data/
# hf_tokenizers.py: llama3 byte-level BPE with Llama 3's special tokens, llama2 SentencePiece-
# style). Compared three ways: keel's shards (read here over the documented layout) against a
# Python rendering encoded by `tokenizers` (mask from its offsets), and that against
# transformers (its chat templates; the mask from return_assistant_tokens_mask over the same
# templates with {% generation %}) where the venv of scripts/setup-torch.sh is (else a SKIP
# line, and the rest still runs). Also: each conversation whole in train or val, shards
# bit-identical for 1, 2 and 3 threads and for .jsonl.gz/.zst, a SentencePiece .model gives
# the tokenizer.json's shards for llama2, --max-tokens stops at a conversation's end, the
# summary's trained share is the shards', a short training run reads the shards, and every
# kind of bad input exits 2 with one line naming the file (and line) and the fix, leaving the
# prepared directory that was there as it was.
source "$KEEL_SRC/tests/lib.sh"
for tool in spm_train spm_export_vocab gzip zstd; do
    command -v "$tool" >/dev/null || fail "$tool not found (run scripts/install-deps.sh)"
done
export RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
TOKENIZERS_VERSION=0.23.3
t0=$SECONDS

# ---- tokenizers, in the venv tokenizer_matches_hf.sh makes (once) --------------------------
venv="${KEEL_CACHE:-$KEEL_SRC/.cache}/venv-hf"
hf_python="$venv/bin/python"
pinned_venv "$venv" tokenizers "$TOKENIZERS_VERSION"
ref() { "$hf_python" "$KEEL_SRC/tests/data/chat_reference.py" "$@"; }
torch_python="${KEEL_TORCH_VENV:-/opt/keel-torch}/bin/python"

# ---- conversations and tokenizers ------------------------------------------------------------
cd "$TMP"
ref corpus conv.jsonl 300 1
ref corpus plain.jsonl 200 2 plain      # no special tokens written in the text (the .model check)
[ "$(grep -c . conv.jsonl)" -gt 300 ] || fail "the corpus has $(grep -c . conv.jsonl) lines"
grep -q '<|eot_id|>' conv.jsonl && grep -q '\[INST\]' conv.jsonl || fail "the corpus lacks special tokens or [INST] in text"
licenses=()
for f in GPL-3 Apache-2.0 LGPL-2.1 MPL-2.0; do
    [ -f "/usr/share/common-licenses/$f" ] && licenses+=("/usr/share/common-licenses/$f")
done
[ ${#licenses[@]} -ge 2 ] || fail "need at least two texts from /usr/share/common-licenses"
{ cat "${licenses[@]}"; python3 -c "
import json
for line in open('conv.jsonl'):
    if line.strip():
        for m in json.loads(line)['messages']: print(m['content'])"; } > train.txt
spm_train --input=train.txt --model_prefix=spm --model_type=bpe --vocab_size=2000 --byte_fallback=true \
    --character_coverage=0.9995 --normalization_rule_name=identity --remove_extra_whitespaces=false \
    --split_digits=true --allow_whitespace_only_pieces=true --hard_vocab_limit=false --num_threads=2 \
    --minloglevel=1 > spm.log 2>&1 || fail "spm_train: $(tail -n 3 spm.log)"
spm_export_vocab --model=spm.model > spm.vocab
"$hf_python" "$KEEL_SRC/tests/data/hf_tokenizers.py" make_chat tok train.txt spm.vocab \
    || fail "building the tokenizer.json files failed"

prepare() { # NAME TEMPLATE ARGS...: prepare --format chat into prep/NAME, the summary in prep/NAME.txt
    local name=$1 template=$2; shift 2
    mkdir -p prep
    "$KEEL_BIN" data prepare --format chat --chat-template "$template" --out "prep/$name" \
        --val-fraction 0.2 "$@" > "prep/$name.txt" 2> "prep/$name.err" \
        || fail "prepare $name: exit $? ($(cat "prep/$name.err"))"
    [ ! -s "prep/$name.err" ] || fail "prepare $name: stderr: $(cat "prep/$name.err")"
}
same() { # A B: the two prepared directories hold the same files, bit for bit
    [ "$(ls "prep/$1")" = "$(ls "prep/$2")" ] || fail "$2 holds $(ls "prep/$2" | tr '\n' ' '), $1 $(ls "prep/$1" | tr '\n' ' ')"
    for f in "prep/$1"/*.bin; do
        cmp -s "$f" "prep/$2/$(basename "$f")" || fail "$2/$(basename "$f") differs from $1's"
    done
}

# ---- ids and mask against the references -------------------------------------------------
gzip -k conv.jsonl
zstd -q -k conv.jsonl
for t in llama3 llama2; do
    model=tok/$t/tokenizer.json
    prepare $t $t --model $model --input conv.jsonl --threads 2
    ref reference $t tok/$t conv.jsonl $t.ref || fail "$t: the Python reference failed"
    read -r n n_train n_val tokens trained < <(ref check prep/$t $t.ref) || fail "$t: keel's shards differ from the reference (above)"
    [ "$n" = 300 ] && [ "$n_train" -gt 0 ] && [ "$n_val" -gt 0 ] || fail "$t: $n records, $n_train in train, $n_val in val"
    share=$(python3 -c "print('%.1f' % (100 * $trained / $tokens))")
    grep -qx "chat: 300 conversations (--chat-template $t): $trained of $tokens tokens trained on ($share%: the assistant's turns), the longest [0-9]* tokens" prep/$t.txt \
        || fail "$t: summary: $(grep '^chat:' prep/$t.txt) (want $trained of $tokens)"
    grep -q "^total: $tokens tokens from 300 documents" prep/$t.txt || fail "$t: $(grep '^total:' prep/$t.txt)"
    pass "$t: 300 conversations ($n_train train, $n_val val, each whole): ids and mask equal the Python rendering's through tokenizers; $share% of $tokens tokens trained on"
    prepare ${t}_1 $t --model $model --input conv.jsonl --threads 1
    prepare ${t}_3 $t --model $model --input conv.jsonl.gz --threads 3
    prepare ${t}_zst $t --model $model --input conv.jsonl.zst
    same $t ${t}_1 && same $t ${t}_3 && same $t ${t}_zst
    pass "$t: 1, 2 and 3 threads, .jsonl.gz and .jsonl.zst: bit-identical shards"
done
if [ -x "$torch_python" ] && "$torch_python" -c "import transformers" 2>/dev/null; then
    for t in llama3 llama2; do
        "$torch_python" "$KEEL_SRC/tests/data/chat_reference.py" transformers $t tok/$t conv.jsonl $t.tf 2> tf.err \
            || fail "$t: transformers: $(grep -v -i warn tf.err | tail -n 3)"
        cmp -s $t.ref $t.tf || fail "$t: transformers' apply_chat_template ids or assistant mask differ from the reference: $(cmp $t.ref $t.tf)"
    done
    pass "transformers $("$torch_python" -c 'import transformers; print(transformers.__version__)'): apply_chat_template ids and assistant masks equal keel's (llama3, llama2)"
else
    echo "SKIP the comparison with transformers: no venv at ${KEEL_TORCH_VENV:-/opt/keel-torch} (make it with scripts/setup-torch.sh); keel's shards were checked against tokenizers"
fi

# ---- a SentencePiece .model for llama2 --------------------------------------------------
prepare model_json llama2 --model tok/llama2/tokenizer.json --input plain.jsonl
prepare model_spm llama2 --model spm.model --input plain.jsonl
same model_json model_spm
ref reference llama2 tok/llama2 plain.jsonl plain.ref
ref check prep/model_spm plain.ref > /dev/null || fail "llama2 .model: the shards differ from the reference (above)"
pass "llama2 with the SentencePiece .model: the tokenizer.json's shards (BOS/EOS from the model)"

# ---- --max-tokens stops at a conversation's end --------------------------------------------
prepare all llama3 --model tok/llama3/tokenizer.json --input conv.jsonl --val-fraction 0
total=$(awk '/^total:/ { print $2 }' prep/all.txt)
cap=$((total / 3))
prepare cap llama3 --model tok/llama3/tokenizer.json --input conv.jsonl.zst --val-fraction 0 --max-tokens $cap --threads 3
read -r n _ _ got _ < <(ref check prep/cap llama3.ref prefix) || fail "--max-tokens: not a prefix of whole conversations (above)"
[ "$got" -ge "$cap" ] && [ "$got" -lt "$total" ] && grep -q "^cap: --max-tokens $cap reached at the end of a document ($got tokens)" prep/cap.txt \
    || fail "--max-tokens $cap: $got of $total tokens; $(grep '^cap:' prep/cap.txt)"
pass "--max-tokens $cap: the first $n conversations whole ($got tokens)"

# ---- the shards train: a few steps of a small model read them with their mask ----------------
vocab=$(python3 -c "import struct; print(struct.unpack_from('<I', open('prep/llama3/train-00000.bin', 'rb').read(), 24)[0])")
cat > micro.json <<EOF
{"model": {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": $vocab, "multiple_of": 32,
           "max_seq_len": 64},
 "train": {"steps": 3, "micro_batch_size": 4, "lr": 3e-3, "warmup_steps": 1, "threads": 2},
 "data": {"path": "$TMP/prep/llama3"}}
EOF
"$KEEL_BIN" train micro.json --run-dir run > train.log 2>&1 || fail "keel train on the chat shards: $(tail -n 3 train.log)"
[ "$(json run/summary.json 'j["status"]')" = completed ] || fail "train: $(cat run/summary.json)"
python3 - run/metrics.jsonl <<'PY' || fail "train: the loss"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 3 and all(math.isfinite(r["loss"]) and r["loss"] > 0 for r in rows), rows
PY
pass "keel train reads the chat shards (3 steps, finite loss)"

# ---- bad input: exit 2, one line naming the file (and line) and the fix, nothing overwritten --
prepare keep llama3 --model tok/llama3/tokenizer.json --input plain.jsonl --val-fraction 0
keep_sums=$(cd prep/keep && md5sum ./*.bin)
keep_files=$(ls -A prep/keep)
n_bad=0
bad() { # NAME PATTERN ARGS...: prepare --force into prep/keep must fail with one line
    local name=$1 pattern=$2; shift 2
    n_bad=$((n_bad + 1))
    expect_input_error "$name" "$pattern" "$KEEL_BIN" data prepare --out "$TMP/prep/keep" --force "$@"
    [ "$(cd prep/keep && md5sum ./*.bin)" = "$keep_sums" ] && [ "$(ls -A prep/keep)" = "$keep_files" ] \
        || fail "$name: the dataset in --out changed: $(ls -A prep/keep | tr '\n' ' ')"
}
chat3=(--format chat --chat-template llama3 --model tok/llama3/tokenizer.json)
U='{"role": "user", "content": "hi"}'
A='{"role": "assistant", "content": "hello"}'
S='{"role": "system", "content": "be brief"}'
record() { # NAME LINE: conv.jsonl's first 40 lines, then LINE (line 41)
    head -n 40 conv.jsonl > "$1.jsonl"
    printf '%s\n' "$2" >> "$1.jsonl"
}
record nomsg '{"text": "hi", "id": 3}'
bad "no messages" 'nomsg\.jsonl:41: the record has no "messages" key \(its keys: "text", "id"\); a chat record holds the conversation as "messages": \[' \
    "${chat3[@]}" --input nomsg.jsonl
record notarray '{"messages": "hi"}'
bad "messages not an array" 'notarray\.jsonl:41: "messages" is a string, not an array; it must list' "${chat3[@]}" --input notarray.jsonl
record empty '{"messages": []}'
bad "no messages at all" 'empty\.jsonl:41: "messages" is empty; a conversation needs' "${chat3[@]}" --input empty.jsonl
record notobj "{\"messages\": [$U, \"hello\"]}"
bad "a message not an object" 'notobj\.jsonl:41: message 2 is a string, not an object; each message is \{"role"' "${chat3[@]}" --input notobj.jsonl
record norole "{\"messages\": [{\"content\": \"hi\"}, $A]}"
bad "no role" 'norole\.jsonl:41: message 1 has no "role"; give each message "role": "system", "user" or "assistant"' "${chat3[@]}" --input norole.jsonl
record rolenum "{\"messages\": [$U, {\"role\": 2, \"content\": \"x\"}]}"
bad "role not a string" 'rolenum\.jsonl:41: message 2 has a "role" that is a number, not a string' "${chat3[@]}" --input rolenum.jsonl
record nocontent "{\"messages\": [$U, {\"role\": \"assistant\"}]}"
bad "no content" 'nocontent\.jsonl:41: message 2 \(assistant\) has no "content"; give each message its text as "content"' "${chat3[@]}" --input nocontent.jsonl
for v in '5|a number' 'null|null' '["a"]|an array' '{"text": "a"}|an object'; do
    record content "{\"messages\": [$U, {\"role\": \"assistant\", \"content\": ${v%%|*}}]}"
    bad "content is ${v#*|}" "content\.jsonl:41: message 2 \(assistant\) has a \"content\" that is ${v#*|}, not a string" "${chat3[@]}" --input content.jsonl
done
record role "{\"messages\": [$U, {\"role\": \"bot\", \"content\": \"x\"}]}"
bad "unknown role" 'role\.jsonl:41: message 2 has role "bot"; the roles are "system", "user" and "assistant"' "${chat3[@]}" --input role.jsonl
record twice "{\"messages\": [$S, $U, $U, $A]}"
bad "user twice" "twice\.jsonl:41: message 3 is the user's after the user's message 2; messages must alternate user, assistant" "${chat3[@]}" --input twice.jsonl
record first "{\"messages\": [$S, $A, $U, $A]}"
bad "assistant first" "first\.jsonl:41: message 2 is the assistant's, before any user message; a conversation starts with the user" "${chat3[@]}" --input first.jsonl
record sys "{\"messages\": [$U, $A, $S, $U, $A]}"
bad "system later" 'sys\.jsonl:41: message 3 is a system message; only the first message may be one' "${chat3[@]}" --input sys.jsonl
record ends "{\"messages\": [$U, $A, $U]}"
bad "ends with the user" "ends\.jsonl:41: the conversation ends with the user's message 3; end it with the assistant's answer" "${chat3[@]}" --input ends.jsonl
record onlysys "{\"messages\": [$S]}"
bad "only a system message" "onlysys\.jsonl:41: the conversation is only a system message; it needs a user message" "${chat3[@]}" --input onlysys.jsonl
record malformed "{\"messages\": [$U, $A"
bad "malformed record" 'malformed\.jsonl:41: malformed JSON record at byte' "${chat3[@]}" --input malformed.jsonl
record array "[$U, $A]"
bad "record not an object" 'array\.jsonl:41: the record is an array, not a JSON object; each line must be one object with the conversation at "messages"' "${chat3[@]}" --input array.jsonl
bad "no --chat-template" 'prepare: --format chat needs --chat-template llama3 or llama2' --format chat --model tok/llama3/tokenizer.json --input conv.jsonl
bad "unknown template" "prepare: --chat-template 'chatml' is not a template keel knows; use llama3 or llama2" \
    --format chat --chat-template chatml --model tok/llama3/tokenizer.json --input conv.jsonl
bad "unknown format" "prepare: --format 'chats' is not a format keel knows; use text .* or chat" --format chats --model tok/llama3/tokenizer.json --input conv.jsonl
bad "template without --format chat" 'prepare: --chat-template applies to conversations; add --format chat' \
    --chat-template llama3 --model tok/llama3/tokenizer.json --input conv.jsonl
bad "--text-key with chat" 'prepare: --text-key names the text of --format text records' "${chat3[@]}" --input conv.jsonl --text-key messages
printf 'a text file\n' > notes.txt
bad "a .txt input" 'prepare: input notes\.txt is text \(by its name\); --format chat reads JSON Lines' "${chat3[@]}" --input conv.jsonl --input notes.txt
bad "llama3 with llama2's tokenizer" "prepare: --chat-template llama3 needs the special token <\|start_header_id\|>, which tokenizer tok/llama2/tokenizer\.json lacks" \
    --format chat --chat-template llama3 --model tok/llama2/tokenizer.json --input conv.jsonl
bad "llama3 with a .model" "prepare: --chat-template llama3 needs the special token <\|start_header_id\|>, which tokenizer spm\.model lacks \(as a control or user-defined piece\)" \
    --format chat --chat-template llama3 --model spm.model --input conv.jsonl
mkdir -p noconfig && cp tok/llama2/tokenizer.json noconfig/
bad "no BOS" "prepare: --chat-template llama2 needs the tokenizer's bos_token \(<s>\), which tokenizer noconfig/tokenizer\.json does not define" \
    --format chat --chat-template llama2 --model noconfig/tokenizer.json --input conv.jsonl
mkdir -p plainbos && cp tok/llama3/tokenizer.json plainbos/ && echo '{"bos_token": "the", "eos_token": "<|eot_id|>"}' > plainbos/tokenizer_config.json
bad "BOS not a special token" "prepare: --chat-template llama3: the bos_token of tokenizer plainbos/tokenizer\.json \(id [0-9]+\) is not a special token" \
    --format chat --chat-template llama3 --model plainbos/tokenizer.json --input conv.jsonl
python3 - <<'PY'
import json
j = json.load(open("tok/llama3/tokenizer.json"))
for t in j["added_tokens"]:
    if t["content"] == "<|eot_id|>": t["lstrip"] = True
import os; os.makedirs("lstrip", exist_ok=True)
json.dump(j, open("lstrip/tokenizer.json", "w"))
PY
cp tok/llama3/tokenizer_config.json lstrip/
bad "a special token that strips spaces" "prepare: --chat-template llama3 needs the special token <\|eot_id\|>, which tokenizer lstrip/tokenizer\.json lacks \(as an added token matched whole in text, without lstrip/rstrip\)" \
    --format chat --chat-template llama3 --model lstrip/tokenizer.json --input conv.jsonl
pass "bad input: $n_bad cases, each exit 2 with one line, the dataset in --out unchanged ($((SECONDS - t0)) s)"
