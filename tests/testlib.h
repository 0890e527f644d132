/* What the C unit tests share: a failure counter and EXPECT, the summary
 * line, a temporary directory, and stderr capture. Include it last, as
 * "../testlib.h" (tests/ is not on the include path).
 *
 * Each EXPECT(cond, fmt, ...) is one check; a false cond counts a failure.
 * By default every check prints a line on stdout, "ok   <message>" or
 * "FAIL <message>". A test with thousands of checks defines TESTLIB_QUIET
 * before the include: then only failures print, on stderr, as
 * "FAIL file:line: cond: <message>", and the message's arguments are
 * evaluated only then. */
#ifndef KEEL_TESTLIB_H
#define KEEL_TESTLIB_H

#include <ftw.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int failures;

/* The larger of two errors, and NaN once either is NaN: a maximum over
 * errors that a NaN anywhere fails (fmax, or `if (e > worst)`, would let a
 * later number replace it and the check pass). */
static inline double testlib_worst(double worst, double e) {
    return isnan(worst) || isnan(e) ? NAN : e > worst ? e : worst;
}

static inline void testlib_report(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void testlib_report(bool ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    failures += !ok;
}

static inline void testlib_fail(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static inline void testlib_fail(const char *file, int line, const char *cond, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL %s:%d: %s: ", file, line, cond);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    failures++;
}

#ifdef TESTLIB_QUIET
#define EXPECT(cond, ...)                                                       \
    do {                                                                        \
        if (!(cond)) testlib_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);      \
    } while (0)
#else
#define EXPECT(cond, ...)                                                       \
    do {                                                                        \
        bool testlib_ok_ = (cond);                                              \
        testlib_report(testlib_ok_, __VA_ARGS__);                               \
    } while (0)
#endif

/* The last line of a test; returns main's exit status. With TESTLIB_QUIET,
 * "<name>: ok" on stdout or "<name>: N failures" on stderr; otherwise, after
 * a line per check, "PASSED: 0 failures" or "FAILED: N failures" on stdout. */
static inline int test_summary(const char *name) {
#ifdef TESTLIB_QUIET
    if (failures) {
        fprintf(stderr, "%s: %d failures\n", name, failures);
        return 1;
    }
    printf("%s: ok\n", name);
    return 0;
#else
    (void)name;
    printf("%s: %d failures\n", failures ? "FAILED" : "PASSED", failures);
    return failures != 0;
#endif
}

/* ---- temporary directories ------------------------------------------------ */

/* Creates a new directory /tmp/keel-test-<name>-XXXXXX and writes its path
 * to out (size bytes); false, after perror, if it cannot. */
static inline bool temp_dir_create(char *out, size_t size, const char *name) {
    int n = snprintf(out, size, "/tmp/keel-test-%s-XXXXXX", name);
    if (n < 0 || (size_t)n >= size) {
        fprintf(stderr, "temp_dir_create: name '%s' too long\n", name);
        return false;
    }
    if (!mkdtemp(out)) {
        perror("mkdtemp");
        return false;
    }
    return true;
}

static inline int testlib_remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

/* Removes path and everything below it (a missing path is not an error). */
static inline void remove_tree(const char *path) {
    nftw(path, testlib_remove_entry, 8, FTW_DEPTH | FTW_PHYS);
}

/* ---- stderr capture ------------------------------------------------------- */

typedef struct {
    FILE *file;         /* anonymous temporary file that fd 2 points at */
    int saved_fd;       /* the real stderr while capturing, else -1 */
    char text[4096];    /* what capture_end read back */
} testlib_capture;

static inline testlib_capture *testlib_capture_state(void) {
    static testlib_capture state = {.saved_fd = -1};
    return &state;
}

/* Sends everything written to stderr (fd 2) to a temporary file until
 * capture_end. Captures do not nest. */
static inline void capture_begin(void) {
    testlib_capture *c = testlib_capture_state();
    if (!c->file && !(c->file = tmpfile())) abort();
    rewind(c->file);
    if (ftruncate(fileno(c->file), 0) != 0) abort();
    fflush(stderr);
    c->saved_fd = dup(2);
    if (c->saved_fd < 0) abort();
    dup2(fileno(c->file), 2);
}

/* Restores stderr and returns what was written to it since capture_begin
 * (its first 4095 bytes), valid until the next capture_end. */
static inline const char *capture_end(void) {
    testlib_capture *c = testlib_capture_state();
    fflush(stderr);
    dup2(c->saved_fd, 2);
    close(c->saved_fd);
    c->saved_fd = -1;
    rewind(c->file);
    size_t n = fread(c->text, 1, sizeof c->text - 1, c->file);
    c->text[n] = '\0';
    return c->text;
}

/* The number of '\n' in s. */
static inline int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

#endif /* KEEL_TESTLIB_H */
