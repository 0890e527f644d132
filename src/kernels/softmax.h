/* kernels/softmax.h: the fp32 masked softmax of causal attention and its
 * backward over blocks of query rows, shared by the fp32 (attention.c) and
 * bf16 (attention_bf16.c) attention so both keep the same fp32 softmax. */
#ifndef KEEL_KERNELS_SOFTMAX_H
#define KEEL_KERNELS_SOFTMAX_H

#include <stdint.h>
#include <string.h>

#include "kernels/simd.h"

/* Masked softmax of rows [r0, r0 + rows) of one head's (T, T) score matrix. */
static inline void softmax_block(float *A, int T, int r0, int rows) {
    for (int t = r0; t < r0 + rows; t++) {
        float *a = A + (int64_t)t * T;
        float mx = keel_max(a, t + 1), sum = 0;
        for (int j = 0; j <= t; j++) sum += (a[j] = keel_expf(a[j] - mx));
        float inv = 1.0f / sum;
        for (int j = 0; j <= t; j++) a[j] *= inv;
        memset(a + t + 1, 0, sizeof(float) * (size_t)(T - t - 1));
    }
}

/* dS_j = scale * A_j (dA_j - Σ_k A_k dA_k) for rows [r0, r0 + rows), in place over dA. */
static inline void softmax_backward_block(const float *A, float *dA, int T, int r0, int rows, float scale) {
    for (int t = r0; t < r0 + rows; t++) {
        const float *a = A + (int64_t)t * T;
        float *d = dA + (int64_t)t * T;
        float s = keel_dot(a, d, t + 1);
        for (int j = 0; j <= t; j++) d[j] = scale * a[j] * (d[j] - s);
        memset(d + t + 1, 0, sizeof(float) * (size_t)(T - t - 1));
    }
}

#endif
