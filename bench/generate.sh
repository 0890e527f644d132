#!/usr/bin/env bash
# generate.sh: `keel generate` beside transformers' generate on the same model and
# machine — prompt processing (prefill) and decode tokens/s at batch 1 and 8, keel
# in fp32 and bf16, transformers in float32 — and how close batch-1 decode comes
# to the machine's memory bandwidth. Not a test: numbers only.
#
#   bash bench/generate.sh
#   BENCH_CONFIG=configs/small.json BENCH_PROMPT_LEN=128 BENCH_NEW=64 BENCH_REPS=3 \
#   BENCH_THREADS=2 BENCH_BATCHES="1 8" bash bench/generate.sh
#
# The model: a Hugging Face LlamaForCausalLM of BENCH_CONFIG's shape with
# transformers' random weights (seed 0), made once under .cache/bench-generate/
# by bench/torch_generate.py. Prompts: BENCH_PROMPT_LEN random token ids each
# (the same for both); batch B decodes the first B of 8 prompts together, each
# to BENCH_NEW new tokens (--ignore-eos / min_new_tokens), greedy. keel's numbers
# are its stderr line ("prompt tokens at X tokens/s ... decode Y tokens/s");
# transformers' are timed as generate with 1 new token (prefill) and the rest of
# a generate of BENCH_NEW (decode), as keel counts them. Every run is its own
# process, BENCH_REPS rounds with keel and transformers alternating; a cell is
# the median over the rounds, a ratio the ratio of two medians of one run.
#
# Bandwidth: bench/bandwidth_bench.c (a 2 GiB buffer read by the same threads in
# a few patterns, best of several reads), at the start of every round and at the
# end; the highest is the machine's bandwidth (a shared VM's bursts included, so
# that the fraction is not flattered). A decode
# token of one sequence reads every weight once except the embedding table (one
# row), so its limit is bandwidth / weight bytes, with weight bytes = (all
# parameters - the embedding table, or all of them when the head is tied) x 4
# (fp32) or x 2 (bf16); "of bandwidth" = tokens/s x weight bytes / bandwidth.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
config="${BENCH_CONFIG:-$root/configs/small.json}"
prompt_len="${BENCH_PROMPT_LEN:-128}"
new="${BENCH_NEW:-64}"
reps="${BENCH_REPS:-3}"
threads="${BENCH_THREADS:-$(nproc)}"
batches="${BENCH_BATCHES:-1 8}"
torch_python="${KEEL_TORCH_VENV:-/opt/keel-torch}/bin/python"

if [ -z "${KEEL_BUILD:-}" ]; then
    make -C "$root" keel >/dev/null
    KEEL_BUILD="$root/build"
fi
if ! { [ -x "$torch_python" ] && "$torch_python" -c 'import torch, transformers' 2>/dev/null; }; then
    echo "generate.sh: transformers is needed to make the model and to compare: bash scripts/setup-torch.sh" >&2
    exit 1
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

cmake --build "$KEEL_BUILD" --target bandwidth_bench >/dev/null # CMakeLists.txt: linked as keel is

cache="$root/.cache/bench-generate"
model="$cache/$(basename "$config" .json)"
mkdir -p "$cache"
"$torch_python" "$root/bench/torch_generate.py" make "$config" "$model" 2>/dev/null
"$torch_python" "$root/bench/torch_generate.py" prompts "$model" "$prompt_len" 8 "$tmp/prompts_all.jsonl"
for b in $batches; do head -n "$b" "$tmp/prompts_all.jsonl" >"$tmp/prompts$b.jsonl"; done

echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(grep -o -m1 -w 'avx512f\|avx2' /proc/cpuinfo | tail -1); load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "keel: $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD || echo '+changes'); $("$torch_python" -c 'import torch, transformers; print(f"torch {torch.__version__}, transformers {transformers.__version__}")')"
: >"$tmp/lines"
for round in $(seq "$reps"); do
    echo "bandwidth round=$round $("$KEEL_BUILD/bandwidth_bench" "$threads")"
    for b in $batches; do
        for precision in fp32 bf16; do
            flag=()
            [ "$precision" = bf16 ] && flag=(--bf16)
            "$KEEL_BUILD/keel" generate "$model" --prompts "$tmp/prompts$b.jsonl" --max-new-tokens "$new" \
                --ignore-eos --batch "$b" --threads "$threads" --json "${flag[@]}" \
                >"$tmp/keel.jsonl" 2>"$tmp/keel.err"
            line="$(grep 'tokens/s' "$tmp/keel.err" | tail -1)"
            prefill="$(sed -n 's/.* prompt tokens at \([0-9.]*\) tokens\/s.*/\1/p' <<<"$line")"
            decode="$(sed -n 's/.*(decode \([0-9.]*\) tokens\/s).*/\1/p' <<<"$line")"
            ids="$(head -1 "$tmp/keel.jsonl" | python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["ids"])))')"
            echo "run impl=keel_$precision batch=$b round=$round prefill=$prefill decode=$decode ids=$ids"
        done
        "$torch_python" "$root/bench/torch_generate.py" run "$model" "$tmp/prompts$b.jsonl" --batch "$b" \
            --new "$new" --threads "$threads" --reps 1 2>/dev/null >"$tmp/torch.json"
        python3 - "$tmp/torch.json" "$b" "$round" <<'EOF'
import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(f"run impl=transformers batch={sys.argv[2]} round={sys.argv[3]} prefill={d['prefill_tokens_per_s']:.2f} "
      f"decode={d['decode_tokens_per_s']:.2f} ids={','.join(map(str, d['ids']))}")
EOF
    done
done | tee -a "$tmp/lines" >&2
echo "bandwidth round=end $("$KEEL_BUILD/bandwidth_bench" "$threads")" | tee -a "$tmp/lines" >&2
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$tmp/lines" "$model/config.json" "$prompt_len" "$new" "$threads" <<'EOF'
import json, statistics, sys
lines, cfg = open(sys.argv[1]).read().splitlines(), json.load(open(sys.argv[2]))
prompt_len, new, threads = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
bws = [float(dict(kv.split("=", 1) for kv in l.split()[1:])["best_gbs"]) for l in lines if l.startswith("bandwidth")]
bw = max(bws)
runs = [dict(kv.split("=", 1) for kv in l.split()[1:]) for l in lines if l.startswith("run ")]

C, L, V, F = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"], cfg["intermediate_size"]
NH, NKV = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
HS = C // NH
tied = cfg.get("tie_word_embeddings", False)
per_layer = C * NH * HS + 2 * C * NKV * HS + NH * HS * C + 3 * C * F + 2 * C
params = V * C + L * per_layer + C + (0 if tied else V * C)
read = params - (0 if tied else V * C)  # the embedding table is read a row at a time
weight_bytes = {"keel_fp32": 4 * read, "keel_bf16": 2 * read, "transformers": 4 * read}

def med(impl, b, key):
    vals = [float(r[key]) for r in runs if r["impl"] == impl and r["batch"] == str(b) and r[key]]
    return statistics.median(vals) if vals else float("nan")

print(f"\nmodel {C} wide, {L} layers, {NH} heads ({NKV} kv), F {F}, vocab {V}: {params / 1e6:.1f}M parameters, "
      f"a decode token reads {read * 4 / 1e6:.0f} MB in fp32, {read * 2 / 1e6:.0f} MB in bf16; "
      f"prompts of {prompt_len} tokens, {new} new tokens each, {threads} threads; "
      f"memory bandwidth {bw:.2f} GB/s (the best of {len(bws)} measurements, {min(bws):.2f}-{bw:.2f}): batch-1 "
      f"decode's limit {bw * 1e9 / weight_bytes['keel_fp32']:.1f} tokens/s in fp32, "
      f"{bw * 1e9 / weight_bytes['keel_bf16']:.1f} in bf16; medians of {len({r['round'] for r in runs})} rounds\n")
print("| batch | phase | keel fp32 tok/s | keel bf16 tok/s | transformers fp32 tok/s | keel fp32 / transformers "
      "| keel bf16 / transformers | of bandwidth: keel fp32 / keel bf16 / transformers |")
print("|---|---|---|---|---|---|---|---|")
for b in dict.fromkeys(r["batch"] for r in runs):
    for phase, key in (("prefill", "prefill"), ("decode", "decode")):
        kf, kb, t = (med(i, b, key) for i in ("keel_fp32", "keel_bf16", "transformers"))
        frac = "-"
        if phase == "decode" and b == "1":
            frac = " / ".join(f"{v * weight_bytes[i] / (bw * 1e9):.0%}"
                              for i, v in (("keel_fp32", kf), ("keel_bf16", kb), ("transformers", t)))
        print(f"| {b} | {phase} | {kf:.1f} | {kb:.1f} | {t:.1f} | {kf / t:.2f}x | {kb / t:.2f}x | {frac} |")

# greedy: keel fp32's first prompt against transformers' (float32 both; sums in another order)
for b in dict.fromkeys(r["batch"] for r in runs):
    k = next(r["ids"] for r in runs if r["impl"] == "keel_fp32" and r["batch"] == b).split(",")
    t = next(r["ids"] for r in runs if r["impl"] == "transformers" and r["batch"] == b).split(",")
    same = next((i for i, (x, y) in enumerate(zip(k, t)) if x != y), None)
    print(f"\nbatch {b}: keel fp32's greedy ids of prompt 1 " +
          (f"= transformers' ({len(k)} tokens)" if same is None and len(k) == len(t)
           else f"differ from transformers' from new token {same}"), end="")
print()
EOF
