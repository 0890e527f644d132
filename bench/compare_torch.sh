#!/usr/bin/env bash
# compare_torch.sh: keel's FSDP beside PyTorch's on CPU, side by side in one run:
# 2 ranks with one thread each, same model (configs/NAME.json), per-rank batch
# (the config's train.micro_batch_size: tiny 4, small 1), sequence length, AdamW
# and gradient clipping. For each config and strategy: keel fp32 (and bf16 when
# `keel config keys` lists fsdp.mixed_precision) against PyTorch's matching
# configurations from bench/torch_fsdp.py — FSDP2 (fully_shard), FSDP1
# (FullyShardedDataParallel per decoder layer), DDP for no_shard — fp32 and bf16
# mixed precision; the PyTorch cell shows the best variant and the others.
# Before them, one process with both threads at the same global batch: keel
# 1 rank x 2 threads and PyTorch's plain loop (bench/torch_train.py, fp32 and bf16
# autocast), so the FSDP tax on one node (2 ranks x 1 thread against 1 x 2) is in
# the same run. Every keel run profiles one step (train.profile_steps, left out of
# the medians): a table shows where its time went (bench/profile_shares.py) and its
# MFU against the peak keel measured for its precision. Medians over the steps
# after BENCH_WARMUP warm-up steps; peak RSS is the max over the 2 ranks. Not a
# test.
#
#   bash bench/compare_torch.sh
#   BENCH_RUNS="tiny:4" BENCH_STRATEGIES="full_shard" bash bench/compare_torch.sh
#   BENCH_TORCH_IMPLS="fsdp2 ddp" BENCH_TORCH_PRECISIONS="fp32" bash bench/compare_torch.sh
#
# BENCH_RUNS (name:steps, default "tiny:8 small:5"), BENCH_ONE_PROCESS (1; 0 leaves
# the one-process runs out), BENCH_STRATEGIES (default
# "full_shard shard_grad_op no_shard"; hybrid_shard too if asked, with shard group
# 2 — on 2 ranks that is full_shard), BENCH_WARMUP (2), BENCH_BATCH (sequences per
# rank; default the config's), BENCH_TORCH_IMPLS ("fsdp2 fsdp1 ddp"),
# BENCH_KEEL_PRECISIONS (default fp32 and bf16), BENCH_TORCH_PRECISIONS ("fp32 bf16"; bf16 = bf16 params/GEMMs with fp32
# gradient reduction, keel's design; add bf16r for bf16 reduction too), BENCH_TORCH_TIMEOUT
# (seconds per PyTorch variant, 900), KEEL_BIN, KEEL_TORCH_VENV (/opt/keel-torch, from
# scripts/setup-torch.sh; without it keel's numbers still print).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
runs="${BENCH_RUNS:-tiny:8 small:5}"
strategies="${BENCH_STRATEGIES:-full_shard shard_grad_op no_shard}"
warmup="${BENCH_WARMUP:-2}"
torch_impls="${BENCH_TORCH_IMPLS:-fsdp2 fsdp1 ddp}"
torch_precisions="${BENCH_TORCH_PRECISIONS:-fp32 bf16}"
torch_timeout="${BENCH_TORCH_TIMEOUT:-900}"
torch_python="${KEEL_TORCH_VENV:-/opt/keel-torch}/bin/python"
one_process="${BENCH_ONE_PROCESS:-1}"

if [ -z "${KEEL_BIN:-}" ]; then
    make -C "$root" keel >/dev/null
    KEEL_BIN="$root/build/keel"
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

have_torch=0
torch_version=""
if [ -x "$torch_python" ] && "$torch_python" -c 'import torch, transformers' 2>/dev/null; then
    have_torch=1
    torch_version="$("$torch_python" -c 'import torch, transformers; print(f"torch {torch.__version__}, transformers {transformers.__version__}")')"
fi
keel_precisions="fp32"
# (not `keel config keys | grep -q`: grep quits at the match, keel gets SIGPIPE and pipefail fails it)
if grep -q 'fsdp\.mixed_precision' <<<"$("$KEEL_BIN" config keys 2>/dev/null)"; then
    keel_precisions="fp32 bf16"
fi
keel_precisions="${BENCH_KEEL_PRECISIONS:-$keel_precisions}"

cpu="$(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
grep -qw amx_tile /proc/cpuinfo && cpu="$cpu, AMX" || cpu="$cpu, no AMX"
grep -qw avx512_bf16 /proc/cpuinfo && cpu="$cpu, AVX512_BF16"
load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
results="$tmp/results.jsonl"
# measure.py OUT CMD...: runs CMD and writes how many cores other work on the machine
# kept busy meanwhile (/proc/stat busy time less CMD's own CPU time, over the wall time).
cat >"$tmp/measure.py" <<'PY'
import json, os, resource, subprocess, sys, time
def cpu():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    hz = os.sysconf("SC_CLK_TCK")
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / hz, v[7] / hz
(busy0, steal0), t0 = cpu(), time.monotonic()
rc = subprocess.call(sys.argv[2:])
wall, (busy1, steal1) = time.monotonic() - t0, cpu()
c = resource.getrusage(resource.RUSAGE_CHILDREN)
with open(sys.argv[1], "w") as f:
    json.dump({"other_cores": max(0.0, busy1 - busy0 - c.ru_utime - c.ru_stime) / wall,
               "steal_cores": (steal1 - steal0) / wall, "children_max_rss_bytes": c.ru_maxrss * 1024}, f)
sys.exit(rc)
PY
: >"$results"
keel_failed=0
# keel_row.py DIR CONFIG STRATEGY PRECISION WARMUP LOAD: a keel run's results line —
# the median tok/s and MFU over the steps after the warm-up but the profiled one, the
# peak RSS, and where the profiled step's time went on rank 0.
cat >"$tmp/keel_row.py" <<'PY'
import json, statistics, sys
d, name, strategy, precision, warmup = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
sys.path.insert(0, sys.argv[7])
from profile_shares import shares
load = json.load(open(sys.argv[6]))
load.pop("children_max_rss_bytes", None)
prof = json.load(open(f"{d}/profile.json"))
rows = [json.loads(l) for l in open(f"{d}/metrics.jsonl") if '"tokens_per_s"' in l]
kept = [r for r in rows[warmup:] if r["step"] != prof["first_step"]] or rows
s = json.load(open(f"{d}/summary.json"))
print(json.dumps({"who": "keel", "config": name, "strategy": strategy, "precision": precision,
                  "ok": True, "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in kept),
                  "mfu_median": statistics.median(r.get("mfu", 0.0) for r in kept),
                  "peak_flops": s.get("peak_flops", 0.0),
                  "peak_rss_bytes_max": max(r["peak_rss_bytes"] for r in s["ranks"]),
                  "shares": shares(prof), **load}))
PY
# keel_run CONFIG NAME STRATEGY PRECISION STEPS DIR ARGS...: one keel run, its results line.
keel_run() {
    local config=$1 name=$2 strategy=$3 precision=$4 steps=$5 dir=$6
    shift 6
    [ "$precision" = fp32 ] || set -- "$@" --set fsdp.mixed_precision="$precision"
    if python3 "$tmp/measure.py" "$tmp/load.json" "$KEEL_BIN" train "$config" --set train.steps="$steps" \
            --set train.profile_steps=1 "$@" \
            --run-dir "$dir" >"$tmp/keel.log" 2>&1; then
        python3 "$tmp/keel_row.py" "$dir" "$name" "$strategy" "$precision" "$warmup" "$tmp/load.json" \
            "$root/bench" >>"$results"
    else
        tail -5 "$tmp/keel.log" >&2
        echo "bench: keel $name $strategy $precision failed" >&2
        keel_failed=1
        python3 -c 'import json,sys; print(json.dumps({"who": "keel", "config": sys.argv[1], "strategy": sys.argv[2], "precision": sys.argv[3], "ok": False, "error": sys.argv[4]}))' \
            "$name" "$strategy" "$precision" "$(grep -v '^\s*$' "$tmp/keel.log" | tail -1)" >>"$results"
    fi
}

for run in $runs; do
    name=${run%%:*} steps=${run##*:}
    config="$root/configs/$name.json"
    batch="${BENCH_BATCH:-$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("train", {}).get("micro_batch_size", 4))' "$config")}"
    if [ "$one_process" = 1 ]; then
        # One process with both threads, the 2 ranks' global batch: keel, then PyTorch's plain loop.
        for precision in $keel_precisions; do
            echo "bench: keel $name, 1 rank x 2 threads, $precision, batch $((2 * batch)), $steps steps" >&2
            keel_run "$config" "$name" one_process "$precision" "$steps" "$tmp/keel-$name-one-$precision" \
                --nproc 1 --set train.threads=2 --set train.micro_batch_size=$((2 * batch))
        done
        for precision in $torch_precisions; do
            [ "$have_torch" = 1 ] && [ "$precision" != bf16r ] || continue
            echo "bench: PyTorch $name, 1 process x 2 threads, $precision, batch $((2 * batch)), $steps steps" >&2
            flag=(); [ "$precision" = fp32 ] || flag=(--bf16)
            if python3 "$tmp/measure.py" "$tmp/load.json" timeout "$torch_timeout" "$torch_python" "$root/bench/torch_train.py" \
                    "$config" --threads 2 --batch $((2 * batch)) --steps "$steps" --warmup "$warmup" ${flag[@]+"${flag[@]}"} \
                    >"$tmp/torch.json" 2>"$tmp/torch.log"; then
                python3 - "$tmp/torch.json" "$tmp/load.json" "$name" "$precision" >>"$results" <<'PY'
import json, sys
r, load = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
rss = load.pop("children_max_rss_bytes")
print(json.dumps({"who": "torch", "impl": "1 process", "config": sys.argv[3], "strategy": "one_process",
                  "precision": sys.argv[4], "ok": True, "tokens_per_s_median": r["tokens_per_s_median"],
                  "peak_rss_bytes_max": rss, **load}))
PY
            else
                tail -3 "$tmp/torch.log" >&2
                python3 -c 'import json,sys; print(json.dumps({"who": "torch", "impl": "1 process", "config": sys.argv[1], "strategy": "one_process", "precision": sys.argv[2], "ok": False, "error": sys.argv[3]}))' \
                    "$name" "$precision" "$(grep -v '^\s*$' "$tmp/torch.log" | tail -1)" >>"$results"
            fi
        done
    fi
    for strategy in $strategies; do
        for precision in $keel_precisions; do
            echo "bench: keel $name $strategy $precision, 2 ranks, batch $batch/rank, $steps steps" >&2
            keel_run "$config" "$name" "$strategy" "$precision" "$steps" "$tmp/keel-$name-$strategy-$precision" \
                --nproc 2 --set train.threads=1 --set train.micro_batch_size="$batch" \
                --set fsdp.strategy="$strategy" --set fsdp.shard_group_size=2
        done
        # PyTorch's variants of this strategy right after keel's runs of it, so both see
        # about the same load from other work on the machine.
        torch_variants=""
        for impl in $torch_impls; do
            for precision in $torch_precisions; do
                if [ "$impl" = ddp ] && { [ "$strategy" != no_shard ] || [ "$precision" = bf16r ]; }; then
                    continue
                fi
                torch_variants="$torch_variants,$impl:$strategy:$precision"
            done
        done
        if [ "$have_torch" = 1 ] && [ -n "$torch_variants" ]; then
            echo "bench: PyTorch $name ${torch_variants#,}, $steps steps each" >&2
            # Exits non-zero when a variant failed; its JSON line says why.
            "$torch_python" "$root/bench/torch_fsdp.py" "$config" --variants "${torch_variants#,}" \
                --steps "$steps" --warmup "$warmup" --batch "$batch" --threads 1 \
                --timeout "$torch_timeout" >"$tmp/torch.jsonl" 2>"$tmp/torch.log" || true
            if ! grep -q '^{' "$tmp/torch.jsonl"; then
                tail -5 "$tmp/torch.log" >&2
                echo "bench: bench/torch_fsdp.py printed nothing for $name $strategy" >&2
            fi
            grep '^{' "$tmp/torch.jsonl" >>"$results" || true
        fi
    done
done

load_end="$(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$results" "$have_torch" "$torch_version" "$cpu" "$load_start" "$load_end" \
    "$keel_precisions" "$torch_precisions" "$strategies" "$runs" "$warmup" "$root/bench" <<'EOF'
import json, sys
(path, have_torch, torch_version, cpu, load_start, load_end, keel_precisions,
 torch_precisions, strategies, runs, warmup) = sys.argv[1:12]
sys.path.insert(0, sys.argv[12])
from profile_shares import HEADER, cells
have_torch = have_torch == "1"
keel_precisions, torch_precisions = keel_precisions.split(), torch_precisions.split()
strategies = strategies.split()
configs = [r.split(":")[0] for r in runs.split()]
rows = [json.loads(l) for l in open(path) if l.strip()]
keel = {(r["config"], r["strategy"], r["precision"]): r for r in rows if r.get("who") == "keel"}
single = [r for r in rows if r.get("who") != "keel" and r["strategy"] == "one_process"]
torch = [r for r in rows if r.get("who") != "keel" and r["strategy"] != "one_process"]
mib = lambda b: f"{b / 2**20:.0f} MiB"
family = lambda p: "bf16" if p.startswith("bf16") else p  # bf16r is a bf16 variant

print()
print(f"keel FSDP vs PyTorch on CPU: 2 ranks x 1 thread, median tok/s (both ranks) over the "
      f"steps after {warmup} warm-up steps, peak RSS = max over ranks")
print(f"machine: {cpu}; load average {load_start} at start, {load_end} at end (other work skews it)")
print("PyTorch: " + (f"{torch_version}, gloo, LlamaForCausalLM eager attention, AdamW, "
                     "OMP_WAIT_POLICY=PASSIVE; variants fsdp2 (fully_shard per layer), "
                     "fsdp1 (FullyShardedDataParallel per decoder layer), ddp"
                     if have_torch else "missing (no venv at KEEL_TORCH_VENV; "
                     "bash scripts/setup-torch.sh): keel only"))
print("| config | strategy | precision | keel tok/s | PyTorch tok/s (variant) | ratio "
      "| keel peak RSS/rank | PyTorch peak RSS/rank | other load keel / PyTorch |")
print("|---|---|---|---|---|---|---|---|---|")
load = lambda r: f"{r['other_cores']:.1f}" if r and "other_cores" in r else "-"
skewed = []
precisions = list(dict.fromkeys(keel_precisions + ([family(p) for p in torch_precisions]
                                                   if have_torch else [])))
for c in configs:
    for s in strategies:
        for p in precisions:
            k = keel.get((c, s, p))
            if k is None:
                kcell, krss = ("n/a" if p not in keel_precisions else "-"), "-"
            elif not k["ok"]:
                kcell, krss = "failed", "-"
            else:
                kcell, krss = f"{k['tokens_per_s_median']:.0f}", mib(k["peak_rss_bytes_max"])
            mine = [r for r in torch if r["config"] == c and r["strategy"] == s
                    and family(r["precision"]) == p]
            good = sorted((r for r in mine if r["ok"]), key=lambda r: -r["tokens_per_s_median"])
            name = lambda r: r["impl"] + ("+bf16 reduce" if r["precision"] == "bf16r" else "")
            if good:
                b = good[0]
                others = [f"{name(r)} {r['tokens_per_s_median']:.0f}" for r in good[1:]]
                others += [f"{name(r)} failed" for r in mine if not r["ok"]]
                tcell = f"{b['tokens_per_s_median']:.0f} ({name(b)}" + \
                    (f"; {', '.join(others)})" if others else ")")
                trss = mib(b["peak_rss_bytes_max"])
                ratio = (f"{k['tokens_per_s_median'] / b['tokens_per_s_median']:.2f}x"
                         if k and k["ok"] else "-")
            else:
                tcell = ("failed (" + ", ".join(name(r) for r in mine) + ")") if mine else "-"
                trss, ratio = "-", "-"
            if k is None and not mine:
                continue
            b = good[0] if good else None
            if any(r and r.get("other_cores", 0) > 0.25 for r in (k, b)):
                skewed.append(f"{c} {s} {p}")
            print(f"| {c} | {s} | {p} | {kcell} | {tcell} | {ratio} | {krss} | {trss} "
                  f"| {load(k)} / {load(b)} |")

print("other load: cores that other work on the machine kept busy during the run shown "
      "(/proc/stat busy time less the run's own CPU time, over its wall time; 2 cores in all)"
      + (f"; above 0.25, numbers skewed: {', '.join(skewed)}" if skewed else ""))
if "hybrid_shard" in strategies:
    print("hybrid_shard: shard groups of 2 on 2 ranks = one group, i.e. full_shard with a "
          "1-way replica dimension (keel fsdp.shard_group_size=2; PyTorch mesh 1 x 2).")
imp = [r["import_rss_bytes_max"] for r in torch if r["ok"] and "import_rss_bytes_max" in r]
if imp:
    print(f"PyTorch peak RSS includes {mib(min(imp))}-{mib(max(imp))} per rank that torch and "
          "transformers hold after import, before the model is built.")
print()
ks = "full_shard" if "full_shard" in strategies else strategies[0]
tps = lambda r: r["tokens_per_s_median"] if r and r["ok"] else None
fmt = lambda x: "failed" if x is None else f"{x:.0f}"
ratio = lambda a, b: f"{a / b:.2f}x" if a and b else "-"
def best_of(c, precision, where=None):
    """PyTorch's fastest run of config c in precision's family (where: its strategy)."""
    return max((r for r in torch if r["config"] == c and r["ok"] and family(r["precision"]) == precision
                and where in (None, r["strategy"])), key=lambda r: r["tokens_per_s_median"], default=None)
if any(s == "one_process" for (_, s, _) in keel):
    print(f"One node, the same global batch: keel 1 rank x 2 threads (nothing sharded) and 2 ranks x 1 "
          f"thread ({ks}), PyTorch's plain loop in 1 process x 2 threads (bench/torch_train.py; bf16 = "
          "autocast) and its best 2-rank run")
    print("| config | precision | keel 1x2 tok/s | keel 2x1 tok/s | keel 2x1 / 1x2 | PyTorch 1 process tok/s "
          "| PyTorch best 2 ranks tok/s | keel 1x2 / PyTorch 1 process | keel 2x1 / PyTorch 2 ranks |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in configs:
        for p in precisions:
            one, two = keel.get((c, "one_process", p)), keel.get((c, ks, p))
            t1 = next((r for r in single if r["config"] == c and r["precision"] == p), None)
            t2 = best_of(c, p)
            if not (one or t1):
                continue
            best2 = f"{tps(t2):.0f} ({t2['impl']} {t2['strategy']})" if t2 else "-"
            print(f"| {c} | {p} | {fmt(tps(one)) if one else '-'} | {fmt(tps(two)) if two else '-'} "
                  f"| {ratio(tps(two), tps(one))} | {fmt(tps(t1)) if t1 else '-'} | {best2} "
                  f"| {ratio(tps(one), tps(t1))} | {ratio(tps(two), tps(t2))} |")
    print()
print("Where keel's profiled step went (rank 0; bench/profile_shares.py), and its MFU against the peak keel "
      "measured for the precision (peak GF/s: all ranks' cores)")
print("| config | run | precision | tok/s | MFU | peak GF/s | " + " | ".join(HEADER) + " |")
print("|" + "---|" * (6 + len(HEADER)))
for c in configs:
    for s in ["one_process"] + strategies:
        for p in keel_precisions:
            k = keel.get((c, s, p))
            if not k or not k["ok"]:
                continue
            run = "1 rank x 2 threads" if s == "one_process" else f"2 ranks x 1 thread, {s}"
            print(f"| {c} | {run} | {p} | {tps(k):.0f} | {100 * k['mfu_median']:.1f}% | {k['peak_flops'] / 1e9:.0f} | "
                  + " | ".join(cells(k["shares"])) + " |")
print()
def best_fp32(c, strategy=None):
    return max((r for r in torch if r["config"] == c and r["ok"] and r["precision"] == "fp32"
                and strategy in (None, r["strategy"])), key=lambda r: r["tokens_per_s_median"], default=None)
for c in configs:
    best, same = best_fp32(c), best_fp32(c, ks)
    kf, kb = keel.get((c, ks, "fp32")), keel.get((c, ks, "bf16"))
    tb = (f"PyTorch's best distributed fp32 {best['tokens_per_s_median']:.0f} tok/s "
          f"({best['impl']} {best['strategy']})" if best else
          "PyTorch's best fp32: none ran" if have_torch else "PyTorch: missing")
    line = f"{c}: keel {ks} fp32 "
    line += f"{kf['tokens_per_s_median']:.0f} tok/s" if kf and kf["ok"] else "failed"
    line += f" vs {tb}"
    if best and kf and kf["ok"]:
        r = kf["tokens_per_s_median"] / best["tokens_per_s_median"]
        line += f" = {r:.2f}x (target >= 1.5x: {'met' if r >= 1.5 else 'missed'})"
    print(line)
    if "bf16" not in keel_precisions:
        print(f"{c}: keel bf16: not run (BENCH_KEEL_PRECISIONS, or `keel config keys` has no "
              "fsdp.mixed_precision); target >= 3x PyTorch fp32 on the same strategy")
    elif kb and kb["ok"]:
        line = f"{c}: keel {ks} bf16 {kb['tokens_per_s_median']:.0f} tok/s"
        if same:  # the target: PyTorch fp32 on the same strategy (its best variant)
            r = kb["tokens_per_s_median"] / same["tokens_per_s_median"]
            line += (f" = {r:.2f}x PyTorch fp32 {ks} ({same['impl']} {same['tokens_per_s_median']:.0f}; "
                     f"target >= 3x: {'met' if r >= 3 else 'missed'})")
        if best:
            line += f", {kb['tokens_per_s_median'] / best['tokens_per_s_median']:.2f}x {tb}"
        print(line if best or same else f"{line} vs {tb}")
    else:
        print(f"{c}: keel {ks} bf16: " + ("failed" if kb else "not run"))
    autocast = next((r for r in torch if r["config"] == c and r["ok"] and r["impl"] == "ddp"
                     and r["precision"] == "bf16"), None)
    if kb and kb["ok"] and autocast:
        r = kb["tokens_per_s_median"] / autocast["tokens_per_s_median"]
        print(f"{c}: keel {ks} bf16 = {r:.2f}x PyTorch's bf16 autocast DDP "
              f"({autocast['tokens_per_s_median']:.0f} tok/s; target >= 1.5x: {'met' if r >= 1.5 else 'missed'})")
    for p in keel_precisions:
        one, two = keel.get((c, "one_process", p)), keel.get((c, ks, p))
        if tps(one) and tps(two):
            r = tps(two) / tps(one)
            print(f"{c}: keel 2 ranks x 1 thread / 1 rank x 2 threads, {p}: {r:.2f} (target >= 0.95: "
                  f"{'met' if r >= 0.95 else 'missed'}; one run each — bench/ranks_threads.sh alternates rounds)")

# Failures, grouped by variant family and message.
groups = {}
for r in torch + single:
    if not r["ok"]:
        key = (r["impl"], r["precision"], r["error"])
        groups.setdefault(key, []).append(f"{r['config']} {r['strategy']}")
for (impl, prec, err), where in groups.items():
    what = {"bf16": "bf16 params (fp32 reduce)", "bf16r": "bf16 params + bf16 reduce",
            "fp32": "fp32"}[prec]
    if impl == "ddp" and prec == "bf16":
        what = "bf16 autocast"
    print(f"PyTorch could not run {impl} {what} on CPU ({', '.join(where)}): {err}")
if have_torch and torch + single and not groups:
    print(f"PyTorch could not run on CPU: nothing; all {len(torch + single)} variants ran "
          f"({', '.join(sorted({r['impl'] for r in torch + single}))}; "
          f"{', '.join(sorted({r['precision'] for r in torch + single}))}, gloo).")
for (c, s, p), k in keel.items():
    if not k["ok"]:
        print(f"keel failed: {c} {s} {p}: {k['error']}")
EOF
exit "$keel_failed"
