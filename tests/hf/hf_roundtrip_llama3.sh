#!/usr/bin/env bash
# tests/hf/hf_roundtrip_llama3.sh: a whole Llama 3.x Hugging Face directory
# through `keel ckpt import --from-hf` and `keel ckpt export`. The directory is
# the hf_tiny_llama3 fixture (config.json with rope_parameters of type llama3,
# bf16 safetensors, generation_config.json, as transformers 5.25 saved them)
# plus a Llama 3-style tokenizer.json and tokenizer_config.json of its 128
# tokens (tests/reference/make_hf_tokenizer.py). The import carries the
# tokenizer and generation_config.json into the checkpoint (checksummed in its
# manifest; `keel ckpt verify` checks them, a damaged one is DAMAGED), names
# the tokenizer in the manifest's data.tokenizer and in its "fine-tune with"
# lines; `keel tokenize` reads the carried tokenizer. The export, with no
# --tokenizer and from another directory, gives back config.json's
# rope_scaling and ids, generation_config.json, tokenizer.json and
# tokenizer_config.json byte for byte, and every tensor bit for bit (bf16
# widened to the fp32 keel writes). A run started from the import with
# init_from (data.tokenizer set from the printed line, and unset) exports
# the same tokenizer and generation_config.json. A SentencePiece
# tokenizer.model with its tokenizer_config.json travels the same way. Bad
# input — a tokenizer.json whose vocabulary exceeds vocab_size, a truncated
# one, one that is a directory, a tokenizer_config.json naming a BOS the
# tokenizer lacks, a generation_config.json that is not JSON or names a
# token id past the vocabulary — exits 2 with one line naming the file and
# leaves no checkpoint (nor its .tmp) behind; a directory without a tokenizer
# imports with one warning.
source "$KEEL_SRC/tests/lib.sh"
K=$KEEL_BIN
FIX=$KEEL_SRC/tests/reference/fixtures/hf_tiny_llama3
TOKFIX=$KEEL_SRC/tests/reference/fixtures/hf_tiny_llama3_tokenizer
CARRIED="tokenizer.json tokenizer_config.json generation_config.json"

# hf_dir NAME: a copy of the Llama 3 directory at $TMP/NAME
hf_dir() {
  mkdir "$TMP/$1"
  cp "$FIX"/{config.json,model.safetensors,generation_config.json} "$TOKFIX"/{tokenizer.json,tokenizer_config.json} "$TMP/$1/"
}
hf_dir hf

# ---- import ------------------------------------------------------------------------
"$K" ckpt import --from-hf "$TMP/hf" --out "$TMP/ckpt" >"$TMP/import.out" 2>"$TMP/import.err" \
  || fail "import: $(cat "$TMP/import.err")"
[ ! -s "$TMP/import.err" ] || fail "import of a tokenizer that fills vocab_size printed: $(cat "$TMP/import.err")"
for f in $CARRIED; do cmp -s "$TMP/hf/$f" "$TMP/ckpt/$f" || fail "the checkpoint's $f is not the directory's"; done
real_tok=$(realpath "$TMP/ckpt/tokenizer.json")
[ "$(json "$TMP/ckpt/manifest.json" "j['config']['data']['tokenizer']")" = "$real_tok" ] \
  || fail "manifest data.tokenizer: $(json "$TMP/ckpt/manifest.json" "j['config']['data'].get('tokenizer')")"
[ "$(json "$TMP/ckpt/manifest.json" "' '.join(f['name'] for f in j['carried_files'])")" = "$CARRIED" ] \
  || fail "manifest carried_files: $(json "$TMP/ckpt/manifest.json" "j.get('carried_files')")"
grep -qx "\"data\": {\"tokenizer\": \"$real_tok\"}" "$TMP/import.out" || fail "no data.tokenizer line: $(cat "$TMP/import.out")"
grep -q "with $(echo $CARRIED | sed 's/ /, /g'); fine-tune with" "$TMP/import.out" || fail "import does not say what it carried: $(cat "$TMP/import.out")"
"$K" ckpt verify "$TMP/ckpt" >"$TMP/out" || fail "verify: $(cat "$TMP/out")"
grep -q "1 file(s) and 3 carried, checksums match" "$TMP/out" || fail "verify: $(cat "$TMP/out")"
pass "import carries $CARRIED (checksummed; data.tokenizer $real_tok)"

# the carried tokenizer is keel's to use: ids as tokenizers 0.23.3 gives them (make_hf_tokenizer.py)
ids=$(printf 'the tokenizer travels<|eot_id|>\n' | "$K" tokenize --model "$TMP/ckpt/tokenizer.json") || fail "keel tokenize"
[ "$ids" = "27 36 77 70 115 26 120" ] || fail "keel tokenize --model CKPT/tokenizer.json: $ids"
pass "keel tokenize --model CKPT/tokenizer.json: $ids"

# ---- export: every file back --------------------------------------------------------
(cd / && "$K" ckpt export "$TMP/ckpt" --format safetensors --out "$TMP/exported") >"$TMP/out" 2>"$TMP/err" \
  || fail "export: $(cat "$TMP/err")"
# compare SRC DST: config.json's rope scaling and ids, the carried files, every tensor
compare() {
  local src=$1 dst=$2
  for f in $CARRIED; do cmp -s "$src/$f" "$dst/$f" || fail "$dst/$f differs from $src/$f"; done
  python3 - "$src" "$dst" <<'PY' || fail "$dst: config.json or weights differ from $src"
import array, json, struct, sys
src, dst = sys.argv[1:3]
a, b = (json.load(open(f"{d}/config.json")) for d in (src, dst))
rope = dict(a["rope_parameters"]); theta = rope.pop("rope_theta")
assert b["rope_scaling"] == rope, (b["rope_scaling"], rope)
assert b["rope_theta"] == theta, b["rope_theta"]
for k in ("bos_token_id", "eos_token_id", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
          "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps",
          "tie_word_embeddings", "model_type"):
    assert a[k] == b[k], (k, a[k], b[k])
def tensors(path):  # name -> the fp32 bit patterns of its values
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    out = {}
    for name, t in json.loads(raw[8:8 + n]).items():
        if name == "__metadata__": continue
        lo, hi = t["data_offsets"]
        data = raw[8 + n + lo:8 + n + hi]
        if t["dtype"] == "BF16":
            out[name] = array.array("I", (h << 16 for h in array.array("H", data)))
        else:
            assert t["dtype"] == "F32", t["dtype"]
            out[name] = array.array("I", data)
        out[name] = (t["shape"], out[name])
    return out
x, y = tensors(f"{src}/model.safetensors"), tensors(f"{dst}/model.safetensors")
assert sorted(x) == sorted(y), (sorted(set(x) ^ set(y)))
for name in x:
    assert x[name] == y[name], name
print(f"ok   {dst}: rope_scaling {b['rope_scaling']}, ids {b['bos_token_id']}/{b['eos_token_id']}, "
      f"{len(x)} tensors bit-equal")
PY
}
compare "$TMP/hf" "$TMP/exported"
grep -q "tokenizer: $TMP/ckpt/tokenizer.json; generation_config.json: $TMP/ckpt/generation_config.json" "$TMP/out" \
  || fail "export did not take the carried files: $(cat "$TMP/out")"
[ ! -s "$TMP/err" ] || [ "$(grep -vc 'info:' "$TMP/err")" = 0 ] || fail "export warned: $(cat "$TMP/err")"
pass "export (no --tokenizer, another working directory): $(ls "$TMP/exported" | tr '\n' ' ')"

# ---- a run started from the import ------------------------------------------------
model=$(sed -n 's/^"model": //p' "$TMP/import.out")
for with_tok in yes no; do
  python3 - "$TMP/run-$with_tok.json" "$model" "$TMP/ckpt" "$with_tok" "$real_tok" <<'PY'
import json, sys
path, model, ckpt, with_tok, tok = sys.argv[1:6]
data = {"synthetic": {"seed": 7, "branching": 2, "vocab": 16}}
if with_tok == "yes": data["tokenizer"] = tok
json.dump({"model": json.loads(model), "init_from": ckpt, "data": data,
           "train": {"steps": 1, "micro_batch_size": 1, "threads": 1}, "checkpoint": {"every_steps": 1}},
          open(path, "w"))
PY
  "$K" train "$TMP/run-$with_tok.json" --run-dir "$TMP/run-$with_tok" >"$TMP/out" 2>&1 || fail "init_from run: $(tail -3 "$TMP/out")"
  "$K" ckpt export "$TMP/run-$with_tok" --format safetensors --out "$TMP/run-$with_tok-hf" >"$TMP/out" 2>&1 \
    || fail "export of the init_from run: $(cat "$TMP/out")"
  for f in $CARRIED; do cmp -s "$TMP/hf/$f" "$TMP/run-$with_tok-hf/$f" || fail "run (data.tokenizer: $with_tok): $f differs"; done
  pass "a run from init_from (data.tokenizer set: $with_tok) exports the imported tokenizer and generation_config.json"
done

# ---- a SentencePiece tokenizer.model with its tokenizer_config.json ------------------
command -v spm_train >/dev/null || fail "spm_train not found (run scripts/install-deps.sh)"
for i in $(seq 1 40); do echo "the model reads tokens and the tokenizer writes them, line $i"; done >"$TMP/text.txt"
spm_train --input="$TMP/text.txt" --model_prefix="$TMP/spm" --vocab_size=100 --model_type=bpe \
  --character_coverage=1.0 >"$TMP/spm.log" 2>&1 || fail "spm_train: $(tail -2 "$TMP/spm.log")"
mkdir "$TMP/hf-spm"
cp "$FIX"/{config.json,model.safetensors} "$TMP/hf-spm/"
cp "$TMP/spm.model" "$TMP/hf-spm/tokenizer.model"
printf '{\n  "add_bos_token": true,\n  "bos_token": "<s>",\n  "eos_token": "</s>",\n  "legacy": false,\n  "tokenizer_class": "LlamaTokenizer"\n}\n' \
  >"$TMP/hf-spm/tokenizer_config.json"
"$K" ckpt import --from-hf "$TMP/hf-spm" --out "$TMP/ckpt-spm" >"$TMP/out" 2>"$TMP/err" || fail "import spm: $(cat "$TMP/err")"
grep -q "padding" "$TMP/err" && [ "$(wc -l <"$TMP/err")" = 1 ] || fail "import of a 100-piece tokenizer: $(cat "$TMP/err")"
"$K" ckpt export "$TMP/ckpt-spm" --format safetensors --out "$TMP/spm-hf" >/dev/null 2>&1 || fail "export spm"
for f in tokenizer.model tokenizer_config.json; do cmp -s "$TMP/hf-spm/$f" "$TMP/spm-hf/$f" || fail "spm: $f differs"; done
python3 - "$TMP/spm-hf/generation_config.json" <<'PY' || fail "spm: generation_config.json made from the ids: $(cat "$TMP/spm-hf/generation_config.json")"
import json, sys
assert json.load(open(sys.argv[1])) == {"_from_model_config": True, "bos_token_id": 1, "eos_token_id": 2}
PY
pass "tokenizer.model + tokenizer_config.json (100 pieces: padded, warned once) carried and exported byte for byte"

# ---- no tokenizer: imports, with one warning ----------------------------------------
mkdir "$TMP/hf-bare"
cp "$FIX"/{config.json,model.safetensors} "$TMP/hf-bare/"
"$K" ckpt import --from-hf "$TMP/hf-bare" --out "$TMP/ckpt-bare" >"$TMP/out" 2>"$TMP/err" || fail "import bare: $(cat "$TMP/err")"
[ "$(wc -l <"$TMP/err")" = 1 ] && grep -q "no tokenizer.json or tokenizer.model" "$TMP/err" || fail "bare import: $(cat "$TMP/err")"
! grep -q '"data"' "$TMP/out" && [ "$(json "$TMP/ckpt-bare/manifest.json" "'carried_files' in j")" = False ] \
  || fail "bare import names a tokenizer: $(cat "$TMP/out")"
pass "a directory without a tokenizer imports with one warning: $(cat "$TMP/err")"

# ---- damage to a carried file ----------------------------------------------------------
cp -r "$TMP/ckpt" "$TMP/damaged"
printf 'X' | dd of="$TMP/damaged/tokenizer.json" bs=1 seek=100 conv=notrunc status=none
rc=0; "$K" ckpt verify "$TMP/damaged" >"$TMP/out" 2>&1 || rc=$?
[ "$rc" = 1 ] && grep -q "^DAMAGED .*tokenizer.json: fails its checksum" "$TMP/out" || fail "verify of a damaged tokenizer.json: exit $rc, $(cat "$TMP/out")"
expect_input_error "export of a damaged carried file" "damaged/tokenizer.json: fails its checksum" \
  "$K" ckpt export "$TMP/damaged" --format safetensors --out "$TMP/damaged-hf"
rm "$TMP/damaged/generation_config.json"
rc=0; "$K" ckpt verify "$TMP/damaged" >"$TMP/out" 2>&1 || rc=$?
[ "$rc" = 1 ] && grep -q "generation_config.json: missing" "$TMP/out" || fail "verify with a carried file gone: exit $rc, $(cat "$TMP/out")"
[ ! -e "$TMP/damaged-hf" ] || fail "a refused export left $TMP/damaged-hf"

# ---- refusals: exit 2, one line, nothing left behind ------------------------------------
# refused NAME PATTERN: import $TMP/NAME; exit 2, one line matching PATTERN, no output or .tmp
refused() {
  expect_input_error "import: $1" "$2" "$K" ckpt import --from-hf "$TMP/$1" --out "$TMP/out-$1"
  [ ! -e "$TMP/out-$1" ] && [ ! -e "$TMP/out-$1.tmp" ] || fail "import: $1 left $(ls -d "$TMP/out-$1"*)"
}
hf_dir big_vocab
python3 - "$TMP/big_vocab/tokenizer.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
j["added_tokens"].append(dict(j["added_tokens"][-1], id=128, content="<|reserved_special_token_8|>"))  # the 129th
json.dump(j, open(sys.argv[1], "w"))
PY
refused big_vocab "big_vocab/tokenizer.json: the tokenizer has 129 tokens but config.json's vocab_size is 128"
hf_dir truncated
head -c 2000 "$TOKFIX/tokenizer.json" >"$TMP/truncated/tokenizer.json"
refused truncated "truncated/tokenizer.json.*import a copy of $TMP/truncated without it"
hf_dir tok_dir
rm "$TMP/tok_dir/tokenizer.json" && mkdir "$TMP/tok_dir/tokenizer.json"
refused tok_dir "tok_dir/tokenizer.json: cannot read it"
hf_dir bad_bos
sed -i 's/"bos_token": "<|begin_of_text|>"/"bos_token": "<|no_such_token|>"/' "$TMP/bad_bos/tokenizer_config.json"
grep -q no_such_token "$TMP/bad_bos/tokenizer_config.json" || fail "could not edit bos_token"
refused bad_bos "bad_bos/tokenizer_config.json.*without it"
hf_dir gen_corrupt
printf '{"bos_token_id": 1, "eos_token_id": ' >"$TMP/gen_corrupt/generation_config.json"
refused gen_corrupt "gen_corrupt/generation_config.json: not a JSON object.*without it"
hf_dir gen_id
sed -i 's/"eos_token_id": 2/"eos_token_id": [2, 128009]/' "$TMP/gen_id/generation_config.json"
refused gen_id "gen_id/generation_config.json: bos_token_id, eos_token_id and pad_token_id must be token ids below vocab_size 128"
