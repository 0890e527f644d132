#!/usr/bin/env bash
# Hostile files for `keel ckpt import`, `export` and `verify`: each crafted
# Hugging Face directory (a tensor of an unsupported dtype; offsets negative,
# reversed, past the end, 2^63 or overlapping another tensor's; a shape of
# 10^30 values; an index entry outside the directory or through a symlink to
# a FIFO; dimensions whose tensors no memory holds) is exit 2 with one stderr
# line, promptly, and leaves neither the output nor its .tmp behind (they
# used to abort with exit 134 and a half-written checkpoint). A checkpoint
# whose manifest config disagrees with its shards is refused by export (exit
# 2, nothing written) and is DAMAGED to verify (exit 1), as is one whose
# sizes wrap around 2^64 or whose numbers are out of range (1e19): "ok" from
# verify means export and resume work. A real directory, and one whose
# tensors file is a symlink (the Hugging Face cache), import fine. A rope_scaling
# keel does not implement (yarn, untyped) or an incomplete or inverted llama3 one
# is refused the same way.
source "$KEEL_SRC/tests/lib.sh"
K=$KEEL_BIN
FIX=$KEEL_SRC/tests/reference/fixtures/hf_tiny
mkfifo "$TMP/fifo"

# hostile NAME: import $TMP/NAME into $TMP/out-NAME; exit 2, one line matching
# PATTERN, nothing left at the output or its .tmp.
hostile() {
  local name=$1 pattern=$2 out=$TMP/out-$1
  expect_input_error "import: $name" "$pattern" timeout 60 "$K" ckpt import --from-hf "$TMP/$name" --out "$out"
  [ ! -e "$out" ] && [ ! -e "$out.tmp" ] || fail "import: $name left $(ls -d "$out"* | tr '\n' ' ')"
}

python3 - "$FIX" "$TMP" <<'PY'
import json, os, shutil, struct, sys
fix, tmp = sys.argv[1:3]
raw = open(f"{fix}/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr, data = json.loads(raw[8:8 + n]), raw[8 + n:]
def make(name, header=None, text=None):
    d = f"{tmp}/{name}"; os.makedirs(d)
    shutil.copy(f"{fix}/config.json", d)
    j = (text if text is not None else json.dumps(header or hdr)).encode()
    open(f"{d}/model.safetensors", "wb").write(struct.pack("<Q", len(j)) + j + data)
def edit(tensor, **kw):
    h = json.loads(json.dumps(hdr)); h[tensor].update(kw); return h
norm, k, v = "model.norm.weight", "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight"
a, b = hdr[norm]["data_offsets"]
make("dtype", edit(norm, dtype="F64"))
make("negative", edit(norm, data_offsets=[-128, b - 128 - a]))
make("reversed", edit(norm, data_offsets=[b, a]))
make("past_end", edit(norm, data_offsets=[a + 4096, b + 4096]))
make("offset_2_63", text=json.dumps(hdr).replace(f"[{a}, {b}]", f"[{a}, 9223372036854775808]"))
make("shape_1e30", edit(norm, shape=[10**15, 10**15]))
make("overlap", edit(v, data_offsets=hdr[k]["data_offsets"]))
# an index sending one tensor outside the directory, or to a symlink to a FIFO
names = [t for t in hdr if t != "__metadata__"]
for case, target in (("index_outside", "../model-1.safetensors"), ("index_fifo", "link.safetensors")):
    d = f"{tmp}/{case}"; shutil.rmtree(d, ignore_errors=True); os.makedirs(d)
    shutil.copy(f"{fix}/config.json", d); shutil.copy(f"{fix}/model.safetensors", f"{d}/model-1.safetensors")
    m = {t: "model-1.safetensors" for t in names}; m["model.norm.weight"] = target
    json.dump({"metadata": {}, "weight_map": m}, open(f"{d}/model.safetensors.index.json", "w"))
os.symlink(f"{tmp}/fifo", f"{tmp}/index_fifo/link.safetensors")
# the Hugging Face cache's layout: the tensors file a symlink to a blob elsewhere
d = f"{tmp}/cache_symlink"; os.makedirs(d); os.makedirs(f"{tmp}/blobs")
shutil.copy(f"{fix}/config.json", d); shutil.copy(f"{fix}/model.safetensors", f"{tmp}/blobs/abc123")
os.symlink("../blobs/abc123", f"{d}/model.safetensors")
PY
hostile dtype "model.norm.weight has unsupported dtype F64"
hostile negative "model.safetensors: bad safetensors header: tensor model.norm.weight: data_offsets must be"
hostile reversed "model.safetensors: bad safetensors header: tensor model.norm.weight: data_offsets must be"
hostile past_end "model.safetensors: (bad safetensors header|truncated)"
hostile offset_2_63 "model.safetensors: bad safetensors header: tensor model.norm.weight: data_offsets must be"
hostile shape_1e30 "model.safetensors: bad safetensors header: tensor model.norm.weight: its shape holds more than 2\^63 values"
hostile overlap "model.safetensors: bad safetensors header: tensors .*k_proj.weight .* and .*v_proj.weight .* overlap"
hostile index_outside "model.safetensors.index.json: weight_map entry of model.norm.weight must be a file name in the same directory"
hostile index_fifo "link.safetensors: cannot open safetensors file: is a FIFO, not a regular file"

# RoPE scalings keel does not implement, and a llama3 one without its numbers or with a band upside down
python3 - "$KEEL_SRC/tests/reference/fixtures/hf_tiny_llama3" "$TMP" <<'PY'
import json, os, shutil, sys
fix, tmp = sys.argv[1:3]
cfg = json.load(open(f"{fix}/config.json"))
def make(name, rope_key, rope):
    d = f"{tmp}/{name}"; os.makedirs(d)
    shutil.copy(f"{fix}/model.safetensors", d)
    c = {k: v for k, v in cfg.items() if k != "rope_parameters"}
    c[rope_key] = rope
    json.dump(c, open(f"{d}/config.json", "w"))
llama3 = cfg["rope_parameters"]
make("rope_yarn", "rope_scaling", {"rope_type": "yarn", "factor": 4.0})
make("rope_no_factor", "rope_parameters", {k: v for k, v in llama3.items() if k != "factor"})
make("rope_bands", "rope_scaling", dict(llama3, low_freq_factor=4.0, high_freq_factor=1.0))
make("rope_untyped", "rope_scaling", {"factor": 8.0})
PY
hostile rope_yarn "config.json: \"rope_scaling\" type yarn is not supported: keel implements default RoPE and llama3"
hostile rope_no_factor "config.json: \"rope_parameters\" of type llama3 needs \"factor\" as a positive number"
hostile rope_bands "model.rope_scaling.high_freq_factor 1 must be above low_freq_factor 4"
hostile rope_untyped "config.json: \"rope_scaling\" has no \"rope_type\""

# Dimensions whose tensors no machine's memory holds (a 2^24 x 2^18 embedding,
# 16 TiB as fp32) in a sparse file whose header is sound: a one-line refusal,
# not an abort in the allocator.
python3 - "$TMP" <<'PY' && hostile huge "out-huge: tensor model.embed_tokens.weight \\(4398046511104 values\\) needs more memory than this machine has" || echo "skip huge dimensions: no sparse file of 10 TiB here"
import json, os, struct, sys
d = f"{sys.argv[1]}/huge"; os.makedirs(d)
C, V, F, KV = 1 << 18, 1 << 24, 699136, 1024
json.dump({"model_type": "llama", "hidden_size": C, "intermediate_size": F, "num_hidden_layers": 1,
           "num_attention_heads": 2048, "num_key_value_heads": 8, "vocab_size": V,
           "max_position_embeddings": 1024, "tie_word_embeddings": True}, open(f"{d}/config.json", "w"))
shapes = {"model.embed_tokens.weight": [V, C], "model.norm.weight": [C]}
L = "model.layers.0."
shapes.update({L + "input_layernorm.weight": [C], L + "post_attention_layernorm.weight": [C],
               L + "self_attn.q_proj.weight": [C, C], L + "self_attn.k_proj.weight": [KV, C],
               L + "self_attn.v_proj.weight": [KV, C], L + "self_attn.o_proj.weight": [C, C],
               L + "mlp.gate_proj.weight": [F, C], L + "mlp.up_proj.weight": [F, C], L + "mlp.down_proj.weight": [C, F]})
h, off = {}, 0
for name, shape in shapes.items():
    size = 2 * shape[0] * (shape[1] if len(shape) > 1 else 1)
    h[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + size]}; off += size
j = json.dumps(h).encode()
with open(f"{d}/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(j)) + j)
    try: f.truncate(8 + len(j) + off)
    except OSError: sys.exit(1)
PY
if [ -e "$TMP/huge/model.safetensors" ]; then # the directories made for --out go too
  expect_input_error "import: huge, into new directories" "needs more memory than this machine has" \
    "$K" ckpt import --from-hf "$TMP/huge" --out "$TMP/new/deeper/out"
  [ ! -e "$TMP/new" ] || fail "a failed import left $(find "$TMP/new")"
fi
rm -f "$TMP/huge/model.safetensors"

# The good ones import (and the cache's symlinked file is followed).
for good in cache_symlink; do
  "$K" ckpt import --from-hf "$TMP/$good" --out "$TMP/out-$good" >/dev/null 2>"$TMP/err" || fail "import $good: $(cat "$TMP/err")"
  "$K" ckpt verify "$TMP/out-$good" >/dev/null || fail "the import of $good does not verify"
done
pass "a directory whose model.safetensors is a symlink (the Hugging Face cache) imports and verifies"

# --- checkpoints whose manifest lies ------------------------------------------------
cat >"$TMP/tiny.json" <<'JSON'
{"model": {"dim": 8, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "vocab_size": 16, "multiple_of": 8, "max_seq_len": 8},
 "train": {"steps": 2, "micro_batch_size": 2, "threads": 1},
 "data": {"synthetic": {"seed": 7, "branching": 2, "vocab": 16}}, "checkpoint": {"every_steps": 2}}
JSON
"$K" train "$TMP/tiny.json" --run-dir "$TMP/run" >/dev/null 2>&1 || fail "tiny training run"
good=$TMP/run/checkpoints/step_00000002
"$K" ckpt verify "$good" >/dev/null || fail "the tiny run's checkpoint does not verify"
# lie NAME PYTHON: a copy of the good checkpoint whose manifest `j` PYTHON edits
lie() {
  cp -r "$good" "$TMP/$1"
  python3 -c "import json, sys; p = sys.argv[1] + '/manifest.json'; j = json.load(open(p)); $2; open(p, 'w').write(json.dumps(j, indent=1))" "$TMP/$1"
}
lie bigger_model "j['config']['model']['dim'] = 16"
lie wrapped "u = j['units'][0]; u['shard'] += 1 << 62; u['padded'] = u['shard']; [x.update(shard_offset=x['shard_offset'] + (1 << 62)) for x in j['units'][1:]]"
cp -r "$good" "$TMP/step_1e19" && sed -i 's/"step":\t2,/"step":\t1e19,/' "$TMP/step_1e19/manifest.json"
grep -q '1e19' "$TMP/step_1e19/manifest.json" || fail "could not write step 1e19"
expect_input_error "export: manifest config disagrees with the shards" "bigger_model: holds a model of [0-9]+ parameters" \
  timeout 60 "$K" ckpt export "$TMP/bigger_model" --format safetensors --out "$TMP/out-export"
[ ! -e "$TMP/out-export" ] && ! ls -d "$TMP"/out-export.tmp* >/dev/null 2>&1 || fail "a refused export left files"
for bad in bigger_model wrapped step_1e19; do
  rc=0
  timeout 60 "$K" ckpt verify "$TMP/$bad" >"$TMP/out" 2>"$TMP/err" || rc=$?
  [ "$rc" = 1 ] && grep -q "^DAMAGED $TMP/$bad: ." "$TMP/out" && [ ! -s "$TMP/err" ] \
    || fail "verify $bad: exit $rc, $(cat "$TMP/out" "$TMP/err")"
  pass "verify $bad: exit 1, $(cat "$TMP/out")"
done
