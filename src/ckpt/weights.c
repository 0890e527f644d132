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

keel_status keel_weights_save(const char *path, const float *params, int64_t n_params) {
    weights_header h = {.version = KEEL_WEIGHTS_VERSION, .dtype = 1, .n_params = (uint64_t)n_params};
    memcpy(h.magic, KEEL_WEIGHTS_MAGIC, 8);
    h.checksum = XXH3_64bits(params, sizeof(float) * (size_t)n_params);
    return keel_write_file_atomic2(path, &h, sizeof h, params, sizeof(float) * (size_t)n_params);
}

keel_status keel_weights_load(const char *path, float *params, int64_t n_params) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        keel_errorf("%s: cannot open weights: %s", path, strerror(errno));
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

void keel_params_xxh3_hex(const float *params, int64_t n_params, char out[17]) {
    snprintf(out, 17, "%016llx",
             (unsigned long long)XXH3_64bits(params, sizeof(float) * (size_t)n_params));
}
