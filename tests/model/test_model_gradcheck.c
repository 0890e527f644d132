/* Finite-difference check of every parameter tensor's gradient: an independent
 * double-precision Llama 2 forward (written plainly here) is differentiated
 * numerically and compared with keel's fp32 analytic backward. Micro config
 * with grouped-query attention, untied and tied heads. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/kernels.h"
#include "keel/model.h"

#include "../testlib.h"

typedef struct {
    const keel_model_layout *lay;
    const int32_t *tokens; /* (B, T+1) */
    int B;
} ref_ctx;

static void rmsnorm(double *out, const double *x, const double *w, int C, double eps) {
    double ss = 0;
    for (int j = 0; j < C; j++) ss += x[j] * x[j];
    double r = 1.0 / sqrt(ss / C + eps);
    for (int j = 0; j < C; j++) out[j] = x[j] * r * w[j];
}

/* y (rows) = W (rows, cols) x (cols) */
static void matvec(double *y, const double *W, const double *x, int rows, int cols) {
    for (int i = 0; i < rows; i++) {
        double s = 0;
        for (int j = 0; j < cols; j++) s += W[(int64_t)i * cols + j] * x[j];
        y[i] = s;
    }
}

static void rope(double *v, int t, int HS, double theta) {
    int half = HS / 2;
    for (int i = 0; i < half; i++) {
        double a = t * (double)(1.0f / powf((float)theta, (float)(2 * i) / (float)HS));
        double x0 = v[i], x1 = v[i + half];
        v[i] = x0 * cos(a) - x1 * sin(a);
        v[i + half] = x1 * cos(a) + x0 * sin(a);
    }
}

/* Mean cross-entropy of the model with parameters p (double, canonical layout). */
static double ref_loss(const ref_ctx *c, const double *p) {
    const keel_model_layout *lay = c->lay;
    int T = lay->T, C = lay->C, NH = lay->NH, NKV = lay->NKV, HS = lay->HS, F = lay->F, V = lay->V;
    double eps = lay->cfg.norm_eps;
    int QD = NH * HS, KVD = NKV * HS;
    double *x = calloc((size_t)T * C, sizeof(double)), *xn = calloc((size_t)C, sizeof(double));
    double *q = calloc((size_t)T * QD, sizeof(double)), *k = calloc((size_t)T * KVD, sizeof(double));
    double *v = calloc((size_t)T * KVD, sizeof(double)), *ao = calloc((size_t)QD, sizeof(double));
    double *tmp = calloc((size_t)(C > F ? C : F) + V, sizeof(double)), *g = calloc((size_t)F, sizeof(double));
    double *u = calloc((size_t)F, sizeof(double)), *logits = calloc((size_t)V, sizeof(double));
    double *att = calloc((size_t)T, sizeof(double));
    double total = 0;
    for (int b = 0; b < c->B; b++) {
        const int32_t *tok = c->tokens + (int64_t)b * (T + 1);
        for (int t = 0; t < T; t++) memcpy(x + t * C, p + (int64_t)tok[t] * C, sizeof(double) * C);
        for (int l = 0; l < lay->L; l++) {
            const double *w = p + lay->unit_offset[1 + l];
            const double *norm1 = w, *wq = norm1 + C, *wk = wq + (int64_t)QD * C, *wv = wk + (int64_t)KVD * C;
            const double *wo = wv + (int64_t)KVD * C, *norm2 = wo + (int64_t)C * QD;
            const double *wg = norm2 + C, *wu = wg + (int64_t)F * C, *wd = wu + (int64_t)F * C;
            for (int t = 0; t < T; t++) {
                rmsnorm(xn, x + t * C, norm1, C, eps);
                matvec(q + t * QD, wq, xn, QD, C);
                matvec(k + t * KVD, wk, xn, KVD, C);
                matvec(v + t * KVD, wv, xn, KVD, C);
                for (int h = 0; h < NH; h++) rope(q + t * QD + h * HS, t, HS, lay->cfg.rope_theta);
                for (int h = 0; h < NKV; h++) rope(k + t * KVD + h * HS, t, HS, lay->cfg.rope_theta);
            }
            for (int t = 0; t < T; t++) {
                for (int h = 0; h < NH; h++) {
                    int kh = h / (NH / NKV);
                    double mx = -INFINITY, sum = 0;
                    for (int j = 0; j <= t; j++) {
                        double s = 0;
                        for (int i = 0; i < HS; i++) s += q[t * QD + h * HS + i] * k[j * KVD + kh * HS + i];
                        att[j] = s / sqrt(HS);
                        mx = fmax(mx, att[j]);
                    }
                    for (int j = 0; j <= t; j++) sum += (att[j] = exp(att[j] - mx));
                    for (int i = 0; i < HS; i++) {
                        double s = 0;
                        for (int j = 0; j <= t; j++) s += att[j] / sum * v[j * KVD + kh * HS + i];
                        ao[h * HS + i] = s;
                    }
                }
                matvec(tmp, wo, ao, C, QD);
                for (int j = 0; j < C; j++) x[t * C + j] += tmp[j]; /* rows after t not yet used */
            }
            for (int t = 0; t < T; t++) {
                rmsnorm(xn, x + t * C, norm2, C, eps);
                matvec(g, wg, xn, F, C);
                matvec(u, wu, xn, F, C);
                for (int i = 0; i < F; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
                matvec(tmp, wd, g, C, F);
                for (int j = 0; j < C; j++) x[t * C + j] += tmp[j];
            }
        }
        const double *normf = p + lay->unit_offset[lay->L + 1];
        const double *head = lay->cfg.tie_embeddings ? p : normf + C;
        for (int t = 0; t < T; t++) {
            rmsnorm(xn, x + t * C, normf, C, eps);
            matvec(logits, head, xn, V, C);
            double mx = logits[0], sum = 0;
            for (int j = 1; j < V; j++) mx = fmax(mx, logits[j]);
            for (int j = 0; j < V; j++) sum += exp(logits[j] - mx);
            total += log(sum) + mx - logits[tok[t + 1]];
        }
    }
    free(x); free(xn); free(q); free(k); free(v); free(ao); free(tmp); free(g); free(u);
    free(logits); free(att);
    return total / (c->B * T);
}

static void check_config(bool tied) {
    keel_model_config mc = {.dim = 16, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                            .vocab_size = 11, .multiple_of = 8, .norm_eps = 1e-5,
                            .rope_theta = 10000, .max_seq_len = 5, .tie_embeddings = tied};
    int B = 2;
    keel_model *m;
    if (keel_model_build(&mc, B, &m) != KEEL_OK) {
        EXPECT(false, "keel_model_build (%s head)", tied ? "tied" : "untied");
        return;
    }
    const keel_model_layout *lay = keel_model_get_layout(m);
    float *params = keel_model_params(m);
    /* Larger than the 0.02 init so every nonlinearity matters. */
    uint64_t s = 12345;
    for (int64_t i = 0; i < lay->n_params; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        params[i] = (float)(((double)(s >> 11) / 9007199254740992.0 - 0.5) * 0.8);
    }
    int32_t tokens[2 * 6] = {1, 5, 9, 3, 3, 10, 0, 7, 2, 2, 8, 4};
    int T = lay->T;
    keel_model_zero_grads(m);
    double loss = keel_model_forward(m, tokens, NULL, B, 1.0f / (float)(B * T)) / (B * T);
    keel_model_backward(m);
    const float *grads = keel_model_grads(m);

    double *p = malloc(sizeof(double) * (size_t)lay->n_params);
    for (int64_t i = 0; i < lay->n_params; i++) p[i] = params[i];
    ref_ctx c = {lay, tokens, B};
    double ref = ref_loss(&c, p);
    EXPECT(!(fabs(loss - ref) > 1e-5 * fabs(ref)), "loss: keel %.9f reference %.9f", loss, ref);
    for (int ti = 0; ti < lay->n_tensors; ti++) {
        const keel_tensor_info *t = &lay->tensors[ti];
        int64_t n = t->rows * t->cols;
        double rms = 0;
        for (int64_t i = 0; i < n; i++) rms += (double)grads[t->offset + i] * grads[t->offset + i];
        rms = sqrt(rms / n);
        double worst = 0;
        int checked = 0;
        for (int64_t i = 0; i < n; i += (n > 40 ? n / 37 : 1), checked++) {
            int64_t at = t->offset + i;
            double save = p[at], h = 1e-5;
            p[at] = save + h;
            double up = ref_loss(&c, p);
            p[at] = save - h;
            double down = ref_loss(&c, p);
            p[at] = save;
            double fd = (up - down) / (2 * h);
            double err = fabs(fd - grads[at]) / (fmax(fabs(fd), rms) + 1e-12);
            if (err > worst) worst = err;
        }
        EXPECT(worst < 1e-3 && rms > 0, "%-45s n=%-6lld checked=%-3d grad_rms=%.3e worst_rel_err=%.2e",
               t->name, (long long)n, checked, rms, worst);
    }
    free(p);
    keel_model_free(m);
}

int main(void) {
    keel_kernels_init(2);
    check_config(false);
    check_config(true);
    keel_kernels_shutdown();
    return test_summary("test_model_gradcheck");
}
