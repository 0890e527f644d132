/* infer/split.c: work split over processes on this machine
 * (keel_infer_split in keel/infer.h) — keel generate --nproc and keel eval
 * --nproc. The model is loaded once, before the fork: the children share its
 * pages (copy-on-write, and never written). Each child starts its own kernel
 * threads, does its share and writes JSON lines into a pipe; the parent reads
 * every pipe as lines come (poll) and hands each line on. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "keel/infer.h"
#include "keel/kernels.h"

typedef struct {
    int fd;
    char *buf;
    size_t len, cap;
} reader;

/* Every whole line read so far goes to on_line; false at the end of the pipe. */
static bool drain(reader *r, void (*on_line)(void *ctx, const char *line), void *ctx) {
    if (r->cap - r->len < 65536) r->buf = keel_xrealloc(r->buf, r->cap = 2 * r->cap + 65536, "split lines");
    ssize_t got = read(r->fd, r->buf + r->len, r->cap - r->len - 1);
    if (got < 0 && errno == EINTR) return true;
    if (got <= 0) return false;
    r->len += (size_t)got;
    char *start = r->buf, *nl;
    while ((nl = memchr(start, '\n', r->len - (size_t)(start - r->buf)))) {
        *nl = '\0';
        on_line(ctx, start);
        start = nl + 1;
    }
    r->len -= (size_t)(start - r->buf);
    memmove(r->buf, start, r->len);
    return true;
}

int keel_infer_split_threads(int threads, int nproc) {
    if (threads > 0 || nproc == 1) return threads;
    int each = keel_cores_allowed() / nproc;
    return each > 1 ? each : 1;
}

keel_status keel_infer_split(int nproc, int threads, keel_split_work work, void (*on_line)(void *ctx, const char *line),
                             void *ctx) {
    threads = keel_infer_split_threads(threads, nproc);
    pid_t *pids = keel_xcalloc(sizeof(pid_t) * (size_t)nproc, "children");
    reader *rd = keel_xcalloc(sizeof(reader) * (size_t)nproc, "pipes");
    keel_status st = KEEL_OK;
    fflush(NULL); /* nothing buffered is written twice */
    int started = 0;
    for (; started < nproc; started++) {
        int fds[2];
        if (pipe(fds) != 0) {
            keel_errorf("--nproc: cannot make a pipe: %s", strerror(errno));
            st = KEEL_ERR_IO;
            break;
        }
        pid_t pid = fork();
        if (pid < 0) {
            keel_errorf("--nproc: cannot start process %d: %s", started, strerror(errno));
            close(fds[0]), close(fds[1]);
            st = KEEL_ERR_IO;
            break;
        }
        if (pid == 0) {
            for (int i = 0; i < started; i++) close(rd[i].fd);
            close(fds[0]);
            FILE *out = fdopen(fds[1], "w");
            keel_kernels_init(threads);
            keel_status cst = out ? work(ctx, started, nproc, out) : KEEL_ERR_IO;
            keel_kernels_shutdown();
            if (out && fclose(out) != 0 && cst == KEEL_OK) cst = KEEL_ERR_IO;
            _exit(keel_status_exit_code(cst));
        }
        close(fds[1]);
        pids[started] = pid, rd[started].fd = fds[0];
    }
    struct pollfd *pf = keel_xcalloc(sizeof *pf * (size_t)nproc, "poll");
    for (int open_n = started; open_n > 0;) {
        for (int i = 0; i < started; i++) pf[i] = (struct pollfd){.fd = rd[i].fd, .events = POLLIN};
        if (poll(pf, (nfds_t)started, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        for (int i = 0; i < started; i++)
            if (rd[i].fd >= 0 && (pf[i].revents & (POLLIN | POLLHUP | POLLERR)) && !drain(&rd[i], on_line, ctx)) {
                close(rd[i].fd);
                rd[i].fd = -1, open_n--;
            }
    }
    for (int i = 0; i < started; i++) {
        int ws = 0;
        while (waitpid(pids[i], &ws, 0) < 0 && errno == EINTR) {}
        int code = WIFEXITED(ws) ? WEXITSTATUS(ws) : 1;
        if (code != 0 && st == KEEL_OK) {
            if (WIFSIGNALED(ws)) keel_errorf("--nproc: process %d was killed by signal %d", i, WTERMSIG(ws));
            st = code == 2 ? KEEL_ERR_INPUT : KEEL_ERR_IO;
        }
        keel_free(rd[i].buf);
    }
    keel_free(pf), keel_free(pids), keel_free(rd);
    return st;
}
