/* kernels/rope.c: rotary position embedding in Hugging Face's rotate-half
 * layout (Su et al. 2021), so HF Llama checkpoints load unpermuted. */
#include <math.h>

#include "keel/kernels.h"

/* Computed exactly as transformers does it, in fp32: inv_freq = 1 / theta^(2i/HS),
 * angle = t * inv_freq, then cos and sin of that fp32 angle. */
void keel_rope_table(float *cos_sin, int T, int HS, double theta) {
    int half = HS / 2;
    for (int i = 0; i < half; i++) {
        float inv_freq = 1.0f / powf((float)theta, (float)(2 * i) / (float)HS);
        for (int t = 0; t < T; t++) {
            float angle = (float)t * inv_freq;
            cos_sin[((int64_t)t * half + i) * 2 + 0] = (float)cos((double)angle);
            cos_sin[((int64_t)t * half + i) * 2 + 1] = (float)sin((double)angle);
        }
    }
}

typedef struct {
    float *x;
    const float *cs;
    int T, H, HS;
    float sign; /* +1 forward, -1 backward (inverse rotation) */
} rope_ctx;

static void rotate_rows(void *p, int64_t begin, int64_t end, int chunk) {
    (void)chunk;
    rope_ctx *c = p;
    int half = c->HS / 2;
    for (int64_t row = begin; row < end; row++) { /* row = (b*T + t) */
        int t = (int)(row % c->T);
        const float *cs = c->cs + (int64_t)t * half * 2;
        for (int h = 0; h < c->H; h++) {
            float *x = c->x + (row * c->H + h) * c->HS;
            for (int i = 0; i < half; i++) {
                float co = cs[2 * i], si = c->sign * cs[2 * i + 1];
                float x0 = x[i], x1 = x[i + half];
                x[i] = x0 * co - x1 * si;
                x[i + half] = x1 * co + x0 * si;
            }
        }
    }
}

void keel_rope_forward(float *x, const float *cos_sin, int B, int T, int H, int HS) {
    rope_ctx c = {x, cos_sin, T, H, HS, 1.0f};
    keel_pool_for((int64_t)B * T, 32, rotate_rows, &c);
}

void keel_rope_backward(float *dx, const float *cos_sin, int B, int T, int H, int HS) {
    rope_ctx c = {dx, cos_sin, T, H, HS, -1.0f};
    keel_pool_for((int64_t)B * T, 32, rotate_rows, &c);
}
