#!/usr/bin/env bash
# Export and import stream tensor by tensor: on a 134M-parameter model (536 MB
# of fp32) `keel ckpt export` and `keel ckpt import` each peak well below one
# copy of the model (bound: half of it; the largest tensor, the 32000 x 768
# embedding, is 98 MB), and the round trip is bit-exact.
source "$KEEL_SRC/tests/lib.sh"
peak_kb() { awk -F: '/Maximum resident set size/ {gsub(/ /, "", $2); print $2}' "$1"; }
"$KEEL_BIN" train "$KEEL_SRC/configs/small.json" --set train.steps=1 --set model.max_seq_len=32 \
  --set checkpoint.every_steps=1 --run-dir "$TMP/run" >"$TMP/train.out" 2>&1 || { cat "$TMP/train.out"; fail "train"; }
/usr/bin/time -v "$KEEL_BIN" ckpt export "$TMP/run" --format safetensors --out "$TMP/hf" \
  >"$TMP/export.out" 2>"$TMP/export.time" || { cat "$TMP/export.out" "$TMP/export.time"; fail "export"; }
/usr/bin/time -v "$KEEL_BIN" ckpt import --from-hf "$TMP/hf" --out "$TMP/imported" \
  >"$TMP/import.out" 2>"$TMP/import.time" || { cat "$TMP/import.out" "$TMP/import.time"; fail "import"; }
model_kb=$(( $(json "$TMP/run/summary.json" "j['n_params']") * 4 / 1024 ))
for step in export import; do
  kb=$(peak_kb "$TMP/$step.time")
  [ -n "$kb" ] || fail "$step: no peak RSS from /usr/bin/time"
  [ "$kb" -lt $(( model_kb / 2 )) ] || fail "$step peaked at $((kb / 1024)) MiB, half the model is $((model_kb / 2048)) MiB"
  pass "$step peak RSS $((kb / 1024)) MiB for a $((model_kb / 1024)) MiB model"
done
"$KEEL_BIN" ckpt verify "$TMP/imported" >/dev/null || fail "the imported checkpoint does not verify"
python3 - "$TMP/run/checkpoints/step_00000001" "$TMP/imported" <<'PY' || fail "imported parameters differ from the checkpoint's"
import json, struct, sys
def params(d):
    m = json.load(open(f"{d}/manifest.json"))
    units = m["units"]
    raw = open(f"{d}/shard-00000-of-00001.bin", "rb").read()
    out = []
    for u in units:   # one shard rank: each unit's logical values at its shard offset
        off = 64 + 4 * u["shard_offset"]
        out.append(raw[off: off + 4 * u["logical"]])
    return b"".join(out)
a, b = params(sys.argv[1]), params(sys.argv[2])
assert len(a) == len(b) and a == b, (len(a), len(b))
print(f"ok   {len(a) // 4} parameters bit-identical after export and import")
PY
