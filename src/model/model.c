/* model/model.c: Llama 2 forward and backward in fp32, one rank, one micro-batch. */
#include <math.h>
#include <string.h>

#include "keel/kernels.h"
#include "keel/model.h"

/* One block's tensors, in the order of layout.c. */
typedef struct {
    float *norm1;  /* (C) */
    float *wq;     /* (NH*HS, C) */
    float *wk;     /* (NKV*HS, C) */
    float *wv;     /* (NKV*HS, C) */
    float *wo;     /* (C, NH*HS) */
    float *norm2;  /* (C) */
    float *wgate;  /* (F, C) */
    float *wup;    /* (F, C) */
    float *wdown;  /* (C, F) */
} block_ptrs;

/* Saved activations of one block for a micro-batch (N = B*T rows). */
typedef struct {
    float *res;          /* (N, C) block input */
    float *n1, *rstd1;   /* (N, C), (N) */
    float *q, *k, *v;    /* (N, NH*HS), (N, NKV*HS), (N, NKV*HS); q, k after RoPE */
    float *att;          /* (B, NH, T, T) softmax probabilities */
    float *ao;           /* (N, NH*HS) attention output before o_proj */
    float *mid;          /* (N, C) res + attention */
    float *n2, *rstd2;   /* (N, C), (N) */
    float *gate, *up, *h;/* (N, F) */
} block_acts;

struct keel_model {
    keel_model_layout lay;
    int B_max;            /* micro-batch the buffers are sized for */
    int B;                /* sequences in the current micro-batch */
    float *params;        /* (n_params) */
    float *grads;         /* (n_params) */
    /* Where each unit's parameters and gradients are read and written: into
     * params/grads by default; FSDP points them at gathered unit buffers. */
    float **unit_params;  /* (n_units) */
    float **unit_grads;   /* (n_units) */
    keel_model_hooks hooks;
    float *acts_mem;      /* every activation and scratch buffer, one allocation */
    block_acts *acts;     /* (L) */
    float *res_final;     /* (N, C) output of the last block */
    float *nf, *rstdf;    /* (N, C), (N) */
    float *logits;        /* (N, V); after a training forward, dloss/dlogits */
    int32_t *inputs, *targets; /* (N) */
    /* backward scratch */
    float *dres;          /* (N, C) */
    float *dn;            /* (N, C) */
    float *dq, *dk, *dv;  /* (N, NH*HS), (N, NKV*HS), (N, NKV*HS) */
    float *datt;          /* (B, NH, T, T) */
    float *dao;           /* (N, NH*HS) */
    float *dgate, *dup, *dh; /* (N, F) */
    float *rope;          /* (T, HS/2, 2) */
    bool have_dlogits;
    bool checkpointing;   /* blocks share one set of activations; backward recomputes */
};

/* The activation table: every buffer with its size in floats, so one
 * allocation holds them all and keel_model_activation_bytes is exact. */
typedef struct {
    float **ptr;
    int64_t floats;
} act_entry;

/* With checkpointing only each block's input is kept per layer; the rest is
 * one set that every block's forward overwrites and backward recomputes. */
static int act_table(keel_model *m, const keel_model_layout *lay, int B, bool checkpointing,
                     act_entry *tab) {
    int64_t N = (int64_t)B * lay->T, C = lay->C, F = lay->F, V = lay->V;
    int64_t QD = (int64_t)lay->NH * lay->HS, KVD = (int64_t)lay->NKV * lay->HS;
    int64_t ATT = (int64_t)B * lay->NH * lay->T * lay->T;
    int n = 0;
#define ACT(p, size) tab[n++] = (act_entry){(m ? (float **)&(p) : NULL), (size)}
    for (int l = 0; l < lay->L; l++) {
        block_acts *a = m ? &m->acts[l] : NULL;
        block_acts dummy;
        if (!a) a = &dummy;
        ACT(a->res, N * C);
        if (checkpointing && l > 0) continue; /* shares layer 0's buffers */
        ACT(a->n1, N * C); ACT(a->rstd1, N);
        ACT(a->q, N * QD); ACT(a->k, N * KVD); ACT(a->v, N * KVD);
        ACT(a->att, ATT); ACT(a->ao, N * QD); ACT(a->mid, N * C);
        ACT(a->n2, N * C); ACT(a->rstd2, N);
        ACT(a->gate, N * F); ACT(a->up, N * F); ACT(a->h, N * F);
    }
    keel_model dm;
    keel_model *mm = m ? m : &dm;
    ACT(mm->res_final, N * C); ACT(mm->nf, N * C); ACT(mm->rstdf, N); ACT(mm->logits, N * V);
    ACT(mm->inputs, N); ACT(mm->targets, N); /* int32 is float-sized */
    ACT(mm->dres, N * C); ACT(mm->dn, N * C); ACT(mm->dq, N * QD); ACT(mm->dk, N * KVD);
    ACT(mm->dv, N * KVD); ACT(mm->datt, ATT); ACT(mm->dao, N * QD);
    ACT(mm->dgate, N * F); ACT(mm->dup, N * F); ACT(mm->dh, N * F);
    ACT(mm->rope, (int64_t)lay->T * lay->HS);
#undef ACT
    return n;
}

static int act_table_len(const keel_model_layout *lay) { return lay->L * 14 + 18; }

int64_t keel_model_activation_bytes(const keel_model_layout *lay, int B, bool checkpointing) {
    act_entry *tab = keel_xmalloc(sizeof(act_entry) * (size_t)act_table_len(lay), "act table");
    int n = act_table(NULL, lay, B, checkpointing, tab);
    int64_t bytes = 0;
    for (int i = 0; i < n; i++) bytes += (tab[i].floats + 15) / 16 * 16 * (int64_t)sizeof(float);
    keel_free(tab);
    return bytes;
}

keel_status keel_model_build_with(const keel_model_config *cfg, int B,
                                  const keel_model_options *opts, keel_model **out) {
    bool own_params = opts->own_params;
    keel_model *m = keel_xcalloc(sizeof *m, "model");
    keel_model_layout_init(&m->lay, cfg);
    m->B_max = m->B = B;
    m->checkpointing = opts->checkpoint_activations;
    if (own_params) {
        m->params = keel_xcalloc(sizeof(float) * (size_t)m->lay.n_params, "parameters");
        m->grads = keel_xcalloc(sizeof(float) * (size_t)m->lay.n_params, "gradients");
    }
    m->acts = keel_xcalloc(sizeof(block_acts) * (size_t)m->lay.L, "activation table");
    m->unit_params = keel_xcalloc(sizeof(float *) * (size_t)m->lay.n_units, "unit pointers");
    m->unit_grads = keel_xcalloc(sizeof(float *) * (size_t)m->lay.n_units, "unit pointers");
    for (int u = 0; own_params && u < m->lay.n_units; u++)
        keel_model_set_unit_buffers(m, u, m->params + m->lay.unit_offset[u],
                                    m->grads + m->lay.unit_offset[u]);

    act_entry *tab = keel_xmalloc(sizeof(act_entry) * (size_t)act_table_len(&m->lay), "act table");
    int n = act_table(m, &m->lay, B, m->checkpointing, tab);
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += (tab[i].floats + 15) / 16 * 16; /* keep 64-byte alignment */
    m->acts_mem = keel_xcalloc(sizeof(float) * (size_t)total, "activations");
    float *p = m->acts_mem;
    for (int i = 0; i < n; i++) {
        *tab[i].ptr = p;
        p += (tab[i].floats + 15) / 16 * 16;
    }
    keel_free(tab);
    for (int l = 1; m->checkpointing && l < m->lay.L; l++) {
        float *res = m->acts[l].res;
        m->acts[l] = m->acts[0];
        m->acts[l].res = res;
    }
    keel_rope_table(m->rope, m->lay.T, m->lay.HS, cfg->rope_theta);
    *out = m;
    return KEEL_OK;
}

keel_status keel_model_build(const keel_model_config *cfg, int B, keel_model **out) {
    keel_model_options opts = {.own_params = true};
    return keel_model_build_with(cfg, B, &opts, out);
}

void keel_model_free(keel_model *m) {
    if (!m) return;
    keel_free(m->params);
    keel_free(m->grads);
    keel_free(m->acts_mem);
    keel_free(m->acts);
    keel_free(m->unit_params);
    keel_free(m->unit_grads);
    keel_model_layout_free(&m->lay);
    keel_free(m);
}

const keel_model_layout *keel_model_get_layout(const keel_model *m) { return &m->lay; }
float *keel_model_params(keel_model *m) { return m->params; }
float *keel_model_grads(keel_model *m) { return m->grads; }

void keel_model_set_unit_buffers(keel_model *m, int unit, float *params, float *grads) {
    KEEL_CHECK(unit >= 0 && unit < m->lay.n_units, "unit %d of %d", unit, m->lay.n_units);
    m->unit_params[unit] = params;
    m->unit_grads[unit] = grads;
}

void keel_model_set_hooks(keel_model *m, const keel_model_hooks *hooks) {
    m->hooks = hooks ? *hooks : (keel_model_hooks){0};
}

static void hook(const keel_model *m, keel_model_hook_fn fn, int unit) {
    if (fn) fn(m->hooks.ctx, unit);
}

void keel_model_zero_grads(keel_model *m) {
    KEEL_CHECK(m->grads, "keel_model_zero_grads on a model without its own gradients");
    memset(m->grads, 0, sizeof(float) * (size_t)m->lay.n_params);
}

/* splitmix64: a tiny, well-mixed generator for reproducible initialisation. */
static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double uniform01(uint64_t *state) { return ((double)(splitmix64(state) >> 11) + 0.5) / 9007199254740992.0; }

void keel_model_init_weights(keel_model *m, uint64_t seed) {
    KEEL_CHECK(m->params, "keel_model_init_weights on a model without its own parameters");
    keel_model_init_params(&m->lay, seed, m->params);
}

void keel_model_init_params(const keel_model_layout *lay, uint64_t seed, float *params) {
    for (int i = 0; i < lay->n_tensors; i++) {
        const keel_tensor_info *t = &lay->tensors[i];
        float *w = params + t->offset;
        int64_t n = t->rows * t->cols;
        if (t->cols == 1) { /* norm weights */
            for (int64_t j = 0; j < n; j++) w[j] = 1.0f;
            continue;
        }
        uint64_t state = seed * 0x100000001B3ull + (uint64_t)i;
        for (int64_t j = 0; j < n; j += 2) { /* Box–Muller, two normals per draw */
            double u1 = uniform01(&state), u2 = uniform01(&state);
            double r = 0.02 * sqrt(-2.0 * log(u1));
            w[j] = (float)(r * cos(2.0 * M_PI * u2));
            if (j + 1 < n) w[j + 1] = (float)(r * sin(2.0 * M_PI * u2));
        }
    }
}

/* The tensors of a block whose unit starts at p. */
static block_ptrs block_at(const keel_model_layout *lay, float *p) {
    int64_t C = lay->C, F = lay->F, QD = (int64_t)lay->NH * lay->HS, KVD = (int64_t)lay->NKV * lay->HS;
    block_ptrs b;
    b.norm1 = p; p += C;
    b.wq = p; p += QD * C;
    b.wk = p; p += KVD * C;
    b.wv = p; p += KVD * C;
    b.wo = p; p += C * QD;
    b.norm2 = p; p += C;
    b.wgate = p; p += F * C;
    b.wup = p; p += F * C;
    b.wdown = p;
    return b;
}

/* The output head: lm_head after the final norm in the head unit, or the
 * embedding when tied. */
static float *head_matrix(const keel_model_layout *lay, float *const *units) {
    return lay->cfg.tie_embeddings ? units[0] : units[lay->L + 1] + lay->C;
}

static void block_forward(keel_model *m, int l, float *out) {
    const keel_model_layout *lay = &m->lay;
    int B = m->B, T = lay->T, N = B * T, C = lay->C, F = lay->F;
    int QD = lay->NH * lay->HS, KVD = lay->NKV * lay->HS;
    block_ptrs w = block_at(lay, m->unit_params[1 + l]);
    block_acts *a = &m->acts[l];
    float eps = (float)lay->cfg.norm_eps;

    keel_rmsnorm_forward(a->n1, a->rstd1, a->res, w.norm1, N, C, eps);
    keel_matmul_forward(a->q, a->n1, w.wq, N, QD, C, false);
    keel_matmul_forward(a->k, a->n1, w.wk, N, KVD, C, false);
    keel_matmul_forward(a->v, a->n1, w.wv, N, KVD, C, false);
    keel_rope_forward(a->q, m->rope, B, T, lay->NH, lay->HS);
    keel_rope_forward(a->k, m->rope, B, T, lay->NKV, lay->HS);
    keel_attention_forward(a->ao, a->att, a->q, a->k, a->v, B, T, lay->NH, lay->NKV, lay->HS);
    memcpy(a->mid, a->res, sizeof(float) * (size_t)N * C);
    keel_matmul_forward(a->mid, a->ao, w.wo, N, C, QD, true);

    keel_rmsnorm_forward(a->n2, a->rstd2, a->mid, w.norm2, N, C, eps);
    keel_matmul_forward(a->gate, a->n2, w.wgate, N, F, C, false);
    keel_matmul_forward(a->up, a->n2, w.wup, N, F, C, false);
    keel_swiglu_forward(a->h, a->gate, a->up, (int64_t)N * F);
    memcpy(out, a->mid, sizeof(float) * (size_t)N * C);
    keel_matmul_forward(out, a->h, w.wdown, N, C, F, true);
}

double keel_model_forward(keel_model *m, const int32_t *tokens, int n_seqs, float grad_scale) {
    KEEL_CHECK(n_seqs >= 1 && n_seqs <= m->B_max, "n_seqs %d outside [1, %d]", n_seqs, m->B_max);
    m->B = n_seqs;
    const keel_model_layout *lay = &m->lay;
    int B = m->B, T = lay->T, N = B * T, C = lay->C, V = lay->V;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            m->inputs[b * T + t] = tokens[(int64_t)b * (T + 1) + t];
            m->targets[b * T + t] = tokens[(int64_t)b * (T + 1) + t + 1];
        }
    hook(m, m->hooks.before_forward, 0);
    const float *embed = m->unit_params[0];
    for (int i = 0; i < N; i++)
        memcpy(m->acts[0].res + (int64_t)i * C, embed + (int64_t)m->inputs[i] * C, sizeof(float) * (size_t)C);
    hook(m, m->hooks.after_forward, 0);
    for (int l = 0; l < lay->L; l++) {
        hook(m, m->hooks.before_forward, 1 + l);
        block_forward(m, l, l + 1 < lay->L ? m->acts[l + 1].res : m->res_final);
        hook(m, m->hooks.after_forward, 1 + l);
    }
    int head = lay->L + 1;
    hook(m, m->hooks.before_forward, head);
    keel_rmsnorm_forward(m->nf, m->rstdf, m->res_final, m->unit_params[head], N, C,
                         (float)lay->cfg.norm_eps);
    keel_matmul_forward(m->logits, m->nf, head_matrix(lay, m->unit_params), N, V, C, false);
    hook(m, m->hooks.after_forward, head);
    m->have_dlogits = grad_scale != 0.0f;
    return keel_xent_forward_backward(m->logits, m->targets, N, V, grad_scale);
}

/* On entry m->dres holds dloss/d(output of block l); on exit dloss/d(input). */
static void block_backward(keel_model *m, int l) {
    const keel_model_layout *lay = &m->lay;
    int B = m->B, T = lay->T, N = B * T, C = lay->C, F = lay->F;
    int QD = lay->NH * lay->HS, KVD = lay->NKV * lay->HS;
    block_ptrs w = block_at(lay, m->unit_params[1 + l]), g = block_at(lay, m->unit_grads[1 + l]);
    block_acts *a = &m->acts[l];

    /* out = mid + h W_downᵀ */
    keel_matmul_backward(m->dh, g.wdown, m->dres, a->h, w.wdown, N, C, F, false);
    keel_swiglu_backward(m->dgate, m->dup, m->dh, a->gate, a->up, (int64_t)N * F);
    keel_matmul_backward(m->dn, g.wgate, m->dgate, a->n2, w.wgate, N, F, C, false);
    keel_matmul_backward(m->dn, g.wup, m->dup, a->n2, w.wup, N, F, C, true);
    keel_rmsnorm_backward(m->dres, g.norm2, m->dn, a->mid, w.norm2, a->rstd2, N, C);

    /* mid = res + ao W_oᵀ */
    keel_matmul_backward(m->dao, g.wo, m->dres, a->ao, w.wo, N, C, QD, false);
    keel_attention_backward(m->dq, m->dk, m->dv, m->datt, m->dao, a->q, a->k, a->v, a->att, B, T,
                            lay->NH, lay->NKV, lay->HS);
    keel_rope_backward(m->dq, m->rope, B, T, lay->NH, lay->HS);
    keel_rope_backward(m->dk, m->rope, B, T, lay->NKV, lay->HS);
    keel_matmul_backward(m->dn, g.wq, m->dq, a->n1, w.wq, N, QD, C, false);
    keel_matmul_backward(m->dn, g.wk, m->dk, a->n1, w.wk, N, KVD, C, true);
    keel_matmul_backward(m->dn, g.wv, m->dv, a->n1, w.wv, N, KVD, C, true);
    keel_rmsnorm_backward(m->dres, g.norm1, m->dn, a->res, w.norm1, a->rstd1, N, C);
}

void keel_model_backward(keel_model *m) {
    KEEL_CHECK(m->have_dlogits, "keel_model_backward needs a forward with grad_scale != 0");
    const keel_model_layout *lay = &m->lay;
    int N = m->B * lay->T, C = lay->C, V = lay->V, head = lay->L + 1;

    /* logits = nf W_headᵀ; nf = rmsnorm(res_final) */
    hook(m, m->hooks.before_backward, head);
    keel_matmul_backward(m->dn, head_matrix(lay, m->unit_grads), m->logits, m->nf,
                         head_matrix(lay, m->unit_params), N, V, C, false);
    memset(m->dres, 0, sizeof(float) * (size_t)N * C);
    keel_rmsnorm_backward(m->dres, m->unit_grads[head], m->dn, m->res_final, m->unit_params[head],
                          m->rstdf, N, C);
    hook(m, m->hooks.after_backward, head);
    for (int l = lay->L - 1; l >= 0; l--) {
        hook(m, m->hooks.before_backward, 1 + l);
        /* Recompute the block's activations from its saved input; the output
         * goes to res_final, which nothing needs after the head's backward. */
        if (m->checkpointing) block_forward(m, l, m->res_final);
        block_backward(m, l);
        hook(m, m->hooks.after_backward, 1 + l);
    }

    hook(m, m->hooks.before_backward, 0);
    float *dembed = m->unit_grads[0]; /* sequential so repeated tokens add in a fixed order */
    for (int i = 0; i < N; i++) {
        float *row = dembed + (int64_t)m->inputs[i] * C;
        const float *d = m->dres + (int64_t)i * C;
        for (int j = 0; j < C; j++) row[j] += d[j];
    }
    hook(m, m->hooks.after_backward, 0);
    m->have_dlogits = false;
}
