#!/usr/bin/env bash
# A checkpoint whose shard file exceeds 4 GiB: the 7B-width slice
# (configs/llama2-7b-slice.json, 464.5M parameters) in one process keeps
# parameters + AdamW m and v in one shard of 5.6 GB (12 bytes a parameter;
# T cut to 64 so steps take seconds). Checked: the shard is over 4 GiB,
# `keel ckpt verify` passes it and catches a byte flipped past the 4 GiB
# mark, and a run resumed from step 1 ends bit-identical (losses and
# params_xxh3) to the uninterrupted one. ~17 GB written (label heavy; run
# alone: ~13 GiB of memory with the async save's buffer).
source "$KEEL_SRC/tests/lib.sh"
CFG=$KEEL_SRC/configs/llama2-7b-slice.json
args=(--set model.max_seq_len=64 --set train.steps=2 --set checkpoint.every_steps=1
      --set checkpoint.keep_last=0 --set resilience.max_restarts=0)
"$KEEL_BIN" train "$CFG" "${args[@]}" --run-dir "$TMP/ref" >"$TMP/log" 2>&1 || { tail -5 "$TMP/log"; fail "reference run"; }
ckpt=$TMP/ref/checkpoints/step_00000001
shard=$(ls "$ckpt"/shard-*.bin)
size=$(stat -c %s "$shard")
[ "$size" -gt $((4 << 30)) ] || fail "the shard is $size bytes, not over 4 GiB"
"$KEEL_BIN" ckpt verify "$ckpt" >"$TMP/out" 2>&1 || { cat "$TMP/out"; fail "verify of a good $size-byte shard"; }
pass "$(basename "$shard"): $size bytes, verified"

# a byte flipped past 4 GiB: verify must see it (offsets and checksums in 64 bits)
at=$(( (4 << 30) + 12345 ))
flip() { python3 - "$shard" "$at" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(int(sys.argv[2])); b = f.read(1); f.seek(int(sys.argv[2])); f.write(bytes([b[0] ^ 0x40]))
PY
}
flip
rc=0; "$KEEL_BIN" ckpt verify "$ckpt" >"$TMP/out" 2>&1 || rc=$?
[ "$rc" = 1 ] || { cat "$TMP/out"; fail "verify exit $rc on a byte flipped at offset $at, want 1"; }
pass "a byte flipped at offset $at: verify exit 1: $(grep -m1 -i 'shard\|damage\|mismatch' "$TMP/out")"
flip

# resume from step 1 (the run as it stood after that commit; hard links, no copy) -> bit-identical
mkdir -p "$TMP/resumed/checkpoints"
cp "$TMP/ref/config.json" "$TMP/resumed/"
cp -al "$ckpt" "$TMP/resumed/checkpoints/"
echo step_00000001 >"$TMP/resumed/checkpoints/LATEST"
"$KEEL_BIN" train "$CFG" "${args[@]}" --run-dir "$TMP/resumed" >"$TMP/log" 2>&1 || { tail -5 "$TMP/log"; fail "resume"; }
grep -q "resuming from .*step_00000001" "$TMP/log" || { cat "$TMP/log"; fail "did not resume from step 1"; }
python3 - "$TMP/ref" "$TMP/resumed" <<'PY' || fail "the resumed run differs from the uninterrupted one"
import json, sys
ref, run = sys.argv[1:]
a = {r["step"]: r["loss"] for r in map(json.loads, open(f"{ref}/metrics.jsonl"))}
b = {r["step"]: r["loss"] for r in map(json.loads, open(f"{run}/metrics.jsonl"))}
assert 2 in b and all(a[s] == b[s] for s in b), (a, b)
x, y = (json.load(open(f"{d}/summary.json"))["params_xxh3"] for d in (ref, run))
assert x == y, (x, y)
print(f"ok   resumed from a >4 GiB shard: losses {a} and params_xxh3 {y} bit-identical")
PY
