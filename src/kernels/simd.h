/* kernels/simd.h: small inline helpers that GCC vectorises without -ffast-math
 * (16 independent lanes instead of one serial float reduction). */
#ifndef KEEL_KERNELS_SIMD_H
#define KEEL_KERNELS_SIMD_H

#include <stdint.h>

#define KEEL_LANES 16

static inline float keel_dot(const float *a, const float *b, int n) {
    float acc[KEEL_LANES] = {0};
    int i = 0;
    for (; i + KEEL_LANES <= n; i += KEEL_LANES)
        for (int j = 0; j < KEEL_LANES; j++) acc[j] += a[i + j] * b[i + j];
    float s = 0;
    for (int j = 0; j < KEEL_LANES; j++) s += acc[j];
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static inline float keel_max(const float *a, int n) {
    float m = a[0];
    for (int i = 1; i < n; i++) m = a[i] > m ? a[i] : m;
    return m;
}

/* exp(x) in fp32 to ~2 ulp (Cephes' expf: x = n ln2 + r, a degree-6
 * polynomial for e^r, 2^n through the exponent bits), written so GCC
 * vectorises it; glibc's expf is scalar and was 9% of a training step. */
static inline float keel_expf(float x) {
    x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { int32_t i; float f; } scale = {.i = ((int32_t)n + 127) << 23};
    return p * scale.f;
}

#endif
