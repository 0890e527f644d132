/* Durable file I/O (core/fsio.c): atomic replacement leaves either the old
 * or the new file and never a tmp; failures are one line naming the file;
 * whole-file reads of missing, empty, binary and piped files; truncated
 * preads say so; and every loop survives partial transfers — short writes
 * at a file-size limit, pipe writes cut short by signals, reads from a pipe
 * that arrive in pieces (transfers above 2 GiB: test_fsio_2gib.c); files a
 * user named opened without blocking (FIFOs, directories, devices refused);
 * sizes a file asks for refused, not fatal. Runs as root too: no failure
 * here relies on permissions. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "keel/core.h"

#include "../testlib.h"

static char tmpdir[128];

#define PATH_BYTES 512
static void tmp_path(char *out, const char *name) { snprintf(out, PATH_BYTES, "%s/%s", tmpdir, name); }

/* How many entries dir holds besides . and ..; their names, comma-separated,
 * into names. */
static int count_entries(const char *dir, char *names, size_t size) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    names[0] = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        size_t k = strlen(names);
        snprintf(names + k, size - k, "%s%s", n ? "," : "", e->d_name);
        n++;
    }
    closedir(d);
    return n;
}

/* The test's own reader: stdio, so it shares no code with what it checks. */
static char *slurp(const char *path, size_t *bytes) {
    FILE *f = fopen(path, "rb");
    *bytes = 0;
    if (!f) return NULL;
    size_t cap = 1 << 16;
    char *buf = malloc(cap);
    for (size_t got; (got = fread(buf + *bytes, 1, cap - *bytes, f)) > 0;) {
        *bytes += got;
        if (*bytes == cap) buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    return buf;
}

static void spit(const char *path, const void *data, size_t bytes) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, bytes, f) != bytes) abort();
    fclose(f);
}

static bool file_is(const char *path, const void *data, size_t bytes) {
    size_t n;
    char *got = slurp(path, &n);
    bool same = got && n == bytes && memcmp(got, data, bytes) == 0;
    free(got);
    return same;
}

/* RLIMIT_FSIZE (and SIGXFSZ ignored, so a write past it fails with EFBIG
 * instead of killing us): the one write failure that holds for root. */
static struct rlimit saved_fsize;
static void limit_file_size(rlim_t bytes) {
    struct rlimit small;
    getrlimit(RLIMIT_FSIZE, &saved_fsize);
    small = (struct rlimit){.rlim_cur = bytes, .rlim_max = saved_fsize.rlim_max};
    signal(SIGXFSZ, SIG_IGN);
    if (setrlimit(RLIMIT_FSIZE, &small) != 0) abort();
}
static void unlimit_file_size(void) { setrlimit(RLIMIT_FSIZE, &saved_fsize); }

/* ---- atomic replacement --------------------------------------------------------- */

static void test_atomic_replaces(void) {
    char dir[PATH_BYTES], path[PATH_BYTES], names[1024];
    tmp_path(dir, "atomic");
    EXPECT(keel_mkdirs(dir) == KEEL_OK, "mkdirs");
    tmp_path(path, "atomic/f.json");
    EXPECT(keel_write_file_atomic(path, "first", 5) == KEEL_OK && file_is(path, "first", 5), "create");
    EXPECT(keel_write_file_atomic(path, "second!", 7) == KEEL_OK && file_is(path, "second!", 7),
           "replace: the new bytes, not the old length");
    EXPECT(count_entries(dir, names, sizeof names) == 1 && !strcmp(names, "f.json"),
           "no tmp left beside the file: %s", names);
    EXPECT(keel_write_file_atomic(path, "", 0) == KEEL_OK && file_is(path, "", 0), "an empty file");
    EXPECT(keel_write_file_atomic2(path, "head|", 5, "body", 4) == KEEL_OK && file_is(path, "head|body", 9),
           "two buffers, head then body");
    EXPECT(keel_write_file_atomic2(path, "only", 4, NULL, 0) == KEEL_OK && file_is(path, "only", 4),
           "no body");
    struct stat sb;
    mode_t mask = umask(0);
    umask(mask);
    EXPECT(stat(path, &sb) == 0 && (sb.st_mode & 0777) == (0666 & ~mask),
           "mode %o: 0666 less the umask, as fopen makes files (not mkstemp's 0600)", sb.st_mode & 0777);

    /* The streaming form: payload first, header filled in at the end. */
    keel_atomic_file f;
    EXPECT(keel_atomic_begin(&f, path) == KEEL_OK, "begin");
    EXPECT(keel_write_all(f.fd, "....payload", 11, path) == KEEL_OK, "write");
    EXPECT(keel_pwrite_all(f.fd, "HEAD", 4, 0, path) == KEEL_OK, "pwrite the header");
    EXPECT(file_is(path, "only", 4), "nothing visible before the commit");
    EXPECT(keel_atomic_commit(&f) == KEEL_OK && file_is(path, "HEADpayload", 11), "commit");
    keel_atomic_abort(&f); /* after a commit: nothing to do, must not crash or unlink */
    EXPECT(file_is(path, "HEADpayload", 11), "abort after commit leaves the file");
    EXPECT(keel_atomic_begin(&f, path) == KEEL_OK && keel_write_all(f.fd, "junk", 4, path) == KEEL_OK,
           "begin again");
    keel_atomic_abort(&f);
    EXPECT(file_is(path, "HEADpayload", 11) && count_entries(dir, names, sizeof names) == 1,
           "abort: old file kept, tmp gone: %s", names);
}

/* A failed replacement: status, exactly one line naming the file, the old
 * bytes intact, no tmp. */
static void expect_failed_replace(const char *what, const char *dir, const char *path, keel_status st,
                                  const char *msg, const char *old, size_t old_bytes) {
    char names[1024];
    EXPECT(st == KEEL_ERR_IO, "%s: KEEL_ERR_IO, got %d", what, (int)st);
    EXPECT(count_lines(msg) == 1 && strstr(msg, path), "%s: one line naming the file: %s", what, msg);
    if (old) EXPECT(file_is(path, old, old_bytes), "%s: the old file is byte-identical", what);
    int n = count_entries(dir, names, sizeof names);
    EXPECT(n == (old ? 1 : 0), "%s: no tmp left: %s", what, names);
}

static void test_atomic_failures(void) {
    char dir[PATH_BYTES], path[PATH_BYTES], bad[PATH_BYTES];
    tmp_path(dir, "fail");
    EXPECT(keel_mkdirs(dir) == KEEL_OK, "mkdirs");
    tmp_path(path, "fail/weights.bin");
    char old[3000];
    for (size_t i = 0; i < sizeof old; i++) old[i] = (char)(i * 7);
    EXPECT(keel_write_file_atomic(path, old, sizeof old) == KEEL_OK, "the old file");

    /* The disk fills half way (a file-size limit: the first write is short,
     * the next one fails). */
    size_t big_bytes = 64 << 10;
    char *big = calloc(1, big_bytes);
    limit_file_size(16 << 10);
    capture_begin();
    keel_status st = keel_write_file_atomic(path, big, big_bytes);
    int err = errno;
    const char *msg = capture_end();
    unlimit_file_size();
    expect_failed_replace("file-size limit", dir, path, st, msg, old, sizeof old);
    EXPECT(err == EFBIG && strstr(msg, "File too large"), "errno EFBIG kept and said: %s", msg);
    capture_begin();
    limit_file_size(16 << 10);
    st = keel_write_file_atomic2(path, old, sizeof old, big, big_bytes);
    unlimit_file_size();
    msg = capture_end();
    expect_failed_replace("file-size limit in the body", dir, path, st, msg, old, sizeof old);

    /* The target is a non-empty directory: everything works until the
     * rename, which must not leave the written tmp behind. */
    char sub[PATH_BYTES], inner[PATH_BYTES], names[1024];
    tmp_path(sub, "fail/sub");
    tmp_path(inner, "fail/sub/x");
    EXPECT(keel_mkdirs(sub) == KEEL_OK, "mkdirs sub");
    spit(inner, "x", 1);
    capture_begin();
    st = keel_write_file_atomic(sub, "data", 4);
    msg = capture_end();
    EXPECT(st == KEEL_ERR_IO && count_lines(msg) == 1 && strstr(msg, sub) && strstr(msg, "rename"),
           "rename onto a directory fails in one line: %s", msg);
    EXPECT(count_entries(dir, names, sizeof names) == 2, "only weights.bin and sub/: %s", names);
    EXPECT(count_entries(sub, names, sizeof names) == 1 && file_is(inner, "x", 1), "sub/ untouched");

    /* A parent that is a regular file: nothing can be created. */
    tmp_path(bad, "fail/weights.bin/child");
    capture_begin();
    st = keel_write_file_atomic(bad, "data", 4);
    msg = capture_end();
    EXPECT(st == KEEL_ERR_IO && count_lines(msg) == 1 && strstr(msg, bad) && strstr(msg, "Not a directory"),
           "parent is a file: one line naming the file: %s", msg);
    EXPECT(file_is(path, old, sizeof old), "the would-be parent is untouched");
    free(big);
}

/* Many threads replace one file at once: every write succeeds (tmp names
 * are unique within the process), the result is one whole version, and no
 * tmp remains. */
#define RACE_THREADS 4
#define RACE_WRITES 40
#define RACE_BYTES 20000
static char race_path[PATH_BYTES];
static void *race_writer(void *arg) {
    char *buf = malloc(RACE_BYTES);
    memset(buf, 'a' + (int)(intptr_t)arg, RACE_BYTES);
    intptr_t failed = 0;
    for (int i = 0; i < RACE_WRITES; i++) failed += keel_write_file_atomic(race_path, buf, RACE_BYTES) != KEEL_OK;
    free(buf);
    return (void *)failed;
}

static void test_atomic_threads(void) {
    char dir[PATH_BYTES], names[1024];
    tmp_path(dir, "race");
    EXPECT(keel_mkdirs(dir) == KEEL_OK, "mkdirs");
    tmp_path(race_path, "race/LATEST");
    pthread_t t[RACE_THREADS];
    for (intptr_t i = 0; i < RACE_THREADS; i++) pthread_create(&t[i], NULL, race_writer, (void *)i);
    intptr_t failed = 0;
    for (int i = 0; i < RACE_THREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        failed += (intptr_t)r;
    }
    EXPECT(failed == 0, "%d threads x %d atomic writes of one file: %ld failed", RACE_THREADS, RACE_WRITES,
           (long)failed);
    size_t n;
    char *got = slurp(race_path, &n);
    bool whole = got && n == RACE_BYTES;
    for (size_t i = 1; whole && i < n; i++) whole = got[i] == got[0];
    EXPECT(whole, "the file is one writer's version, whole (%zu bytes)", n);
    free(got);
    EXPECT(count_entries(dir, names, sizeof names) == 1, "no tmp left: %s", names);
}

/* ---- whole-file reads -------------------------------------------------------------- */

/* Writes `total` bytes into a pipe in pieces of `piece`, pausing between
 * them, so that the reader's read() calls come back short. */
typedef struct {
    int fd;
    size_t total, piece;
} pipe_feed;
static unsigned char pattern(size_t i) { return (unsigned char)(i * 131 + (i >> 9)); }
static void *feed_pipe(void *arg) {
    pipe_feed *p = arg;
    unsigned char buf[4096];
    for (size_t at = 0; at < p->total;) {
        size_t n = p->total - at < p->piece ? p->total - at : p->piece;
        for (size_t i = 0; i < n; i++) buf[i] = pattern(at + i);
        if (write(p->fd, buf, n) != (ssize_t)n) break; /* the reader gave up early */
        at += n;
        if (at % (64 * p->piece) == 0) usleep(1000);
    }
    close(p->fd);
    return NULL;
}

static void test_read_file(void) {
    char path[PATH_BYTES];
    char *text = (char *)&text;
    size_t len = 99;

    tmp_path(path, "missing.json");
    capture_begin();
    keel_status st = keel_read_file(path, &text, &len);
    const char *msg = capture_end();
    EXPECT(st == KEEL_ERR_INPUT && count_lines(msg) == 1 && strstr(msg, path) && strstr(msg, "No such file"),
           "missing: KEEL_ERR_INPUT, one line naming it: %s", msg);
    EXPECT(text == (char *)&text && len == 99, "missing: outputs untouched");
    capture_begin();
    st = keel_read_file_quiet(path, 0, &text, &len);
    msg = capture_end();
    EXPECT(st == KEEL_ERR_INPUT && errno == ENOENT && !msg[0], "quiet: no message, errno ENOENT: %s", msg);

    tmp_path(path, "empty");
    spit(path, "", 0);
    EXPECT(keel_read_file(path, &text, &len) == KEEL_OK && len == 0 && text[0] == 0, "empty file: \"\"");
    keel_free(text);
    EXPECT(keel_read_file(path, &text, NULL) == KEEL_OK && text[0] == 0, "len may be NULL");
    keel_free(text);

    unsigned char bin[70000];
    for (size_t i = 0; i < sizeof bin; i++) bin[i] = pattern(i);
    bin[0] = 0, bin[5000] = 0; /* NULs inside do not end it */
    tmp_path(path, "binary");
    spit(path, bin, sizeof bin);
    EXPECT(keel_read_file(path, &text, &len) == KEEL_OK && len == sizeof bin && !memcmp(text, bin, len) &&
               text[len] == 0,
           "binary: every byte, then a NUL (len %zu)", len);
    keel_free(text);

    capture_begin();
    st = keel_read_file_quiet(path, 1000, &text, &len);
    msg = capture_end();
    EXPECT(st == KEEL_ERR_INPUT && errno == EFBIG && !msg[0], "over max_bytes: EFBIG, quietly");
    EXPECT(keel_read_file_quiet(path, sizeof bin, &text, &len) == KEEL_OK && len == sizeof bin,
           "exactly max_bytes is fine");
    keel_free(text);

    capture_begin();
    st = keel_read_file(tmpdir, &text, &len);
    msg = capture_end();
    EXPECT(st == KEEL_ERR_INPUT && count_lines(msg) == 1 && strstr(msg, tmpdir),
           "a directory: KEEL_ERR_INPUT, one line: %s", msg);

    /* A pipe delivers the data in 1000-byte pieces (no size to go by): the
     * read loop must gather 300 kB of them. */
    int fds[2];
    if (pipe(fds) != 0) abort();
    pipe_feed feed = {.fd = fds[1], .total = 300000, .piece = 1000};
    pthread_t t;
    pthread_create(&t, NULL, feed_pipe, &feed);
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fds[0]);
    st = keel_read_file(proc, &text, &len);
    close(fds[0]); /* before the join: a reader that stopped early must not block the feeder */
    pthread_join(t, NULL);
    bool same = st == KEEL_OK && len == feed.total;
    for (size_t i = 0; same && i < len; i++) same = (unsigned char)text[i] == pattern(i);
    EXPECT(same, "a pipe read in pieces: %zu of %zu bytes, in order", len, feed.total);
    if (st == KEEL_OK) keel_free(text);
}

/* ---- looped transfers ---------------------------------------------------------------- */

static void test_pread_truncated(void) {
    char path[PATH_BYTES], want[PATH_BYTES + 64];
    tmp_path(path, "short.bin");
    char data[100];
    memset(data, 7, sizeof data);
    spit(path, data, sizeof data);
    int fd = open(path, O_RDONLY);
    char buf[200];
    capture_begin();
    keel_status st = keel_pread_all(fd, buf, 200, 0, path);
    const char *msg = capture_end();
    snprintf(want, sizeof want, "%s: truncated: expected 200 bytes at offset 0, got 100", path);
    EXPECT(st == KEEL_ERR_INPUT && count_lines(msg) == 1 && strstr(msg, want),
           "pread past EOF: KEEL_ERR_INPUT, '%s': %s", want, msg);
    capture_begin();
    st = keel_pread_all(fd, buf, 10, 95, path);
    msg = capture_end();
    EXPECT(st == KEEL_ERR_INPUT && strstr(msg, "expected 10 bytes at offset 95, got 5"), "at an offset: %s", msg);
    capture_begin();
    st = keel_pread_all(fd, buf, 10, 100, NULL);
    msg = capture_end();
    EXPECT(st == KEEL_ERR_INPUT && !msg[0], "quiet at EOF: %s", msg);
    EXPECT(keel_pread_all(fd, buf, 100, 0, path) == KEEL_OK && !memcmp(buf, data, 100), "the whole file");
    EXPECT(keel_pread_all(fd, buf, 0, 500, path) == KEEL_OK, "nothing, past the end");
    close(fd);
    capture_begin();
    st = keel_pread_all(-1, buf, 10, 0, path);
    msg = capture_end();
    EXPECT(st == KEEL_ERR_IO && errno == EBADF && count_lines(msg) == 1 && strstr(msg, path),
           "a read error is KEEL_ERR_IO naming the file: %s", msg);
}

/* At a file-size limit write() first comes back short (it stops at the
 * limit) and only the next call fails: seeing EFBIG proves the loop went on
 * after the short write instead of calling it done or failed. */
static void test_short_write_at_limit(void) {
    char path[PATH_BYTES];
    tmp_path(path, "limit.bin");
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    char buf[10000];
    memset(buf, 1, sizeof buf);
    limit_file_size(4096);
    capture_begin();
    errno = 0;
    keel_status st = keel_write_all(fd, buf, sizeof buf, path);
    int err = errno;
    const char *msg = capture_end();
    unlimit_file_size();
    close(fd);
    struct stat sb;
    stat(path, &sb);
    EXPECT(st == KEEL_ERR_IO && err == EFBIG && sb.st_size == 4096,
           "short write, then EFBIG from the next call (errno %d, %lld bytes written)", err,
           (long long)sb.st_size);
    EXPECT(count_lines(msg) == 1 && strstr(msg, path) && strstr(msg, "File too large"), "message: %s", msg);
}

/* A pipe write interrupted by a signal (no SA_RESTART) returns what it moved
 * so far, or EINTR when nothing moved: a slow reader and a signal to the
 * writer every half millisecond make both happen many times over 8 MiB. The
 * signals go to the writing thread by name: a process-wide timer could land
 * on any thread (OpenBLAS starts its own). */
static volatile sig_atomic_t alarms;
static void on_alarm(int sig) { (void)sig, alarms++; }
typedef struct {
    pthread_t target;
    atomic_bool stop;
} pest;
static void *pester(void *arg) {
    pest *p = arg;
    while (!atomic_load(&p->stop)) {
        pthread_kill(p->target, SIGUSR1);
        usleep(500);
    }
    return NULL;
}
typedef struct {
    int fd;
    size_t got;
    bool in_order;
} pipe_drain;
static void *drain_pipe(void *arg) {
    pipe_drain *p = arg;
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &block, NULL);
    unsigned char buf[16384];
    p->in_order = true;
    for (ssize_t n; (n = read(p->fd, buf, sizeof buf)) != 0;) {
        if (n < 0) {
            if (errno == EINTR) continue;
            break;
        }
        for (ssize_t i = 0; i < n; i++) p->in_order &= buf[i] == pattern(p->got + (size_t)i);
        p->got += (size_t)n;
        usleep(200);
    }
    return NULL;
}

static void test_write_interrupted(void) {
    size_t bytes = 8 << 20;
    unsigned char *data = malloc(bytes);
    for (size_t i = 0; i < bytes; i++) data[i] = pattern(i);
    int fds[2];
    if (pipe(fds) != 0) abort();
    pipe_drain drain = {.fd = fds[0]};
    pthread_t t;
    pthread_create(&t, NULL, drain_pipe, &drain);
    struct sigaction sa = {.sa_handler = on_alarm}, old_sa; /* no SA_RESTART */
    sigaction(SIGUSR1, &sa, &old_sa);
    pest p = {.target = pthread_self()};
    pthread_t pt;
    pthread_create(&pt, NULL, pester, &p);
    keel_status st = keel_write_all(fds[1], data, bytes, "pipe");
    atomic_store(&p.stop, true);
    pthread_join(pt, NULL);
    sigaction(SIGUSR1, &old_sa, NULL);
    close(fds[1]);
    pthread_join(t, NULL);
    close(fds[0]);
    EXPECT(alarms > 5, "the writer was interrupted (%d signals)", (int)alarms);
    EXPECT(st == KEEL_OK && drain.got == bytes && drain.in_order,
           "8 MiB through signal-interrupted pipe writes: status %d, %zu bytes arrived%s", (int)st, drain.got,
           drain.in_order ? ", in order" : ", out of order");
    free(data);
}

/* ---- directories and paths ---------------------------------------------------------- */

static void test_dirs(void) {
    char deep[PATH_BYTES], file[PATH_BYTES], under[PATH_BYTES];
    tmp_path(deep, "a/b/c/");
    EXPECT(keel_mkdirs(deep) == KEEL_OK && keel_path_exists(deep), "mkdirs a/b/c/");
    EXPECT(keel_mkdirs(deep) == KEEL_OK, "again: existing directories are fine");
    EXPECT(keel_fsync_dir(deep) == KEEL_OK, "fsync a directory");
    tmp_path(file, "a/b/file");
    spit(file, "x", 1);
    EXPECT(keel_fsync_parent(file) == KEEL_OK, "fsync a file's directory");
    tmp_path(under, "a/b/file/d/e");
    capture_begin();
    keel_status st = keel_mkdirs(under);
    const char *msg = capture_end();
    EXPECT(st == KEEL_ERR_IO && count_lines(msg) == 1 && strstr(msg, file) && strstr(msg, "Not a directory"),
           "mkdirs under a file: one line naming it: %s", msg);
    capture_begin();
    st = keel_mkdirs(file);
    msg = capture_end();
    EXPECT(st == KEEL_ERR_IO && strstr(msg, "Not a directory"), "mkdirs onto a file: %s", msg);
    capture_begin();
    st = keel_fsync_dir(under);
    msg = capture_end();
    EXPECT(st == KEEL_ERR_IO && count_lines(msg) == 1 && strstr(msg, under), "fsync a missing dir: %s", msg);
    EXPECT(keel_path_exists(file) && !keel_path_exists(under), "path_exists");

    /* A staged directory committed into place, then one that cannot be:
     * its target exists and is not empty. */
    char staged[PATH_BYTES], final[PATH_BYTES], staged2[PATH_BYTES], inside[PATH_BYTES];
    tmp_path(staged, "step_1.tmp");
    tmp_path(final, "step_1");
    tmp_path(inside, "step_1.tmp/manifest.json");
    EXPECT(keel_mkdirs(staged) == KEEL_OK, "a staged directory");
    EXPECT(keel_write_file_atomic(inside, "{}", 2) == KEEL_OK, "with a file");
    tmp_path(inside, "step_1/manifest.json");
    EXPECT(keel_commit_dir(staged, final) == KEEL_OK && !keel_path_exists(staged) && file_is(inside, "{}", 2),
           "commit_dir moves it into place");
    tmp_path(staged2, "step_2.tmp");
    EXPECT(keel_mkdirs(staged2) == KEEL_OK, "another staged directory");
    capture_begin();
    st = keel_commit_dir(staged2, final);
    msg = capture_end();
    EXPECT(st == KEEL_ERR_IO && count_lines(msg) == 1 && strstr(msg, final) && keel_path_exists(staged2) &&
               file_is(inside, "{}", 2),
           "commit_dir onto a non-empty directory: one line, both left as they were: %s", msg);
    char *joined = keel_path_join("run", "config.json");
    EXPECT(!strcmp(joined, "run/config.json"), "path_join: %s", joined);
    keel_free(joined);
}

/* Files a user named are opened without ever blocking: a FIFO nobody writes
 * to (open() would wait for a writer forever), a directory and a device are
 * refused at once where a file format is read; the whole-file reader streams
 * a FIFO (empty without a writer) and still refuses devices. */
static void test_open_read_kinds(void) {
    printf("== opening what a user named\n");
    char fifo[PATH_BYTES], dir[PATH_BYTES], file[PATH_BYTES], why[160], *text;
    tmp_path(fifo, "fifo");
    tmp_path(dir, "dir");
    tmp_path(file, "file");
    EXPECT(mkfifo(fifo, 0644) == 0 && mkdir(dir, 0755) == 0, "a FIFO and a directory made");
    FILE *f = fopen(file, "wb");
    fputs("{}", f);
    fclose(f);
    int fd = -2;
    double t0 = keel_now_s();
    keel_status st = keel_open_read(fifo, false, &fd, why, sizeof why);
    EXPECT(st == KEEL_ERR_INPUT && fd == -1 && strstr(why, "is a FIFO, not a regular file") &&
               keel_now_s() - t0 < 5, "FIFO refused at once: %s", why);
    st = keel_open_read(dir, false, &fd, why, sizeof why);
    EXPECT(st == KEEL_ERR_INPUT && errno == EISDIR && strstr(why, "is a directory"), "directory refused: %s", why);
    st = keel_open_read("/dev/zero", true, &fd, why, sizeof why);
    EXPECT(st == KEEL_ERR_INPUT && strstr(why, "character device"), "device refused even where pipes are fine: %s", why);
    st = keel_open_read(file, false, &fd, why, sizeof why);
    EXPECT(st == KEEL_OK && fd >= 0 && !(fcntl(fd, F_GETFL) & O_NONBLOCK), "a regular file opens, reads block again");
    if (fd >= 0) close(fd);
    size_t len = 99;
    st = keel_read_regular(fifo, 0, &text, &len, why, sizeof why);
    EXPECT(st == KEEL_ERR_INPUT && strstr(why, "FIFO"), "keel_read_regular refuses the FIFO: %s", why);
    st = keel_read_regular(file, 1, &text, &len, why, sizeof why);
    EXPECT(st == KEEL_ERR_INPUT && strstr(why, "larger than 1 bytes"), "keel_read_regular: over max_bytes: %s", why);
    t0 = keel_now_s();
    st = keel_read_file_quiet(fifo, 0, &text, &len);
    EXPECT(st == KEEL_OK && len == 0 && keel_now_s() - t0 < 5, "a FIFO without a writer reads as empty, at once");
    if (st == KEEL_OK) keel_free(text);
    errno = 0;
    st = keel_read_file_quiet("/dev/zero", 0, &text, &len);
    EXPECT(st == KEEL_ERR_INPUT && errno == EINVAL, "keel_read_file_quiet refuses a device (/dev/zero would never end)");
}

/* Sizes a file asks for: keel_try_malloc refuses more than the machine's
 * memory without asking malloc (and under ASan without its report). */
static void test_try_malloc(void) {
    printf("== keel_try_malloc\n");
    void *p = keel_try_malloc(64);
    EXPECT(p != NULL && ((uintptr_t)p & 63) == 0, "a small block, 64-byte aligned");
    keel_free(p);
    EXPECT(keel_try_malloc((size_t)1 << 62) == NULL, "2^62 bytes: NULL, no abort");
    EXPECT(keel_try_malloc(SIZE_MAX) == NULL, "SIZE_MAX: NULL (no rounding wrap-around)");
}

int main(void) {
    if (!temp_dir_create(tmpdir, sizeof tmpdir, "fsio")) return 1;
    signal(SIGPIPE, SIG_IGN); /* a pipe test that fails must report, not die */
    test_atomic_replaces();
    test_atomic_failures();
    test_atomic_threads();
    test_read_file();
    test_pread_truncated();
    test_short_write_at_limit();
    test_write_interrupted();
    test_dirs();
    test_open_read_kinds();
    test_try_malloc();
    remove_tree(tmpdir);
    return test_summary("test_fsio");
}
