/* kernels/attention.c: flash-style causal attention with grouped-query heads,
 * fp32 and bf16 (FlashAttention-2, Dao 2023).
 *
 * Scores are computed a tile at a time, QB queries x KB keys, and never
 * stored: forward keeps a running max and sum per query (online softmax) and
 * saves only the output and each query's log-sum-exp; backward recomputes
 * each tile's probabilities from q, k and the log-sum-exp. Memory is
 * O(B·NH·T) for the log-sum-exp plus, per thread, a few tiles and a
 * contiguous copy of one kv head's K and V (2·T·HS floats), where the
 * (B, NH, T, T) probabilities were 2 GiB per layer per sequence at T=4096
 * (Llama 2 7B). Keys above a query block's last query are never visited, nor
 * with document masking (kv_start) the tiles before its rows' documents.
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

/* Queries and keys per tile. Measured on the AVX2 machine (one 7B layer, fp32,
 * CPU time at T = 512 / 2048): 128 x 128 tiles 201 / 2716 ms, 128 x 256
 * 179 / 2428, 256 x 256 180 / 2435, 128 x 512 178 / 2501, 64 x 256
 * 184 / 2817 — sgemm runs ~20% slower on 128-wide products than on large
 * ones, and a thread's tiles stay in L2 at 128 x 256. KB is a multiple of QB,
 * so every row sees a key of every tile it visits. */
#define QB 128
#define KB 256

static int max_int(int a, int b) { return a > b ? a : b; }
static int min_int(int a, int b) { return a < b ? a : b; }
static int query_blocks(int T) { return (T + QB - 1) / QB; }

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

/* A thread's tiles, a copy of one kv head, then the product's own scratch.
 * Backward reads a kv head's K twice and V once for every query block of
 * every head in its group, forward K and V once for each of a task's two
 * query blocks; a contiguous copy (rounded once in a bf16 run) instead of the
 * (B, T, NKV*HS) rows took a 7B layer's bf16 attention at T=2048 from 3049
 * to 2512 ms (CPU, emulated; backward's copy first, then forward's); fp32
 * moved within the machine's noise (2213, 2184, 2101-2388 ms). */
typedef struct {
    float *S, *dP;           /* (QB, KB) scores, then P; dP, then dS */
    float *q, *dO, *acc;     /* (QB, HS) the query block's Q and dO, the output accumulator */
    float *m, *l, *corr, *D; /* (QB) each */
    float *k, *v;            /* (T, HS) a kv head's keys and values, contiguous */
    char *product;
} tiles;

static size_t tiles_bytes(int T, int HS, tile_scratch_fn product_scratch) {
    return 2 * aligned(sizeof(float) * QB * KB) + 3 * aligned(sizeof(float) * QB * (size_t)HS) +
           4 * aligned(sizeof(float) * QB) + 2 * aligned(sizeof(float) * (size_t)T * HS) +
           product_scratch(max_int(KB, HS));
}

static tiles tiles_at(char *at, int T, int HS) {
    tiles t;
    size_t big = aligned(sizeof(float) * QB * KB), head = aligned(sizeof(float) * QB * (size_t)HS);
    size_t row = aligned(sizeof(float) * QB), kv = aligned(sizeof(float) * (size_t)T * HS);
    t.S = (float *)at, at += big;
    t.dP = (float *)at, at += big;
    t.q = (float *)at, at += head;
    t.dO = (float *)at, at += head;
    t.acc = (float *)at, at += head;
    t.m = (float *)at, at += row;
    t.l = (float *)at, at += row;
    t.corr = (float *)at, at += row;
    t.D = (float *)at, at += row;
    t.k = (float *)at, at += kv;
    t.v = (float *)at, at += kv;
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
    if (keel_isa_active() >= KEEL_ISA_AMX) return (precision){tile_product_amx, tile_scratch_amx, true};
    if (keel_isa_active() >= KEEL_ISA_AVX512_BF16)
        return (precision){tile_product_bf16, tile_scratch_bf16, true};
    return (precision){tile_product_bf16_emulated, tile_scratch_bf16_emulated, true};
}

int64_t keel_attention_workspace_bytes(int T, int HS, int threads, bool bf16) {
    return (int64_t)aligned(tiles_bytes(T, HS, precision_of(bf16).scratch)) * threads;
}

/* dst (rows, cols) with row stride ldd = src (row stride lds; may be dst),
 * rounded to bf16 values when round: an operand that several products read
 * is rounded once (the products are told, so an emulated one does not round
 * it again). */
static void copy_rows(float *dst, int64_t ldd, const float *src, int64_t lds, int rows, int cols,
                      bool round) {
    for (int r = 0; r < rows; r++) {
        float *d = dst + r * ldd;
        const float *s = src + r * lds;
        if (!round) memmove(d, s, sizeof(float) * (size_t)cols);
        for (int i = 0; round && i < cols; i++)
            d[i] = keel_bf16_to_float(keel_bf16_from_float(s[i]));
    }
}

/* ---- one (batch, head) ----------------------------------------------------- */

typedef struct {
    float *out, *lse, *dq, *dk, *dv;
    const float *q, *k, *v, *dout, *out_in, *lse_in;
    const int32_t *kv_start; /* (B, T) each query's first visible key (document masking), or NULL */
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

/* The key rows of query block [r0, r0 + rows) of sequence b start at: each
 * row's first visible key with document masking (*from, and the first key
 * tile any row sees), else none (NULL, tile 0). */
static int first_tile(const attn_ctx *c, int b, int r0, int rows, const int32_t **from) {
    if (!c->kv_start) {
        *from = NULL;
        return 0;
    }
    *from = c->kv_start + (int64_t)b * c->T + r0;
    int lo = (*from)[0];
    for (int r = 1; r < rows; r++) lo = (*from)[r] < lo ? (*from)[r] : lo;
    return lo / KB * KB;
}

/* Forward of query block i: for each key tile [k0, k0 + keys) it sees,
 *   S = scale Q_i K_tileᵀ;  m, l, P = online softmax;  acc = acc · corr + P V_tile
 * then O_i = acc / l and lse_i = m + log l. */
static void forward_block(const attn_ctx *c, const tiles *t, int b, int h, int i) {
    int T = c->T, HS = c->HS, r0 = i * QB, rows = min_int(QB, T - r0);
    head_at at = head_of(c, b, h);
    float scale = 1.0f / sqrtf((float)HS);
    bool bf16 = c->prec.bf16;
    copy_rows(t->q, HS, c->q + at.qoff + r0 * at.ldq, at.ldq, rows, HS, bf16);
    const int32_t *from;
    int k_first = first_tile(c, b, r0, rows, &from);
    for (int k0 = k_first; k0 < r0 + rows; k0 += KB) {
        int keys = min_int(KB, r0 + rows - k0);
        const float *Kt = t->k + k0 * HS, *Vt = t->v + k0 * HS; /* (keys, HS) */
        /* S = scale Q_i K_tileᵀ; P = exp(S - m), with m and l moved on */
        c->prec.product(&(tile_product){.a = t->q, .lda = HS, .a_bf16 = bf16,
                                        .b = Kt, .ldb = HS, .b_t = true, .b_bf16 = bf16,
                                        .c = t->S, .ldc = KB, .M = rows, .N = keys, .K = HS,
                                        .alpha = scale},
                        t->product);
        online_softmax_tile(t->S, KB, rows, keys, r0 - k0, k0 == k_first, from, k0, t->m, t->l, t->corr);
        /* acc = acc · corr + P V_tile */
        if (k0 > k_first)
            for (int r = 0; r < rows; r++)
                for (int d = 0; d < HS; d++) t->acc[r * HS + d] *= t->corr[r];
        c->prec.product(&(tile_product){.a = t->S, .lda = KB, .b = Vt, .ldb = HS, .b_bf16 = bf16,
                                        .c = t->acc, .ldc = HS, .M = rows, .N = HS, .K = keys,
                                        .alpha = 1.0f, .accumulate = k0 > k_first},
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
 * of the causal triangle, so every task has the same work and the pool's
 * equal contiguous ranges of tasks are balanced. The keys both blocks see
 * are copied (rounded, in a bf16 run) once for the two. */
static void forward_tasks(void *p, int64_t begin, int64_t end, int chunk) {
    const attn_ctx *c = p;
    tiles t = tiles_at(scratch.mem + (size_t)chunk * c->per_chunk, c->T, c->HS);
    int n = query_blocks(c->T), pairs = (n + 1) / 2;
    for (int64_t task = begin; task < end; task++) {
        int64_t bh = task / pairs;
        int pair = (int)(task % pairs), b = (int)(bh / c->NH), h = (int)(bh % c->NH);
        head_at at = head_of(c, b, h);
        int keys = min_int(c->T, (n - pair) * QB); /* up to the later block's last query */
        copy_rows(t.k, c->HS, c->k + at.kvoff, at.ldkv, keys, c->HS, c->prec.bf16);
        copy_rows(t.v, c->HS, c->v + at.kvoff, at.ldkv, keys, c->HS, c->prec.bf16);
        forward_block(c, &t, b, h, pair);
        if (n - 1 - pair != pair) forward_block(c, &t, b, h, n - 1 - pair);
    }
}

/* Backward of query block i (FlashAttention-2): D = rowsum(dO_i ∘ O_i), then
 * for each key tile, with P recomputed from the saved lse:
 *   S = scale Q_i K_tileᵀ;  P = exp(S - lse);  dV_tile += Pᵀ dO_i;  dP = dO_i V_tileᵀ;
 *   dS = scale P ∘ (dP - D);  dQ_i += dS K_tile;  dK_tile += dSᵀ Q_i
 * With bf16 products D takes dO rounded as they do: dP - D cancels, and would
 * otherwise carry dO's rounding (test_attention_bf16's worst gradient error:
 * 0.64% with fp32 dO, 0.53% with the rounded one). */
static void backward_block(const attn_ctx *c, const tiles *t, int b, int h, int i) {
    int T = c->T, HS = c->HS, r0 = i * QB, rows = min_int(QB, T - r0);
    head_at at = head_of(c, b, h);
    int64_t qi = at.qoff + r0 * at.ldq;
    const float *O = c->out_in + qi, *lse = c->lse_in + at.lseoff + r0;
    float *dQ = c->dq + qi, scale = 1.0f / sqrtf((float)HS);
    bool bf16 = c->prec.bf16;
    tile_product_fn product = c->prec.product;
    copy_rows(t->q, HS, c->q + qi, at.ldq, rows, HS, bf16);
    copy_rows(t->dO, HS, c->dout + qi, at.ldq, rows, HS, bf16);
    for (int r = 0; r < rows; r++) t->D[r] = keel_dot(t->dO + r * HS, O + r * at.ldq, HS); /* D */
    const int32_t *from;
    int k_first = first_tile(c, b, r0, rows, &from);
    for (int k0 = k_first; k0 < r0 + rows; k0 += KB) {
        int keys = min_int(KB, r0 + rows - k0);
        const float *Kt = t->k + k0 * HS, *Vt = t->v + k0 * HS; /* (keys, HS) */
        float *dKt = c->dk + at.kvoff + k0 * at.ldkv, *dVt = c->dv + at.kvoff + k0 * at.ldkv;
        /* S = scale Q_i K_tileᵀ; P = exp(S - lse) */
        product(&(tile_product){.a = t->q, .lda = HS, .a_bf16 = bf16,
                                .b = Kt, .ldb = HS, .b_t = true, .b_bf16 = bf16,
                                .c = t->S, .ldc = KB, .M = rows, .N = keys, .K = HS,
                                .alpha = scale},
                t->product);
        softmax_recompute_tile(t->S, KB, rows, keys, r0 - k0, from, k0, lse);
        /* dV_tile += Pᵀ dO_i */
        product(&(tile_product){.a = t->S, .lda = KB, .a_t = true,
                                .b = t->dO, .ldb = HS, .b_bf16 = bf16,
                                .c = dVt, .ldc = at.ldkv, .M = keys, .N = HS, .K = rows,
                                .alpha = 1.0f, .accumulate = true},
                t->product);
        /* dP = dO_i V_tileᵀ; dS = scale P ∘ (dP - D), rounded once for its two products */
        product(&(tile_product){.a = t->dO, .lda = HS, .a_bf16 = bf16,
                                .b = Vt, .ldb = HS, .b_t = true, .b_bf16 = bf16,
                                .c = t->dP, .ldc = KB, .M = rows, .N = keys, .K = HS,
                                .alpha = 1.0f},
                t->product);
        softmax_backward_tile(t->dP, t->S, KB, rows, keys, t->D, scale);
        if (bf16) copy_rows(t->dP, KB, t->dP, KB, rows, keys, true);
        /* dQ_i += dS K_tile */
        product(&(tile_product){.a = t->dP, .lda = KB, .a_bf16 = bf16,
                                .b = Kt, .ldb = HS, .b_bf16 = bf16,
                                .c = dQ, .ldc = at.ldq, .M = rows, .N = HS, .K = keys,
                                .alpha = 1.0f, .accumulate = k0 > k_first},
                t->product);
        /* dK_tile += dSᵀ Q_i */
        product(&(tile_product){.a = t->dP, .lda = KB, .a_t = true, .a_bf16 = bf16,
                                .b = t->q, .ldb = HS, .b_bf16 = bf16,
                                .c = dKt, .ldc = at.ldkv, .M = keys, .N = HS, .K = rows,
                                .alpha = 1.0f, .accumulate = true},
                t->product);
    }
}

/* Tasks are (b, kv head): the query heads of a group and all their query
 * blocks add into the same dK and dV, so they stay on one thread — no
 * atomics, and no second pass that recomputes P for dQ alone (FA2 on GPUs
 * does one or the other). B·NKV tasks of equal work. */
static void backward_tasks(void *p, int64_t begin, int64_t end, int chunk) {
    const attn_ctx *c = p;
    tiles t = tiles_at(scratch.mem + (size_t)chunk * c->per_chunk, c->T, c->HS);
    int group = c->NH / c->NKV, n = query_blocks(c->T);
    for (int64_t bg = begin; bg < end; bg++) {
        int b = (int)(bg / c->NKV), g = (int)(bg % c->NKV);
        head_at at = head_of(c, b, g * group);
        for (int row = 0; row < c->T; row++) {
            memset(c->dk + at.kvoff + row * at.ldkv, 0, sizeof(float) * (size_t)c->HS);
            memset(c->dv + at.kvoff + row * at.ldkv, 0, sizeof(float) * (size_t)c->HS);
        }
        copy_rows(t.k, c->HS, c->k + at.kvoff, at.ldkv, c->T, c->HS, c->prec.bf16);
        copy_rows(t.v, c->HS, c->v + at.kvoff, at.ldkv, c->T, c->HS, c->prec.bf16);
        for (int h = g * group; h < (g + 1) * group; h++)
            for (int i = 0; i < n; i++) backward_block(c, &t, b, h, i);
    }
}

/* ---- entry points -------------------------------------------------------- */

static void run(attn_ctx *c, int64_t tasks, keel_pool_fn fn) {
    c->per_chunk = aligned(tiles_bytes(c->T, c->HS, c->prec.scratch));
    size_t want = c->per_chunk * (size_t)keel_pool_threads();
    if (want > scratch.bytes) {
        keel_free(scratch.mem);
        scratch.mem = keel_xmalloc(want, "attention scratch");
        scratch.bytes = want;
    }
    keel_pool_for(tasks, 1, fn, c);
}

static void forward(bool bf16, float *out, float *lse, const float *q, const float *k,
                    const float *v, const int32_t *kv_start, int B, int T, int NH, int NKV, int HS) {
    attn_ctx c = {.out = out, .lse = lse, .q = q, .k = k, .v = v, .kv_start = kv_start, .B = B, .T = T,
                  .NH = NH, .NKV = NKV, .HS = HS, .prec = precision_of(bf16)};
    run(&c, (int64_t)B * NH * ((query_blocks(T) + 1) / 2), forward_tasks);
}

static void backward(bool bf16, float *dq, float *dk, float *dv, const float *dout,
                     const float *out, const float *lse, const float *q, const float *k,
                     const float *v, const int32_t *kv_start, int B, int T, int NH, int NKV, int HS) {
    attn_ctx c = {.dq = dq, .dk = dk, .dv = dv, .dout = dout, .out_in = out, .lse_in = lse, .q = q,
                  .k = k, .v = v, .kv_start = kv_start, .B = B, .T = T, .NH = NH, .NKV = NKV, .HS = HS,
                  .prec = precision_of(bf16)};
    run(&c, (int64_t)B * NKV, backward_tasks);
}

void keel_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                            const int32_t *kv_start, int B, int T, int NH, int NKV, int HS) {
    forward(false, out, lse, q, k, v, kv_start, B, T, NH, NKV, HS);
}

void keel_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                             const float *lse, const float *q, const float *k, const float *v,
                             const int32_t *kv_start, int B, int T, int NH, int NKV, int HS) {
    backward(false, dq, dk, dv, dout, out, lse, q, k, v, kv_start, B, T, NH, NKV, HS);
}

void keel_attention_forward_bf16(float *out, float *lse, const float *q, const float *k,
                                 const float *v, const int32_t *kv_start, int B, int T, int NH, int NKV,
                                 int HS) {
    forward(true, out, lse, q, k, v, kv_start, B, T, NH, NKV, HS);
}

void keel_attention_backward_bf16(float *dq, float *dk, float *dv, const float *dout,
                                  const float *out, const float *lse, const float *q, const float *k,
                                  const float *v, const int32_t *kv_start, int B, int T, int NH, int NKV,
                                  int HS) {
    backward(true, dq, dk, dv, dout, out, lse, q, k, v, kv_start, B, T, NH, NKV, HS);
}
