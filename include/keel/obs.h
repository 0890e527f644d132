/* obs: what a run tells the world — metrics.jsonl lines and the progress
 * display (a live line on a terminal, plain lines otherwise), and events.jsonl
 * with its machine-readable fields. What reads them back for people —
 * /metrics, the dashboard, keel status — is keel/monitor.h. */
#ifndef KEEL_OBS_H
#define KEEL_OBS_H

#include <stdio.h>

#include "keel/core.h"

/* An append-only JSON-lines file; each line is flushed as it is written. */
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

#endif
