#!/usr/bin/env bash
# tests/fuzz/make_corpus.sh: (re)make the fuzz harnesses' fixed inputs and
# seed corpora from a keel binary, spm_train and python3 — what is checked in
# under tests/fuzz/data/ and tests/fuzz/corpus/<harness>/ (small valid and
# near-valid files, a few KB each). Not run by the tests; run it after a
# format changes:  tests/fuzz/make_corpus.sh build/keel
set -euo pipefail
KEEL=$(realpath "${1:?usage: tests/fuzz/make_corpus.sh KEEL_BIN}")
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
DATA=$HERE/data CORPUS=$HERE/corpus
KEEL_SRC_FIXTURE=$HERE/../reference/fixtures/hf_tiny KEEL_SRC_CONFIGS=$HERE/../../configs
rm -rf "$DATA" "$CORPUS"
mkdir -p "$DATA/hf" "$CORPUS"/{tokenizer_model,tokenizer_text,hf,ckpt,token_shard,config,node_config,cluster_spec,k8s_spec,k8s_status,chat_record}

# --- tokenizer models: BPE, byte fallback, user symbols, custom (de)normalization rules
head -c 20000 /usr/share/common-licenses/GPL-3 > text.txt
printf '\xef\xac\x81ne \xe2\x85\xa3\xe3\x80\x80full \xef\xbc\x90\xef\xbc\x91 caf\xc3\xa9\tAB ab\n' >> text.txt
printf '41\t61\n42\t62\nFB01\t66 69\n2163\t49 56\n3000\t20\nFF10\t30\nFF11\t31\n41 42\t78\nE9\t65 301\n200B\t\n9\t20\nD\t\n' > rules.tsv
printf '61\t41\n78\t41 42\n' > denorm.tsv
common=(--input=text.txt --vocab_size=360 --model_type=bpe --character_coverage=1.0 --minloglevel=2)
spm_train "${common[@]}" --model_prefix=rules --byte_fallback=true --normalization_rule_tsv=rules.tsv \
  --user_defined_symbols='<tab>,@@' --split_digits=true >/dev/null 2>&1
spm_train "${common[@]}" --model_prefix=denorm --byte_fallback=true --normalization_rule_tsv=rules.tsv \
  --denormalization_rule_tsv=denorm.tsv --user_defined_symbols='<tab>,@@' --treat_whitespace_as_suffix=true \
  >/dev/null 2>&1
spm_train "${common[@]}" --model_prefix=identity --normalization_rule_name=identity --remove_extra_whitespaces=false \
  >/dev/null 2>&1
cp denorm.model "$DATA/tok.model"
cp rules.model denorm.model identity.model "$CORPUS/tokenizer_model/"
head -c 700 rules.model > "$CORPUS/tokenizer_model/truncated.model"
# every 7th normal piece UNUSED (type 5): BPE re-splits what merges into one
python3 - rules.model "$CORPUS/tokenizer_model/unused_pieces.model" <<'PY'
import sys
def varint(b, i):
    x = s = 0
    while True:
        c = b[i]; i += 1; x |= (c & 0x7f) << s; s += 7
        if not c & 0x80: return x, i
def enc(x):
    out = bytearray()
    while True:
        c = x & 0x7f; x >>= 7; out.append(c | (0x80 if x else 0))
        if not x: return bytes(out)
def fields(b):
    i, out = 0, []
    while i < len(b):
        key, i = varint(b, i); num, wire = key >> 3, key & 7
        if wire == 0: v, i = varint(b, i)
        elif wire == 5: v = b[i:i + 4]; i += 4
        else: n, i = varint(b, i); v = b[i:i + n]; i += n
        out.append((num, wire, v))
    return out
def build(fs):
    return b"".join(enc(num << 3 | wire) + (enc(v) if wire == 0 else v if wire == 5 else enc(len(v)) + v)
                    for num, wire, v in fs)
model, k = [], 0
for num, wire, v in fields(open(sys.argv[1], "rb").read()):
    if num == 1:
        f = fields(v)
        if not any(n == 3 for n, _, _ in f):  # a normal piece
            k += 1
            if k % 7 == 0: f.append((3, 0, 5))
        v = build(f)
    model.append((num, wire, v))
open(sys.argv[2], "wb").write(build(model))
PY

# --- text for a valid model: 0 = a line to encode, 1 = ids to decode
printf '\0Hello world, it is \xef\xac\x81ne.' > "$CORPUS/tokenizer_text/line"
printf '\0  \xe2\x85\xa3\xe3\x80\x80AB\t\xef\xbc\x90\xef\xbc\x91 caf\xc3\xa9 @@<tab>x \xff\xfe\xc3' > "$CORPUS/tokenizer_text/edges"
printf '\x01\x05\x00\x10\x01\x03\x00\x67\x01\x00\x00\x02\x00' > "$CORPUS/tokenizer_text/ids"

# --- a tiny model's run, checkpoint and Hugging Face export
cat > tiny.json <<'JSON'
{
  "model": {"dim": 8, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "vocab_size": 16,
            "multiple_of": 8, "max_seq_len": 8},
  "train": {"steps": 2, "micro_batch_size": 2, "lr": 3e-3, "threads": 1},
  "data": {"synthetic": {"seed": 7, "branching": 2, "vocab": 16}},
  "checkpoint": {"every_steps": 2}
}
JSON
"$KEEL" train tiny.json --run-dir run >/dev/null 2>&1
ck=run/checkpoints/step_00000002
"$KEEL" ckpt export "$ck" --format safetensors --out hf >/dev/null 2>&1
"$KEEL" ckpt export "$ck" --format safetensors --out split --max-shard-mb 0.003 >/dev/null 2>&1
"$KEEL" ckpt import --from-hf hf --out imported >/dev/null 2>&1
cp hf/config.json split/model-0000?-of-00002.safetensors "$DATA/hf/"

python3 - "$CORPUS" "$ck" imported hf split "$KEEL_SRC_FIXTURE" <<'PY'
import json, struct, sys
corpus, ck, imported, hf, split, fixture = sys.argv[1:7]
def put(harness, name, data):
    open(f"{corpus}/{harness}/{name}", "wb").write(data)
rd = lambda p: open(p, "rb").read()
# hf: 0 config.json, 1 index, 2 a safetensors file, 3 model.safetensors for data/hf/config.json, 4 index for the split
put("hf", "config", b"\0" + rd(f"{hf}/config.json"))
put("hf", "config_transformers", b"\0" + rd(f"{fixture}/config.json"))
put("hf", "index", b"\1" + rd(f"{split}/model.safetensors.index.json"))
st = rd(f"{hf}/model.safetensors")
def half(st, dtype):
    n = struct.unpack("<Q", st[:8])[0]
    h = json.loads(st[8:8 + n]); data = st[8 + n:]
    out, hd, off = b"", {"__metadata__": {"format": "pt"}}, 0
    for k, v in sorted(((k, v) for k, v in h.items() if k != "__metadata__"), key=lambda kv: -kv[1]["data_offsets"][0]):
        a, b = v["data_offsets"]
        fl = struct.unpack(f"<{(b - a) // 4}f", data[a:b])
        if dtype == "BF16": raw = b"".join(struct.pack("<I", struct.unpack("<I", struct.pack("<f", x))[0])[2:] for x in fl)
        else: raw = struct.pack(f"<{len(fl)}e", *fl)
        hd[k] = {"dtype": dtype, "shape": v["shape"], "data_offsets": [off, off + len(raw)]}
        out += raw; off += len(raw)
    j = json.dumps(hd).encode()
    return struct.pack("<Q", len(j)) + j + out
put("hf", "safetensors", b"\2" + st)
put("hf", "safetensors_bf16", b"\2" + half(st, "BF16"))
put("hf", "model", b"\3" + st)
put("hf", "model_bf16", b"\3" + half(st, "BF16"))
put("hf", "model_f16", b"\3" + half(st, "F16"))
put("hf", "split_index", b"\4" + rd(f"{split}/model.safetensors.index.json"))
# ckpt: 0 manifest, 1 u32 length + manifest + shard 0
for name, d in (("trained", ck), ("imported", imported)):
    m, shard = rd(f"{d}/manifest.json"), rd(f"{d}/shard-00000-of-00001.bin")
    put("ckpt", f"manifest_{name}", b"\0" + m)
    put("ckpt", f"files_{name}", b"\1" + struct.pack("<I", len(m)) + m + shard)
PY

# --- token shards (0: as they are, 1: with the payload checksum set right first)
printf 'Hello world.\n\nA second document, with \xef\xac\x81ne text.\n' > doc.txt
"$KEEL" data prepare --model rules.model --input doc.txt --out shards >/dev/null 2>&1
python3 - "$CORPUS/token_shard" shards/train-00000.bin <<'PY'
import struct, sys
out, shard = sys.argv[1], open(sys.argv[2], "rb").read()
open(f"{out}/u16", "wb").write(b"\0" + shard)
open(f"{out}/u16_fixed", "wb").write(b"\1" + shard)
ids = [1, 2, 70000, 69999, 5]  # a 4-byte shard: vocab 70001
hdr = b"KEELTOK1" + struct.pack("<IIQII", 1, 4, len(ids), 70001, 0) + b"\0" * 8
hdr += b"\0" * (64 - len(hdr))
open(f"{out}/u32_fixed", "wb").write(b"\1" + hdr + struct.pack(f"<{len(ids)}I", *ids))
open(f"{out}/truncated", "wb").write(b"\1" + shard[:70])
PY

# --- the config: 0 = a config file, 1 = --set lines
printf '\0' | cat - tiny.json > "$CORPUS/config/tiny"
printf '\0' | cat - "$KEEL_SRC_CONFIGS/tiny.json" > "$CORPUS/config/configs_tiny"
printf '\x01train.steps=3\nmodel.dim=16\nresilience.health_checks=gemm,mpi\nfsdp.strategy=hybrid_shard\ndata.synthetic.seed=4\nfsdp.activation_checkpointing=true\ntrain.lr=1e-3\n' \
  > "$CORPUS/config/set_lines"

# --- node configs
printf '{"checks": ["gemm", "memory", "checkpoint_dir"], "gemm_floor_gflops": 5, "memory_floor_gib": 1.5, "dir": "/tmp/ck"}' \
  > "$CORPUS/node_config/basic.json"
printf '{"checks": ["gpu"], "gpu": {"baseline": "/var/lib/keel/b.json", "xid_max": 0, "xid_ignore": [13, 31, 43], "temp_max_c": 87, "ecc_uncorrected_max": 0, "remapped_rows_uncorrectable_max": 63, "fail_on_row_remap_pending": true, "fail_on_row_remap_failure": false, "clock_events_fail": ["hw_slowdown", "sw_thermal_slowdown"], "sm_clock_min_fraction": 0.5, "sm_clock_busy_util_pct": 50}}' \
  > "$CORPUS/node_config/gpu.json"
# --- cluster specs: the example, GPUs and every optional key, and one that must be refused
cp "$HERE/../../examples/cluster-local.json" "$CORPUS/cluster_spec/local.json"
cat > "$CORPUS/cluster_spec/gpus.json" <<'EOF'
{"ClusterName": "gpu-pod", "InstanceGroups": [
  {"InstanceGroupName": "controller", "Role": "controller", "InstanceCount": 1},
  {"InstanceGroupName": "gpu", "Role": "worker", "InstanceCount": 2, "Cpus": 8, "Gpus": 4, "MemoryMiB": 64000,
   "LifeCycleConfig": {"SourceDir": "/srv/lifecycle", "OnCreate": "./setup.sh"}}],
 "StateDir": "/var/lib/keel/gpu-pod", "SharedDir": "/fsx", "Subnet": "10.9.8.0/28", "Partition": "gpu",
 "AutoResumePlugin": "/usr/lib/keel/keel_auto_resume.so", "HealthTimeoutS": 30,
 "HealthCheck": {"checks": ["gpu", "gemm"], "gpu": {"baseline": "/var/lib/keel/xid.json"}}}
EOF
cat > "$CORPUS/cluster_spec/quoting.json" <<'EOF'
{"ClusterName": "q", "InstanceGroups": [{"InstanceGroupName": "controller", "Role": "controller", "InstanceCount": 1},
 {"InstanceGroupName": "w", "Role": "worker", "InstanceCount": 1}],
 "StateDir": "/var/lib/keel/$(id)", "SharedDir": "relative//dir/./x", "Subnet": "10.1.0.0/28"}
EOF
# --- keel k8s manifest specs: the two examples, a Master with every optional key, one that must be refused
cp "$HERE/../../examples/k8s-pytorchjob.json" "$CORPUS/k8s_spec/elastic.json"
cp "$HERE/../../examples/k8s-mpijob.json" "$CORPUS/k8s_spec/mpijob.json"
printf '{"name": "job", "namespace": "ml", "image": "keel@sha256:00ff", "nodes": 3, "master": true, "nprocPerNode": 2, "checkpointClaim": "a.b-c", "config": "/etc/keel/c.json", "runId": "job-1", "etcdImage": "etcd:3"}' \
  > "$CORPUS/k8s_spec/master.json"
printf '{"name": "Job\\n", "image": "k\\"\\n---", "nodes": 1e300, "elastic": {"minNodes": 3, "maxNodes": 2}, "checkpointClaim": "x"}' \
  > "$CORPUS/k8s_spec/refused.json"
# --- keel k8s status (first byte 0): kubectl's JSON for each job of tests/k8s/kube_stand_in.py's world and
# its pods, a NUL between them; one with every field of a wrong type. .env files (first byte 1): the guide's
# variables, one with a command substitution that must be refused
python3 - "$HERE/../k8s" "$CORPUS/k8s_status" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1])
import kube_stand_in
objs = kube_stand_in.world()
for job in (o for o in objs if o["kind"] in ("PyTorchJob", "MPIJob")):
    name = job["metadata"]["name"]
    pods = [o for o in objs if o["kind"] == "Pod" and o["metadata"]["labels"].get("training.kubeflow.org/job-name") == name]
    pod_list = {"apiVersion": "v1", "items": pods, "kind": "List", "metadata": {"resourceVersion": ""}}
    with open(f"{sys.argv[2]}/{name}", "wb") as f:  # as `kubectl get ... -o json` prints them
        f.write(b"\0" + json.dumps(job, indent=4, sort_keys=True).encode() + b"\0" +
                json.dumps(pod_list, indent=4, sort_keys=True).encode())
PY
printf '\0{"kind": 7, "metadata": [], "status": {"conditions": {"type": "Running", "status": "True"}, "replicaStatuses": {"Worker": {"active": "2", "failed": -1, "succeeded": 1e300}, "Master": 3}}}\0{"items": [{"metadata": {"name": "p\\u001b[31m\\u00e9", "creationTimestamp": "2026-13-01T00:00:00Z"}, "spec": {"containers": {}}, "status": {"phase": 1, "containerStatuses": [{"restartCount": 2147483647, "ready": "yes"}, {"restartCount": 1, "state": {"waiting": {"reason": ["x"]}}}]}}, 3, null]}' \
  > "$CORPUS/k8s_status/wrong_types"
printf '\1# the AWS guide'"'"'s env_vars, for keel\nexport IMAGE_URI=registry.example.com/keel:0.1\nexport NUM_NODES=4  # p5\n  export GPU_PER_NODE='"'"'8'"'"'\r\nEFA_PER_NODE="32"\nFI_PROVIDER=efa\nJOB_NAME=llama-fsdp\nNAMESPACE=training\nCHECKPOINT_CLAIM=fsx-claim\nCHECKPOINT_DIR=/fsx\nKEEL_CONFIG=/fsx/c.json\nSHM_SIZE_GIB=64\nRUN_ID=r1\n' \
  > "$CORPUS/k8s_status/guide.env"
printf '\1JOB_NAME=j\nIMAGE_URI=k\nCHECKPOINT_CLAIM=c\nMIN_NODES=1\nMAX_NODES=3\nMAX_RESTARTS=2\nETCD_IMAGE=etcd:3\n' \
  > "$CORPUS/k8s_status/elastic.env"
printf '\1JOB_NAME=j\nNUM_NODES=$(touch /tmp/keel-fuzz-pwned)\nNAMESPACE="`id`"\n' > "$CORPUS/k8s_status/substitution.env"
printf '#hosts\n# name address group\nhead 192.168.1.10 ctl\ngpu-a 192.168.1.21 gpu\ngpu-b node-b.example gpu  # rack 2\n' \
  > "$CORPUS/cluster_spec/hosts"
# --- keel data prepare: JSON Lines records (first byte: the key, 0 "text" 1 "content") and the
# .gz/.zst readers (first byte: mode 0 gzip, 1 zstd, 2/3 compressed here + a cut; bits 2-3: read size)
mkdir -p "$CORPUS/jsonl_record" "$CORPUS/decompress"
printf '\0{"id": 3, "text": "Hello\\nworld \\u00e9 \\ud83d\\ude00", "meta": {"a": [1, 2.5e3, null, true]}}' \
  > "$CORPUS/jsonl_record/record"
printf '\0{"text":"\\\\\\"\\/\\b\\f\\n\\r\\t\\u0000after"}\r' > "$CORPUS/jsonl_record/escapes"
printf '\1{"content": "c\\r\\n\\r\\nd", "text": 1}' > "$CORPUS/jsonl_record/content"
printf '\0  \t\r ' > "$CORPUS/jsonl_record/blank"
printf '\0{"body": "x", "id": 7}' > "$CORPUS/jsonl_record/no_key"
printf '\0{"text": [12]}' > "$CORPUS/jsonl_record/not_string"
printf '\0["text"]' > "$CORPUS/jsonl_record/array"
printf '\0{"text": "a"} {"text": "b"}' > "$CORPUS/jsonl_record/two_values"
printf '\0{"text": "unterminated' > "$CORPUS/jsonl_record/unterminated"
# --- keel data prepare --format chat: records (first byte: 0 llama3, 1 llama2), valid and each refusal
mkdir -p "$CORPUS/chat_record"
chat() { printf "$1"; printf '%s' "$2"; } # TEMPLATE_BYTE LINE
U='{"role": "user", "content": "What is 2+2?"}' A='{"role": "assistant", "content": " Four.\n"}'
S='{"role": "system", "content": "\u3000Be brief. "}'
chat '\0' "{\"messages\": [$S, $U, $A, $U, $A]}" > "$CORPUS/chat_record/llama3_system"
chat '\1' "{\"messages\": [$S, $U, $A, $U, $A]}" > "$CORPUS/chat_record/llama2_system"
chat '\1' "{\"id\": 1, \"messages\": [$U, {\"role\": \"assistant\", \"content\": \"\", \"name\": \"x\"}]}" \
  > "$CORPUS/chat_record/llama2_empty_answer"
chat '\0' '{"messages": [{"role": "user", "content": " \u001c[INST] <|eot_id|> caf\u00e9 \ud83d\ude00\u2028"}, {"role": "assistant", "content": "\t</s>\u180e"}]}' \
  > "$CORPUS/chat_record/llama3_specials"
chat '\1' '{"messages": [{"role": "system", "content": ""}, {"role": "user", "content": "  \n "}, {"role": "assistant", "content": "[/INST]  the  "}]}' \
  > "$CORPUS/chat_record/llama2_blank_user"
chat '\0' '  ' > "$CORPUS/chat_record/blank"
chat '\0' '{"text": "x"}' > "$CORPUS/chat_record/no_messages"
chat '\1' "{\"messages\": [$U, $U, $A]}" > "$CORPUS/chat_record/order"
chat '\0' "{\"messages\": [$U, $A, $U]}" > "$CORPUS/chat_record/ends_user"
chat '\1' '{"messages": [{"role": "bot", "content": 1}, {"content": null}]}' > "$CORPUS/chat_record/bad_messages"
chat '\0' '{"messages": [{"role": "user", "content": "unterminated' > "$CORPUS/chat_record/unterminated"
head -c 3000 /usr/share/common-licenses/GPL-3 > prose.txt
gzip -9 -c prose.txt > prose.gz
zstd -q -19 -c prose.txt > prose.zst
{ printf '\10'; cat prose.gz; } > "$CORPUS/decompress/gzip"
{ printf '\11'; cat prose.zst; } > "$CORPUS/decompress/zstd"
{ printf '\0'; cat prose.gz; printf 'second member\n' | gzip -c; } > "$CORPUS/decompress/gzip_members"
{ printf '\5'; cat prose.zst; printf '\x50\x2a\x4d\x18\4\0\0\0skip'; printf 'next frame\n' | zstd -q -c; } \
  > "$CORPUS/decompress/zstd_frames"
{ printf '\14'; head -c 700 prose.gz; } > "$CORPUS/decompress/gzip_truncated"
{ printf '\15'; head -c 700 prose.zst; } > "$CORPUS/decompress/zstd_truncated"
{ printf '\6\200'; head -c 1000 prose.txt; } > "$CORPUS/decompress/roundtrip_gzip"
{ printf '\17\3'; head -c 1000 prose.txt; } > "$CORPUS/decompress/roundtrip_zstd"
# --- Hugging Face tokenizer.json: byte-level (Llama 3's and GPT-2's pre-tokenizers), SentencePiece-
# style (Llama 2's normalizer, Metaspace), the other components keel reproduces, and a truncated file
mkdir -p "$CORPUS/tokenizer_json"
python3 - "$CORPUS/tokenizer_json" /usr/share/common-licenses/GPL-3 <<'PY'
import collections, json, os, sys
out, text = sys.argv[1], open(sys.argv[2], encoding="utf-8").read()[:6000]

def byte_chars():  # GPT-2's byte -> character map
    bs = list(range(33, 127)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    return dict(zip(bs, map(chr, cs)))

def bpe(words, vocab, n):  # n merges learned from words (lists of symbols)
    merges = []
    for _ in range(n):
        pairs = collections.Counter(p for w in words for p in zip(w, w[1:]))
        if not pairs: break
        (a, b), _ = pairs.most_common(1)[0]
        merges.append((a, b)); vocab.setdefault(a + b, len(vocab))
        for w in words:
            i = 0
            while i + 1 < len(w):
                if w[i] == a and w[i + 1] == b: w[i:i + 2] = [a + b]
                i += 1
    return merges

def added(tokens, first):
    return [{"id": first + i, "content": c, "single_word": sw, "lstrip": ls, "rstrip": rs, "normalized": nm,
             "special": sp} for i, (c, sw, ls, rs, nm, sp) in enumerate(tokens)]

def tokenizer(model, added_tokens, normalizer=None, pre=None, decoder=None):
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens,
            "normalizer": normalizer, "pre_tokenizer": pre, "post_processor": None, "decoder": decoder,
            "model": model}

def bpe_model(vocab, merges, legacy, **kw):
    m = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
         "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
         "vocab": vocab, "merges": [" ".join(p) if legacy else list(p) for p in merges]}
    m.update(kw)
    return m

def save(name, j):
    with open(os.path.join(out, name), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, separators=(",", ":"))

llama3_re = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
m = byte_chars()
vocab = {m[b]: b for b in range(256)}
words = [[m[b] for b in (" " + w).encode()] for w in text.split()]
merges = bpe(words, vocab, 60)
specials = added([("<|begin_of_text|>", False, False, False, False, True), ("<|eot_id|>", False, False, False, False, True),
                  ("<mask>", False, True, True, False, True), ("keel", True, False, False, False, False),
                  (" ab", False, False, False, True, False)], len(vocab))
split = {"type": "Split", "pattern": {"Regex": llama3_re}, "behavior": "Isolated", "invert": False}
save("llama3.json", tokenizer(bpe_model(vocab, merges, True, ignore_merges=True), specials,
     pre={"type": "Sequence", "pretokenizers": [split, {"type": "ByteLevel", "add_prefix_space": False,
                                                        "trim_offsets": True, "use_regex": False}]},
     decoder={"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}))
save("gpt2.json", tokenizer(bpe_model(vocab, merges, False), specials[:2],
     pre={"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
     decoder={"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}))
behaviours = ["Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"]
save("splits.json", tokenizer(bpe_model(vocab, merges[:20], False), [],
     normalizer={"type": "Replace", "pattern": {"Regex": r"\d+"}, "content": "0"},
     pre={"type": "Sequence", "pretokenizers": [
         {"type": "Split", "pattern": {"String": " "}, "behavior": b, "invert": i == 1}
         for i, b in enumerate(behaviours)] + [{"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                                 "use_regex": True}]},
     decoder={"type": "Sequence", "decoders": [{"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                                "use_regex": True},
                                              {"type": "Strip", "content": " ", "start": 2, "stop": 1}]}))

sp = "\u2581"
vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
for b in range(256): vocab["<0x%02X>" % b] = len(vocab)
for ch in sorted(set(text.replace(" ", sp).replace("\n", sp))): vocab.setdefault(ch, len(vocab))
words = [list(sp + w) for w in text.split()]
merges = bpe(words, vocab, 60)
sp_added = added([("<unk>", False, False, False, False, True), ("<s>", False, False, False, False, True),
                  ("</s>", False, False, False, False, True)], 0)
model = bpe_model(vocab, merges, False, unk_token="<unk>", fuse_unk=True, byte_fallback=True)
save("llama2.json", tokenizer(model, sp_added,
     normalizer={"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": sp},
                 {"type": "Replace", "pattern": {"String": " "}, "content": sp}]},
     decoder={"type": "Sequence", "decoders": [
         {"type": "Replace", "pattern": {"String": sp}, "content": " "}, {"type": "ByteFallback"},
         {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}))
save("metaspace.json", tokenizer(model, sp_added,
     pre={"type": "Metaspace", "replacement": sp, "prepend_scheme": "first", "split": True},
     decoder={"type": "Metaspace", "replacement": sp, "prepend_scheme": "always", "split": True}))
PY
head -c 3000 "$CORPUS/tokenizer_json/llama3.json" > "$CORPUS/tokenizer_json/truncated.json"
# --- keel data prepare: Parquet files (first byte: the column, 0 "text" 1 "a"), written by pyarrow
# from the venv tests/data/data_prepare_parquet.sh makes: each encoding, codec and page version keel
# reads, nulls, runs, a nested and an INT64 column, an LZ4 file and a truncated one, all tiny
PARQUET_PY=${KEEL_CACHE:-$HERE/../../.cache}/venv-parquet/bin/python
"$PARQUET_PY" -c "import pyarrow" 2>/dev/null \
  || { echo "make_corpus.sh: no pyarrow at $PARQUET_PY: run tests/data/data_prepare_parquet.sh once" >&2; exit 1; }
mkdir -p "$CORPUS/parquet"
"$PARQUET_PY" - "$CORPUS/parquet" <<'PY'
import io, os, sys
import pyarrow as pa, pyarrow.parquet as pq
out = sys.argv[1]
rows = ["Hello world", None, "", "caf\u00e9 \U0001F600\nsecond line", None, None, "same", "same", "same",
        " \t\r\n", "prefix one", "prefix two", "prefix three"]
table = pa.table({"id": pa.array(range(len(rows)), pa.int64()),
                  "nested": [{"x": i} for i in range(len(rows))],
                  "text": rows})
def save(name, first_byte, t=table, **kw):
    buf = io.BytesIO()
    pq.write_table(t, buf, data_page_size=64, row_group_size=7, **kw)
    data = buf.getvalue()
    with open(os.path.join(out, name), "wb") as f: f.write(bytes([first_byte]) + data)
save("dictionary_v1_snappy", 0, compression="snappy")
save("dictionary_v2_zstd", 0, compression="zstd", data_page_version="2.0")
save("plain_v1_gzip", 0, compression="gzip", use_dictionary=False)
save("plain_v2_none", 0, compression="none", use_dictionary=False, data_page_version="2.0")
save("delta_length_v1_zstd", 0, compression="zstd", use_dictionary=False,
     column_encoding={"text": "DELTA_LENGTH_BYTE_ARRAY"})
save("delta_byte_array_v2_snappy", 0, compression="snappy", use_dictionary=False, data_page_version="2.0",
     column_encoding={"text": "DELTA_BYTE_ARRAY"})
# uncompressed too, so that mutations reach the decoders as they are
save("dictionary_v1_none", 0, compression="none")
save("delta_length_v2_none", 0, compression="none", use_dictionary=False, data_page_version="2.0",
     column_encoding={"text": "DELTA_LENGTH_BYTE_ARRAY"})
save("delta_byte_array_v1_none", 0, compression="none", use_dictionary=False,
     column_encoding={"text": "DELTA_BYTE_ARRAY"})
required = pa.table({"a": pa.array([r or "x" for r in rows], pa.string())},
                    schema=pa.schema([pa.field("a", pa.string(), nullable=False)]))
save("required_binary", 1, t=required, compression="none")
save("int64_column", 1, t=pa.table({"a": pa.array(range(5), pa.int64())}), compression="none")
save("nested_column", 1, t=pa.table({"a": [{"x": 1}, {"x": 2}]}), compression="none")
save("lz4", 0, compression="lz4")
buf = io.BytesIO(); pq.write_table(table, buf, compression="snappy")
with open(os.path.join(out, "truncated"), "wb") as f: f.write(b"\0" + buf.getvalue()[:600])
PY
echo "made $(find "$DATA" "$CORPUS" -type f | wc -l) files ($(du -sk "$DATA" "$CORPUS" | awk '{s += $1} END {print s}') KiB)"
