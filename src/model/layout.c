/* model/layout.c: where each Llama 2 tensor lives in the flat parameter vector. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "keel/model.h"

keel_status keel_params_from_buffer(void *params, int64_t begin, int64_t len, float *dst) {
    memcpy(dst, (const float *)params + begin, sizeof(float) * (size_t)len);
    return KEEL_OK;
}

int keel_model_ffn_hidden(const keel_model_config *cfg) {
    int64_t hidden = 2 * (4 * (int64_t)cfg->dim) / 3;
    if (cfg->ffn_dim_multiplier > 0) hidden = (int64_t)(cfg->ffn_dim_multiplier * (double)hidden);
    return (int)(cfg->multiple_of * ((hidden + cfg->multiple_of - 1) / cfg->multiple_of));
}

static void add(keel_model_layout *lay, int unit, const char *name, int64_t rows, int64_t cols,
                bool norm_or_embedding) {
    keel_tensor_info *t = &lay->tensors[lay->n_tensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->unit = unit;
    t->offset = lay->n_params;
    t->rows = rows;
    t->cols = cols;
    t->is_norm_or_embedding = norm_or_embedding;
    lay->n_params += rows * cols;
    lay->unit_size[unit] += rows * cols;
}

void keel_model_layout_init(keel_model_layout *lay, const keel_model_config *cfg) {
    keel_model_layout_init_units(lay, cfg, KEEL_UNIT_BLOCK);
}

/* A block's tensors in order, and with matrix units the unit (from the
 * block's first) each joins: every unit is used without a break in forward
 * (0..4) and in backward (4..0), norms travelling with their neighbour. */
static const struct {
    const char *suffix;
    int sub_unit;
} BLOCK_TENSORS[KEEL_BLOCK_TENSORS] = {
    {"input_layernorm.weight", 0},  {"self_attn.q_proj.weight", 0}, {"self_attn.k_proj.weight", 0},
    {"self_attn.v_proj.weight", 0}, {"self_attn.o_proj.weight", 1}, {"post_attention_layernorm.weight", 1},
    {"mlp.gate_proj.weight", 2},    {"mlp.up_proj.weight", 3},      {"mlp.down_proj.weight", 4},
};

void keel_model_layout_init_units(keel_model_layout *lay, const keel_model_config *cfg, keel_unit_kind kind) {
    memset(lay, 0, sizeof *lay);
    lay->cfg = *cfg;
    lay->C = cfg->dim;
    lay->L = cfg->n_layers;
    lay->NH = cfg->n_heads;
    lay->NKV = cfg->n_kv_heads ? cfg->n_kv_heads : cfg->n_heads;
    lay->HS = cfg->dim / cfg->n_heads;
    lay->F = keel_model_ffn_hidden(cfg);
    lay->V = cfg->vocab_size;
    lay->T = cfg->max_seq_len;
    lay->units_per_block = kind == KEEL_UNIT_MATRIX ? KEEL_BLOCK_MATRIX_UNITS : 1;
    lay->n_units = lay->L * lay->units_per_block + 2;
    lay->tensors = keel_xcalloc(sizeof(keel_tensor_info) * (size_t)(lay->L * KEEL_BLOCK_TENSORS + 3),
                                "tensor table");
    lay->unit_offset = keel_xcalloc(sizeof(int64_t) * (size_t)lay->n_units, "unit offsets");
    lay->unit_size = keel_xcalloc(sizeof(int64_t) * (size_t)lay->n_units, "unit sizes");
    int C = lay->C, F = lay->F, QD = lay->NH * lay->HS, KVD = lay->NKV * lay->HS;

    add(lay, 0, "model.embed_tokens.weight", lay->V, C, true);
    int64_t rows[KEEL_BLOCK_TENSORS] = {C, QD, KVD, KVD, C, C, F, F, C};
    int64_t cols[KEEL_BLOCK_TENSORS] = {1, C, C, C, QD, 1, C, C, F};
    for (int l = 0; l < lay->L; l++)
        for (int k = 0; k < KEEL_BLOCK_TENSORS; k++) {
            int u = keel_model_block_unit(lay, l) + (lay->units_per_block > 1 ? BLOCK_TENSORS[k].sub_unit : 0);
            if (lay->unit_size[u] == 0) lay->unit_offset[u] = lay->n_params;
            char name[64];
            snprintf(name, sizeof name, "model.layers.%d.%s", l, BLOCK_TENSORS[k].suffix);
            add(lay, u, name, rows[k], cols[k], cols[k] == 1);
        }
    int head = lay->n_units - 1;
    lay->unit_offset[head] = lay->n_params;
    add(lay, head, "model.norm.weight", C, 1, true);
    if (!cfg->tie_embeddings) add(lay, head, "lm_head.weight", lay->V, C, false);
}

void keel_model_layout_free(keel_model_layout *lay) {
    keel_free(lay->tensors);
    keel_free(lay->unit_offset);
    keel_free(lay->unit_size);
    keel_free(lay->lora_a);
    memset(lay, 0, sizeof *lay);
}

static double matmul_params(const keel_model_layout *lay) {
    double n = 0;
    for (int i = 0; i < lay->n_tensors; i++)
        if (lay->tensors[i].cols > 1 && lay->tensors[i].unit != 0) /* embedding is a lookup */
            n += (double)(lay->tensors[i].rows * lay->tensors[i].cols);
    if (lay->cfg.tie_embeddings) n += (double)lay->V * lay->C;
    return n;
}

double keel_model_flops_per_token(const keel_model_layout *lay) {
    return 6.0 * matmul_params(lay) + 12.0 * lay->L * lay->C * lay->T;
}

void keel_model_unit_flops(const keel_model_layout *lay, const keel_model_layout *lora, double *fwd, double *bwd) {
    int n = lay->n_units;
    double matrix_bwd = lora ? 1 : 2; /* a frozen matrix: the input's gradient, not its own */
    for (int u = 0; u < n; u++) fwd[u] = bwd[u] = 0;
    for (int i = 0; i < lay->n_tensors; i++) {
        const keel_tensor_info *t = &lay->tensors[i];
        if (t->cols > 1 && t->unit != 0) fwd[t->unit] += 2.0 * (double)t->rows * t->cols; /* embedding: a lookup */
    }
    if (lay->cfg.tie_embeddings) fwd[n - 1] += 2.0 * lay->V * lay->C;
    for (int u = 0; u < n; u++) bwd[u] = matrix_bwd * fwd[u];
    for (int l = 0; l < lay->L; l++) {
        int u = keel_model_block_unit(lay, l);
        fwd[u] += 4.0 * lay->C * lay->T;
        bwd[u] += 8.0 * lay->C * lay->T;
    }
    for (int i = 0; lora && i < lora->n_tensors; i++) {
        const keel_tensor_info *t = &lora->tensors[i];
        double size = (double)(t->rows * t->cols);
        fwd[t->unit] += 2 * size;
        bwd[t->unit] += (strstr(t->name, ".lora_A.") ? 6.0 : 4.0) * size;
    }
}

double keel_model_train_flops_per_token(const keel_model_layout *lay, const keel_model_layout *lora) {
    double *f = keel_xmalloc(sizeof(double) * 2 * (size_t)lay->n_units, "unit flops"), sum = 0;
    keel_model_unit_flops(lay, lora, f, f + lay->n_units);
    for (int u = 0; u < 2 * lay->n_units; u++) sum += f[u];
    keel_free(f);
    return sum;
}

/* The block tensor (BLOCK_TENSORS' index) each LoRA target adapts. */
static const int TARGET_TENSOR[KEEL_LORA_TARGETS] = {1, 2, 3, 4, 6, 7, 8};

keel_status keel_lora_layout_init(keel_model_layout *lora, const keel_model_layout *base, const keel_lora_config *cfg,
                                  char *why, size_t why_n) {
    memset(lora, 0, sizeof *lora);
    int C = base->C, F = base->F, QD = base->NH * base->HS, KVD = base->NKV * base->HS;
    int64_t rows[KEEL_BLOCK_TENSORS] = {C, QD, KVD, KVD, C, C, F, F, C};
    int64_t cols[KEEL_BLOCK_TENSORS] = {1, C, C, C, QD, 1, C, C, F};
    for (int t = 0; t < KEEL_LORA_TARGETS; t++) {
        int k = TARGET_TENSOR[t];
        int64_t side = rows[k] < cols[k] ? rows[k] : cols[k];
        if (cfg->targets & (1u << t) && cfg->rank > side) {
            snprintf(why, why_n, "train.lora.rank %d is more than %s's smaller side %lld: use a rank of at most %lld",
                     cfg->rank, keel_lora_target_name((keel_lora_target)t), (long long)side, (long long)side);
            return KEEL_ERR_INPUT;
        }
    }
    *lora = *base;
    lora->lora = *cfg;
    lora->n_tensors = 0;
    lora->n_params = 0;
    lora->tensors = keel_xcalloc(sizeof(keel_tensor_info) * (size_t)(2 * base->L * KEEL_LORA_TARGETS + 1),
                                 "adapter table");
    lora->unit_offset = keel_xcalloc(sizeof(int64_t) * (size_t)base->n_units, "unit offsets");
    lora->unit_size = keel_xcalloc(sizeof(int64_t) * (size_t)base->n_units, "unit sizes");
    lora->lora_a = keel_xmalloc(sizeof(int) * (size_t)base->L * KEEL_LORA_TARGETS, "adapter index");
    for (int i = 0; i < base->L * KEEL_LORA_TARGETS; i++) lora->lora_a[i] = -1;
    for (int u = 0; u < base->n_units; u++) { /* units in order; a unit's offset is where its first adapter goes */
        lora->unit_offset[u] = lora->n_params;
        for (int l = 0; l < base->L; l++)
            for (int t = 0; t < KEEL_LORA_TARGETS; t++) {
                const keel_tensor_info *w = &base->tensors[1 + l * KEEL_BLOCK_TENSORS + TARGET_TENSOR[t]];
                if (!(cfg->targets & (1u << t)) || w->unit != u) continue;
                lora->lora_a[l * KEEL_LORA_TARGETS + t] = lora->n_tensors;
                char name[64];
                int dot = (int)(strrchr(w->name, '.') - w->name); /* "...q_proj" of "...q_proj.weight" */
                snprintf(name, sizeof name, "%.*s.lora_A.weight", dot, w->name);
                add(lora, u, name, cfg->rank, w->cols, false);
                snprintf(name, sizeof name, "%.*s.lora_B.weight", dot, w->name);
                add(lora, u, name, w->rows, cfg->rank, false);
            }
    }
    return KEEL_OK;
}

void keel_lora_init_range(const keel_model_layout *lora, uint64_t seed, int64_t begin, int64_t len, float *out) {
    int64_t end = begin + len;
    for (int i = 0; i < lora->n_tensors; i++) {
        const keel_tensor_info *t = &lora->tensors[i];
        int64_t lo = t->offset > begin ? t->offset : begin, hi = t->offset + t->rows * t->cols;
        if (hi > end) hi = end;
        bool is_a = strstr(t->name, ".lora_A.") != NULL;
        double bound = 1.0 / sqrt((double)t->cols); /* A (r, in): fan_in = in */
        uint64_t key = keel_hash64(seed ^ 0x4C6F5241ull /* "LoRA" */) + 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
        for (int64_t j = lo; j < hi; j++) {
            double u = (double)(keel_hash64(key + 0x9E3779B97F4A7C15ull * (uint64_t)(j - t->offset)) >> 11) /
                       9007199254740992.0; /* [0, 1) */
            out[j - begin] = is_a ? (float)((2 * u - 1) * bound) : 0.0f;
        }
    }
}

void keel_lora_merge_unit(const keel_model_layout *base, const keel_model_layout *lora, int u, float *base_unit,
                          const float *lora_unit) {
    int r = lora->lora.rank;
    float s = (float)(lora->lora.alpha / r);
    for (int l = 0; l < base->L; l++)
        for (int t = 0; t < KEEL_LORA_TARGETS; t++) {
            int ia = lora->lora_a[l * KEEL_LORA_TARGETS + t];
            const keel_tensor_info *W = &base->tensors[1 + l * KEEL_BLOCK_TENSORS + TARGET_TENSOR[t]];
            if (ia < 0 || W->unit != u) continue;
            const float *A = lora_unit + (lora->tensors[ia].offset - lora->unit_offset[u]);
            const float *Bm = lora_unit + (lora->tensors[ia + 1].offset - lora->unit_offset[u]);
            int64_t O = W->rows, I = W->cols;
            /* W (O, I) += s · B (O, r) · A (r, I), row by row: the inner loop runs along A's and W's rows */
            float *w = base_unit + (W->offset - base->unit_offset[u]);
            for (int64_t o = 0; o < O; o++)
                for (int k = 0; k < r; k++) {
                    float b = s * Bm[o * r + k];
                    const float *a = A + (int64_t)k * I;
                    float *row = w + o * I;
                    for (int64_t i = 0; i < I; i++) row[i] += b * a[i];
                }
        }
}
