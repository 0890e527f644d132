/* obs/progress.c: metrics.jsonl and events.jsonl writers and the training
 * progress line. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "keel/obs.h"

struct keel_jsonl {
    FILE *f;
};

keel_status keel_jsonl_open(const char *path, keel_jsonl **out) {
    FILE *f = fopen(path, "a");
    if (!f) {
        keel_errorf("%s: cannot open for writing: %s", path, strerror(errno));
        return KEEL_ERR_IO;
    }
    *out = keel_xcalloc(sizeof **out, "jsonl");
    (*out)->f = f;
    return KEEL_OK;
}

static void event_v(const char *run_dir, const char *type, int64_t step, const keel_event_fields *f,
                    const char *fmt, va_list ap) {
    char detail[2048], when[32], path[4096];
    vsnprintf(detail, sizeof detail, fmt, ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&ts.tv_sec));
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "time", when);
    cJSON_AddNumberToObject(o, "unix_s", (double)ts.tv_sec + ts.tv_nsec * 1e-9);
    cJSON_AddStringToObject(o, "event", type);
    if (step >= 0) cJSON_AddNumberToObject(o, "step", (double)step);
    if (f && f->cause) cJSON_AddStringToObject(o, "cause", f->cause);
    if (f && f->has_rank) cJSON_AddNumberToObject(o, "rank", f->rank);
    if (f && f->node) cJSON_AddStringToObject(o, "node", f->node);
    if (f && f->has_seconds) cJSON_AddNumberToObject(o, "seconds", f->seconds);
    if (f && f->bytes > 0) cJSON_AddNumberToObject(o, "bytes", (double)f->bytes);
    if (f && f->steps > 0) cJSON_AddNumberToObject(o, "steps", (double)f->steps);
    cJSON_AddStringToObject(o, "detail", detail);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    snprintf(path, sizeof path, "%s/events.jsonl", run_dir);
    FILE *out = fopen(path, "a");
    if (out) {
        fprintf(out, "%s\n", text);
        fclose(out);
    } else {
        keel_log_warn("%s: cannot append an event: %s", path, strerror(errno));
    }
    free(text);
}

void keel_event(const char *run_dir, const char *type, int64_t step, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    event_v(run_dir, type, step, NULL, fmt, ap);
    va_end(ap);
}

void keel_event_with(const char *run_dir, const char *type, int64_t step, const keel_event_fields *fields,
                     const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    event_v(run_dir, type, step, fields, fmt, ap);
    va_end(ap);
}

void keel_jsonl_write(keel_jsonl *j, const char *text) {
    fputs(text, j->f);
    fputc('\n', j->f);
    fflush(j->f);
}

void keel_jsonl_close(keel_jsonl *j) {
    if (!j) return;
    fclose(j->f);
    keel_free(j);
}

void keel_progress_init(keel_progress *p, FILE *out, int total_steps) {
    memset(p, 0, sizeof *p);
    p->out = out;
    /* A distributed run's leader learns from the launcher whether the user's
     * stdout is a terminal (its own stdout is mpirun's). */
    const char *env = getenv("KEEL_TTY");
    p->tty = env ? atoi(env) != 0 : isatty(fileno(out));
    p->total_steps = total_steps;
    p->plain_every = total_steps <= 100 ? 1 : total_steps / 100;
}

static void format_duration(char *buf, size_t n, double s) {
    if (s < 0 || s > 1e8) snprintf(buf, n, "?");
    else if (s < 60) snprintf(buf, n, "%.0fs", s);
    else if (s < 3600) snprintf(buf, n, "%dm%02ds", (int)s / 60, (int)s % 60);
    else snprintf(buf, n, "%dh%02dm", (int)s / 3600, (int)s % 3600 / 60);
}

void keel_progress_step(keel_progress *p, int step, double loss, double tokens_per_s, double mfu,
                        double elapsed_s) {
    char eta[32], spent[32];
    format_duration(eta, sizeof eta, elapsed_s / step * (p->total_steps - step));
    format_duration(spent, sizeof spent, elapsed_s);
    int width = 1;
    for (int t = p->total_steps; t >= 10; t /= 10) width++;
    char line[256], mfu_text[16] = "?"; /* a device whose peak keel does not know */
    if (isfinite(mfu)) snprintf(mfu_text, sizeof mfu_text, "%.1f%%", 100 * mfu);
    snprintf(line, sizeof line, "step %*d/%d | loss %.4f | %.0f tok/s | MFU %s | %s elapsed | ETA %s", width,
             step, p->total_steps, loss, tokens_per_s, mfu_text, spent, eta);
    if (p->tty) {
        /* Redraw in place, but leave every tenth of the run on screen so the
         * loss curve stays readable. */
        int tenth = p->total_steps >= 10 ? p->total_steps / 10 : 1;
        bool keep = step % tenth == 0 || step == p->total_steps;
        fprintf(p->out, "\r\033[K%s%s", line, keep ? "\n" : "");
        p->line_open = !keep;
    } else if (step % p->plain_every == 0 || step == p->total_steps) {
        fprintf(p->out, "%s\n", line);
    }
    fflush(p->out);
}

void keel_progress_note(keel_progress *p, const char *fmt, ...) {
    if (p->line_open) fputs("\r\033[K", p->out);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(p->out, fmt, ap);
    va_end(ap);
    fputc('\n', p->out);
    p->line_open = false;
    fflush(p->out);
}

void keel_progress_end(keel_progress *p) {
    if (p->line_open) fputc('\n', p->out);
    p->line_open = false;
    fflush(p->out);
}
