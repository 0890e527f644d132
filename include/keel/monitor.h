/* monitor: what a run tells the world, and the run as people and Prometheus
 * see it. Writing: metrics.jsonl lines, events.jsonl with its
 * machine-readable fields, and the progress display (a live line on a
 * terminal, plain lines otherwise) — the ranks and the supervisor call these.
 * Reading, from the run directory alone (metrics.jsonl, events.jsonl,
 * heartbeats; keel/run.h): the exporter (Prometheus text and a JSON view),
 * the HTTP endpoint that serves them with the dashboard page
 * (libmicrohttpd), `keel status` and `keel plot`. Any process that can read
 * the run directory can serve it: `keel train` does, as the supervisor of an
 * --nproc run or as the single process; the ranks and the supervisor never
 * wait on it.
 *
 *     keel_metrics_server *m;
 *     keel_metrics_serve(&cfg, "runs/x", &m);   // GET /metrics, /, /api/run
 *     keel_run_prepare(&cfg, "runs/x", n);
 *     keel_metrics_publish(m);                  // runs/x/endpoint.json
 *     ...train...
 *     keel_metrics_stop(m);
 */
#ifndef KEEL_MONITOR_H
#define KEEL_MONITOR_H

#include <stdio.h>

#include "keel/core.h"

/* ---- what a run writes (journal.c, progress.c) ------------------------------
 * An append-only JSON-lines file; each line is flushed as it is written. */
typedef struct keel_jsonl keel_jsonl;
keel_status keel_jsonl_open(const char *path, keel_jsonl **out);
void keel_jsonl_write(keel_jsonl *j, const char *json_object_text);
void keel_jsonl_close(keel_jsonl *j);

/* One line of RUN/events.jsonl: {"time": ISO-8601 UTC, "unix_s": seconds,
 * "event": type, "step": step (if >= 0), "detail": the formatted text}.
 * Appended and flushed at once; what keel decided and why (DESIGN §6). */
void keel_event(const char *run_dir, const char *type, int64_t step, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The machine-readable fields an event may carry beside its text, each
 * written only when set. An event with a cause is a failure: the metrics
 * count failures by it (keel_failures_total{cause}). */
typedef struct {
    const char *cause;    /* crash, hang, diverged, preempted, health, straggler */
    const char *node;
    bool has_rank;
    int rank;
    bool has_seconds;
    double seconds;       /* how long it took (a recovery, a save, a backoff) */
    int64_t bytes;        /* > 0: bytes written */
    int64_t steps;        /* > 0: steps lost */
} keel_event_fields;
void keel_event_with(const char *run_dir, const char *type, int64_t step, const keel_event_fields *fields,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));

typedef struct {
    FILE *out;
    bool tty;          /* redraw one line in place */
    int total_steps;
    int plain_every;   /* non-TTY: print every N steps */
    bool line_open;    /* a live line is on screen without its newline */
} keel_progress;

void keel_progress_init(keel_progress *p, FILE *out, int total_steps);
/* step is 1-based (steps done). */
void keel_progress_step(keel_progress *p, int step, double loss, double tokens_per_s, double mfu,
                        double elapsed_s);
/* A line that stays on screen (eval results, warnings). */
void keel_progress_note(keel_progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void keel_progress_end(keel_progress *p);

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

/* GET /metrics on cfg's metrics.bind:metrics.port, on a thread of its own,
 * and logs the URL; *out = NULL when metrics.port is 0. A metrics.port the
 * user set (keel_config_key_origin) that is in use is an input error; the
 * default moves to the first free port of the KEEL_METRICS_PORT_RANGE from
 * it, and with all of them in use *out = NULL with KEEL_OK and a warning:
 * the run trains without an endpoint. A metrics.allowed_hosts entry that is
 * not a host name or an IP address is an input error. Clients cannot hold
 * it (a deadline per request, a share per remote address), the dashboard
 * and /api/run answer only this machine's Host names, and libmicrohttpd's
 * messages are rate-limited keel warnings (docs/security.md). */
typedef struct keel_metrics_server keel_metrics_server;
keel_status keel_metrics_serve(const keel_config *cfg, const char *run_dir, keel_metrics_server **out);
const char *keel_metrics_url(const keel_metrics_server *s); /* http://ADDR:PORT/metrics, or NULL */
/* Once the run directory exists (keel_run_prepare made it), whoever made it
 * names the endpoint there: RUN/endpoint.json, {"url", "port", "pid",
 * "node", "unix_s"} on one line, written atomically. A failed write is a
 * warning: the endpoint serves anyway. Nothing when s is NULL. */
void keel_metrics_publish(keel_metrics_server *s);
/* Stops serving and removes RUN/endpoint.json if it published it. */
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
