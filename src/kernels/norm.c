/* kernels/norm.c: RMSNorm forward and backward (Zhang & Sennrich 2019). */
#include <math.h>

#include "keel/kernels.h"
#include "kernels/simd.h"

typedef struct {
    float *out, *rstd, *dx, *dw;
    const float *x, *w, *dout, *rstd_in;
    int64_t N;
    int C;
    float eps;
} norm_ctx;

static void forward_rows(void *p, int64_t begin, int64_t end, int chunk) {
    (void)chunk;
    norm_ctx *c = p;
    int C = c->C;
    for (int64_t i = begin; i < end; i++) {
        const float *x = c->x + i * C;
        float *out = c->out + i * C;
        float r = 1.0f / sqrtf(keel_dot(x, x, C) / (float)C + c->eps);
        c->rstd[i] = r;
        for (int j = 0; j < C; j++) out[j] = x[j] * r * c->w[j];
    }
}

void keel_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int C,
                          float eps) {
    norm_ctx c = {.out = out, .rstd = rstd, .x = x, .w = w, .C = C, .eps = eps};
    keel_pool_for(N, 64, forward_rows, &c);
}

/* y_j = x_j r w_j with r = (mean(x²)+eps)^(-1/2):
 * dx_j = r w_j dy_j - x_j r³/C Σ_k dy_k w_k x_k. */
static void backward_rows(void *p, int64_t begin, int64_t end, int chunk) {
    (void)chunk;
    norm_ctx *c = p;
    int C = c->C;
    for (int64_t i = begin; i < end; i++) {
        const float *x = c->x + i * C, *dy = c->dout + i * C;
        float *dx = c->dx + i * C;
        float r = c->rstd_in[i];
        float acc[KEEL_LANES] = {0};
        int j = 0;
        for (; j + KEEL_LANES <= C; j += KEEL_LANES)
            for (int l = 0; l < KEEL_LANES; l++) acc[l] += dy[j + l] * c->w[j + l] * x[j + l];
        float s = 0;
        for (int l = 0; l < KEEL_LANES; l++) s += acc[l];
        for (; j < C; j++) s += dy[j] * c->w[j] * x[j];
        float k = s * r * r * r / (float)C;
        for (j = 0; j < C; j++) dx[j] += r * c->w[j] * dy[j] - x[j] * k;
    }
}

/* dw is reduced over rows: each chunk owns a column range so no two threads
 * write the same dw and the sum order is fixed. */
static void backward_cols(void *p, int64_t begin, int64_t end, int chunk) {
    (void)chunk;
    norm_ctx *c = p;
    int C = c->C;
    for (int64_t i = 0; i < c->N; i++) {
        const float *x = c->x + i * C, *dy = c->dout + i * C;
        float r = c->rstd_in[i];
        for (int64_t j = begin; j < end; j++) c->dw[j] += dy[j] * x[j] * r;
    }
}

void keel_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x,
                           const float *w, const float *rstd, int N, int C) {
    norm_ctx c = {.dx = dx, .dw = dw, .x = x, .w = w, .dout = dout, .rstd_in = rstd, .N = N, .C = C};
    keel_pool_for(N, 64, backward_rows, &c);
    if (dw) keel_pool_for(C, 64, backward_cols, &c);
}
