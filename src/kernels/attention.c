/* kernels/attention.c: causal multi-head attention with grouped-query heads.
 *
 * Work is split over (batch, head) on keel's pool; inside a task the scores
 * and the weighted sums are single-threaded OpenBLAS GEMMs over blocks of
 * query rows, each against only the keys it can see, so the masked upper
 * triangle is mostly skipped (T=512: 62% of the full square is computed).
 * (OpenBLAS itself is single-threaded; see gemm.c.) attention_bf16.c is the
 * same with bf16 products, for fsdp.mixed_precision bf16. */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "keel/kernels.h"
#include "kernels/softmax.h"

#define ROW_BLOCK 128

typedef struct {
    float *out, *att, *dq, *dk, *dv, *datt;
    const float *q, *k, *v, *dout, *att_in;
    int B, T, NH, NKV, HS;
} attn_ctx;

static void forward_heads(void *p, int64_t begin, int64_t end, int chunk) {
    (void)chunk;
    const attn_ctx *c = p;
    int T = c->T, HS = c->HS, ldq = c->NH * HS, ldkv = c->NKV * HS, group = c->NH / c->NKV;
    float scale = 1.0f / sqrtf((float)HS);
    for (int64_t bh = begin; bh < end; bh++) {
        int b = (int)(bh / c->NH), h = (int)(bh % c->NH);
        const float *Q = c->q + (int64_t)b * T * ldq + h * HS;
        const float *K = c->k + (int64_t)b * T * ldkv + (h / group) * HS;
        const float *V = c->v + (int64_t)b * T * ldkv + (h / group) * HS;
        float *O = c->out + (int64_t)b * T * ldq + h * HS;
        float *A = c->att + bh * T * T;
        for (int r0 = 0; r0 < T; r0 += ROW_BLOCK) {
            int rows = T - r0 < ROW_BLOCK ? T - r0 : ROW_BLOCK, keys = r0 + rows;
            float *S = A + (int64_t)r0 * T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, HS, scale,
                        Q + (int64_t)r0 * ldq, ldq, K, ldkv, 0.0f, S, T);
            softmax_block(A, T, r0, rows);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, HS, keys, 1.0f, S, T, V,
                        ldkv, 0.0f, O + (int64_t)r0 * ldq, ldq);
        }
    }
}

/* One task per (batch, kv head): the query heads of a group all add into the
 * same dK and dV, so they stay on one thread. */
static void backward_groups(void *p, int64_t begin, int64_t end, int chunk) {
    (void)chunk;
    const attn_ctx *c = p;
    int T = c->T, HS = c->HS, ldq = c->NH * HS, ldkv = c->NKV * HS, group = c->NH / c->NKV;
    float scale = 1.0f / sqrtf((float)HS);
    for (int64_t bg = begin; bg < end; bg++) {
        int b = (int)(bg / c->NKV), g = (int)(bg % c->NKV);
        int64_t kvoff = (int64_t)b * T * ldkv + g * HS;
        for (int t = 0; t < T; t++) {
            memset(c->dk + kvoff + (int64_t)t * ldkv, 0, sizeof(float) * (size_t)HS);
            memset(c->dv + kvoff + (int64_t)t * ldkv, 0, sizeof(float) * (size_t)HS);
        }
        for (int h = g * group; h < (g + 1) * group; h++) {
            int64_t qoff = (int64_t)b * T * ldq + h * HS;
            const float *A = c->att_in + ((int64_t)b * c->NH + h) * T * T;
            float *dA = c->datt + ((int64_t)b * c->NH + h) * T * T;
            for (int r0 = 0; r0 < T; r0 += ROW_BLOCK) {
                int rows = T - r0 < ROW_BLOCK ? T - r0 : ROW_BLOCK, keys = r0 + rows;
                const float *dO = c->dout + qoff + (int64_t)r0 * ldq;
                const float *Ab = A + (int64_t)r0 * T;
                float *dS = dA + (int64_t)r0 * T;
                /* dA = dO Vᵀ ; dV += Aᵀ dO */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, HS, 1.0f, dO, ldq,
                            c->v + kvoff, ldkv, 0.0f, dS, T);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, HS, rows, 1.0f, Ab, T, dO,
                            ldq, 1.0f, c->dv + kvoff, ldkv);
                softmax_backward_block(A, dA, T, r0, rows, scale);
                /* dQ = dS K ; dK += dSᵀ Q */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, HS, keys, 1.0f, dS, T,
                            c->k + kvoff, ldkv, 0.0f, c->dq + qoff + (int64_t)r0 * ldq, ldq);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, HS, rows, 1.0f, dS, T,
                            c->q + qoff + (int64_t)r0 * ldq, ldq, 1.0f, c->dk + kvoff, ldkv);
            }
        }
    }
}


void keel_attention_forward(float *out, float *att, const float *q, const float *k,
                            const float *v, int B, int T, int NH, int NKV, int HS) {
    attn_ctx c = {.out = out, .att = att, .q = q, .k = k, .v = v,
                  .B = B, .T = T, .NH = NH, .NKV = NKV, .HS = HS};
    keel_pool_for((int64_t)B * NH, 1, forward_heads, &c);
}

void keel_attention_backward(float *dq, float *dk, float *dv, float *datt, const float *dout,
                             const float *q, const float *k, const float *v, const float *att,
                             int B, int T, int NH, int NKV, int HS) {
    attn_ctx c = {.dq = dq, .dk = dk, .dv = dv, .datt = datt, .dout = dout, .q = q, .k = k,
                  .v = v, .att_in = att, .B = B, .T = T, .NH = NH, .NKV = NKV, .HS = HS};
    keel_pool_for((int64_t)B * NKV, 1, backward_groups, &c);
}
