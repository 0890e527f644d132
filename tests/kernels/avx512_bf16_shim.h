/* tests/kernels/avx512_bf16_shim.h: scalar stand-ins, written from Intel's
 * descriptions, for the AVX-512 intrinsics that src/kernels/attention_bf16.c
 * uses, so that its AVX512_BF16 path's logic (packing layouts, the
 * microkernel's tiles, the flash tiles' products) runs on a CPU without
 * those instructions (attention_bf16_native_logic.sh). They check the code,
 * not the instructions: rounding is keel_bf16_from_float's (the instruction
 * flushes denormals), and VDPBF16PS sums in plain fp32. Needs keel/core.h. */
#include <stdint.h>
#include <string.h>
typedef float __m512 __attribute__((vector_size(64), may_alias));
typedef long long __m512i __attribute__((vector_size(64), may_alias));
typedef short __m512bh __attribute__((vector_size(64), may_alias));
typedef short __m256bh __attribute__((vector_size(32), may_alias));
typedef long long __m256i __attribute__((vector_size(32), may_alias));
typedef unsigned short __mmask16;
static inline uint16_t sh_bf(float x) { return keel_bf16_from_float(x); }
static inline float sh_f(uint16_t h) { return keel_bf16_to_float(h); }
static inline __m512 _mm512_loadu_ps(const void *p) { __m512 r; memcpy(&r, p, 64); return r; }
static inline void _mm512_storeu_ps(void *p, __m512 a) { memcpy(p, &a, 64); }
static inline __m512 _mm512_maskz_loadu_ps(__mmask16 k, const void *p) {
    float f[16] = {0}; const float *s = p;
    for (int i = 0; i < 16; i++) if (k >> i & 1) f[i] = s[i];
    __m512 r; memcpy(&r, f, 64); return r; }
static inline void _mm512_mask_storeu_ps(void *p, __mmask16 k, __m512 a) {
    float f[16]; memcpy(f, &a, 64); float *d = p;
    for (int i = 0; i < 16; i++) if (k >> i & 1) d[i] = f[i]; }
static inline __m512 _mm512_setzero_ps(void) { __m512 r; memset(&r, 0, 64); return r; }
static inline __m512i _mm512_setzero_si512(void) { __m512i r; memset(&r, 0, 64); return r; }
static inline __m512 _mm512_set1_ps(float x) { float f[16]; for (int i = 0; i < 16; i++) f[i] = x; __m512 r; memcpy(&r, f, 64); return r; }
static inline __m512i _mm512_set1_epi32(int x) { int32_t f[16]; for (int i = 0; i < 16; i++) f[i] = x; __m512i r; memcpy(&r, f, 64); return r; }
static inline __m512 _mm512_mul_ps(__m512 a, __m512 b) { return a * b; }
static inline __m512 _mm512_add_ps(__m512 a, __m512 b) { return a + b; }
static inline __m256bh _mm512_cvtneps_pbh(__m512 a) {
    float f[16]; uint16_t h[16]; memcpy(f, &a, 64);
    for (int i = 0; i < 16; i++) h[i] = sh_bf(f[i]);
    __m256bh r; memcpy(&r, h, 32); return r; }
static inline __m512bh _mm512_cvtne2ps_pbh(__m512 a, __m512 b) { /* low half from b, high from a */
    float fa[16], fb[16]; uint16_t h[32]; memcpy(fa, &a, 64); memcpy(fb, &b, 64);
    for (int i = 0; i < 16; i++) h[i] = sh_bf(fb[i]), h[16 + i] = sh_bf(fa[i]);
    __m512bh r; memcpy(&r, h, 64); return r; }
static inline void _mm256_storeu_si256(void *p, __m256i a) { memcpy(p, &a, 32); }
static inline void _mm512_storeu_si512(void *p, __m512i a) { memcpy(p, &a, 64); }
static inline __m512i _mm512_loadu_si512(const void *p) { __m512i r; memcpy(&r, p, 64); return r; }
static inline void _mm256_mask_storeu_epi16(void *p, __mmask16 k, __m256i a) {
    uint16_t h[16]; memcpy(h, &a, 32); uint16_t *d = p;
    for (int i = 0; i < 16; i++) if (k >> i & 1) d[i] = h[i]; }
static inline __m512i _mm512_set_epi16(short e31, short e30, short e29, short e28, short e27, short e26, short e25, short e24, short e23, short e22, short e21, short e20, short e19, short e18, short e17, short e16, short e15, short e14, short e13, short e12, short e11, short e10, short e9, short e8, short e7, short e6, short e5, short e4, short e3, short e2, short e1, short e0) {
    short h[32] = {e0, e1, e2, e3, e4, e5, e6, e7, e8, e9, e10, e11, e12, e13, e14, e15, e16, e17, e18, e19, e20, e21, e22, e23, e24, e25, e26, e27, e28, e29, e30, e31};
    __m512i r; memcpy(&r, h, 64); return r; }
static inline __m512i _mm512_set_epi32(int e15, int e14, int e13, int e12, int e11, int e10, int e9, int e8, int e7, int e6, int e5, int e4, int e3, int e2, int e1, int e0) {
    int h[16] = {e0, e1, e2, e3, e4, e5, e6, e7, e8, e9, e10, e11, e12, e13, e14, e15};
    __m512i r; memcpy(&r, h, 64); return r; }
static inline __m512i _mm512_permutexvar_epi16(__m512i idx, __m512i a) {
    uint16_t i16[32], a16[32], d[32]; memcpy(i16, &idx, 64); memcpy(a16, &a, 64);
    for (int i = 0; i < 32; i++) d[i] = a16[i16[i] & 31];
    __m512i r; memcpy(&r, d, 64); return r; }
static inline __m512i _mm512_mullo_epi32(__m512i a, __m512i b) {
    int32_t x[16], y[16]; memcpy(x, &a, 64); memcpy(y, &b, 64);
    for (int i = 0; i < 16; i++) x[i] = (int32_t)((uint32_t)x[i] * (uint32_t)y[i]);
    __m512i r; memcpy(&r, x, 64); return r; }
static inline __m512i _mm512_mask_i32gather_epi32(__m512i src, __mmask16 k, __m512i vindex, const void *base, int scale) {
    int32_t s[16], ix[16]; memcpy(s, &src, 64); memcpy(ix, &vindex, 64);
    for (int i = 0; i < 16; i++) if (k >> i & 1) memcpy(&s[i], (const char *)base + (int64_t)ix[i] * scale, 4);
    __m512i r; memcpy(&r, s, 64); return r; }
static inline __m512 _mm512_dpbf16_ps(__m512 src, __m512bh a, __m512bh b) {
    float s[16]; uint16_t x[32], y[32]; memcpy(s, &src, 64); memcpy(x, &a, 64); memcpy(y, &b, 64);
    for (int i = 0; i < 16; i++) s[i] += sh_f(x[2 * i]) * sh_f(y[2 * i]) + sh_f(x[2 * i + 1]) * sh_f(y[2 * i + 1]);
    __m512 r; memcpy(&r, s, 64); return r; }
