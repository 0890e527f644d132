/* kernels/simd.h: small inline helpers that GCC vectorises without -ffast-math
 * (16 independent lanes instead of one serial float reduction). */
#ifndef KEEL_KERNELS_SIMD_H
#define KEEL_KERNELS_SIMD_H

#include <stdint.h>
#ifdef __AVX2__
#include <immintrin.h>

#endif

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

#ifdef __AVX2__
/* keel_expf's steps on 8 lanes of AVX2 + FMA (keel's baseline): GCC keeps
 * every loop that calls keel_expf scalar under its default -ftrapping-math
 * (the clamp's compares feed arithmetic) — flash attention's softmax,
 * SwiGLU and the cross-entropy call this instead. The clamp's operand
 * order lets a NaN through, as keel_expf does. */
static inline __m256 keel_expf8(__m256 x) {
    x = _mm256_min_ps(_mm256_set1_ps(88.3f), _mm256_max_ps(_mm256_set1_ps(-87.3f), x));
    const __m256 magic = _mm256_set1_ps(12582912.0f); /* 1.5 * 2^23: rounds to integers */
    __m256 y = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), magic);
    __m256 n = _mm256_sub_ps(y, magic);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f),
                               _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x));
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
    /* n sits in y's low mantissa bits (|n| <= 128): 2^n through the exponent */
    __m256i e = _mm256_sub_epi32(_mm256_castps_si256(y), _mm256_castps_si256(magic));
    e = _mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif

#endif
