#!/usr/bin/env bash
# train_throughput.sh: keel's fp32 CPU training throughput beside PyTorch's, same
# model shape, batch, sequence length and optimizer, in one run (`make bench`).
#
#   bash bench/train_throughput.sh
#   BENCH_RUNS="tiny:12 small:6" BENCH_THREADS="1 2" bash bench/train_throughput.sh
#
# Each run takes the median tokens/s of its steps after BENCH_WARMUP warm-up
# steps (the machine is shared and noisy). MFU = tokens/s x FLOPs per token /
# peak, with FLOPs per token = 6 x matmul params (lm_head included, embedding
# lookup excluded) + 12 x L x C x T (keel_model_flops_per_token), against the
# fp32 FMA peak keel measures on this machine at start-up (one core, times 2
# for the 2-core peak; "MFU/thr" is against the threads the run used).
# PyTorch comes from the venv of scripts/setup-torch.sh (KEEL_TORCH_VENV);
# without it keel's numbers still print.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
runs="${BENCH_RUNS:-tiny:12 small:6}"
threads_list="${BENCH_THREADS:-1 2}"
warmup="${BENCH_WARMUP:-2}"
torch_python="${KEEL_TORCH_VENV:-/opt/keel-torch}/bin/python"

if [ -z "${KEEL_BIN:-}" ]; then
    make -C "$root" keel >/dev/null
    KEEL_BIN="$root/build/keel"
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

have_torch=0
if [ -x "$torch_python" ] && "$torch_python" -c 'import torch, transformers' 2>/dev/null; then
    have_torch=1
    torch_version="$("$torch_python" -c 'import torch, transformers; print(f"torch {torch.__version__}, transformers {transformers.__version__}")')"
fi

# median_of FILE KEY: median of KEY over metrics.jsonl steps after the warm-up.
median_of() {
    python3 - "$1" "$2" "$warmup" <<'EOF'
import json, statistics, sys
path, key, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [json.loads(l) for l in open(path) if l.strip()]
vals = [r[key] for r in rows if key in r]
print(statistics.median(vals[warmup:] or vals))
EOF
}

# json_of FILE KEY: KEY of the last JSON line of FILE.
json_of() { python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])[sys.argv[2]])' "$1" "$2"; }

cpu="$(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
grep -qw amx_tile /proc/cpuinfo && cpu="$cpu, AMX" || cpu="$cpu, no AMX"
load_start="$(cut -d' ' -f1-3 /proc/loadavg)"

rows=()
for run in $runs; do
    name="${run%%:*}"
    steps="${run##*:}"
    config="$root/configs/$name.json"
    for threads in $threads_list; do
        dir="$tmp/keel-$name-$threads"
        echo "bench: keel $name, $threads thread(s), $steps steps" >&2
        if ! "$KEEL_BIN" train "$config" --set "train.steps=$steps" \
                --set "train.threads=$threads" --run-dir "$dir" >"$tmp/keel.log" 2>&1; then
            cat "$tmp/keel.log" >&2
            echo "bench: keel train failed on $config" >&2
            exit 1
        fi
        keel_tps="$(median_of "$dir/metrics.jsonl" tokens_per_s)"
        keel_mfu="$(median_of "$dir/metrics.jsonl" mfu)" # against this run's peak
        keel_peak="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["peak_flops"])' "$dir/summary.json")"
        torch_tps=""
        torch_fpt=""
        if [ "$have_torch" = 1 ]; then
            echo "bench: torch $name, $threads thread(s), $steps steps" >&2
            if OMP_WAIT_POLICY=PASSIVE "$torch_python" "$root/bench/torch_train.py" "$config" \
                    --threads "$threads" --steps "$steps" --warmup "$warmup" \
                    >"$tmp/torch.json" 2>"$tmp/torch.log"; then
                torch_tps="$(json_of "$tmp/torch.json" tokens_per_s_median)"
                torch_fpt="$(json_of "$tmp/torch.json" flops_per_token)"
            else
                tail -5 "$tmp/torch.log" >&2
                echo "bench: torch run failed on $config (its column stays empty)" >&2
            fi
        fi
        rows+=("$name $threads $keel_tps $keel_mfu $keel_peak ${torch_tps:--} ${torch_fpt:--}")
    done
done

load_end="$(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$have_torch" "${torch_version:-}" "$cpu" "$load_start" "$load_end" "${rows[@]}" <<'EOF'
import sys
have_torch, torch_version = sys.argv[1] == "1", sys.argv[2]
cpu, load_start, load_end = sys.argv[3:6]
rows = [r.split() for r in sys.argv[6:]]
# Each keel run measured one core's FMA peak at start-up (peak_flops = core x threads).
peak_thr = max(float(r[4]) / int(r[1]) for r in rows)
peak_all = 2 * peak_thr
print()
print("fp32 training throughput, median over steps after warm-up")
print(f"CPU: {cpu}; load average {load_start} at start, {load_end} at end (other work skews it)")
print(f"MFU against the 2-core fp32 peak measured by keel here: {peak_all/1e9:.0f} GF/s "
      f"({peak_thr/1e9:.0f} GF/s per core); MFU/thr against the threads used")
print("torch: " + (f"{torch_version}, CPU, LlamaForCausalLM eager attention, AdamW, "
                   "OMP_WAIT_POLICY=PASSIVE" if have_torch else
                   "not installed (bash scripts/setup-torch.sh): keel only"))
head = ("config", "threads", "keel tok/s", "keel MFU", "keel MFU/thr", "torch tok/s", "torch MFU", "ratio")
fmt = "| {:<6} | {:>7} | {:>10} | {:>8} | {:>12} | {:>11} | {:>9} | {:>6} |"
print(fmt.format(*head))
print("|" + "|".join("-" * (len(fmt.format(*head).split("|")[i + 1])) for i in range(len(head))) + "|")
best = {}
for name, threads, ktps, kmfu, kpeak, ttps, tfpt in rows:
    threads, ktps, kmfu = int(threads), float(ktps), float(kmfu)
    fpt = kmfu * float(kpeak) / ktps
    cells = [name, threads, f"{ktps:.0f}", f"{100*ktps*fpt/peak_all:.1f}%",
             f"{100*ktps*fpt/(peak_thr*threads):.1f}%"]
    if ttps != "-":
        ttps = float(ttps)
        cells += [f"{ttps:.0f}", f"{100*ttps*fpt/peak_all:.1f}%", f"{ktps/ttps:.2f}x"]
        if abs(float(tfpt) / fpt - 1) > 1e-6:
            print(f"warning: {name}: FLOPs/token differ, keel {fpt:.4g} torch {float(tfpt):.4g}")
    else:
        cells += ["-", "-", "-"]
    print(fmt.format(*cells))
    b = best.setdefault(name, {"fpt": fpt})
    if ktps > b.get("keel", (0, 0))[0]:
        b["keel"] = (ktps, threads)
    if ttps != "-" and ttps > b.get("torch", (0, 0))[0]:
        b["torch"] = (ttps, threads)
for name, b in best.items():
    line = f"{name}: {b['fpt']/1e6:.1f} MFLOP/token; keel best {b['keel'][0]:.0f} tok/s ({b['keel'][1]} threads)"
    if "torch" in b:
        line += (f"; torch best {b['torch'][0]:.0f} tok/s ({b['torch'][1]} threads); "
                 f"keel best / torch best = {b['keel'][0]/b['torch'][0]:.2f}x")
    print(line)
EOF
