/* core/fsio.c: durable file I/O — looped reads and writes, atomic replacement, whole-file reads. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "keel/core.h"

/* Linux moves at most 0x7ffff000 bytes per read/write, and other systems
 * refuse counts above INT_MAX outright; 1 GiB per call is valid everywhere,
 * and the loops below take care of the rest. */
#define IO_CHUNK ((size_t)1 << 30)

/* Print "PATH: <what>: <strerror>" unless path is NULL; errno survives. */
static keel_status io_fail(const char *path, const char *what) {
    int saved = errno;
    if (path) keel_errorf("%s: %s: %s", path, what, strerror(saved));
    errno = saved;
    return KEEL_ERR_IO;
}

keel_status keel_mkdirs(const char *dir) {
    char *path = keel_xstrdup(dir);
    keel_status st = KEEL_OK;
    if (!path[0]) {
        errno = ENOENT;
        st = io_fail("(empty path)", "cannot create directory");
        goto fail;
    }
    for (size_t n = strlen(path); n > 1 && path[n - 1] == '/'; n--) path[n - 1] = 0;
    /* Each ancestor in turn, then dir itself: mkdir -p. */
    for (char *p = path + 1;; p++) {
        bool last = *p == 0;
        if (!last && *p != '/') continue;
        *p = 0;
        struct stat sb;
        if (mkdir(path, 0755) != 0) {
            if (errno == EEXIST && stat(path, &sb) == 0 && !S_ISDIR(sb.st_mode)) errno = ENOTDIR;
            if (errno != EEXIST) {
                st = io_fail(path, "cannot create directory");
                goto fail;
            }
        }
        if (last) break;
        *p = '/';
    }
fail:
    keel_free(path);
    return st;
}

keel_status keel_write_all(int fd, const void *data, size_t bytes, const char *path) {
    const char *p = data;
    while (bytes > 0) {
        ssize_t n = write(fd, p, bytes < IO_CHUNK ? bytes : IO_CHUNK);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            if (n == 0) errno = EIO; /* no progress and no reason: do not spin */
            return io_fail(path, "write failed");
        }
        p += n;
        bytes -= (size_t)n;
    }
    return KEEL_OK;
}

keel_status keel_pwrite_all(int fd, const void *data, size_t bytes, int64_t offset, const char *path) {
    KEEL_CHECK(offset >= 0, "negative file offset %lld", (long long)offset);
    const char *p = data;
    while (bytes > 0) {
        ssize_t n = pwrite(fd, p, bytes < IO_CHUNK ? bytes : IO_CHUNK, (off_t)offset);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            if (n == 0) errno = EIO;
            return io_fail(path, "write failed");
        }
        p += n;
        bytes -= (size_t)n;
        offset += n;
    }
    return KEEL_OK;
}

keel_status keel_pread_all(int fd, void *data, size_t bytes, int64_t offset, const char *path) {
    KEEL_CHECK(offset >= 0, "negative file offset %lld", (long long)offset);
    char *p = data;
    size_t got = 0;
    while (got < bytes) {
        size_t want = bytes - got < IO_CHUNK ? bytes - got : IO_CHUNK;
        ssize_t n = pread(fd, p + got, want, (off_t)(offset + (int64_t)got));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return io_fail(path, "read failed");
        if (n == 0) {
            if (path)
                keel_errorf("%s: truncated: expected %zu bytes at offset %lld, got %zu", path, bytes,
                            (long long)offset, got);
            return KEEL_ERR_INPUT;
        }
        got += (size_t)n;
    }
    return KEEL_OK;
}

keel_status keel_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return io_fail(dir, "cannot open directory to fsync it");
    int rc = fsync(fd);
    /* Some file systems cannot sync a directory at all (EINVAL): there is
     * nothing more to do there, and failing every save would not help. */
    if (rc != 0 && (errno == EINVAL || errno == ENOTSUP)) rc = 0;
    keel_status st = rc == 0 ? KEEL_OK : io_fail(dir, "cannot fsync directory");
    close(fd);
    return st;
}

keel_status keel_fsync_parent(const char *path) {
    char *copy = keel_xstrdup(path);
    keel_status st = keel_fsync_dir(dirname(copy));
    keel_free(copy);
    return st;
}

/* ---- atomic replacement ------------------------------------------------------ */

keel_status keel_atomic_begin(keel_atomic_file *f, const char *path) {
    /* pid + a process-wide counter: unique among the threads of this process
     * (two background saves) and, with O_EXCL, against any other process. */
    static atomic_uint counter;
    size_t n = strlen(path) + 48;
    f->path = keel_xstrdup(path);
    f->tmp = keel_xmalloc(n, "tmp path");
    f->fd = -1;
    for (int attempt = 0; f->fd < 0 && attempt < 100; attempt++) {
        snprintf(f->tmp, n, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&counter, 1));
        f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (f->fd < 0 && errno != EEXIST) break;
    }
    if (f->fd >= 0) return KEEL_OK;
    keel_status st = io_fail(path, "cannot create");
    keel_free(f->path);
    keel_free(f->tmp);
    f->path = f->tmp = NULL;
    return st;
}

void keel_atomic_abort(keel_atomic_file *f) {
    if (f->fd >= 0) {
        close(f->fd);
        unlink(f->tmp);
    }
    keel_free(f->path);
    keel_free(f->tmp);
    f->path = f->tmp = NULL;
    f->fd = -1;
}

/* The one line for a replacement that did not happen. */
static keel_status replace_failed(keel_atomic_file *f, const char *what) {
    int saved = errno;
    keel_errorf("%s: %s failed: %s (the previous file, if any, is untouched)", f->path, what,
                strerror(saved));
    keel_atomic_abort(f);
    errno = saved;
    return KEEL_ERR_IO;
}

keel_status keel_atomic_commit(keel_atomic_file *f) {
    if (fsync(f->fd) != 0) return replace_failed(f, "fsync");
    int rc = close(f->fd);
    f->fd = -1;
    if (rc != 0 || rename(f->tmp, f->path) != 0) {
        int saved = errno;
        unlink(f->tmp);
        errno = saved;
        return replace_failed(f, rc != 0 ? "close" : "rename");
    }
    keel_status st = keel_fsync_parent(f->path);
    keel_atomic_abort(f); /* frees the names; the tmp is gone already */
    return st;
}

keel_status keel_write_file_atomic2(const char *path, const void *head, size_t head_bytes,
                                    const void *body, size_t body_bytes) {
    keel_atomic_file f;
    keel_status st = keel_atomic_begin(&f, path);
    if (st != KEEL_OK) return st;
    if (keel_write_all(f.fd, head, head_bytes, NULL) != KEEL_OK ||
        keel_write_all(f.fd, body, body_bytes, NULL) != KEEL_OK)
        return replace_failed(&f, "write");
    return keel_atomic_commit(&f);
}

keel_status keel_write_file_atomic(const char *path, const void *data, size_t bytes) {
    return keel_write_file_atomic2(path, data, bytes, NULL, 0);
}

keel_status keel_commit_dir(const char *tmp_dir, const char *dir) {
    /* The entries durable before the rename, the rename durable before the
     * caller tells anyone (LATEST) that dir exists. */
    keel_status st = keel_fsync_dir(tmp_dir);
    if (st != KEEL_OK) return st;
    if (rename(tmp_dir, dir) != 0) {
        int saved = errno;
        keel_errorf("%s: cannot move %s into place: %s", dir, tmp_dir, strerror(saved));
        errno = saved;
        return KEEL_ERR_IO;
    }
    return keel_fsync_parent(dir);
}

/* ---- opening what a user named ------------------------------------------------- */

/* What a non-regular file is, in words. */
static const char *kind_of(mode_t mode) {
    return S_ISDIR(mode) ? "a directory" : S_ISFIFO(mode) ? "a FIFO" : S_ISSOCK(mode) ? "a socket"
         : S_ISCHR(mode) ? "a character device" : S_ISBLK(mode) ? "a block device" : "not a regular file";
}

keel_status keel_open_read(const char *path, bool pipes_ok, int *fd_out, char *why, size_t why_n) {
    *fd_out = -1;
    /* O_NONBLOCK: open() of a FIFO that no process writes to would wait for
     * one forever; so opened, it returns at once and fstat says what it is. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(why, why_n, "%s", strerror(e));
        errno = e;
        return e == ENOENT || e == ENOTDIR || e == ELOOP || e == ENAMETOOLONG ? KEEL_ERR_INPUT : KEEL_ERR_IO;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        snprintf(why, why_n, "cannot stat: %s", strerror(e));
        close(fd);
        errno = e;
        return KEEL_ERR_IO;
    }
    bool ok = S_ISREG(sb.st_mode) || (pipes_ok && S_ISFIFO(sb.st_mode));
    if (!ok) {
        snprintf(why, why_n, "is %s, not a regular file", kind_of(sb.st_mode));
        close(fd);
        errno = S_ISDIR(sb.st_mode) ? EISDIR : EINVAL;
        return KEEL_ERR_INPUT;
    }
    /* reads block again: a pipe's writer may be slower than its reader (a
     * FIFO nobody writes to reads as empty, it does not wait) */
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    *fd_out = fd;
    return KEEL_OK;
}

/* ---- whole-file reads -------------------------------------------------------- */

/* Read fd (open, at its start) to EOF into a new NUL-terminated buffer; at
 * most max_bytes (0 = no limit: EFBIG past it). Closes fd. */
static keel_status read_fd(int fd, size_t max_bytes, char **out, size_t *len) {
    keel_status st = KEEL_ERR_IO;
    char *buf = NULL;
    size_t n = 0, cap = 1 << 16;
    struct stat sb;
    if (fstat(fd, &sb) != 0) goto fail;
    if (max_bytes && S_ISREG(sb.st_mode) && (uint64_t)sb.st_size > max_bytes) {
        errno = EFBIG;
        st = KEEL_ERR_INPUT;
        goto fail;
    }
    /* A regular file's size, + the NUL, + one byte of room so that the read
     * that finds EOF needs no bigger buffer. Read to EOF all the same: pipes,
     * /proc files (size 0) and files still growing. A size the memory cannot
     * hold is an input error, not an abort: the file is what is wrong. */
    if (S_ISREG(sb.st_mode) && sb.st_size > 0) {
        if ((uint64_t)sb.st_size > SIZE_MAX - 2) {
            errno = EFBIG;
            st = KEEL_ERR_INPUT;
            goto fail;
        }
        cap = (size_t)sb.st_size + 2;
    }
    buf = keel_try_malloc(cap);
    if (!buf) {
        errno = ENOMEM;
        st = KEEL_ERR_INPUT;
        goto fail;
    }
    for (;;) {
        if (n + 1 == cap) {
            char *bigger = cap <= SIZE_MAX / 2 ? realloc(buf, cap * 2) : NULL;
            if (!bigger) {
                errno = ENOMEM;
                st = KEEL_ERR_INPUT;
                goto fail;
            }
            buf = bigger;
            cap *= 2;
        }
        size_t room = cap - 1 - n;
        ssize_t got = read(fd, buf + n, room < IO_CHUNK ? room : IO_CHUNK);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) goto fail;
        if (got == 0) break;
        n += (size_t)got;
        if (max_bytes && n > max_bytes) {
            errno = EFBIG;
            st = KEEL_ERR_INPUT;
            goto fail;
        }
    }
    close(fd);
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return KEEL_OK;
fail:;
    int saved = errno;
    keel_free(buf);
    close(fd);
    errno = saved;
    return st;
}

keel_status keel_read_file_quiet(const char *path, size_t max_bytes, char **out, size_t *len) {
    int fd;
    char why[160];
    keel_status st = keel_open_read(path, true, &fd, why, sizeof why);
    return st != KEEL_OK ? st : read_fd(fd, max_bytes, out, len);
}

keel_status keel_read_regular(const char *path, size_t max_bytes, char **out, size_t *len, char *why,
                              size_t why_n) {
    int fd;
    keel_status st = keel_open_read(path, false, &fd, why, why_n);
    if (st != KEEL_OK) return st;
    st = read_fd(fd, max_bytes, out, len);
    if (st != KEEL_OK) {
        int e = errno;
        if (e == EFBIG) snprintf(why, why_n, "larger than %zu bytes", max_bytes);
        else snprintf(why, why_n, "%s", strerror(e));
        errno = e;
    }
    return st;
}

keel_status keel_read_file(const char *path, char **out, size_t *len) {
    keel_status st = keel_read_file_quiet(path, 0, out, len);
    if (st != KEEL_OK) {
        int saved = errno;
        keel_errorf("%s: cannot read: %s", path, strerror(saved));
        errno = saved;
    }
    return st;
}

bool keel_path_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

char *keel_path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = keel_xmalloc(n, "path");
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}
