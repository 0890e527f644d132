/* ckpt/weights.c: durable file writes and the run's final-weights file. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "keel/ckpt.h"

static keel_status write_all(int fd, const void *data, size_t bytes) {
    const char *p = data;
    while (bytes > 0) {
        ssize_t n = write(fd, p, bytes);
        if (n < 0) {
            if (errno == EINTR) continue;
            return KEEL_ERR_IO;
        }
        p += n;
        bytes -= (size_t)n;
    }
    return KEEL_OK;
}

static void fsync_parent(const char *path) {
    char *copy = keel_xstrdup(path);
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    keel_free(copy);
}

/* Two-part write (header + payload) so large payloads are never copied. */
static keel_status write_parts_atomic(const char *path, const void *a, size_t a_bytes,
                                      const void *b, size_t b_bytes) {
    size_t len = strlen(path);
    char *tmp = keel_xmalloc(len + 16, "tmp path");
    snprintf(tmp, len + 16, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        keel_errorf("%s: cannot create: %s", tmp, strerror(errno));
        keel_free(tmp);
        return KEEL_ERR_IO;
    }
    keel_status st = write_all(fd, a, a_bytes);
    if (st == KEEL_OK && b_bytes) st = write_all(fd, b, b_bytes);
    int saved_errno = errno;
    if (st == KEEL_OK && fsync(fd) != 0) st = KEEL_ERR_IO, saved_errno = errno;
    if (close(fd) != 0 && st == KEEL_OK) st = KEEL_ERR_IO, saved_errno = errno;
    if (st == KEEL_OK && rename(tmp, path) != 0) st = KEEL_ERR_IO, saved_errno = errno;
    if (st != KEEL_OK) {
        keel_errorf("%s: write failed: %s (the previous file, if any, is untouched)", path,
                    strerror(saved_errno));
        unlink(tmp);
    } else {
        fsync_parent(path);
    }
    keel_free(tmp);
    return st;
}

keel_status keel_write_file_atomic(const char *path, const void *data, size_t bytes) {
    return write_parts_atomic(path, data, bytes, NULL, 0);
}

typedef struct {
    char magic[8];
    uint32_t version;
    uint32_t dtype;
    uint64_t n_params;
    uint64_t checksum;
    uint8_t pad[32];
} weights_header;
_Static_assert(sizeof(weights_header) == 64, "weights header is 64 bytes");

keel_status keel_weights_save(const char *path, const float *params, int64_t n_params) {
    weights_header h = {.version = KEEL_WEIGHTS_VERSION, .dtype = 1, .n_params = (uint64_t)n_params};
    memcpy(h.magic, KEEL_WEIGHTS_MAGIC, 8);
    h.checksum = XXH3_64bits(params, sizeof(float) * (size_t)n_params);
    return write_parts_atomic(path, &h, sizeof h, params, sizeof(float) * (size_t)n_params);
}

keel_status keel_weights_load(const char *path, float *params, int64_t n_params) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        keel_errorf("%s: cannot open weights: %s", path, strerror(errno));
        return KEEL_ERR_INPUT;
    }
    weights_header h;
    keel_status st = KEEL_ERR_INPUT;
    if (fread(&h, sizeof h, 1, f) != 1 || memcmp(h.magic, KEEL_WEIGHTS_MAGIC, 8) != 0)
        keel_errorf("%s: not a keel weights file (bad magic)", path);
    else if (h.version != KEEL_WEIGHTS_VERSION || h.dtype != 1)
        keel_errorf("%s: unsupported weights version %u / dtype %u", path, h.version, h.dtype);
    else if (h.n_params != (uint64_t)n_params)
        keel_errorf("%s: holds %llu parameters but the config's model has %lld; use the run's own "
                    "config.json", path, (unsigned long long)h.n_params, (long long)n_params);
    else if (fread(params, sizeof(float), (size_t)n_params, f) != (size_t)n_params)
        keel_errorf("%s: truncated (expected %lld parameters)", path, (long long)n_params);
    else if (XXH3_64bits(params, sizeof(float) * (size_t)n_params) != h.checksum)
        keel_errorf("%s: checksum mismatch: the file is damaged", path);
    else
        st = KEEL_OK;
    fclose(f);
    return st;
}

void keel_params_xxh3_hex(const float *params, int64_t n_params, char out[17]) {
    snprintf(out, 17, "%016llx",
             (unsigned long long)XXH3_64bits(params, sizeof(float) * (size_t)n_params));
}
