#!/usr/bin/env bash
# fsdp.activation_checkpointing on a one-process run: the same trained
# parameters bit for bit (params_xxh3) and a lower peak RSS.
source "$KEEL_SRC/tests/lib.sh"
CFG=$KEEL_SRC/tests/train/micro.json
shape=(--set model.n_layers=8 --set model.max_seq_len=256 --set train.micro_batch_size=8 --set train.steps=3)
"$KEEL_BIN" train "$CFG" "${shape[@]}" --run-dir "$TMP/plain" >/dev/null 2>&1
"$KEEL_BIN" train "$CFG" "${shape[@]}" --set fsdp.activation_checkpointing=true --run-dir "$TMP/ckpt" >/dev/null 2>&1
python3 - "$TMP/plain/summary.json" "$TMP/ckpt/summary.json" <<'PY' || fail "checkpointing"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["params_xxh3"] == b["params_xxh3"], (a["params_xxh3"], b["params_xxh3"])
ra, rb = a["peak_rss_bytes"], b["peak_rss_bytes"]
assert rb < 0.75 * ra, f"peak RSS {rb} with checkpointing vs {ra} without"
print(f"ok   same params_xxh3 {a['params_xxh3']}; peak RSS {rb/2**20:.0f} MiB with checkpointing vs {ra/2**20:.0f} MiB without")
PY
