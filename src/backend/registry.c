/* backend/registry.c: the choice of a backend by kind — the CPU's (or the
 * CPU's on fenced memory, KEEL_FENCED_BACKEND=1) or the CUDA backend's where
 * a GPU can be used. */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda_table.h"
#include "keel/backend.h"
#include "keel/cuda.h"

keel_status keel_backend_get(keel_backend_kind kind, const keel_backend **out) {
    *out = NULL;
    if (kind == KEEL_BACKEND_CPU) {
        const char *fenced = getenv("KEEL_FENCED_BACKEND");
        *out = keel_backend_cpu();
        if (fenced && !strcmp(fenced, "1")) {
            keel_log_warn("KEEL_FENCED_BACKEND=1: the CPU backend on fenced memory, a debugging aid (slower): a "
                          "host access to a tensor outside a backend call faults");
            *out = keel_backend_fenced();
        }
        return KEEL_OK;
    }
    char why[512];
    if (keel_cuda_device_count(why, sizeof why) == 0) {
        keel_errorf("device cuda: %s", why);
        return KEEL_ERR_INPUT;
    }
    *out = keel_backend_cuda_table();
    return KEEL_OK;
}
