/* core/log.c: status names, leveled logging, user errors, internal checks. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "keel/core.h"

static keel_log_level g_level = KEEL_LOG_INFO;
static FILE *g_file; /* a second sink (a rank's log file), or NULL */

int keel_status_exit_code(keel_status st) {
    switch (st) {
    case KEEL_OK: return 0;
    case KEEL_ERR_INPUT: return 2;
    case KEEL_ERR_STOPPED: return KEEL_EXIT_RESUME;
    case KEEL_ERR_NUMERIC: return KEEL_EXIT_DIVERGED;
    case KEEL_ERR_UNHEALTHY: return KEEL_EXIT_UNHEALTHY;
    default: return 1;
    }
}

const char *keel_status_str(keel_status st) {
    switch (st) {
    case KEEL_OK: return "ok";
    case KEEL_ERR_INPUT: return "bad input";
    case KEEL_ERR_IO: return "i/o error";
    case KEEL_ERR_NOMEM: return "out of memory";
    case KEEL_ERR_NUMERIC: return "non-finite value";
    case KEEL_ERR_INTERNAL: return "internal error";
    case KEEL_ERR_STOPPED: return "stopped on a signal";
    case KEEL_ERR_UNHEALTHY: return "failed a health check";
    }
    return "unknown status";
}

void keel_log_set_level(keel_log_level level) { g_level = level; }
void keel_log_set_file(FILE *f) { g_file = f; }

static void emit(const char *prefix, const char *fmt, va_list ap) {
    va_list copy;
    va_copy(copy, ap);
    fprintf(stderr, "%s", prefix);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    if (g_file) {
        fprintf(g_file, "%s", prefix);
        vfprintf(g_file, fmt, copy);
        fputc('\n', g_file);
        fflush(g_file);
    }
    va_end(copy);
}

void keel_log(keel_log_level level, const char *fmt, ...) {
    static const char *names[] = {"debug", "info", "warn", "error"};
    if (level < g_level) return;
    char prefix[32];
    snprintf(prefix, sizeof prefix, "keel: %s: ", names[level]);
    va_list ap;
    va_start(ap, fmt);
    emit(prefix, fmt, ap);
    va_end(ap);
}

static _Thread_local bool t_capture;
static _Thread_local char t_last[1024];

void keel_error_capture(bool on) {
    t_capture = on;
    if (on) t_last[0] = 0;
}

const char *keel_last_error(void) { return t_last; }

void keel_errorf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (t_capture) vsnprintf(t_last, sizeof t_last, fmt, ap);
    else emit("keel: error: ", fmt, ap);
    va_end(ap);
}

void keel_check_failed(const char *file, int line, const char *cond, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "keel: internal error at %s:%d: check `%s` failed: ", file, line, cond);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}
