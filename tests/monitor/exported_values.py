"""Checks the values keel exported against what the run recorded: every scrape's
keel_* run families against metrics.jsonl and events.jsonl of the same run
directory, each series' exact value (not a range, not that it exists).

  exported_values.py prometheus PROM_PORT RUN T_LAUNCH T_ANNOUNCE
      every scrape Prometheus stored (job="keel"): RUN's serving process was
      started after T_LAUNCH and had announced its endpoint by T_ANNOUNCE
      (unix seconds), which bounds keel_goodput's wall time
  exported_values.py text METRICS.TXT RUN T_LAUNCH T_AFTER
      one /metrics text of a run whose process started after T_LAUNCH,
      fetched before T_AFTER

A scrape read metrics.jsonl up to some line: the line whose step,
tokens_per_s and step_s are the scraped ones. From that prefix:
keel_step/loss/learning_rate/grad_norm/tokens_per_second/mfu/step_seconds/
tokens_total are its last line's fields, val_loss the last evaluation's,
exposed communication and checkpoint stall the sums of the prefix's
comm_wait_s and ckpt_stall_s, and goodput the newest step_s of each step (a
step redone after a rollback counts once) over the wall time since the
serving process started. It read events.jsonl up to some line near its
time: failures by cause, restarts, the last and median recovery, the newest
committed checkpoint and the drained nodes must all be one prefix's counts.
Prints one line; exits 1 naming the first family that disagrees.
"""
import json, statistics, sys, urllib.parse, urllib.request

CAUSES = ["crash", "hang", "diverged", "preempted", "health", "straggler"]
METRIC_FIELDS = {"keel_step": "step", "keel_loss": "loss", "keel_learning_rate": "lr",
                 "keel_grad_norm": "grad_norm", "keel_tokens_per_second": "tokens_per_s", "keel_mfu": "mfu",
                 "keel_step_seconds": "step_s", "keel_tokens_total": "tokens"}


def lines(path):
    try:
        with open(path) as f:
            return [json.loads(l) for l in f if l.endswith("\n")]
    except FileNotFoundError:
        return []


def close(a, b):
    return abs(a - b) <= 1e-12 * max(1.0, abs(b))


def series_key(name, labels):
    rest = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k not in ("__name__", "job", "instance", "run"))
    return f"{name}{{{rest}}}" if rest else name


def metrics_prefix(metrics, got):
    """The index of the last metrics.jsonl line this scrape had read."""
    hits = [i for i, o in enumerate(metrics)
            if o["step"] == got["keel_step"] and o["tokens_per_s"] == got["keel_tokens_per_second"] and
            o["step_s"] == got["keel_step_seconds"]]
    if not hits:
        raise AssertionError(f"no metrics.jsonl line has step {got['keel_step']}, tokens_per_s "
                             f"{got['keel_tokens_per_second']}, step_s {got['keel_step_seconds']}")
    return hits[-1]


def expected_from_metrics(metrics, k):
    want, last = {}, metrics[k]
    for family, field in METRIC_FIELDS.items():
        if field in last:
            want[family] = float(last[field])
    vals = [o["val_loss"] for o in metrics[:k + 1] if "val_loss" in o]
    if vals:
        want["keel_val_loss"] = float(vals[-1])
    comm = ckpt = 0.0
    for o in metrics[:k + 1]:
        comm += o.get("comm_wait_s", 0.0)
        ckpt += o.get("ckpt_stall_s", 0.0)
    want["keel_exposed_communication_seconds_total"] = comm
    want["keel_checkpoint_stall_seconds_total"] = ckpt
    return want


def productive_s(metrics, k):
    newest = {}
    for o in metrics[:k + 1]:
        if o["step"] >= 1:
            newest[o["step"]] = o["step_s"]
    return sum(newest[s] for s in sorted(newest))


def expected_from_events(events, j):
    want = {f'keel_failures_total{{cause="{c}"}}': 0.0 for c in CAUSES}
    other = restarts = 0
    recoveries, ckpt, drained = [], None, []
    for e in events[:j]:
        cause = e.get("cause")
        if isinstance(cause, str):
            if cause in CAUSES:
                want[f'keel_failures_total{{cause="{cause}"}}'] += 1
            else:
                other += 1
        kind = e.get("event")
        restarts += kind == "restart"
        if kind == "recovered" and isinstance(e.get("seconds"), (int, float)):
            recoveries.append(float(e["seconds"]))
        if kind == "checkpoint_committed" and isinstance(e.get("step"), (int, float)):
            ckpt = e
        if kind in ("node_drained", "node_excluded") and isinstance(e.get("node"), str) and e["node"] not in drained:
            drained.append(e["node"])
    if other:
        want['keel_failures_total{cause="other"}'] = float(other)
    want["keel_restarts_total"] = float(restarts)
    if recoveries:
        want["keel_recovery_last_seconds"] = recoveries[-1]
        want["keel_recovery_median_seconds"] = statistics.median_high(recoveries)
    if ckpt:
        want["keel_checkpoint_last_step"] = float(ckpt["step"])
        want["keel_checkpoint_bytes"] = float(ckpt.get("bytes", 0))
        want["keel_checkpoint_save_seconds"] = float(ckpt.get("seconds", 0))
    want["keel_drained_nodes"] = float(len(drained))
    for n in drained:
        want[f'keel_node_drained{{node="{n}"}}'] = 1.0
    return want


EVENT_FAMILIES = ("keel_failures_total", "keel_restarts_total", "keel_recovery_last_seconds",
                  "keel_recovery_median_seconds", "keel_checkpoint_last_step", "keel_checkpoint_bytes",
                  "keel_checkpoint_save_seconds", "keel_drained_nodes", "keel_node_drained")
METRIC_FAMILIES = tuple(METRIC_FIELDS) + ("keel_val_loss", "keel_exposed_communication_seconds_total",
                                          "keel_checkpoint_stall_seconds_total")


def pick(got, families):
    return {k: v for k, v in got.items() if k.split("{")[0] in families}


def diff(what, got, want):
    bad = [f"{k}: exported {got.get(k)}, recorded {want.get(k)}" for k in sorted(set(got) | set(want))
           if k not in got or k not in want or not close(got[k], want[k])]
    if bad:
        raise AssertionError(f"{what}: " + "; ".join(bad))


def check_scrape(got, metrics, events, ts=None, events_window=None):
    """got: series -> value of one scrape. Returns the productive seconds (None before a step)."""
    productive = None
    if "keel_step" in got:
        k = metrics_prefix(metrics, got)
        diff(f"metrics.jsonl line {k + 1} (step {got['keel_step']:g})", pick(got, METRIC_FAMILIES),
             expected_from_metrics(metrics, k))
        productive = productive_s(metrics, k)
    else:
        assert not pick(got, METRIC_FAMILIES), f"step families without keel_step: {pick(got, METRIC_FAMILIES)}"
    lo, hi = events_window if events_window else (0, len(events))
    exported = pick(got, EVENT_FAMILIES)
    for j in range(lo, hi + 1):
        want = expected_from_events(events, j)
        if set(want) == set(exported) and all(close(v, want[k]) for k, v in exported.items()):
            return productive
    raise AssertionError(f"events at {ts}: exported {exported} is no prefix of events.jsonl "
                         f"(lines {lo}..{hi}; with {hi} lines: {expected_from_events(events, hi)})")


def prometheus(port, run, t_launch, t_announce):
    q = urllib.parse.urlencode({"query": '{__name__=~"keel_.*",job="keel"}[30m]'})
    r = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/query?{q}", timeout=30))
    assert r["status"] == "success", r
    scrapes = {}
    for s in r["data"]["result"]:
        name = s["metric"]["__name__"]
        if name.startswith("keel_rank_") or name in ("keel_nvml_up", "keel_checkpoint_dir_free_bytes"):
            continue  # heartbeats and the host: tests/monitor/test_exporter.c checks them value by value
        for ts, v in s["values"]:
            scrapes.setdefault(float(ts), {})[series_key(name, s["metric"])] = float(v)
    metrics, events = lines(f"{run}/metrics.jsonl"), lines(f"{run}/events.jsonl")
    with_steps = 0
    for ts in sorted(scrapes):
        got = scrapes[ts]
        goodput = got.pop("keel_goodput", None)
        assert goodput is not None, f"scrape at {ts}: no keel_goodput"
        # events stamped well before the scrape were read; events stamped well after it were not
        # (5 s either side: a busy machine may stall a writer between stamping and writing)
        lo = max((i + 1 for i, e in enumerate(events) if e.get("unix_s", 0) < ts - 5), default=0)
        hi = next((i for i, e in enumerate(events) if e.get("unix_s", 0) > ts + 5), len(events))
        productive = check_scrape(got, metrics, events, ts, (min(lo, hi), max(lo, hi)))
        # the process started in [t_launch, t_announce] and rendered in [ts, ts + 1] (the scrape timeout)
        p = productive or 0.0
        g_lo = min(1.0, p / (ts + 1.0 - t_launch))
        g_hi = min(1.0, p / (ts - 0.01 - t_announce)) if ts - 0.01 > t_announce else 1.0
        assert g_lo - 1e-9 <= goodput <= g_hi + 1e-9, (
            f"scrape at {ts}: keel_goodput {goodput}, want {g_lo:.4f}..{g_hi:.4f} "
            f"({p:.3f} s of kept steps in metrics.jsonl over {ts - t_announce:.2f}..{ts + 1 - t_launch:.2f} s)")
        with_steps += productive is not None
    assert with_steps >= 5, f"only {with_steps} scrapes with a step"
    return f"{len(scrapes)} scrapes ({with_steps} with steps): every run family equals metrics.jsonl/events.jsonl"


def text(path, run, t_launch, t_after):
    got = {}
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        series, value = line.rsplit(" ", 1)
        name = series.split("{")[0]
        if name.startswith(("keel_rank_", "DCGM_")) or name in ("keel_nvml_up", "keel_checkpoint_dir_free_bytes"):
            continue
        got[series] = float(value)
    goodput = got.pop("keel_goodput")
    metrics, events = lines(f"{run}/metrics.jsonl"), lines(f"{run}/events.jsonl")
    productive = check_scrape(got, metrics, events)
    assert productive is not None, "no step exported"
    g_lo = min(1.0, productive / (t_after - t_launch))
    assert g_lo - 1e-9 <= goodput <= 1, (f"keel_goodput {goodput}, want at least {g_lo:.4f} ({productive:.3f} s of "
                                         f"kept steps in metrics.jsonl within {t_after - t_launch:.2f} s)")
    return f"{path}: every run family equals {run}/metrics.jsonl (step {got['keel_step']:g})"


if __name__ == "__main__":
    try:
        if sys.argv[1] == "prometheus":
            print(prometheus(sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])))
        else:
            print(text(sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])))
    except AssertionError as e:
        print(f"exported value differs from the run's record: {e}", file=sys.stderr)
        sys.exit(1)
