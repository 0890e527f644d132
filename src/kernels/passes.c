/* kernels/passes.c: the compute thread's whole-buffer passes (zero, copy, add, bf16 <-> fp32).
 *
 * Memory-bound, so on the pool's threads: one core's stores reached 9.4 GB/s
 * on a 2-core Xeon VM, two 15.5. Not for other threads (the snapshot thread's
 * copies are plain memmove: the pool is the compute thread's). */
#include <string.h>

#include "keel/kernels.h"

typedef struct {
    void *dst;
    const void *src;
} pass_ctx;

static void zero_range(void *p, int64_t begin, int64_t end, int chunk) {
    (void)chunk;
    memset((char *)((pass_ctx *)p)->dst + begin, 0, (size_t)(end - begin));
}

void keel_zero(void *dst, size_t bytes) {
    keel_pool_for((int64_t)bytes, 1 << 20, zero_range, &(pass_ctx){dst, NULL});
}

static void copy_range(void *p, int64_t begin, int64_t end, int chunk) {
    (void)chunk;
    const pass_ctx *c = p;
    memcpy((char *)c->dst + begin, (const char *)c->src + begin, (size_t)(end - begin));
}

void keel_copy(void *dst, const void *src, size_t bytes) {
    const char *d = dst, *s = src;
    if (d < s + bytes && s < d + bytes) memmove(dst, src, bytes); /* overlapping: in order */
    else keel_pool_for((int64_t)bytes, 1 << 20, copy_range, &(pass_ctx){dst, src});
}

static void accumulate_range(void *p, int64_t begin, int64_t end, int chunk) {
    (void)chunk;
    const pass_ctx *c = p;
    float *d = c->dst;
    const float *s = c->src;
    for (int64_t i = begin; i < end; i++) d[i] += s[i];
}

void keel_accumulate(float *dst, const float *src, int64_t n) {
    keel_pool_for(n, 1 << 16, accumulate_range, &(pass_ctx){dst, src});
}

static void accumulate_bf16_range(void *p, int64_t begin, int64_t end, int chunk) {
    (void)chunk;
    const pass_ctx *c = p;
    float *d = c->dst;
    const keel_bf16 *s = c->src;
    for (int64_t i = begin; i < end; i++) d[i] += keel_bf16_to_float(s[i]);
}

void keel_accumulate_bf16(float *dst, const keel_bf16 *src, int64_t n) {
    keel_pool_for(n, 1 << 16, accumulate_bf16_range, &(pass_ctx){dst, src});
}

static void to_bf16_range(void *p, int64_t begin, int64_t end, int chunk) {
    (void)chunk;
    const pass_ctx *c = p;
    keel_bf16 *d = c->dst;
    const float *s = c->src;
    for (int64_t i = begin; i < end; i++) d[i] = keel_bf16_from_float(s[i]);
}

void keel_f32_to_bf16(keel_bf16 *dst, const float *src, int64_t n) {
    keel_pool_for(n, 1 << 16, to_bf16_range, &(pass_ctx){dst, src});
}

static void to_f32_range(void *p, int64_t begin, int64_t end, int chunk) {
    (void)chunk;
    const pass_ctx *c = p;
    float *d = c->dst;
    const keel_bf16 *s = c->src;
    for (int64_t i = begin; i < end; i++) d[i] = keel_bf16_to_float(s[i]);
}

void keel_bf16_to_f32(float *dst, const keel_bf16 *src, int64_t n) {
    keel_pool_for(n, 1 << 16, to_f32_range, &(pass_ctx){dst, src});
}
