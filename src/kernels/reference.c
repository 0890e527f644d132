/* kernels/reference.c: plain, obviously-correct versions of every non-GEMM
 * kernel (double accumulation, no threads, no tricks) for the tests. */
#include <math.h>
#include <stdlib.h>

#include "keel/kernels.h"

void keel_ref_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N,
                              int C, float eps) {
    for (int i = 0; i < N; i++) {
        double ss = 0;
        for (int j = 0; j < C; j++) ss += (double)x[i * C + j] * x[i * C + j];
        double r = 1.0 / sqrt(ss / C + eps);
        rstd[i] = (float)r;
        for (int j = 0; j < C; j++) out[i * C + j] = (float)(x[i * C + j] * r * w[j]);
    }
}

void keel_ref_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x,
                               const float *w, const float *rstd, int N, int C) {
    for (int i = 0; i < N; i++) {
        double r = rstd[i], s = 0;
        for (int j = 0; j < C; j++) s += (double)dout[i * C + j] * w[j] * x[i * C + j];
        for (int j = 0; j < C; j++) {
            dx[i * C + j] += (float)(r * w[j] * dout[i * C + j] - x[i * C + j] * r * r * r * s / C);
            dw[j] += (float)((double)dout[i * C + j] * x[i * C + j] * r);
        }
    }
}

void keel_ref_rope_forward(float *x, int B, int T, int H, int HS, double theta) {
    int half = HS / 2;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                float *v = x + (((int64_t)b * T + t) * H + h) * HS;
                for (int i = 0; i < half; i++) {
                    double angle = t * pow(theta, -2.0 * i / HS);
                    double x0 = v[i], x1 = v[i + half];
                    v[i] = (float)(x0 * cos(angle) - x1 * sin(angle));
                    v[i + half] = (float)(x1 * cos(angle) + x0 * sin(angle));
                }
            }
}

void keel_ref_attention_forward(float *out, float *att, float *lse, const float *q, const float *k,
                                const float *v, const int32_t *kv_start, int B, int T, int NH, int NKV,
                                int HS) {
    int group = NH / NKV;
    double scale = 1.0 / sqrt(HS);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *qt = q + ((int64_t)b * T + t) * NH * HS + h * HS;
                float *a = att + (((int64_t)b * NH + h) * T + t) * T;
                double mx = -INFINITY, sum = 0;
                int j0 = kv_start ? kv_start[(int64_t)b * T + t] : 0;
                for (int j = 0; j < T; j++) {
                    if (j > t || j < j0) { a[j] = 0; continue; }
                    const float *kj = k + ((int64_t)b * T + j) * NKV * HS + (h / group) * HS;
                    double s = 0;
                    for (int i = 0; i < HS; i++) s += (double)qt[i] * kj[i];
                    a[j] = (float)(s * scale);
                    mx = fmax(mx, a[j]);
                }
                for (int j = j0; j <= t; j++) sum += exp(a[j] - mx);
                for (int j = j0; j <= t; j++) a[j] = (float)(exp(a[j] - mx) / sum);
                lse[((int64_t)b * NH + h) * T + t] = (float)(mx + log(sum));
                float *o = out + ((int64_t)b * T + t) * NH * HS + h * HS;
                for (int i = 0; i < HS; i++) {
                    double acc = 0;
                    for (int j = 0; j <= t; j++)
                        acc += a[j] * (double)v[((int64_t)b * T + j) * NKV * HS + (h / group) * HS + i];
                    o[i] = (float)acc;
                }
            }
}

void keel_ref_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                                 const float *q, const float *k, const float *v,
                                 const float *att, int B, int T, int NH, int NKV, int HS) {
    int group = NH / NKV;
    double scale = 1.0 / sqrt(HS);
    for (int64_t i = 0; i < (int64_t)B * T * NKV * HS; i++) dk[i] = dv[i] = 0;
    double *da = malloc(sizeof(double) * (size_t)T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *a = att + (((int64_t)b * NH + h) * T + t) * T;
                const float *dot = dout + ((int64_t)b * T + t) * NH * HS + h * HS;
                const float *qt = q + ((int64_t)b * T + t) * NH * HS + h * HS;
                float *dqt = dq + ((int64_t)b * T + t) * NH * HS + h * HS;
                double s = 0;
                for (int j = 0; j <= t; j++) {
                    const float *vj = v + ((int64_t)b * T + j) * NKV * HS + (h / group) * HS;
                    float *dvj = dv + ((int64_t)b * T + j) * NKV * HS + (h / group) * HS;
                    double acc = 0;
                    for (int i = 0; i < HS; i++) {
                        acc += (double)dot[i] * vj[i];
                        dvj[i] += (float)((double)a[j] * dot[i]);
                    }
                    da[j] = acc;
                    s += acc * a[j];
                }
                for (int i = 0; i < HS; i++) dqt[i] = 0;
                for (int j = 0; j <= t; j++) {
                    double ds = a[j] * (da[j] - s) * scale;
                    const float *kj = k + ((int64_t)b * T + j) * NKV * HS + (h / group) * HS;
                    float *dkj = dk + ((int64_t)b * T + j) * NKV * HS + (h / group) * HS;
                    for (int i = 0; i < HS; i++) {
                        dqt[i] += (float)(ds * kj[i]);
                        dkj[i] += (float)(ds * qt[i]);
                    }
                }
            }
    free(da);
}

void keel_ref_swiglu_forward(float *h, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) h[i] = (float)(gate[i] / (1.0 + exp(-(double)gate[i])) * up[i]);
}

void keel_ref_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate,
                              const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double g = gate[i], s = 1.0 / (1.0 + exp(-g));
        dup[i] = (float)(dh[i] * g * s);
        dgate[i] = (float)(dh[i] * up[i] * (s + g * s * (1.0 - s)));
    }
}

double keel_ref_xent_forward_backward(float *logits, const int32_t *targets, int N, int V,
                                      float dscale) {
    double loss = 0;
    for (int i = 0; i < N; i++) {
        float *z = logits + (int64_t)i * V;
        if (targets[i] < 0) { /* ignored: no loss, no gradient */
            if (dscale != 0.0f)
                for (int j = 0; j < V; j++) z[j] = 0.0f;
            continue;
        }
        double mx = z[0], sum = 0;
        for (int j = 1; j < V; j++) mx = fmax(mx, z[j]);
        for (int j = 0; j < V; j++) sum += exp(z[j] - mx);
        loss += log(sum) + mx - z[targets[i]];
        if (dscale != 0.0f) {
            for (int j = 0; j < V; j++) z[j] = (float)(exp(z[j] - mx) / sum * dscale);
            z[targets[i]] -= dscale;
        }
    }
    return loss;
}

void keel_ref_adamw_update(float *param, const float *grad, float *m, float *v, int64_t n,
                           const keel_adamw_step *s) {
    double bc1 = 1.0 - pow(s->beta1, (double)s->t), bc2 = 1.0 - pow(s->beta2, (double)s->t);
    for (int64_t i = 0; i < n; i++) {
        double g = (double)grad[i] * s->grad_scale;
        m[i] = (float)(s->beta1 * m[i] + (1.0 - s->beta1) * g);
        v[i] = (float)(s->beta2 * v[i] + (1.0 - s->beta2) * g * g);
        double mhat = m[i] / bc1, vhat = v[i] / bc2;
        param[i] = (float)(param[i] * (1.0 - (double)s->lr * s->weight_decay) -
                           s->lr * mhat / (sqrt(vhat) + s->eps));
    }
}
