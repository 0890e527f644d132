#!/usr/bin/env bash
# fsdp.activation_checkpointing on a one-process run of 8 blocks: none, the
# first 4 and every block give the same trained parameters bit for bit
# (params_xxh3); the peak RSS falls from none to 4 to all, and each run's
# activations in `keel train --dry-run` (the planned bytes) fall the same way,
# 4 blocks by 3 blocks' sets and all by 7 (exact bytes:
# tests/model/test_activation_checkpointing.c).
source "$KEEL_SRC/tests/lib.sh"
CFG=$KEEL_SRC/tests/train/micro.json
shape=(--set model.n_layers=8 --set model.max_seq_len=256 --set train.micro_batch_size=8 --set train.steps=3)
for ac in false 4 true; do
  "$KEEL_BIN" train "$CFG" "${shape[@]}" --set fsdp.activation_checkpointing=$ac --run-dir "$TMP/$ac" \
    >"$TMP/$ac.log" 2>&1 || { tail -3 "$TMP/$ac.log"; fail "activation_checkpointing=$ac: the run failed"; }
  "$KEEL_BIN" train "$CFG" "${shape[@]}" --set fsdp.activation_checkpointing=$ac --dry-run |
    awk '/^  activations/ {print $2 * 2^30}' >"$TMP/$ac.planned"
done
python3 - "$TMP" <<'PY' || fail "checkpointing"
import json, sys
d = sys.argv[1]
runs = {ac: json.load(open(f"{d}/{ac}/summary.json")) for ac in ("false", "4", "true")}
plan = {ac: float(open(f"{d}/{ac}.planned").read()) for ac in runs}
xxh = {ac: r["params_xxh3"] for ac, r in runs.items()}
assert len(set(xxh.values())) == 1, xxh
rss = {ac: r["peak_rss_bytes"] for ac, r in runs.items()}
assert rss["true"] < 0.75 * rss["false"], f"peak RSS {rss}: all blocks checkpointed should save a quarter"
assert rss["true"] < rss["4"] < rss["false"], f"peak RSS {rss}: 4 of 8 blocks should sit between none and all"
set_ = (plan["false"] - plan["true"]) / 7
# the dry run prints GiB to 3 decimals: within two of its last digits
assert set_ > 0 and abs(plan["false"] - plan["4"] - 3 * set_) < 2e-3 * 2**30, \
    f"planned activations {plan}: 4 blocks should save 3 of the 7 sets all blocks save"
print(f"ok   same params_xxh3 {xxh['true']}; peak RSS {rss['false']/2**20:.0f} / {rss['4']/2**20:.0f} / "
      f"{rss['true']/2**20:.0f} MiB with none / 4 / all 8 blocks checkpointed; planned activations "
      f"{plan['false']/2**20:.1f} / {plan['4']/2**20:.1f} / {plan['true']/2**20:.1f} MiB")
PY
