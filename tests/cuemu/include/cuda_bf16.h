// tests/cuemu/include/cuda_bf16.h: the bf16 type and conversions keel's
// kernels use, for the host emulator: a plain 16-bit payload (the top half of
// an fp32) without implicit conversions, so a kernel cannot lean on one.
#ifndef KEEL_CUEMU_CUDA_BF16_H
#define KEEL_CUEMU_CUDA_BF16_H

#include <stdint.h>
#include <string.h>

struct __nv_bfloat16 {
    unsigned short __x;
};
struct alignas(4) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
static_assert(sizeof(__nv_bfloat16) == 2 && sizeof(__nv_bfloat162) == 4, "bf16 sizes");

// round to nearest even; a NaN stays a NaN (quiet, sign and top payload kept)
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    __nv_bfloat16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        r.__x = (unsigned short)((u >> 16) | 0x40u);
        return r;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    r.__x = (unsigned short)(u >> 16);
    return r;
}
static inline float __bfloat162float(__nv_bfloat16 b) {
    uint32_t u = (uint32_t)b.__x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
    __nv_bfloat162 r;
    r.x = __float2bfloat16_rn(a);
    r.y = __float2bfloat16_rn(b);
    return r;
}

#endif
