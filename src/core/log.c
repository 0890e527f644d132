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

/* ---- one line, whatever the values in it -------------------------------------
 * A message carries values from input (config keys, paths, names read from
 * files, a client's Host header): none of them may end the line, start a
 * fake one, or drive the terminal. So every byte that is not printable text
 * is written as an escape, and a message longer than the bound is cut. */

/* The length of the UTF-8 character at s (at most n bytes): 2-4, or 0 when
 * s does not start a well-formed one (overlong, a surrogate, past U+10FFFF,
 * cut short) or starts a C1 control (U+0080-U+009F: CSI is U+009B), which
 * a terminal may obey like its 7-bit form. */
static size_t utf8_char(const unsigned char *s, size_t n) {
    size_t len = s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : 2;
    if (s[0] < 0xc2 || s[0] > 0xf4 || n < len) return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    if (s[0] == 0xc2 && s[1] < 0xa0) return 0;                 /* C1 controls */
    if (s[0] == 0xe0 && s[1] < 0xa0) return 0;                 /* overlong */
    if (s[0] == 0xed && s[1] >= 0xa0) return 0;                /* surrogates */
    if (s[0] == 0xf0 && s[1] < 0x90) return 0;                 /* overlong */
    if (s[0] == 0xf4 && s[1] >= 0x90) return 0;                /* past U+10FFFF */
    return len;
}

/* Escapes in[0..n) into out (at most room bytes, not NUL-ended, no escape or
 * character split): \n \r \t, \\xNN for every other control byte, DEL and
 * each byte of ill-formed UTF-8 or a C1 control. Returns the bytes written;
 * *consumed says how much of in they stand for. */
static size_t escape(char *out, size_t room, const char *in, size_t n, size_t *consumed) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)in;
    size_t i = 0, o = 0;
    while (i < n) {
        unsigned char c = s[i];
        size_t len = c >= 0x80 ? utf8_char(s + i, n - i) : c >= 0x20 && c != 0x7f;
        if (len > 0) { /* printable: as it is */
            if (o + len > room) break;
            memcpy(out + o, s + i, len);
            o += len, i += len;
            continue;
        }
        char e[4] = {'\\', 0, 0, 0};
        size_t elen = 2;
        if (c == '\n') e[1] = 'n';
        else if (c == '\r') e[1] = 'r';
        else if (c == '\t') e[1] = 't';
        else e[1] = 'x', e[2] = hex[c >> 4], e[3] = hex[c & 15], elen = 4;
        if (o + elen > room) break;
        memcpy(out + o, e, elen);
        o += elen, i++;
    }
    *consumed = i;
    return o;
}

/* The message fmt formats, as one line in out (NUL-ended, at most size - 1
 * bytes; 64 <= size <= KEEL_LOG_MAX_MESSAGE + 1): trailing line breaks
 * dropped (the line gets keel's own), everything else escaped (escape), and
 * a message that does not fit cut, the cut said: "...[N more bytes]". */
static void format_message(char *out, size_t size, const char *fmt, va_list ap) {
    enum { CUT_MARK_MAX = 40 }; /* "...[%zu more bytes]" at its longest */
    char raw[KEEL_LOG_MAX_MESSAGE + 1];
    int len = vsnprintf(raw, sizeof raw, fmt, ap);
    if (len < 0) {
        snprintf(out, size, "(a message keel could not format)");
        return;
    }
    size_t total = (size_t)len, have = total < sizeof raw ? total : sizeof raw - 1, consumed;
    while (have > 0 && have == total && (raw[have - 1] == '\n' || raw[have - 1] == '\r')) have--, total--;
    size_t o = escape(out, size - 1, raw, have, &consumed);
    if (consumed < total) { /* again, leaving room to say so */
        o = escape(out, size - 1 - CUT_MARK_MAX, raw, have, &consumed);
        o += (size_t)snprintf(out + o, size - o, "...[%zu more bytes]", total - consumed);
    }
    out[o] = 0;
}

/* prefix, the message and one newline, written whole to stderr and to the
 * log file: a line is never interleaved with another thread's. */
static void emit(const char *prefix, const char *fmt, va_list ap) {
    char line[KEEL_LOG_MAX_MESSAGE + 512];
    size_t n = strlen(prefix);
    if (n > sizeof line - KEEL_LOG_MAX_MESSAGE - 2) n = sizeof line - KEEL_LOG_MAX_MESSAGE - 2;
    memcpy(line, prefix, n);
    format_message(line + n, KEEL_LOG_MAX_MESSAGE + 1, fmt, ap);
    n += strlen(line + n);
    line[n++] = '\n';
    fwrite(line, 1, n, stderr);
    if (g_file) {
        fwrite(line, 1, n, g_file);
        fflush(g_file);
    }
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
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    format_message(t_last, sizeof t_last, fmt, ap); /* kept printed or not: keel_last_error */
    if (!t_capture) emit("keel: error: ", fmt, again);
    va_end(again);
    va_end(ap);
}

void keel_check_failed(const char *file, int line, const char *cond, const char *fmt, ...) {
    char prefix[512];
    snprintf(prefix, sizeof prefix, "keel: internal error at %s:%d: check `%s` failed: ", file, line, cond);
    va_list ap;
    va_start(ap, fmt);
    emit(prefix, fmt, ap);
    va_end(ap);
    abort();
}
