#!/usr/bin/env bash
# plan_llama2.sh: keel plan on paper for Llama 2 7B/13B/70B (configs/llama2-*.json)
# on NODES nodes of 8 GPUs (default 16 x h100, bf16 compute, micro-batch 1 of
# 4096 tokens): every strategy with activation checkpointing off and on, peak
# memory per GPU, time per step and where communication goes, tokens/s per
# GPU, MFU, scaling efficiency, and NODES nodes' tokens/s per GPU over one
# node's. The recommendation is marked (a row of its own when it checkpoints
# only some blocks). Prints a markdown table; no GPU needed.
#
#   bash bench/plan_llama2.sh
#   BENCH_DEVICE=a100 BENCH_NODES=4 BENCH_SETS="--net 1600" bash bench/plan_llama2.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
device="${BENCH_DEVICE:-h100}" nodes="${BENCH_NODES:-16}"
read -ra extra <<<"${BENCH_SETS:-}"
if [ -z "${KEEL_BIN:-}" ]; then
    make -C "$root" keel >/dev/null
    KEEL_BIN="$root/build/keel"
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for model in 7b 13b 70b; do
    for ac in false true; do
        for n in 1 "$nodes"; do
            rc=0
            "$KEEL_BIN" plan "$root/configs/llama2-$model.json" --device "$device" --nodes "$n" "${extra[@]}" \
                --set fsdp.mixed_precision=bf16 --set fsdp.activation_checkpointing=$ac --json \
                >"$tmp/$model-$ac-$n.json" || rc=$?
            [ "$rc" -le 1 ] || { echo "bench: keel plan failed for $model" >&2; exit 1; }
        done
    done
done
python3 - "$tmp" "$nodes" "$device" "$root" <<'PY'
import json, sys
tmp, nodes, device, root = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
gib = 2**30
print(f"| model | strategy, checkpointing | peak / GPU | fits | compute + recompute | communication: all / exposed / cost of hidden | step | tokens/s per GPU | MFU | scaling efficiency | {nodes} nodes ÷ 1 node, tokens/s per GPU |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for model in ("7b", "13b", "70b"):
    plans = {ac: json.load(open(f"{tmp}/{model}-{ac}-{nodes}.json")) for ac in ("false", "true")}
    one = {ac: json.load(open(f"{tmp}/{model}-{ac}-1.json")) for ac in ("false", "true")}
    # the recommendation over both checkpointing settings: the most tokens/s that fits
    fits = [p["recommendation"] for p in plans.values() if p["recommendation"]["fits"]]
    best = max(fits, key=lambda r: r["tokens_per_s"]) if fits else None
    ranks = plans["true"]["cluster"]["ranks"]
    def row(s, name, vs_one):
        t = s["time"]
        per_gpu = s["tokens_per_s"] / ranks
        print(f"| {model.upper()} | {name} | {s['peak_bytes'] / gib:.1f} GiB | {'yes' if s['fits'] else '**no**'} | "
              f"{t['compute_s'] + t['recompute_s']:.3f} s | {t['comm_s']:.3f} / {t['exposed_s']:.3f} / {t['overlap_cost_s']:.3f} s | "
              f"{t['step_s']:.3f} s | {per_gpu:.0f} | {s['mfu']:.3f} | {s['scaling_efficiency']:.3f} | {vs_one} |")
    def words(ac):
        return "on" if ac is True else "off" if ac is False else f"{ac} of {layers} blocks"
    layers = json.load(open(f"{root}/configs/llama2-{model}.json"))["model"]["n_layers"]
    marked = False
    for ac in ("false", "true"):
        for s, s1 in zip(plans[ac]["strategies"], one[ac]["strategies"]):
            rec = best is not None and s["strategy"] == best["strategy"] and \
                s["activation_checkpointing"] == best["activation_checkpointing"] and \
                s["micro_batch"] == best["micro_batch"]
            marked |= rec
            per_gpu = s["tokens_per_s"] / ranks
            vs_one = f"{per_gpu / (s1['tokens_per_s'] / one[ac]['cluster']['ranks']):.3f}" if s1["fits"] else "1 node: does not fit"
            row(s, f"{s['strategy']}, {words(s['activation_checkpointing'])}" + (" **(recommended)**" if rec else ""), vs_one)
    if best is not None and not marked:  # checkpointing some of the blocks, or another micro-batch
        row(best, f"{best['strategy']}, {words(best['activation_checkpointing'])}, micro-batch {best['micro_batch']} "
                  "**(recommended)**", "-")
PY
