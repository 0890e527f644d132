/* monitor: the run as people and Prometheus see it, read from the run
 * directory alone (metrics.jsonl, events.jsonl, heartbeats; keel/run.h) —
 * the exporter (Prometheus text and a JSON view), the HTTP endpoint that
 * serves them with the dashboard page (libmicrohttpd), `keel status` and
 * `keel plot`. Any process that can read the run directory can serve it:
 * `keel train` does, as the supervisor of an --nproc run or as the single
 * process. Neither the ranks nor the supervisor call it.
 *
 *     keel_metrics_server *m;
 *     keel_metrics_serve(&cfg.metrics, "runs/x", &m);   // GET /metrics, /, /api/run
 *     ...train...
 *     keel_metrics_stop(m);
 */
#ifndef KEEL_MONITOR_H
#define KEEL_MONITOR_H

#include <stdio.h>

#include "keel/core.h"

/* ---- the exporter (exporter.c) --------------------------------------------------- */
typedef struct keel_exporter keel_exporter;
keel_exporter *keel_exporter_new(const char *run_dir);
/* The text of one scrape (free with keel_free); thread-safe. */
char *keel_exporter_render(keel_exporter *x);
/* The run as JSON for the dashboard and `keel status` (free with free()):
 * {"run_dir", "unix_s", "steps": {"step": [...], "loss", "val_loss",
 * "tokens_per_s", "mfu", "step_s"} (columns; a rollback truncates to the
 * redone step), "events": [the newest 500 events.jsonl objects], "failures":
 * {cause: n}, "restarts", "drained_nodes", "checkpoint_step", "ranks":
 * [{"rank", "node", "phase", "doing", "step", "pid", "heartbeat_age_s", "progress_age_s", "step_s",
 * "compute_s", "rss_bytes", "cpu_utilization"}]}; thread-safe. */
char *keel_exporter_json(keel_exporter *x);
typedef struct {
    double step, loss, val_loss, tokens_per_s, mfu, step_s;
} keel_step_point;
void keel_exporter_free(keel_exporter *x);

/* GET /metrics on cfg's metrics.bind:metrics.port, on a thread of its own;
 * *out = NULL when metrics.port is 0. A port in use is an input error. */
typedef struct keel_metrics_server keel_metrics_server;
keel_status keel_metrics_serve(const keel_metrics_config *mc, const char *run_dir, keel_metrics_server **out);
const char *keel_metrics_url(const keel_metrics_server *s); /* http://ADDR:PORT/metrics, or NULL */
void keel_metrics_stop(keel_metrics_server *s);

/* `keel status RUN`: the run, its ranks and its last events as a table (or
 * the exporter's JSON view); an input error when run_dir is not a run. */
keel_status keel_run_status_print(const char *run_dir, FILE *out, bool json);
/* `keel plot RUN --out FILE.svg|FILE.png`: loss and val loss, and tokens/s, by
 * step, failures and recoveries marked; written atomically. The PNG is the
 * same SVG drawn by librsvg (1800x1120 pixels). Another extension is an input
 * error. */
keel_status keel_run_plot(const char *run_dir, const char *out_path);

#endif
