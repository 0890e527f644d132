/* ckpt/weights.c: the run's final-weights file (RUN/weights.bin). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "keel/ckpt.h"

typedef struct {
    char magic[8];
    uint32_t version;
    uint32_t dtype;
    uint64_t n_params;
    uint64_t checksum;
    uint8_t pad[32];
} weights_header;
_Static_assert(sizeof(weights_header) == 64, "weights header is 64 bytes");

struct keel_weights_writer {
    keel_atomic_file file;
    char path[4096];
    XXH3_state_t *hash;
    int64_t n_params, written;
};

keel_status keel_weights_begin(const char *path, int64_t n_params, keel_weights_writer **out) {
    keel_weights_writer *w = keel_xcalloc(sizeof *w, "weights writer");
    snprintf(w->path, sizeof w->path, "%s", path);
    w->n_params = n_params;
    keel_status st = keel_atomic_begin(&w->file, path);
    weights_header blank = {0}; /* the real header, with the checksum, goes in at commit */
    if (st == KEEL_OK) st = keel_write_all(w->file.fd, &blank, sizeof blank, path);
    if (st != KEEL_OK) {
        keel_atomic_abort(&w->file);
        keel_free(w);
        return st;
    }
    w->hash = XXH3_createState();
    KEEL_CHECK(w->hash && XXH3_64bits_reset(w->hash) == XXH_OK, "XXH3 state");
    *out = w;
    return KEEL_OK;
}

keel_status keel_weights_append(keel_weights_writer *w, const float *values, int64_t n) {
    KEEL_CHECK(w->written + n <= w->n_params, "%lld parameters past the %lld announced",
               (long long)(w->written + n), (long long)w->n_params);
    XXH3_64bits_update(w->hash, values, sizeof(float) * (size_t)n);
    w->written += n;
    return keel_write_all(w->file.fd, values, sizeof(float) * (size_t)n, w->path);
}

void keel_weights_abort(keel_weights_writer *w) {
    if (!w) return;
    keel_atomic_abort(&w->file);
    XXH3_freeState(w->hash);
    keel_free(w);
}

keel_status keel_weights_commit(keel_weights_writer *w, char xxh3_hex[17]) {
    KEEL_CHECK(w->written == w->n_params, "weights: %lld of %lld parameters written", (long long)w->written,
               (long long)w->n_params);
    weights_header h = {.version = KEEL_WEIGHTS_VERSION, .dtype = 1, .n_params = (uint64_t)w->n_params,
                        .checksum = XXH3_64bits_digest(w->hash)};
    memcpy(h.magic, KEEL_WEIGHTS_MAGIC, 8);
    if (xxh3_hex) snprintf(xxh3_hex, 17, "%016llx", (unsigned long long)h.checksum);
    keel_status st = keel_pwrite_all(w->file.fd, &h, sizeof h, 0, w->path);
    if (st == KEEL_OK) st = keel_atomic_commit(&w->file);
    keel_weights_abort(w); /* frees; a committed file stays */
    return st;
}

keel_status keel_weights_save(const char *path, const float *params, int64_t n_params) {
    keel_weights_writer *w;
    keel_status st = keel_weights_begin(path, n_params, &w);
    if (st != KEEL_OK) return st;
    if ((st = keel_weights_append(w, params, n_params)) != KEEL_OK) {
        keel_weights_abort(w);
        return st;
    }
    return keel_weights_commit(w, NULL);
}

keel_status keel_weights_load(const char *path, float *params, int64_t n_params) {
    int fd;
    char why[160];
    if (keel_open_read(path, false, &fd, why, sizeof why) != KEEL_OK) {
        keel_errorf("%s: cannot open weights: %s", path, why);
        return KEEL_ERR_INPUT;
    }
    weights_header h;
    size_t bytes = sizeof(float) * (size_t)n_params;
    keel_status st = KEEL_ERR_INPUT;
    if (keel_pread_all(fd, &h, sizeof h, 0, NULL) != KEEL_OK || memcmp(h.magic, KEEL_WEIGHTS_MAGIC, 8) != 0)
        keel_errorf("%s: not a keel weights file (bad magic)", path);
    else if (h.version != KEEL_WEIGHTS_VERSION || h.dtype != 1)
        keel_errorf("%s: unsupported weights version %u / dtype %u", path, h.version, h.dtype);
    else if (h.n_params != (uint64_t)n_params)
        keel_errorf("%s: holds %llu parameters but the config's model has %lld; use the run's own "
                    "config.json", path, (unsigned long long)h.n_params, (long long)n_params);
    else
        st = keel_pread_all(fd, params, bytes, sizeof h, path); /* says "truncated" itself */
    if (st == KEEL_OK && XXH3_64bits(params, bytes) != h.checksum) {
        keel_errorf("%s: checksum mismatch: the file is damaged", path);
        st = KEEL_ERR_INPUT;
    }
    close(fd);
    return st;
}
