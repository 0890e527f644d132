/* kernels/scale_masked.c: a scale with an optional dropout mask drawn from a
 * hash (LoRA's adapter input and its gradient, keel/kernels.h). */
#include "keel/kernels.h"

typedef struct {
    float *out;
    const float *x;
    float mult;
    uint64_t drop_below; /* an element whose 53-bit draw is below this is dropped */
    uint64_t key;
    bool accumulate;
} scale_ctx;

static void scale_range(void *p, int64_t begin, int64_t end, int chunk) {
    (void)chunk;
    const scale_ctx *c = p;
    for (int64_t i = begin; i < end; i++) {
        float v = keel_mask_keeps(c->key, i, c->drop_below) ? c->mult * c->x[i] : 0.0f;
        c->out[i] = c->accumulate ? c->out[i] + v : v;
    }
}

void keel_scale_masked(float *out, const float *x, int64_t n, float mult, float p, uint64_t key, bool accumulate) {
    scale_ctx c = {out, x, mult, keel_mask_threshold(p), key, accumulate};
    keel_pool_for(n, 1 << 14, scale_range, &c);
}
