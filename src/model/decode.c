/* model/decode.c: the Llama forward for generation — new tokens of many
 * sequences at once against a KV cache (keel_decoder in keel/model.h).
 *
 * A step takes N rows, each one token of one sequence at one position, in any
 * mix: a prompt's chunk of rows (prefill), or one row per sequence (decode),
 * or both. Every row-wise operation (the GEMMs, norms, SwiGLU, RoPE at the
 * row's own position) runs over the N rows together, so a decode step of B
 * sequences reads every weight once; attention stores the rows' keys and
 * values in the cache and reads back their sequences' (keel_attention_cached).
 * Like model.c it calls only the backend on its tensors. */
#include <string.h>

#include "keel/backend.h"
#include "keel/kernels.h"
#include "keel/model.h"

/* rows of logits computed at a time: (HEAD_ROWS, V) is the largest buffer a step keeps */
enum { HEAD_ROWS = 64 };
/* Steps of at most this many rows use the few-row GEMMs: faster than sgemm up
 * to 16-24 rows on the matrices of configs/small.json (measured 2026-12-06 on
 * the 2-vCPU AVX2 EPYC; 2.5-7x at one row). */
enum { FEW_ROWS = 16 };

struct keel_decoder {
    keel_model_layout lay;
    const keel_backend *be;
    keel_decoder_options opt;
    float *params;            /* (n_params) fp32; NULL once converted to bf16 */
    keel_bf16 *params16;      /* (n_params) with bf16 */
    void *kcache, *vcache;    /* (L, max_seqs, NKV, max_len, HS): fp32, or bf16 with bf16 */
    float *x, *xn, *rstd;     /* (rows, C), (rows, C), (rows) */
    float *q, *k, *v, *ao;    /* (rows, QD), (rows, KVD) x 2, (rows, QD) */
    float *gate, *up, *h;     /* (rows, F) */
    float *fused;             /* (FEW_ROWS, max(QD + 2 KVD, 2F)): q|k|v or gate|up rows of a few-row step */
    float *sel, *seln, *logits; /* (HEAD_ROWS, C) x 2, (HEAD_ROWS, V) */
    keel_bf16 *xb;            /* a GEMM input in bf16: (rows, max(C, QD, F)) */
    float *normw;             /* (C) a norm weight from bf16 */
    float *rope;              /* (max_len, HS/2, 2) */
    int32_t *tokens, *seq, *pos; /* (rows) */
};

keel_status keel_decoder_build(const keel_model_config *cfg, const float *params, const keel_decoder_options *opt,
                               keel_decoder **out) {
    const keel_backend *be = opt->backend ? opt->backend : keel_backend_cpu();
    *out = NULL;
    if (!be->rope_at || !be->attention_cached || !be->attention_cached_bf16) {
        keel_errorf("generation on the %s backend: its KV-cache kernels are not written yet; run it on the CPU "
                    "(model.backend cpu)", be->name);
        return KEEL_ERR_INPUT;
    }
    KEEL_CHECK(opt->max_seqs >= 1 && opt->max_rows >= 1 && opt->max_len >= 1 && opt->max_len <= cfg->max_seq_len,
               "decoder options");
    keel_decoder *d = keel_xcalloc(sizeof *d, "decoder");
    keel_model_layout_init(&d->lay, cfg);
    const keel_model_layout *lay = &d->lay;
    for (int l = 0; l < lay->L; l++) { /* block() reads q|k|v and gate|up as one matrix each */
        const keel_tensor_info *t = lay->tensors + 1 + l * KEEL_BLOCK_TENSORS;
#define FOLLOWS(a, b) (t[b].offset == t[a].offset + t[a].rows * t[a].cols)
        KEEL_CHECK(FOLLOWS(1, 2) && FOLLOWS(2, 3) && FOLLOWS(6, 7), "layer %d: q, k, v or gate, up apart in the layout",
                   l);
#undef FOLLOWS
    }
    d->be = be;
    d->opt = *opt;
    d->opt.backend = be;
    size_t n = (size_t)lay->n_params;
    if (be->host_memory && !opt->bf16) d->params = (float *)params; /* borrowed: no second copy of the model */
    else if (be->host_memory) { /* bf16 straight from the caller's fp32: a copy first cost 1.9 s of page faults */
        d->params16 = be->alloc(2 * n, "bf16 parameters");
        be->f32_to_bf16(d->params16, params, (int64_t)n);
    } else {
        float *dev = be->alloc(sizeof(float) * n, "parameters");
        be->to_device(dev, params, sizeof(float) * n);
        if (opt->bf16) {
            d->params16 = be->alloc(2 * n, "bf16 parameters");
            be->f32_to_bf16(d->params16, dev, (int64_t)n);
            be->free(dev);
        } else d->params = dev;
    }
    size_t R = (size_t)opt->max_rows, C = (size_t)lay->C, F = (size_t)lay->F, V = (size_t)lay->V;
    size_t QD = (size_t)lay->NH * lay->HS, KVD = (size_t)lay->NKV * lay->HS;
    size_t cache = (size_t)lay->L * opt->max_seqs * opt->max_len * KVD * (opt->bf16 ? 2 : sizeof(float));
    d->kcache = be->alloc(cache, "the KV cache");
    d->vcache = be->alloc(cache, "the KV cache");
#define BUF(p, count) (p) = be->alloc(sizeof *(p) * (count), "generation buffers")
    BUF(d->x, R * C); BUF(d->xn, R * C); BUF(d->rstd, R);
    BUF(d->q, R * QD); BUF(d->k, R * KVD); BUF(d->v, R * KVD); BUF(d->ao, R * QD);
    BUF(d->gate, R * F); BUF(d->up, R * F); BUF(d->h, R * F);
    BUF(d->fused, FEW_ROWS * (QD + 2 * KVD > 2 * F ? QD + 2 * KVD : 2 * F));
    BUF(d->sel, HEAD_ROWS * C); BUF(d->seln, HEAD_ROWS * C); BUF(d->logits, HEAD_ROWS * V);
    size_t widest = C > QD ? C : QD;
    BUF(d->xb, R * (widest > F ? widest : F)); BUF(d->normw, C);
    BUF(d->rope, (size_t)opt->max_len * lay->HS);
    BUF(d->tokens, R); BUF(d->seq, R); BUF(d->pos, R);
#undef BUF
    float *rope = keel_xmalloc(sizeof(float) * (size_t)opt->max_len * lay->HS, "RoPE table");
    keel_rope_table(rope, opt->max_len, lay->HS, cfg->rope_theta, &cfg->rope_scaling);
    be->to_device(d->rope, rope, sizeof(float) * (size_t)opt->max_len * lay->HS);
    keel_free(rope);
    *out = d;
    return KEEL_OK;
}

void keel_decoder_free(keel_decoder *d) {
    if (!d) return;
    const keel_backend *be = d->be;
    if (!be->host_memory || d->opt.bf16) be->free(d->params); /* else borrowed */
    void *bufs[] = {d->params16, d->kcache, d->vcache, d->x, d->xn, d->rstd, d->q, d->k, d->v, d->ao,
                    d->gate, d->up, d->h, d->fused, d->sel, d->seln, d->logits, d->xb, d->normw, d->rope,
                    d->tokens, d->seq, d->pos};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(bufs[i]);
    keel_model_layout_free(&d->lay);
    keel_free(d);
}

const keel_model_layout *keel_decoder_layout(const keel_decoder *d) { return &d->lay; }

/* A norm weight in fp32: in place, or converted from bf16. */
static const float *norm_weight(keel_decoder *d, int tensor) {
    int64_t at = d->lay.tensors[tensor].offset;
    if (!d->opt.bf16) return d->params + at;
    d->be->bf16_to_f32(d->normw, d->params16 + at, d->lay.C);
    return d->normw;
}

static bool few_rows(const keel_decoder *d, int N) {
    return N <= FEW_ROWS && d->be->matmul_few_rows && d->be->matmul_few_rows_bf16;
}

/* out (N, O) (+= when accumulate) = x (N, I) · Wᵀ, W (O, I) tensor `tensor`
 * (or, with O past its rows, it and the tensors after it in the layout).
 * Up to FEW_ROWS rows (decode steps) stream each weight once
 * (matmul_few_rows), where sgemm would copy it first; more (prefill) run as
 * GEMMs. */
static void linear(keel_decoder *d, float *out, const float *x, int tensor, int N, int O, int I, bool accumulate) {
    const keel_backend *be = d->be;
    int64_t at = d->lay.tensors[tensor].offset;
    bool few = few_rows(d, N);
    if (!d->opt.bf16) {
        if (few) be->matmul_few_rows(out, x, d->params + at, N, O, I, accumulate);
        else be->matmul_forward(out, x, d->params + at, N, O, I, accumulate);
        return;
    }
    be->f32_to_bf16(d->xb, x, (int64_t)N * I);
    if (few) be->matmul_few_rows_bf16(out, d->xb, d->params16 + at, N, O, I, accumulate);
    else be->gemm_bf16(out, d->xb, false, d->params16 + at, true, N, O, I, accumulate);
}

static void block(keel_decoder *d, int l, int N) {
    const keel_model_layout *lay = &d->lay;
    const keel_backend *be = d->be;
    int C = lay->C, F = lay->F, QD = lay->NH * lay->HS, KVD = lay->NKV * lay->HS;
    int t = 1 + l * KEEL_BLOCK_TENSORS; /* norm1, q, k, v, o, norm2, gate, up, down */
    float eps = (float)lay->cfg.norm_eps;
    size_t layer = (size_t)d->opt.max_seqs * d->opt.max_len * KVD * l;
    be->rmsnorm_forward(d->xn, d->rstd, d->x, norm_weight(d, t), N, C, eps);
    if (few_rows(d, N)) { /* wq, wk, wv follow each other in the layout: one pass over (QD + 2 KVD, C) */
        linear(d, d->fused, d->xn, t + 1, N, QD + 2 * KVD, C, false);
        for (int i = 0; i < N; i++) {
            const float *row = d->fused + (size_t)i * (QD + 2 * KVD);
            be->copy(d->q + (size_t)i * QD, row, sizeof(float) * (size_t)QD);
            be->copy(d->k + (size_t)i * KVD, row + QD, sizeof(float) * (size_t)KVD);
            be->copy(d->v + (size_t)i * KVD, row + QD + KVD, sizeof(float) * (size_t)KVD);
        }
    } else {
        linear(d, d->q, d->xn, t + 1, N, QD, C, false);
        linear(d, d->k, d->xn, t + 2, N, KVD, C, false);
        linear(d, d->v, d->xn, t + 3, N, KVD, C, false);
    }
    be->rope_at(d->q, d->rope, d->pos, N, lay->NH, lay->HS);
    be->rope_at(d->k, d->rope, d->pos, N, lay->NKV, lay->HS);
    if (d->opt.bf16)
        be->attention_cached_bf16(d->ao, d->q, d->k, d->v, (keel_bf16 *)d->kcache + layer,
                                  (keel_bf16 *)d->vcache + layer, d->seq, d->pos, N, lay->NH, lay->NKV, lay->HS,
                                  d->opt.max_len);
    else
        be->attention_cached(d->ao, d->q, d->k, d->v, (float *)d->kcache + layer, (float *)d->vcache + layer, d->seq,
                             d->pos, N, lay->NH, lay->NKV, lay->HS, d->opt.max_len);
    linear(d, d->x, d->ao, t + 4, N, C, QD, true);
    be->rmsnorm_forward(d->xn, d->rstd, d->x, norm_weight(d, t + 5), N, C, eps);
    if (few_rows(d, N)) { /* w_gate, w_up: one pass over (2F, C) */
        linear(d, d->fused, d->xn, t + 6, N, 2 * F, C, false);
        for (int i = 0; i < N; i++)
            be->swiglu_forward(d->h + (size_t)i * F, d->fused + (size_t)i * 2 * F, d->fused + (size_t)i * 2 * F + F, F);
    } else {
        linear(d, d->gate, d->xn, t + 6, N, F, C, false);
        linear(d, d->up, d->xn, t + 7, N, F, C, false);
        be->swiglu_forward(d->h, d->gate, d->up, (int64_t)N * F);
    }
    linear(d, d->x, d->h, t + 8, N, C, F, true);
}

void keel_decoder_step(keel_decoder *d, const int32_t *tokens, const int32_t *seq, const int32_t *pos, int n,
                       const int32_t *logit_rows, int n_logits, float *logits) {
    const keel_model_layout *lay = &d->lay;
    const keel_backend *be = d->be;
    int C = lay->C, V = lay->V;
    KEEL_CHECK(n >= 1 && n <= d->opt.max_rows && n_logits >= 0 && n_logits <= n,
               "decoder step of %d rows (at most %d), %d of them with logits", n, d->opt.max_rows, n_logits);
    for (int i = 0; i < n; i++)
        KEEL_CHECK(seq[i] >= 0 && seq[i] < d->opt.max_seqs && pos[i] >= 0 && pos[i] < d->opt.max_len &&
                       tokens[i] >= 0 && tokens[i] < V,
                   "decoder row %d: token %d of sequence %d at position %d", i, tokens[i], seq[i], pos[i]);
    be->to_device(d->tokens, tokens, sizeof(int32_t) * (size_t)n);
    be->to_device(d->seq, seq, sizeof(int32_t) * (size_t)n);
    be->to_device(d->pos, pos, sizeof(int32_t) * (size_t)n);
    if (d->opt.bf16) be->embedding_forward_bf16(d->x, d->params16, d->tokens, n, C);
    else be->embedding_forward(d->x, d->params, d->tokens, n, C);
    for (int l = 0; l < lay->L; l++) block(d, l, n);
    int final_norm = 1 + lay->L * KEEL_BLOCK_TENSORS, head = lay->cfg.tie_embeddings ? 0 : final_norm + 1;
    for (int r0 = 0; r0 < n_logits; r0 += HEAD_ROWS) {
        int rows = n_logits - r0 < HEAD_ROWS ? n_logits - r0 : HEAD_ROWS;
        for (int r = 0; r < rows; r++) {
            int row = logit_rows[r0 + r];
            KEEL_CHECK(row >= 0 && row < n, "logits of row %d of %d", row, n);
            be->copy(d->sel + (size_t)r * C, d->x + (size_t)row * C, sizeof(float) * (size_t)C);
        }
        be->rmsnorm_forward(d->seln, d->rstd, d->sel, norm_weight(d, final_norm), rows, C, (float)lay->cfg.norm_eps);
        linear(d, d->logits, d->seln, head, rows, V, C, false);
        be->to_host(logits + (size_t)r0 * V, d->logits, sizeof(float) * (size_t)rows * V);
    }
}
