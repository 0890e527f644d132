/* kernels/swiglu.c: SwiGLU gating h = silu(gate) * up (Shazeer 2020). */
#include <math.h>

#include "keel/kernels.h"
#include "kernels/simd.h"

typedef struct {
    float *h, *dgate, *dup;
    const float *gate, *up, *dh;
} swiglu_ctx;

static void forward_range(void *p, int64_t begin, int64_t end, int chunk) {
    (void)chunk;
    swiglu_ctx *c = p;
    for (int64_t i = begin; i < end; i++) {
        float g = c->gate[i];
        c->h[i] = g / (1.0f + keel_expf(-g)) * c->up[i];
    }
}

void keel_swiglu_forward(float *h, const float *gate, const float *up, int64_t n) {
    swiglu_ctx c = {.h = h, .gate = gate, .up = up};
    keel_pool_for(n, 4096, forward_range, &c);
}

/* d silu(g)/dg = s (1 + g (1 - s)) with s = sigmoid(g). */
static void backward_range(void *p, int64_t begin, int64_t end, int chunk) {
    (void)chunk;
    swiglu_ctx *c = p;
    for (int64_t i = begin; i < end; i++) {
        float g = c->gate[i], s = 1.0f / (1.0f + keel_expf(-g));
        c->dup[i] = c->dh[i] * g * s;
        c->dgate[i] = c->dh[i] * c->up[i] * s * (1.0f + g * (1.0f - s));
    }
}

void keel_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate,
                          const float *up, int64_t n) {
    swiglu_ctx c = {.dgate = dgate, .dup = dup, .gate = gate, .up = up, .dh = dh};
    keel_pool_for(n, 4096, backward_range, &c);
}
