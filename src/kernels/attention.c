/* kernels/attention.c: flash-style causal attention with grouped-query heads,
 * fp32 and bf16 (FlashAttention-2, Dao 2023).
 *
 * Scores are computed a tile at a time, BLOCK queries x BLOCK keys, and never
 * stored: forward keeps a running max and sum per query (online softmax) and
 * saves only the output and each query's log-sum-exp; backward recomputes
 * each tile's probabilities from q, k and the log-sum-exp. Memory is
 * O(B·NH·T) for the log-sum-exp plus a few tiles of scratch per thread, where
 * the (B, NH, T, T) probabilities were 2 GiB per layer per sequence at T=4096
 * (Llama 2 7B). Key blocks wholly above the diagonal are never visited.
 *
 * The tiles' products go through tile_product_fn (attention_tiles.h):
 * OpenBLAS sgemm for fp32 (single-threaded: the parallelism is keel's pool,
 * see gemm.c), bf16 operands with fp32 sums for fsdp.mixed_precision bf16.
 * The softmax is fp32 either way (softmax.h). */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "keel/kernels.h"
#include "kernels/attention_tiles.h"
#include "kernels/softmax.h"

/* Queries and keys per tile. 128: sgemm is within a few percent of its large
 * shapes' speed at 128 x 128 x 128, and a thread's tiles stay in L2. */
#define BLOCK 128

static int max_int(int a, int b) { return a > b ? a : b; }
static int blocks(int T) { return (T + BLOCK - 1) / BLOCK; }

/* ---- per-thread scratch ----------------------------------------------------
 * One slice per pool chunk, grown (never per call once large enough) by the
 * entry points before the pool runs and freed by keel_kernels_shutdown.
 * Attention runs from one thread at a time (the model's), like every keel
 * kernel. */
static struct {
    char *mem;
    size_t bytes;
} scratch;

void keel_attention_release(void) {
    keel_free(scratch.mem);
    scratch.mem = NULL;
    scratch.bytes = 0;
}

static size_t aligned(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

/* A thread's tiles: S and dP (BLOCK, BLOCK), the output accumulator
 * (BLOCK, HS), four row vectors, then the product's own scratch. */
typedef struct {
    float *S, *dP, *acc;    /* (BLOCK, BLOCK), (BLOCK, BLOCK), (BLOCK, HS) */
    float *m, *l, *corr, *D; /* (BLOCK) each */
    char *product;
} tiles;

static size_t tiles_bytes(int HS, tile_scratch_fn product_scratch) {
    return 2 * aligned(sizeof(float) * BLOCK * BLOCK) + aligned(sizeof(float) * BLOCK * (size_t)HS) +
           4 * aligned(sizeof(float) * BLOCK) + product_scratch(max_int(BLOCK, HS));
}

static tiles tiles_at(char *at, int HS) {
    tiles t;
    t.S = (float *)at, at += aligned(sizeof(float) * BLOCK * BLOCK);
    t.dP = (float *)at, at += aligned(sizeof(float) * BLOCK * BLOCK);
    t.acc = (float *)at, at += aligned(sizeof(float) * BLOCK * (size_t)HS);
    t.m = (float *)at, at += aligned(sizeof(float) * BLOCK);
    t.l = (float *)at, at += aligned(sizeof(float) * BLOCK);
    t.corr = (float *)at, at += aligned(sizeof(float) * BLOCK);
    t.D = (float *)at, at += aligned(sizeof(float) * BLOCK);
    t.product = at;
    return t;
}

/* ---- the products ---------------------------------------------------------- */

static void tile_product_fp32(const tile_product *g, char *unused) {
    (void)unused;
    cblas_sgemm(CblasRowMajor, g->a_t ? CblasTrans : CblasNoTrans, g->b_t ? CblasTrans : CblasNoTrans,
                g->M, g->N, g->K, g->alpha, g->a, (int)g->lda, g->b, (int)g->ldb,
                g->accumulate ? 1.0f : 0.0f, g->c, (int)g->ldc);
}
static size_t tile_scratch_fp32(int max_dim) {
    (void)max_dim;
    return 0;
}

typedef struct {
    tile_product_fn product;
    tile_scratch_fn scratch;
    bool bf16; /* the products round their inputs to bf16 */
} precision;

static precision precision_of(bool bf16) {
    if (!bf16) return (precision){tile_product_fp32, tile_scratch_fp32, false};
    if (keel_isa_active() >= KEEL_ISA_AVX512_BF16)
        return (precision){tile_product_bf16, tile_scratch_bf16, true};
    return (precision){tile_product_bf16_emulated, tile_scratch_bf16_emulated, true};
}

int64_t keel_attention_workspace_bytes(int HS, int threads, bool bf16) {
    return (int64_t)tiles_bytes(HS, precision_of(bf16).scratch) * threads;
}

/* ---- one (batch, head) ----------------------------------------------------- */

typedef struct {
    float *out, *lse, *dq, *dk, *dv;
    const float *q, *k, *v, *dout, *out_in, *lse_in;
    int B, T, NH, NKV, HS;
    precision prec;
    size_t per_chunk;
} attn_ctx;

/* Where head h of sequence b (kv head h / (NH/NKV)) starts in each tensor. */
typedef struct {
    int64_t ldq, ldkv; /* row strides: NH*HS, NKV*HS */
    int64_t qoff, kvoff, lseoff;
} head_at;

static head_at head_of(const attn_ctx *c, int b, int h) {
    int64_t ldq = (int64_t)c->NH * c->HS, ldkv = (int64_t)c->NKV * c->HS;
    return (head_at){.ldq = ldq, .ldkv = ldkv, .qoff = (int64_t)b * c->T * ldq + (int64_t)h * c->HS,
                     .kvoff = (int64_t)b * c->T * ldkv + (int64_t)(h / (c->NH / c->NKV)) * c->HS,
                     .lseoff = ((int64_t)b * c->NH + h) * c->T};
}

/* Forward of query block i: for each key block j <= i,
 *   S = scale Q_i K_jᵀ;  m, l, P = online softmax;  acc = acc · corr + P V_j
 * then O_i = acc / l and lse_i = m + log l. */
static void forward_block(const attn_ctx *c, const tiles *t, int b, int h, int i) {
    int T = c->T, HS = c->HS, r0 = i * BLOCK, rows = T - r0 < BLOCK ? T - r0 : BLOCK;
    head_at at = head_of(c, b, h);
    const float *Q = c->q + at.qoff + r0 * at.ldq;            /* (rows, HS) */
    const float *K = c->k + at.kvoff, *V = c->v + at.kvoff; /* (T, HS) */
    float scale = 1.0f / sqrtf((float)HS);
    for (int j = 0; j <= i; j++) {
        int keys = j < i ? BLOCK : rows;
        const float *Kj = K + (int64_t)j * BLOCK * at.ldkv, *Vj = V + (int64_t)j * BLOCK * at.ldkv;
        c->prec.product(&(tile_product){.a = Q, .lda = at.ldq, .b = Kj, .ldb = at.ldkv, .b_t = true,
                                        .c = t->S, .ldc = BLOCK, .M = rows, .N = keys, .K = HS,
                                        .alpha = scale},
                        t->product);
        online_softmax_tile(t->S, BLOCK, rows, keys, j == i, j == 0, t->m, t->l, t->corr);
        if (j > 0)
            for (int r = 0; r < rows; r++)
                for (int d = 0; d < HS; d++) t->acc[r * HS + d] *= t->corr[r];
        c->prec.product(&(tile_product){.a = t->S, .lda = BLOCK, .b = Vj, .ldb = at.ldkv, .c = t->acc,
                                        .ldc = HS, .M = rows, .N = HS, .K = keys, .alpha = 1.0f,
                                        .accumulate = j > 0},
                        t->product);
    }
    float *O = c->out + at.qoff + r0 * at.ldq, *lse = c->lse + at.lseoff + r0;
    for (int r = 0; r < rows; r++) {
        float inv = 1.0f / t->l[r];
        for (int d = 0; d < HS; d++) O[r * at.ldq + d] = t->acc[r * HS + d] * inv;
        lse[r] = t->m[r] + logf(t->l[r]);
    }
}

/* Tasks are (b, h, p): query blocks p and n-1-p of one head, one from each end
 * of the causal triangle, so every task has the same work (n+1 key blocks)
 * and the pool's equal contiguous ranges of tasks are balanced. */
static void forward_tasks(void *p, int64_t begin, int64_t end, int chunk) {
    const attn_ctx *c = p;
    tiles t = tiles_at(scratch.mem + (size_t)chunk * c->per_chunk, c->HS);
    int n = blocks(c->T), pairs = (n + 1) / 2;
    for (int64_t task = begin; task < end; task++) {
        int64_t bh = task / pairs;
        int pair = (int)(task % pairs), b = (int)(bh / c->NH), h = (int)(bh % c->NH);
        forward_block(c, &t, b, h, pair);
        if (n - 1 - pair != pair) forward_block(c, &t, b, h, n - 1 - pair);
    }
}

/* D (rows) = rowsum(dO ∘ O) = Σ_keys P ∘ dP. The products compute dP from dO
 * rounded to bf16 in a bf16 run; D then takes the same dO, or dP - D, which
 * cancels, would carry dO's rounding (test_attention_bf16's worst gradient
 * error: 0.64% with fp32 dO, 0.53% with the rounded one, as the T x T path). */
static void rowsum_dO_O(float *D, const float *dO, const float *O, int64_t ld, int rows, int HS,
                        bool bf16) {
    for (int r = 0; r < rows; r++) {
        const float *d = dO + r * ld, *o = O + r * ld;
        float s = 0;
        if (!bf16) s = keel_dot(d, o, HS);
        for (int i = 0; bf16 && i < HS; i++) s += keel_bf16_to_float(keel_bf16_from_float(d[i])) * o[i];
        D[r] = s;
    }
}

/* Backward of query block i (FlashAttention-2): D = rowsum(dO_i ∘ O_i), then
 * for each key block j <= i, with P recomputed from the saved lse:
 *   S = scale Q_i K_jᵀ;  P = exp(S - lse);  dV_j += Pᵀ dO_i;  dP = dO_i V_jᵀ;
 *   dS = scale P ∘ (dP - D);  dQ_i += dS K_j;  dK_j += dSᵀ Q_i */
static void backward_block(const attn_ctx *c, const tiles *t, int b, int h, int i) {
    int T = c->T, HS = c->HS, r0 = i * BLOCK, rows = T - r0 < BLOCK ? T - r0 : BLOCK;
    head_at at = head_of(c, b, h);
    int64_t qi = at.qoff + r0 * at.ldq;
    const float *Q = c->q + qi, *dO = c->dout + qi, *O = c->out_in + qi; /* (rows, HS) */
    const float *lse = c->lse_in + at.lseoff + r0;
    float *dQ = c->dq + qi, *D = t->D, scale = 1.0f / sqrtf((float)HS);
    rowsum_dO_O(D, dO, O, at.ldq, rows, HS, c->prec.bf16);
    for (int j = 0; j <= i; j++) {
        int keys = j < i ? BLOCK : rows;
        int64_t kj = at.kvoff + (int64_t)j * BLOCK * at.ldkv;
        const float *Kj = c->k + kj, *Vj = c->v + kj; /* (keys, HS) */
        float *dKj = c->dk + kj, *dVj = c->dv + kj;
        tile_product_fn product = c->prec.product;
        product(&(tile_product){.a = Q, .lda = at.ldq, .b = Kj, .ldb = at.ldkv, .b_t = true, .c = t->S,
                                .ldc = BLOCK, .M = rows, .N = keys, .K = HS, .alpha = scale},
                t->product);
        softmax_recompute_tile(t->S, BLOCK, rows, keys, j == i, lse);
        product(&(tile_product){.a = t->S, .lda = BLOCK, .a_t = true, .b = dO, .ldb = at.ldq, .c = dVj,
                                .ldc = at.ldkv, .M = keys, .N = HS, .K = rows, .alpha = 1.0f,
                                .accumulate = true},
                t->product);
        product(&(tile_product){.a = dO, .lda = at.ldq, .b = Vj, .ldb = at.ldkv, .b_t = true,
                                .c = t->dP, .ldc = BLOCK, .M = rows, .N = keys, .K = HS, .alpha = 1.0f},
                t->product);
        softmax_backward_tile(t->dP, t->S, BLOCK, rows, keys, D, scale);
        product(&(tile_product){.a = t->dP, .lda = BLOCK, .b = Kj, .ldb = at.ldkv, .c = dQ,
                                .ldc = at.ldq, .M = rows, .N = HS, .K = keys, .alpha = 1.0f,
                                .accumulate = j > 0},
                t->product);
        product(&(tile_product){.a = t->dP, .lda = BLOCK, .a_t = true, .b = Q, .ldb = at.ldq, .c = dKj,
                                .ldc = at.ldkv, .M = keys, .N = HS, .K = rows, .alpha = 1.0f,
                                .accumulate = true},
                t->product);
    }
}

/* Tasks are (b, kv head): the query heads of a group and all their query
 * blocks add into the same dK and dV, so they stay on one thread — no
 * atomics, and no second pass that recomputes P for dQ alone (FA2 on GPUs
 * does one or the other). B·NKV tasks of equal work. */
static void backward_tasks(void *p, int64_t begin, int64_t end, int chunk) {
    const attn_ctx *c = p;
    tiles t = tiles_at(scratch.mem + (size_t)chunk * c->per_chunk, c->HS);
    int group = c->NH / c->NKV, n = blocks(c->T);
    for (int64_t bg = begin; bg < end; bg++) {
        int b = (int)(bg / c->NKV), g = (int)(bg % c->NKV);
        head_at at = head_of(c, b, g * group);
        for (int row = 0; row < c->T; row++) {
            memset(c->dk + at.kvoff + row * at.ldkv, 0, sizeof(float) * (size_t)c->HS);
            memset(c->dv + at.kvoff + row * at.ldkv, 0, sizeof(float) * (size_t)c->HS);
        }
        for (int h = g * group; h < (g + 1) * group; h++)
            for (int i = 0; i < n; i++) backward_block(c, &t, b, h, i);
    }
}

/* ---- entry points -------------------------------------------------------- */

static void run(attn_ctx *c, int64_t tasks, keel_pool_fn fn) {
    c->per_chunk = aligned(tiles_bytes(c->HS, c->prec.scratch));
    size_t want = c->per_chunk * (size_t)keel_pool_threads();
    if (want > scratch.bytes) {
        keel_free(scratch.mem);
        scratch.mem = keel_xmalloc(want, "attention scratch");
        scratch.bytes = want;
    }
    keel_pool_for(tasks, 1, fn, c);
}

static void forward(bool bf16, float *out, float *lse, const float *q, const float *k,
                    const float *v, int B, int T, int NH, int NKV, int HS) {
    attn_ctx c = {.out = out, .lse = lse, .q = q, .k = k, .v = v, .B = B, .T = T, .NH = NH,
                  .NKV = NKV, .HS = HS, .prec = precision_of(bf16)};
    run(&c, (int64_t)B * NH * ((blocks(T) + 1) / 2), forward_tasks);
}

static void backward(bool bf16, float *dq, float *dk, float *dv, const float *dout,
                     const float *out, const float *lse, const float *q, const float *k,
                     const float *v, int B, int T, int NH, int NKV, int HS) {
    attn_ctx c = {.dq = dq, .dk = dk, .dv = dv, .dout = dout, .out_in = out, .lse_in = lse, .q = q,
                  .k = k, .v = v, .B = B, .T = T, .NH = NH, .NKV = NKV, .HS = HS,
                  .prec = precision_of(bf16)};
    run(&c, (int64_t)B * NKV, backward_tasks);
}

void keel_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                            int B, int T, int NH, int NKV, int HS) {
    forward(false, out, lse, q, k, v, B, T, NH, NKV, HS);
}

void keel_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                             const float *lse, const float *q, const float *k, const float *v,
                             int B, int T, int NH, int NKV, int HS) {
    backward(false, dq, dk, dv, dout, out, lse, q, k, v, B, T, NH, NKV, HS);
}

void keel_attention_forward_bf16(float *out, float *lse, const float *q, const float *k,
                                 const float *v, int B, int T, int NH, int NKV, int HS) {
    forward(true, out, lse, q, k, v, B, T, NH, NKV, HS);
}

void keel_attention_backward_bf16(float *dq, float *dk, float *dv, const float *dout,
                                  const float *out, const float *lse, const float *q, const float *k,
                                  const float *v, int B, int T, int NH, int NKV, int HS) {
    backward(true, dq, dk, dv, dout, out, lse, q, k, v, B, T, NH, NKV, HS);
}
