/* kernels/rope.c: rotary position embedding in Hugging Face's rotate-half
 * layout (Su et al. 2021), so HF Llama checkpoints load unpermuted. */
#include <math.h>

#include "keel/kernels.h"

float keel_rope_inv_freq(int i, int HS, double theta, const keel_rope_scaling *s) {
    float f = 1.0f / powf((float)theta, (float)(2 * i) / (float)HS);
    if (!s || !s->on) return f;
    /* transformers' float32 tensor arithmetic with Python scalars, step by step */
    const float factor = (float)s->factor, low = (float)s->low_freq_factor;
    const float low_freq_wavelen = (float)(s->original_max_position_embeddings / s->low_freq_factor);
    const float high_freq_wavelen = (float)(s->original_max_position_embeddings / s->high_freq_factor);
    const float wavelen = (float)(2 * M_PI) / f;
    if (wavelen > low_freq_wavelen) return f / factor;
    if (wavelen < high_freq_wavelen) return f;
    const float smooth = ((float)s->original_max_position_embeddings / wavelen - low) /
                         (float)(s->high_freq_factor - s->low_freq_factor);
    return (1.0f - smooth) * f / factor + smooth * f;
}

/* Computed exactly as transformers does it, in fp32: inv_freq (above), angle =
 * t * inv_freq, then cos and sin of that fp32 angle. */
void keel_rope_table(float *cos_sin, int T, int HS, double theta, const keel_rope_scaling *scaling) {
    int half = HS / 2;
    for (int i = 0; i < half; i++) {
        float inv_freq = keel_rope_inv_freq(i, HS, theta, scaling);
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
    const int32_t *pos; /* each row's position; NULL: row % T */
    int T, H, HS;
    float sign; /* +1 forward, -1 backward (inverse rotation) */
} rope_ctx;

static void rotate_rows(void *p, int64_t begin, int64_t end, int chunk) {
    (void)chunk;
    rope_ctx *c = p;
    int half = c->HS / 2;
    for (int64_t row = begin; row < end; row++) { /* row = (b*T + t) */
        int t = c->pos ? c->pos[row] : (int)(row % c->T);
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
    rope_ctx c = {x, cos_sin, NULL, T, H, HS, 1.0f};
    keel_pool_for((int64_t)B * T, 32, rotate_rows, &c);
}

void keel_rope_at(float *x, const float *cos_sin, const int32_t *pos, int N, int H, int HS) {
    rope_ctx c = {x, cos_sin, pos, 1, H, HS, 1.0f};
    keel_pool_for(N, 32, rotate_rows, &c);
}

void keel_rope_backward(float *dx, const float *cos_sin, int B, int T, int H, int HS) {
    rope_ctx c = {dx, cos_sin, NULL, T, H, HS, -1.0f};
    keel_pool_for((int64_t)B * T, 32, rotate_rows, &c);
}
