#!/usr/bin/env bash
# recovery.sh: what failures cost a supervised run. Not a test.
# (1) configs/tiny.json on 2 ranks, 300 steps, a checkpoint every 50 steps,
#     in-memory snapshots every step (the default), and one kill -9 of a
#     random rank at a random step in each block of 100 steps (three
#     failures). Per failure: detection (kill -> the supervisor's failure
#     event), recovery (the failure's last sign of life -> first step after
#     the resume, from summary.json) and where it went (detect, health checks,
#     backoff, launch, restore and its source, first step), lost steps; for
#     the run: goodput (productive step time / wall time). Targets: lost steps
#     <= 1 per failure, recovery median <= 1 s + one step, goodput >= 97%.
# (2) a SIGSTOP of a rank once steps are steady: time to the failure event.
# (3) what snapshots cost: tiny and small on 2 ranks, snapshot every 0 (off),
#     1, 2 and 5 steps, in rounds (one run of each per round), the median
#     step time of each and its ratio to off. Target: < 5% at every step.
#
#   bash bench/recovery.sh
#   BENCH_STEPS=600 BENCH_EVERY=20 BENCH_ROUNDS=3 bash bench/recovery.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
steps="${BENCH_STEPS:-300}"
every="${BENCH_EVERY:-50}"
rounds="${BENCH_ROUNDS:-2}"
if [ -z "${KEEL_BIN:-}" ]; then
    make -C "$root" keel >/dev/null
    KEEL_BIN="$root/build/keel"
fi
export KEEL_SRC="$root" KEEL_BIN WAIT_STEP_S=900
source "$root/tests/lib.sh" # hb, wait_train_step, TMP (removed on exit)
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg)"
run=$TMP/run
"$KEEL_BIN" train "$root/configs/tiny.json" --nproc 2 --set train.steps="$steps" \
    --set checkpoint.every_steps="$every" --run-dir "$run" >"$TMP/out" 2>&1 &
sup=$!
last=x
: >"$TMP/kills"
for block in $(seq 0 $(( steps / 100 - 1 ))); do
    at=$(( block * 100 + 20 + RANDOM % 60 )) rank=$(( RANDOM % 2 ))
    last=$(wait_train_step "$run" "$rank" "$at" "$last")
    done_steps=$(hb step "$run" "$rank")
    echo "$(date +%s.%N) $rank $done_steps" >>"$TMP/kills"
    kill -9 "$last"
    for _ in $(seq 1 1200); do [ "$(event_count "$run" failure)" -gt "$block" ] && break; sleep 0.05; done
done
rc=0; wait "$sup" || rc=$?
[ "$rc" = 0 ] || { tail -20 "$TMP/out"; echo "keel train exit $rc" >&2; exit 1; }
python3 - "$run" "$TMP/kills" "$every" <<'PY'
import json, sys
run, kills, every = sys.argv[1], sys.argv[2], int(sys.argv[3])
ev = [json.loads(l) for l in open(f"{run}/events.jsonl")]
fails = [e for e in ev if e["event"] == "failure"]
lost = [e for e in ev if e["event"] == "lost_work"]
s = json.load(open(f"{run}/summary.json"))
rec = s["recovery_s"]["each"]
split = s["recovery_s"]["split"]
print(f"\n| failure | killed | at step | detection s | recovery s | detect | health | backoff | launch | restore (from) "
      f"| first step | lost steps |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
for i, line in enumerate(open(kills)):
    t, rank, step = line.split()
    det = fails[i]["unix_s"] - float(t)
    x = split[i]
    print(f"| {i + 1} | rank {rank} | {int(step) + 1} | {det:.2f} | {rec[i]:.2f} | {x['detect']:.2f} | {x['health']:.2f} "
          f"| {x['backoff']:.2f} | {x['launch']:.2f} | {x['restore']:.2f} ({x['source']}) | {x['first_step']:.2f} "
          f"| {lost[i].get('steps', 0)} |")
for k in ("detect", "health", "backoff", "launch", "restore", "first_step"):
    v = sorted(x[k] for x in split)
    print(f"median {k}: {v[len(v) // 2]:.2f} s", end="; " if k != "first_step" else "\n")
med = sorted(rec)[len(rec) // 2]
step_s = s['tokens'] / s['steps'] / s['tokens_per_s_median']
print(f"\nsteps {s['steps']}, restarts {s['restarts']}, lost steps {s['lost_steps']} (checkpoint every {every}, "
      f"snapshot every step), recovery median {med:.2f} s max {max(rec):.2f} s, goodput {100 * s['goodput']:.1f}% "
      f"(wall {s['supervisor_wall_s']:.1f} s, median step {step_s:.3f} s)")
print(f"targets: lost <= 1 step per failure: {'met' if all(l.get('steps', 0) <= 1 for l in lost) else 'MISSED'}; "
      f"recovery median <= 1 s + one step ({1 + step_s:.2f} s): {'met' if med <= 1 + step_s else 'MISSED'}; "
      f"goodput >= 97%: {'met' if s['goodput'] >= 0.97 else 'MISSED'}")
PY

# hang detection: SIGSTOP of rank 1 once steps are steady, with the automatic timeout
hang=$TMP/hang
"$KEEL_BIN" train "$root/configs/tiny.json" --nproc 2 --set train.steps=100000 --set resilience.max_restarts=0 \
    --run-dir "$hang" >"$TMP/hang.out" 2>&1 &
sup=$!
pid=$(wait_train_step "$hang" 1 30)
t0=$(date +%s.%N)
kill -STOP "$pid"
wait "$sup" || true
python3 - "$hang" "$t0" <<'PY'
import json, sys
ev = [json.loads(l) for l in open(f"{sys.argv[1]}/events.jsonl")]
f = [e for e in ev if e["event"] == "failure"][0]
print(f"\nhang: SIGSTOP of rank 1 at step 30+ -> detected in {f['unix_s'] - float(sys.argv[2]):.2f} s: {f['detail']}")
PY

# what snapshots cost per step: rounds of (off, 1, 2, 5) for tiny and small
echo
echo "| model | snapshot every | median step s (per round) | median | vs off | snapshot bytes per rank |"
echo "|---|---|---|---|---|---|"
for model in tiny small; do
    n=30; [ "$model" = small ] && n=8
    for r in $(seq 1 "$rounds"); do
        for k in 0 1 2 5; do
            "$KEEL_BIN" train "$root/configs/$model.json" --nproc 2 --set train.steps=$n \
                --set resilience.snapshot_every_steps=$k --run-dir "$TMP/cost-$model-$k-$r" >"$TMP/cost.out" 2>&1 ||
                { tail -5 "$TMP/cost.out"; exit 1; }
        done
    done
    python3 - "$TMP" "$model" "$rounds" <<'PY'
import json, statistics, sys
tmp, model, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
def steps(k, r):  # the step times of a run, its first two (warm-up) left out
    return [json.loads(l)["step_s"] for l in open(f"{tmp}/cost-{model}-{k}-{r}/metrics.jsonl")][2:]
med = {k: statistics.median([x for r in range(1, rounds + 1) for x in steps(k, r)]) for k in (0, 1, 2, 5)}
for k in (0, 1, 2, 5):
    per = ", ".join(f"{statistics.median(steps(k, r)):.3f}" for r in range(1, rounds + 1))
    b = json.load(open(f"{tmp}/cost-{model}-{k}-1/summary.json"))["ranks"][0]["snapshot_bytes"]
    print(f"| {model} | {k or 'off'} | {per} | {med[k]:.3f} | {100 * (med[k] / med[0] - 1):+.1f}% | {b / 2**20:.0f} MiB |")
PY
done
