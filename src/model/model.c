/* model/model.c: Llama 2 forward and backward (fp32, or bf16 GEMMs), one rank, one
 * micro-batch. Every tensor lives in the backend's memory and every operation
 * on one is a backend call (keel/backend.h): this file never touches them
 * from the host, so it runs unchanged on the CPU and on a GPU. */
#include <math.h>
#include <string.h>

#include "keel/backend.h"
#include "keel/kernels.h"
#include "keel/model.h"

/* A weight: its unit and where it starts within the unit; with LoRA, where
 * its adapter's A starts in the unit's adapters (B follows it), or -1. */
typedef struct {
    int unit;
    int64_t offset;
    int64_t lora;
    int lora_stream; /* l * KEEL_LORA_TARGETS + target: the adapter's dropout masks */
} weight_at;

/* One block's tensors, in the order of layout.c. */
typedef struct {
    weight_at norm1;  /* (C) */
    weight_at wq;     /* (NH*HS, C) */
    weight_at wk;     /* (NKV*HS, C) */
    weight_at wv;     /* (NKV*HS, C) */
    weight_at wo;     /* (C, NH*HS) */
    weight_at norm2;  /* (C) */
    weight_at wgate;  /* (F, C) */
    weight_at wup;    /* (F, C) */
    weight_at wdown;  /* (C, F) */
} block_weights;

/* Saved activations of one block for a micro-batch (N = B*T rows). */
typedef struct {
    float *res;          /* (N, C) block input */
    float *n1, *rstd1;   /* (N, C), (N) */
    float *q, *k, *v;    /* (N, NH*HS), (N, NKV*HS), (N, NKV*HS); q, k after RoPE */
    float *lse;          /* (B, NH, T) each query's log-sum-exp: attention's backward state */
    float *ao;           /* (N, NH*HS) attention output before o_proj */
    float *mid;          /* (N, C) res + attention */
    float *n2, *rstd2;   /* (N, C), (N) */
    float *gate, *up, *h;/* (N, F) */
} block_acts;

struct keel_model {
    keel_model_layout lay;
    const keel_backend *be; /* where every buffer below lives and every kernel runs */
    int B_max;            /* micro-batch the buffers are sized for */
    int B;                /* sequences in the current micro-batch */
    float *params;        /* (n_params) */
    float *grads;         /* (n_params) */
    /* Where each unit's parameters and gradients are read and written: into
     * params/grads by default; FSDP points them at gathered unit buffers. */
    float **unit_params;  /* (n_units) */
    float **unit_grads;   /* (n_units) */
    /* bf16 compute (fsdp.mixed_precision bf16): GEMMs read bf16 weights from
     * unit_params16 and bf16 copies of their fp32 inputs; the model's own
     * parameters get a bf16 copy, refreshed when they change. */
    bool bf16;
    keel_bf16 **unit_params16; /* (n_units) */
    keel_bf16 *params16;       /* (n_params) with own parameters */
    bool params16_stale;
    keel_bf16 *xb;        /* bf16 copy of a GEMM's input activation */
    keel_bf16 *dyb;       /* bf16 copy of a GEMM's output gradient */
    float *normw;         /* (C) a norm weight converted from bf16 */
    keel_model_hooks hooks;
    keel_model_progress_fn progress;
    void *progress_ctx;
    float *acts_mem;      /* every activation and scratch buffer, one allocation */
    block_acts *acts;     /* (L) */
    float *res_final;     /* (N, C) output of the last block */
    float *nf, *rstdf;    /* (N, C), (N) */
    float *logits;        /* (head_rows, V): one chunk of rows' logits; after a training
                             forward, the last chunk's dloss/dlogits */
    int32_t *inputs, *targets; /* (N) */
    int32_t *kv_start;    /* (N) document masking: each position's document's first position; else NULL */
    bool masked;          /* the forward a backward follows gave kv_start (its tokens had flags) */
    int32_t *tokens_host; /* (2N, 3N with document masking) inputs, targets, kv_start, staged on the host */
    /* backward scratch */
    float *dres;          /* (N, C) */
    float *dn;            /* (N, C) */
    float *dq, *dk, *dv;  /* (N, NH*HS), (N, NKV*HS), (N, NKV*HS) */
    float *dao;           /* (N, NH*HS) */
    float *dgate, *dup, *dh; /* (N, F) */
    float *rope;          /* (T, HS/2, 2) */
    bool have_dlogits;
    float grad_scale;     /* of the forward a backward follows */
    int head_rows;        /* rows of logits at a time: the whole (N, V) never exists */
    int checkpoint_blocks; /* the first ones share one set of activations (0..L) */
    int recomputed_blocks; /* the first ones backward recomputes: checkpoint_blocks - 1 */
    /* LoRA (options.lora): the adapters' layout, where each unit's adapters and
     * their gradients are (fp32 whatever the base's precision), the
     * sequences' dropout keys and scratch: z (N, r) and its gradient, and with
     * dropout the masked input (N, max in) and its gradient. */
    bool lora;
    keel_model_layout lora_lay;
    float **unit_lora, **unit_lora_grads; /* (n_units) */
    float *lora_params, *lora_grads;      /* (lora_lay.n_params), own parameters */
    float lora_scale;                     /* alpha / r */
    uint64_t *seq_keys;                   /* (B_max) this micro-batch's sequences' dropout keys */
    bool have_keys;
    float *lz, *ldz, *lx, *ldx;
};

/* The activation table: every buffer with its size in floats, so one
 * allocation holds them all and keel_model_activation_bytes is exact. */
typedef struct {
    float **ptr;
    int64_t floats;
} act_entry;

/* The output head runs on chunks of at most this many logits (256 MiB in
 * fp32): rows of a micro-batch at a time, so (N, V) never exists whole — at
 * Llama 2's V = 32000 and T = 4096 the whole would be 0.5 GiB a sequence. */
#define HEAD_CHUNK_FLOATS ((int64_t)1 << 26)

static int head_rows(const keel_model_layout *lay, int B, const keel_model_options *opts) {
    int64_t N = (int64_t)B * lay->T, rows = opts->head_rows > 0 ? opts->head_rows : HEAD_CHUNK_FLOATS / lay->V;
    return (int)(rows < 1 ? 1 : rows < N ? rows : N);
}

static int checkpoint_blocks(const keel_model_layout *lay, const keel_model_options *opts) {
    int K = opts->checkpoint_blocks;
    return K < 0 || K > lay->L ? lay->L : K;
}

int keel_model_recomputed_blocks(const keel_model_layout *lay, int K) {
    K = K < 0 || K > lay->L ? lay->L : K;
    return K > 0 ? K - 1 : 0;
}

/* The checkpointed blocks keep only their input per layer; the rest is one
 * set (block 0's) that each of their forwards overwrites and backward
 * recomputes, except for the last of them, whose forward wrote it last. */
static int act_table(keel_model *m, const keel_model_layout *lay, int B,
                     const keel_model_options *opts, act_entry *tab) {
    int K = checkpoint_blocks(lay, opts);
    int64_t N = (int64_t)B * lay->T, C = lay->C, F = lay->F, V = lay->V;
    int64_t QD = (int64_t)lay->NH * lay->HS, KVD = (int64_t)lay->NKV * lay->HS;
    int64_t LSE = (int64_t)B * lay->NH * lay->T, HR = head_rows(lay, B, opts);
    int n = 0;
#define ACT(p, size) tab[n++] = (act_entry){(m ? (float **)&(p) : NULL), (size)}
    for (int l = 0; l < lay->L; l++) {
        block_acts *a = m ? &m->acts[l] : NULL;
        block_acts dummy;
        if (!a) a = &dummy;
        ACT(a->res, N * C);
        if (l > 0 && l < K) continue; /* shares block 0's buffers */
        ACT(a->n1, N * C); ACT(a->rstd1, N);
        ACT(a->q, N * QD); ACT(a->k, N * KVD); ACT(a->v, N * KVD);
        ACT(a->lse, LSE); ACT(a->ao, N * QD); ACT(a->mid, N * C);
        ACT(a->n2, N * C); ACT(a->rstd2, N);
        ACT(a->gate, N * F); ACT(a->up, N * F); ACT(a->h, N * F);
    }
    keel_model dm;
    keel_model *mm = m ? m : &dm;
    ACT(mm->res_final, N * C); ACT(mm->nf, N * C); ACT(mm->rstdf, N); ACT(mm->logits, HR * V);
    ACT(mm->inputs, N); ACT(mm->targets, N); /* int32 is float-sized */
    if (opts->document_mask) ACT(mm->kv_start, N);
    ACT(mm->dres, N * C); ACT(mm->dn, N * C); ACT(mm->dq, N * QD); ACT(mm->dk, N * KVD);
    ACT(mm->dv, N * KVD); ACT(mm->dao, N * QD);
    ACT(mm->dgate, N * F); ACT(mm->dup, N * F); ACT(mm->dh, N * F);
    ACT(mm->rope, (int64_t)lay->T * lay->HS);
    int64_t in = C > QD ? C : QD; /* a GEMM's widest input */
    in = in > F ? in : F;
    if (opts->lora && opts->lora->on) { /* LoRA's scratch */
        int64_t r = opts->lora->rank;
        ACT(mm->lz, N * r); ACT(mm->ldz, N * r);
        if (opts->lora->dropout > 0) { ACT(mm->lx, N * in); ACT(mm->ldx, N * in); }
    }
    if (opts->bf16) { /* bf16 scratch, counted in floats (two per float) */
        int64_t out = N * (in > KVD ? in : KVD); /* a block's output gradients, or a chunk of dlogits */
        out = out > HR * V ? out : HR * V;
        ACT(mm->xb, (N * in + 1) / 2); ACT(mm->dyb, (out + 1) / 2); ACT(mm->normw, C);
    }
#undef ACT
    return n;
}

static int act_table_len(const keel_model_layout *lay) { return lay->L * 14 + 28; }

int64_t keel_model_activation_bytes(const keel_model_layout *lay, int B,
                                    const keel_model_options *opts) {
    act_entry *tab = keel_xmalloc(sizeof(act_entry) * (size_t)act_table_len(lay), "act table");
    int n = act_table(NULL, lay, B, opts, tab);
    int64_t bytes = 0;
    for (int i = 0; i < n; i++) bytes += (tab[i].floats + 15) / 16 * 16 * (int64_t)sizeof(float);
    keel_free(tab);
    return bytes;
}

keel_status keel_model_build_with(const keel_model_config *cfg, int B,
                                  const keel_model_options *opts, keel_model **out) {
    bool own_params = opts->own_params;
    keel_model *m = keel_xcalloc(sizeof *m, "model");
    keel_model_layout_init_units(&m->lay, cfg, opts->unit);
    const keel_backend *be = m->be = opts->backend ? opts->backend : keel_backend_cpu();
    m->B_max = m->B = B;
    m->head_rows = head_rows(&m->lay, B, opts);
    m->checkpoint_blocks = checkpoint_blocks(&m->lay, opts);
    m->recomputed_blocks = keel_model_recomputed_blocks(&m->lay, m->checkpoint_blocks);
    m->bf16 = opts->bf16;
    KEEL_CHECK(!opts->document_mask || be->document_masking, "document masking on the %s backend", be->name);
    if (opts->lora && opts->lora->on) {
        char why[256];
        if (keel_lora_layout_init(&m->lora_lay, &m->lay, opts->lora, why, sizeof why) != KEEL_OK) {
            keel_errorf("%s", why);
            keel_model_free(m);
            return KEEL_ERR_INPUT;
        }
        m->lora = true;
        m->lora_scale = (float)(opts->lora->alpha / opts->lora->rank);
        m->unit_lora = keel_xcalloc(sizeof(float *) * (size_t)m->lay.n_units, "unit pointers");
        m->unit_lora_grads = keel_xcalloc(sizeof(float *) * (size_t)m->lay.n_units, "unit pointers");
        m->seq_keys = keel_xcalloc(sizeof(uint64_t) * (size_t)B, "dropout keys");
    }
    if (own_params) { /* with LoRA the base is frozen: no gradients */
        m->params = be->alloc(sizeof(float) * (size_t)m->lay.n_params, "parameters");
        if (!m->lora) m->grads = be->alloc(sizeof(float) * (size_t)m->lay.n_params, "gradients");
        if (m->bf16) m->params16 = be->alloc(2 * (size_t)m->lay.n_params, "bf16 parameters");
    }
    if (own_params && m->lora) {
        int64_t n = m->lora_lay.n_params;
        m->lora_params = be->alloc(sizeof(float) * (size_t)n, "adapters");
        m->lora_grads = be->alloc(sizeof(float) * (size_t)n, "adapter gradients");
        for (int u = 0; u < m->lay.n_units; u++)
            keel_model_set_unit_lora(m, u, m->lora_params + m->lora_lay.unit_offset[u],
                                     m->lora_grads + m->lora_lay.unit_offset[u]);
    }
    m->acts = keel_xcalloc(sizeof(block_acts) * (size_t)m->lay.L, "activation table");
    m->unit_params = keel_xcalloc(sizeof(float *) * (size_t)m->lay.n_units, "unit pointers");
    m->unit_grads = keel_xcalloc(sizeof(float *) * (size_t)m->lay.n_units, "unit pointers");
    m->unit_params16 = keel_xcalloc(sizeof(keel_bf16 *) * (size_t)m->lay.n_units, "unit pointers");
    for (int u = 0; own_params && u < m->lay.n_units; u++) {
        int64_t off = m->lay.unit_offset[u];
        float *grads = m->grads ? m->grads + off : NULL;
        if (m->bf16) keel_model_set_unit_bf16(m, u, m->params16 + off, grads);
        else keel_model_set_unit_buffers(m, u, m->params + off, grads);
    }
    m->params16_stale = true;

    act_entry *tab = keel_xmalloc(sizeof(act_entry) * (size_t)act_table_len(&m->lay), "act table");
    int n = act_table(m, &m->lay, B, opts, tab);
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += (tab[i].floats + 15) / 16 * 16; /* keep 64-byte alignment */
    m->acts_mem = be->alloc(sizeof(float) * (size_t)total, "activations");
    m->tokens_host = keel_xmalloc(sizeof(int32_t) * (opts->document_mask ? 3 : 2) * (size_t)B * (size_t)m->lay.T,
                                  "tokens");
    float *p = m->acts_mem;
    for (int i = 0; i < n; i++) {
        *tab[i].ptr = p;
        p += (tab[i].floats + 15) / 16 * 16;
    }
    keel_free(tab);
    for (int l = 1; l < m->checkpoint_blocks; l++) {
        float *res = m->acts[l].res;
        m->acts[l] = m->acts[0];
        m->acts[l].res = res;
    }
    size_t rope_bytes = sizeof(float) * (size_t)m->lay.T * (size_t)m->lay.HS;
    float *rope = keel_xmalloc(rope_bytes, "RoPE table");
    keel_rope_table(rope, m->lay.T, m->lay.HS, cfg->rope_theta, &cfg->rope_scaling);
    be->to_device(m->rope, rope, rope_bytes);
    keel_free(rope);
    *out = m;
    return KEEL_OK;
}

keel_status keel_model_build(const keel_model_config *cfg, int B, keel_model **out) {
    keel_model_options opts = {.own_params = true};
    return keel_model_build_with(cfg, B, &opts, out);
}

void keel_model_free(keel_model *m) {
    if (!m) return;
    m->be->free(m->params);
    m->be->free(m->grads);
    m->be->free(m->params16);
    m->be->free(m->lora_params);
    m->be->free(m->lora_grads);
    keel_free(m->unit_lora);
    keel_free(m->unit_lora_grads);
    keel_free(m->seq_keys);
    keel_model_layout_free(&m->lora_lay);
    m->be->free(m->acts_mem);
    keel_free(m->tokens_host);
    keel_free(m->unit_params16);
    keel_free(m->acts);
    keel_free(m->unit_params);
    keel_free(m->unit_grads);
    keel_model_layout_free(&m->lay);
    keel_free(m);
}

const keel_model_layout *keel_model_get_layout(const keel_model *m) { return &m->lay; }
float *keel_model_params(keel_model *m) { return m->params; }
const keel_backend *keel_model_backend(const keel_model *m) { return m->be; }
float *keel_model_grads(keel_model *m) { return m->grads; }

void keel_model_set_unit_buffers(keel_model *m, int unit, float *params, float *grads) {
    KEEL_CHECK(unit >= 0 && unit < m->lay.n_units, "unit %d of %d", unit, m->lay.n_units);
    KEEL_CHECK(!m->bf16, "fp32 unit buffers given to a bf16 model");
    m->unit_params[unit] = params;
    m->unit_grads[unit] = grads;
}

void keel_model_set_unit_bf16(keel_model *m, int unit, keel_bf16 *params, float *grads) {
    KEEL_CHECK(unit >= 0 && unit < m->lay.n_units, "unit %d of %d", unit, m->lay.n_units);
    KEEL_CHECK(m->bf16, "bf16 unit buffers given to an fp32 model");
    m->unit_params16[unit] = params;
    m->unit_grads[unit] = grads;
}

bool keel_model_is_bf16(const keel_model *m) { return m->bf16; }

const keel_model_layout *keel_model_lora_layout(const keel_model *m) { return m->lora ? &m->lora_lay : NULL; }
float *keel_model_lora_params(keel_model *m) { return m->lora_params; }
float *keel_model_lora_grads(keel_model *m) { return m->lora_grads; }

void keel_model_set_unit_lora(keel_model *m, int unit, float *params, float *grads) {
    KEEL_CHECK(m->lora && unit >= 0 && unit < m->lay.n_units, "adapters of unit %d of a model %s", unit,
               m->lora ? "with them" : "without adapters");
    m->unit_lora[unit] = params;
    m->unit_lora_grads[unit] = grads;
}

void keel_model_set_dropout_keys(keel_model *m, const uint64_t *keys, int n) {
    KEEL_CHECK(m->lora && n >= 0 && n <= m->B_max, "%d dropout keys", n);
    if (n) memcpy(m->seq_keys, keys, sizeof(uint64_t) * (size_t)n);
    m->have_keys = n > 0;
}

void keel_model_params_changed(keel_model *m) { m->params16_stale = true; }

void keel_model_set_hooks(keel_model *m, const keel_model_hooks *hooks) {
    m->hooks = hooks ? *hooks : (keel_model_hooks){0};
}

void keel_model_set_progress(keel_model *m, keel_model_progress_fn fn, void *ctx) {
    m->progress = fn;
    m->progress_ctx = ctx;
}

static int head_unit(const keel_model_layout *lay) { return lay->n_units - 1; }

static void progress(const keel_model *m, const char *doing) {
    if (m->progress) m->progress(m->progress_ctx, doing);
}

/* ---- the unit schedule -------------------------------------------------
 * Forward uses units 0, 1, ..., head; backward head, ..., 0, and each
 * recomputed block's units run forward once more (recomputation) just
 * before their backward. Each hook is told the next unit other than
 * its own that the model will use, for FSDP to prefetch. */

static bool last_of_block(const keel_model_layout *lay, int u) {
    return u >= 1 && u < head_unit(lay) && (u - 1) % lay->units_per_block == lay->units_per_block - 1;
}

static int next_backward(const keel_model *m, int u) {
    if (u == 0) return -1;
    int v = u - 1, P = m->lay.units_per_block;
    if (last_of_block(&m->lay, v) && (v - 1) / P < m->recomputed_blocks)
        return 1 + (v - 1) / P * P; /* its recomputation */
    return v;
}

/* recompute: a block's forward inside backward, whose last unit's backward follows at once. */
static int next_forward(const keel_model *m, int u, bool recompute) {
    if (recompute && last_of_block(&m->lay, u)) return next_backward(m, u);
    if (u < head_unit(&m->lay)) return u + 1;
    return m->have_dlogits ? next_backward(m, u) : -1;
}

static void begin_forward(const keel_model *m, int u, bool recompute) {
    if (m->hooks.before_forward) m->hooks.before_forward(m->hooks.ctx, u, next_forward(m, u, recompute));
}

/* after_forward is told u itself when u's backward comes next (keep it). */
static void end_forward(const keel_model *m, int u, bool recompute) {
    bool backward_next = (recompute && last_of_block(&m->lay, u)) ||
                         (u == head_unit(&m->lay) && m->have_dlogits);
    if (m->hooks.after_forward)
        m->hooks.after_forward(m->hooks.ctx, u, backward_next ? u : next_forward(m, u, recompute));
    progress(m, "forward");
}

static void begin_backward(const keel_model *m, int u) {
    if (m->hooks.before_backward) m->hooks.before_backward(m->hooks.ctx, u, next_backward(m, u));
}

static void end_backward(const keel_model *m, int u) {
    if (m->hooks.after_backward) m->hooks.after_backward(m->hooks.ctx, u, next_backward(m, u));
    progress(m, "backward");
}

/* Inside a block: the weights about to be used are in unit u; *cur is the
 * unit in use so far (-1 before the first). */
static void use_forward(const keel_model *m, int *cur, int u, bool recompute) {
    if (*cur == u) return;
    if (*cur >= 0) end_forward(m, *cur, recompute);
    begin_forward(m, u, recompute);
    *cur = u;
}

static void use_backward(const keel_model *m, int *cur, int u) {
    if (*cur == u) return;
    if (*cur >= 0) end_backward(m, *cur);
    begin_backward(m, u);
    *cur = u;
}

void keel_model_zero_grads(keel_model *m) {
    KEEL_CHECK(m->grads || m->lora_grads, "keel_model_zero_grads on a model without its own gradients");
    if (m->lora) m->be->zero(m->lora_grads, sizeof(float) * (size_t)m->lora_lay.n_params);
    else m->be->zero(m->grads, sizeof(float) * (size_t)m->lay.n_params);
}

#define GOLDEN 0x9E3779B97F4A7C15ull

/* A uniform in (0, 1) from a hash: 53 bits, never 0 (log below). */
static double uniform01(uint64_t h) { return ((double)(h >> 11) + 0.5) / 9007199254740992.0; }

void keel_model_init_weights(keel_model *m, uint64_t seed) {
    KEEL_CHECK(m->params, "keel_model_init_weights on a model without its own parameters");
    if (m->be->host_memory) { /* straight in */
        keel_model_init_params(&m->lay, seed, m->params);
        m->params16_stale = true;
        return;
    }
    enum { CHUNK = 1 << 22 }; /* floats staged on the host at a time */
    int64_t n = m->lay.n_params, chunk = n < CHUNK ? n : CHUNK;
    float *host = keel_xmalloc(sizeof(float) * (size_t)chunk, "initial parameters");
    for (int64_t at = 0; at < n; at += chunk) {
        int64_t len = n - at < chunk ? n - at : chunk;
        keel_model_init_range(&m->lay, seed, at, len, host);
        m->be->to_device(m->params + at, host, sizeof(float) * (size_t)len);
    }
    keel_free(host);
    m->params16_stale = true;
}

/* Elements [first, end) of tensor i: elements 2p and 2p+1 are the Box–Muller
 * pair of draw p, whose two uniforms hash (seed, tensor, p) — so any slice is
 * computed alone, and equals that slice of a whole initialisation. */
static void init_tensor_slice(const keel_tensor_info *t, int i, uint64_t seed, int64_t first, int64_t end, float *out) {
    if (t->cols == 1) { /* norm weights */
        for (int64_t j = first; j < end; j++) out[j - first] = 1.0f;
        return;
    }
    uint64_t key = keel_hash64(seed + GOLDEN * (uint64_t)(i + 1));
    for (int64_t p = first / 2; 2 * p < end; p++) {
        double u1 = uniform01(keel_hash64(key + GOLDEN * (uint64_t)(2 * p + 1)));
        double u2 = uniform01(keel_hash64(key + GOLDEN * (uint64_t)(2 * p + 2)));
        double r = 0.02 * sqrt(-2.0 * log(u1));
        if (2 * p >= first) out[2 * p - first] = (float)(r * cos(2.0 * M_PI * u2));
        if (2 * p + 1 >= first && 2 * p + 1 < end) out[2 * p + 1 - first] = (float)(r * sin(2.0 * M_PI * u2));
    }
}

typedef struct {
    const keel_model_layout *lay;
    uint64_t seed;
    int64_t begin;
    float *out;
} init_job;

/* Elements [begin + from, begin + to) of the job: any slice stands alone. */
static void init_part(void *ctx, int64_t from, int64_t to, int chunk) {
    (void)chunk;
    const init_job *j = ctx;
    int64_t begin = j->begin + from, end = j->begin + to;
    for (int i = 0; i < j->lay->n_tensors; i++) {
        const keel_tensor_info *t = &j->lay->tensors[i];
        int64_t lo = t->offset > begin ? t->offset : begin, hi = t->offset + t->rows * t->cols;
        if (hi > end) hi = end;
        if (lo < hi) init_tensor_slice(t, i, j->seed, lo - t->offset, hi - t->offset, j->out + (lo - j->begin));
    }
}

/* On keel's pool (~30 ns an element on one core: minutes for a 7B model alone). */
void keel_model_init_range(const keel_model_layout *lay, uint64_t seed, int64_t begin, int64_t len, float *out) {
    init_job j = {lay, seed, begin, out};
    keel_pool_for(len, 1 << 16, init_part, &j);
}

void keel_model_init_params(const keel_model_layout *lay, uint64_t seed, float *params) {
    keel_model_init_range(lay, seed, 0, lay->n_params, params);
}

static weight_at weight(const keel_model_layout *lay, int tensor) {
    const keel_tensor_info *t = &lay->tensors[tensor];
    return (weight_at){t->unit, t->offset - lay->unit_offset[t->unit], -1, 0};
}

/* Block l's tensor k (0..8), with its adapter when it has one. */
static weight_at block_weight(const keel_model *m, int l, int k) {
    static const int TARGET[KEEL_BLOCK_TENSORS] = {-1, KEEL_LORA_Q, KEEL_LORA_K, KEEL_LORA_V, KEEL_LORA_O,
                                                   -1, KEEL_LORA_GATE, KEEL_LORA_UP, KEEL_LORA_DOWN};
    weight_at w = weight(&m->lay, 1 + l * KEEL_BLOCK_TENSORS + k); /* after the embedding */
    int stream = l * KEEL_LORA_TARGETS + TARGET[k];
    if (m->lora && TARGET[k] >= 0 && m->lora_lay.lora_a[stream] >= 0) {
        const keel_tensor_info *a = &m->lora_lay.tensors[m->lora_lay.lora_a[stream]];
        w.lora = a->offset - m->lora_lay.unit_offset[a->unit];
        w.lora_stream = stream;
    }
    return w;
}

static block_weights block_at(const keel_model *m, int l) {
    return (block_weights){block_weight(m, l, 0), block_weight(m, l, 1), block_weight(m, l, 2),
                           block_weight(m, l, 3), block_weight(m, l, 4), block_weight(m, l, 5),
                           block_weight(m, l, 6), block_weight(m, l, 7), block_weight(m, l, 8)};
}

/* The output head: lm_head after the final norm in the head unit, or the
 * embedding when tied. */
static weight_at head_matrix(const keel_model_layout *lay) {
    return lay->cfg.tie_embeddings ? (weight_at){0, 0, -1, 0} : (weight_at){head_unit(lay), lay->C, -1, 0};
}

/* A norm weight (C) in fp32: in place, or converted from bf16. */
static const float *norm_weight(keel_model *m, weight_at w) {
    if (!m->bf16) return m->unit_params[w.unit] + w.offset;
    m->be->bf16_to_f32(m->normw, m->unit_params16[w.unit] + w.offset, m->lay.C);
    return m->normw;
}

/* The bf16 copy of a GEMM input x (n values) in m->xb; NULL in fp32. */
static const keel_bf16 *input_bf16(keel_model *m, const float *x, int64_t n) {
    if (!m->bf16) return NULL;
    m->be->f32_to_bf16(m->xb, x, n);
    return m->xb;
}

/* The bf16 copy of an output gradient dy (n values) in m->dyb; NULL in fp32. */
static const keel_bf16 *grad_bf16(keel_model *m, const float *dy, int64_t n) {
    if (!m->bf16) return NULL;
    m->be->f32_to_bf16(m->dyb, dy, n);
    return m->dyb;
}

/* ---- LoRA: out += (alpha / r) · dropout(x) Aᵀ Bᵀ ----------------------------
 * In fp32 whatever the base's precision (r is small next to the matrix). The
 * scale is applied to z = dropout(x) Aᵀ (N, r), the smallest tensor. Dropout
 * (training forwards only, with the sequences' keys) masks each sequence's
 * rows with a stream of its key, the layer and the target, so a recomputed
 * forward and the backward draw the same mask. */

static bool lora_dropping(const keel_model *m) {
    return m->lora_lay.lora.dropout > 0 && m->have_dlogits;
}

/* dropout(x) into out (or added to it) for each sequence's T rows of I: the
 * same mask wherever it is drawn for one weight (forward, recomputation,
 * backward). */
static void lora_dropout(keel_model *m, float *out, const float *x, weight_at w, int N, int I, bool accumulate) {
    KEEL_CHECK(m->have_keys, "LoRA dropout in a training forward without the sequences' keys");
    float p = (float)m->lora_lay.lora.dropout;
    int T = m->lay.T;
    for (int b = 0; b < N / T; b++) {
        int64_t at = (int64_t)b * T * I;
        m->be->scale_masked(out + at, x + at, (int64_t)T * I, 1.0f / (1.0f - p), p,
                            m->seq_keys[b] + 0x9E3779B97F4A7C15ull * (uint64_t)(w.lora_stream + 1), accumulate);
    }
}

/* The adapter's input: x itself, or x with this forward's dropout in m->lx. */
static const float *lora_input(keel_model *m, const float *x, weight_at w, int N, int I) {
    if (!lora_dropping(m)) return x;
    lora_dropout(m, m->lx, x, w, N, I, false);
    return m->lx;
}

/* z (N, r) = scale · xin Aᵀ into m->lz. */
static void lora_z(keel_model *m, const float *xin, const float *A, int N, int I) {
    int r = m->lora_lay.lora.rank;
    m->be->matmul_forward(m->lz, xin, A, N, r, I, false);
    m->be->scale_masked(m->lz, m->lz, (int64_t)N * r, m->lora_scale, 0, 0, false);
}

static void lora_forward(keel_model *m, float *out, const float *x, weight_at w, int N, int O, int I) {
    const float *A = m->unit_lora[w.unit] + w.lora, *Bw = A + (int64_t)m->lora_lay.lora.rank * I;
    lora_z(m, lora_input(m, x, w, N, I), A, N, I);
    m->be->matmul_forward(out, m->lz, Bw, N, O, m->lora_lay.lora.rank, true);
}

/* dx += the adapter's input gradient; dA, dB += theirs. z is recomputed. */
static void lora_backward(keel_model *m, float *dx, const float *dy, const float *x, weight_at w, int N, int O,
                          int I) {
    int r = m->lora_lay.lora.rank;
    const float *A = m->unit_lora[w.unit] + w.lora, *Bw = A + (int64_t)r * I;
    float *dA = m->unit_lora_grads[w.unit] + w.lora, *dB = dA + (int64_t)r * I;
    const float *xin = lora_input(m, x, w, N, I);
    lora_z(m, xin, A, N, I);
    /* dz = dy B; dB += dyᵀ z; then dz times the scale: dA += dzᵀ xin, dxin = dz A */
    m->be->matmul_backward(m->ldz, dB, dy, m->lz, Bw, N, O, r, false);
    m->be->scale_masked(m->ldz, m->ldz, (int64_t)N * r, m->lora_scale, 0, 0, false);
    if (!lora_dropping(m)) {
        m->be->matmul_backward(dx, dA, m->ldz, xin, A, N, r, I, true);
        return;
    }
    m->be->matmul_backward(dx ? m->ldx : NULL, dA, m->ldz, xin, A, N, r, I, false);
    if (dx) lora_dropout(m, dx, m->ldx, w, N, I, true); /* the forward's mask */
}

/* out (N,O) = x (N,I) · Wᵀ (+ out if accumulate), W (O,I) at w, plus its
 * adapter's term; x16 is x in bf16 (input_bf16) for a bf16 model. */
static void linear_forward(keel_model *m, float *out, const float *x, const keel_bf16 *x16,
                           weight_at w, int N, int O, int I, bool accumulate) {
    if (m->bf16)
        m->be->gemm_bf16(out, x16, false, m->unit_params16[w.unit] + w.offset, true, N, O, I, accumulate);
    else
        m->be->matmul_forward(out, x, m->unit_params[w.unit] + w.offset, N, O, I, accumulate);
    if (w.lora >= 0) lora_forward(m, out, x, w, N, O, I);
    progress(m, "forward");
}

/* dx (N,I) = dy (N,O) · W (+ dx if accumulate_dx; skipped if dx is NULL) and
 * dW += dyᵀ · x, with W's gradient at the same place in unit_grads — none
 * when the unit has no gradient buffer (a frozen base) — plus the adapter's. */
static void linear_backward(keel_model *m, float *dx, const float *dy, const keel_bf16 *dy16,
                            const float *x, const keel_bf16 *x16, weight_at w, int N, int O, int I,
                            bool accumulate_dx) {
    float *dw = m->unit_grads[w.unit] ? m->unit_grads[w.unit] + w.offset : NULL;
    if (!m->bf16) {
        m->be->matmul_backward(dx, dw, dy, x, m->unit_params[w.unit] + w.offset, N, O, I, accumulate_dx);
    } else {
        if (dx) m->be->gemm_bf16(dx, dy16, false, m->unit_params16[w.unit] + w.offset, false, N, I, O, accumulate_dx);
        if (dw) m->be->gemm_bf16(dw, dy16, true, x16, false, O, I, N, true);
    }
    if (w.lora >= 0) lora_backward(m, dx, dy, x, w, N, O, I);
    progress(m, "backward");
}


static void block_forward(keel_model *m, int l, float *out, bool recompute) {
    const keel_model_layout *lay = &m->lay;
    int B = m->B, T = lay->T, N = B * T, C = lay->C, F = lay->F;
    int QD = lay->NH * lay->HS, KVD = lay->NKV * lay->HS, cur = -1;
    block_weights o = block_at(m, l);
    block_acts *a = &m->acts[l];
    const keel_backend *be = m->be;
    float eps = (float)lay->cfg.norm_eps;
#define USE(w) (use_forward(m, &cur, o.w.unit, recompute), o.w)

    be->rmsnorm_forward(a->n1, a->rstd1, a->res, norm_weight(m, USE(norm1)), N, C, eps);
    const keel_bf16 *x16 = input_bf16(m, a->n1, (int64_t)N * C);
    linear_forward(m, a->q, a->n1, x16, USE(wq), N, QD, C, false);
    linear_forward(m, a->k, a->n1, x16, USE(wk), N, KVD, C, false);
    linear_forward(m, a->v, a->n1, x16, USE(wv), N, KVD, C, false);
    be->rope_forward(a->q, m->rope, B, T, lay->NH, lay->HS);
    be->rope_forward(a->k, m->rope, B, T, lay->NKV, lay->HS);
    (m->bf16 ? be->attention_forward_bf16 : be->attention_forward)(a->ao, a->lse, a->q, a->k, a->v,
                                                                   m->masked ? m->kv_start : NULL, B, T, lay->NH,
                                                                   lay->NKV, lay->HS);
    be->copy(a->mid, a->res, sizeof(float) * (size_t)N * C);
    linear_forward(m, a->mid, a->ao, input_bf16(m, a->ao, (int64_t)N * QD), USE(wo), N, C, QD, true);

    be->rmsnorm_forward(a->n2, a->rstd2, a->mid, norm_weight(m, USE(norm2)), N, C, eps);
    x16 = input_bf16(m, a->n2, (int64_t)N * C);
    linear_forward(m, a->gate, a->n2, x16, USE(wgate), N, F, C, false);
    linear_forward(m, a->up, a->n2, x16, USE(wup), N, F, C, false);
    be->swiglu_forward(a->h, a->gate, a->up, (int64_t)N * F);
    be->copy(out, a->mid, sizeof(float) * (size_t)N * C);
    linear_forward(m, out, a->h, input_bf16(m, a->h, (int64_t)N * F), USE(wdown), N, C, F, true);
#undef USE
    end_forward(m, cur, recompute);
}

/* Rows [r0, r0 + rows) of the output head: their logits from nf, and their
 * summed cross-entropy; with dscale != 0 the logits become dloss/dlogits
 * times dscale. */
static double head_chunk(keel_model *m, int r0, int rows, float dscale) {
    const keel_model_layout *lay = &m->lay;
    int C = lay->C, V = lay->V;
    const float *x = m->nf + (int64_t)r0 * C;
    linear_forward(m, m->logits, x, input_bf16(m, x, (int64_t)rows * C), head_matrix(lay), rows, V, C, false);
    return m->be->xent_forward_backward(m->logits, m->targets + r0, rows, V, dscale);
}

double keel_model_forward(keel_model *m, const int32_t *tokens, const uint8_t *flags, int n_seqs,
                          float grad_scale) {
    KEEL_CHECK(n_seqs >= 1 && n_seqs <= m->B_max, "n_seqs %d outside [1, %d]", n_seqs, m->B_max);
    m->B = n_seqs;
    const keel_model_layout *lay = &m->lay;
    int B = m->B, T = lay->T, N = B * T, C = lay->C;
    const keel_backend *be = m->be;
    if (m->params16 && m->params16_stale) { /* own parameters changed: refresh their bf16 copy */
        be->f32_to_bf16(m->params16, m->params, lay->n_params);
        m->params16_stale = false;
    }
    int32_t *in = m->tokens_host, *target = m->tokens_host + N;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            in[b * T + t] = tokens[(int64_t)b * (T + 1) + t];
            int64_t at = (int64_t)b * (T + 1) + t + 1;
            /* -1: the cross-entropy ignores it */
            target[b * T + t] = !flags || (flags[at] & KEEL_TOKEN_TRAIN) ? tokens[at] : -1;
        }
    be->to_device(m->inputs, in, sizeof(int32_t) * (size_t)N);
    be->to_device(m->targets, target, sizeof(int32_t) * (size_t)N);
    /* document masking: each position sees its document's positions only, from the last one
     * flagged DOC_START (the row's first position when its document began before the row) */
    m->masked = m->kv_start && flags;
    if (m->masked) {
        int32_t *start = m->tokens_host + 2 * N;
        for (int b = 0; b < B; b++)
            for (int t = 0, from = 0; t < T; t++) {
                if (flags[(int64_t)b * (T + 1) + t] & KEEL_TOKEN_DOC_START) from = t;
                start[b * T + t] = from;
            }
        be->to_device(m->kv_start, start, sizeof(int32_t) * (size_t)N);
    }
    m->have_dlogits = grad_scale != 0.0f; /* a backward follows */
    begin_forward(m, 0, false);
    if (m->bf16) be->embedding_forward_bf16(m->acts[0].res, m->unit_params16[0], m->inputs, N, C);
    else be->embedding_forward(m->acts[0].res, m->unit_params[0], m->inputs, N, C);
    end_forward(m, 0, false);
    for (int l = 0; l < lay->L; l++) block_forward(m, l, l + 1 < lay->L ? m->acts[l + 1].res : m->res_final, false);
    int head = head_unit(lay);
    begin_forward(m, head, false);
    be->rmsnorm_forward(m->nf, m->rstdf, m->res_final, norm_weight(m, (weight_at){head, 0, -1, 0}), N, C,
                         (float)lay->cfg.norm_eps);
    /* the logits a chunk at a time; the last chunk keeps its gradient for backward */
    m->grad_scale = grad_scale;
    double loss = 0;
    for (int r0 = 0; r0 < N; r0 += m->head_rows) {
        int rows = N - r0 < m->head_rows ? N - r0 : m->head_rows;
        loss += head_chunk(m, r0, rows, r0 + rows == N ? grad_scale : 0.0f);
    }
    end_forward(m, head, false);
    return loss;
}

/* On entry m->dres holds dloss/d(output of block l); on exit dloss/d(input). */
static void block_backward(keel_model *m, int l) {
    const keel_model_layout *lay = &m->lay;
    int B = m->B, T = lay->T, N = B * T, C = lay->C, F = lay->F;
    int QD = lay->NH * lay->HS, KVD = lay->NKV * lay->HS, cur = -1;
    block_weights o = block_at(m, l);
    block_acts *a = &m->acts[l];
    const keel_backend *be = m->be;
    const keel_bf16 *x16, *dy16;
#define USE(w) (use_backward(m, &cur, o.w.unit), o.w)
#define GRAD(w) (m->unit_grads[o.w.unit] ? m->unit_grads[o.w.unit] + o.w.offset : NULL)

    /* out = mid + h W_downᵀ */
    linear_backward(m, m->dh, m->dres, grad_bf16(m, m->dres, (int64_t)N * C), a->h,
                    input_bf16(m, a->h, (int64_t)N * F), USE(wdown), N, C, F, false);
    be->swiglu_backward(m->dgate, m->dup, m->dh, a->gate, a->up, (int64_t)N * F);
    x16 = input_bf16(m, a->n2, (int64_t)N * C);
    /* up before gate: every unit's backward in reverse forward order */
    linear_backward(m, m->dn, m->dup, grad_bf16(m, m->dup, (int64_t)N * F), a->n2, x16, USE(wup), N,
                    F, C, false);
    linear_backward(m, m->dn, m->dgate, grad_bf16(m, m->dgate, (int64_t)N * F), a->n2, x16,
                    USE(wgate), N, F, C, true);
    const float *w_norm2 = norm_weight(m, USE(norm2));
    be->rmsnorm_backward(m->dres, GRAD(norm2), m->dn, a->mid, w_norm2, a->rstd2, N, C);

    /* mid = res + ao W_oᵀ */
    dy16 = grad_bf16(m, m->dres, (int64_t)N * C);
    linear_backward(m, m->dao, m->dres, dy16, a->ao, input_bf16(m, a->ao, (int64_t)N * QD), USE(wo),
                    N, C, QD, false);
    (m->bf16 ? be->attention_backward_bf16 : be->attention_backward)(
        m->dq, m->dk, m->dv, m->dao, a->ao, a->lse, a->q, a->k, a->v, m->masked ? m->kv_start : NULL, B, T,
        lay->NH, lay->NKV, lay->HS);
    be->rope_backward(m->dq, m->rope, B, T, lay->NH, lay->HS);
    be->rope_backward(m->dk, m->rope, B, T, lay->NKV, lay->HS);
    x16 = input_bf16(m, a->n1, (int64_t)N * C);
    linear_backward(m, m->dn, m->dq, grad_bf16(m, m->dq, (int64_t)N * QD), a->n1, x16, USE(wq), N, QD,
                    C, false);
    linear_backward(m, m->dn, m->dk, grad_bf16(m, m->dk, (int64_t)N * KVD), a->n1, x16, USE(wk), N,
                    KVD, C, true);
    linear_backward(m, m->dn, m->dv, grad_bf16(m, m->dv, (int64_t)N * KVD), a->n1, x16, USE(wv), N,
                    KVD, C, true);
    const float *w_norm1 = norm_weight(m, USE(norm1));
    be->rmsnorm_backward(m->dres, GRAD(norm1), m->dn, a->res, w_norm1, a->rstd1, N, C);
#undef GRAD
#undef USE
    end_backward(m, cur);
}

void keel_model_backward(keel_model *m) {
    KEEL_CHECK(m->have_dlogits, "keel_model_backward needs a forward with grad_scale != 0");
    const keel_model_layout *lay = &m->lay;
    int N = m->B * lay->T, C = lay->C, V = lay->V, head = head_unit(lay);

    /* logits = nf W_headᵀ, a chunk of rows at a time, last first: forward
     * left the last chunk's gradient in place; the others are recomputed */
    begin_backward(m, head);
    int last = (N - 1) / m->head_rows * m->head_rows;
    for (int r0 = last; r0 >= 0; r0 -= m->head_rows) {
        int rows = N - r0 < m->head_rows ? N - r0 : m->head_rows;
        if (r0 != last) head_chunk(m, r0, rows, m->grad_scale);
        const float *x = m->nf + (int64_t)r0 * C;
        linear_backward(m, m->dn + (int64_t)r0 * C, m->logits, grad_bf16(m, m->logits, (int64_t)rows * V), x,
                        input_bf16(m, x, (int64_t)rows * C), head_matrix(lay), rows, V, C, false);
    }
    m->be->zero(m->dres, sizeof(float) * (size_t)N * C);
    m->be->rmsnorm_backward(m->dres, m->unit_grads[head], m->dn, m->res_final,
                          norm_weight(m, (weight_at){head, 0, -1, 0}), m->rstdf, N, C);
    end_backward(m, head);
    for (int l = lay->L - 1; l >= 0; l--) {
        /* Recompute the block's activations from its saved input; the output
         * goes to res_final, which nothing needs after the head's backward. */
        if (l < m->recomputed_blocks) block_forward(m, l, m->res_final, true);
        block_backward(m, l);
    }

    begin_backward(m, 0);
    if (m->unit_grads[0]) m->be->embedding_backward(m->unit_grads[0], m->dres, m->inputs, N, C); /* else frozen */
    end_backward(m, 0);
    m->have_dlogits = false;
}
