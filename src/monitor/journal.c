/* monitor/journal.c: the run's records as it writes them — metrics.jsonl
 * (any append-only JSON-lines file) and events.jsonl with its
 * machine-readable fields. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "keel/monitor.h"

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
