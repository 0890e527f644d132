/* LoRA in the model (train.lora): the adapters' layout (PEFT's names, the
 * base's units, the rank refused where it does not fit), PEFT's
 * initialisation (B zero, A within ±1/sqrt(in), any slice alone), and the
 * forward and backward against the model they are equivalent to: without
 * dropout, W + (alpha/r)·B·A in place of W gives the same loss, and the
 * plain model's gradient G of that matrix gives the adapters' exactly as
 * dB = s·G·Aᵀ and dA = s·Bᵀ·G — checked for every target, fp32 and bf16, block
 * and matrix units, with activation checkpointing. The base gets no
 * gradient. Dropout: the same keys give the same loss and gradients
 * (recomputation included), other keys other ones, a central difference
 * agrees with dA, and the mask drops p of the elements. Against Hugging Face
 * PEFT (tests/reference/make_lora_golden.py): keel's initial adapters are the
 * fixture's bit for bit, and 10 AdamW steps of LoRA on llama_micro follow
 * PEFT + transformers' losses and gradient norms within the golden
 * trajectory's tolerance, ending at its adapters. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "keel/kernels.h"
#include "keel/model.h"
#include "keel/optim.h"
#include "../testlib.h"

static keel_model_config tiny(void) {
    return (keel_model_config){.dim = 32, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .vocab_size = 53,
                               .multiple_of = 16, .norm_eps = 1e-5, .rope_theta = 10000, .max_seq_len = 12};
}

enum { B = 2 };

static void tokens_of(const keel_model_config *mc, int32_t *tok) {
    for (int i = 0; i < B * (mc->max_seq_len + 1); i++) tok[i] = (i * 29 + 7) % mc->vocab_size;
}

static void check_layout(void) {
    keel_model_config mc = tiny();
    keel_model_layout base, lora;
    keel_model_layout_init_units(&base, &mc, KEEL_UNIT_MATRIX);
    keel_lora_config lc = {.on = true, .rank = 4, .alpha = 8, .targets = 1u << KEEL_LORA_Q | 1u << KEEL_LORA_DOWN};
    char why[256] = "";
    EXPECT(keel_lora_layout_init(&lora, &base, &lc, why, sizeof why) == KEEL_OK, "adapter layout: %s", why);
    EXPECT(lora.n_tensors == 2 * 2 * 2, "2 layers x 2 targets x (A, B): %d tensors", lora.n_tensors);
    const keel_tensor_info *a = &lora.tensors[0], *b = &lora.tensors[1];
    EXPECT(!strcmp(a->name, "model.layers.0.self_attn.q_proj.lora_A.weight") && a->rows == 4 && a->cols == 32,
           "first: %s (%lld, %lld)", a->name, (long long)a->rows, (long long)a->cols);
    EXPECT(!strcmp(b->name, "model.layers.0.self_attn.q_proj.lora_B.weight") && b->rows == 32 && b->cols == 4,
           "second: %s (%lld, %lld)", b->name, (long long)b->rows, (long long)b->cols);
    int down = lora.lora_a[1 * KEEL_LORA_TARGETS + KEEL_LORA_DOWN];
    const keel_tensor_info *d = &lora.tensors[down];
    EXPECT(down >= 0 && d->unit == base.tensors[1 + KEEL_BLOCK_TENSORS + 8].unit && d->cols == base.F,
           "layer 1's down_proj adapter sits in its matrix's unit %d (%s)", d->unit, d->name);
    EXPECT(lora.lora_a[KEEL_LORA_K] == -1 && lora.unit_size[0] == 0 && lora.unit_size[lora.n_units - 1] == 0,
           "no adapter for k_proj, none in the embedding's or head's unit");
    int64_t sum = 0;
    for (int u = 0; u < lora.n_units; u++) sum += lora.unit_size[u];
    EXPECT(sum == lora.n_params && lora.n_params == 2 * (4 * 32 + 32 * 4 + 4 * base.F + 32 * 4),
           "the units add up to the %lld adapter parameters", (long long)lora.n_params);
    keel_model_layout_free(&lora);

    lc.rank = 17;
    lc.targets = 1u << KEEL_LORA_K; /* (16, 32): KV heads 2 x head size 8 */
    EXPECT(keel_lora_layout_init(&lora, &base, &lc, why, sizeof why) == KEEL_ERR_INPUT && strstr(why, "k_proj") &&
               strstr(why, "at most 16"),
           "a rank above k_proj's 16 rows is refused: %s", why);
    keel_model_layout_free(&base);
}

static void check_init(void) {
    keel_model_config mc = tiny();
    keel_model_layout base, lora;
    keel_model_layout_init(&base, &mc);
    keel_lora_config lc = {.on = true, .rank = 8, .alpha = 16, .targets = (1u << KEEL_LORA_TARGETS) - 1};
    char why[256];
    keel_lora_layout_init(&lora, &base, &lc, why, sizeof why);
    int64_t n = lora.n_params;
    float *all = keel_xmalloc(sizeof(float) * (size_t)n, "adapters"), *part = keel_xmalloc(sizeof(float) * 1000, "part");
    keel_lora_init_range(&lora, 7, 0, n, all);
    bool ok = true;
    double sum_a = 0, sum_a2 = 0;
    int64_t n_a = 0;
    for (int i = 0; i < lora.n_tensors; i++) {
        const keel_tensor_info *t = &lora.tensors[i];
        bool is_a = strstr(t->name, "lora_A") != NULL;
        double bound = 1.0 / sqrt((double)t->cols);
        for (int64_t j = 0; j < t->rows * t->cols; j++) {
            float v = all[t->offset + j];
            ok &= is_a ? fabs(v) <= bound : v == 0.0f;
            if (is_a) sum_a += v / bound, sum_a2 += (v / bound) * (v / bound), n_a++;
        }
    }
    EXPECT(ok, "every B is zero and every A within ±1/sqrt(in)");
    double mean = sum_a / (double)n_a, var = sum_a2 / (double)n_a - mean * mean;
    EXPECT(fabs(mean) < 0.05 && fabs(var - 1.0 / 3) < 0.03, "A is uniform: mean %.4f, variance %.4f (1/3) in bound units",
           mean, var);
    keel_lora_init_range(&lora, 7, 123, 1000, part);
    EXPECT(!memcmp(part, all + 123, sizeof(float) * 1000), "a slice alone equals that slice of the whole");
    keel_lora_init_range(&lora, 8, 0, 1000, part);
    EXPECT(memcmp(part, all, sizeof(float) * 1000) != 0, "another seed, other adapters");
    keel_free(all);
    keel_free(part);
    keel_model_layout_free(&lora);
    keel_model_layout_free(&base);
}

/* One step of the LoRA model (base from seed 3, adapters from seed 9 with a
 * random B, so that every gradient is non-zero): the loss, the adapters, their
 * gradients. */
typedef struct {
    bool bf16, ckpt;
    keel_unit_kind unit;
    keel_lora_config lc;
    const uint64_t *keys; /* dropout keys, or NULL */
    const float *adapters; /* start from these instead of the seeded ones */
} lora_run;

static double lora_step(const lora_run *r, float **adapters, float **grads, int64_t *n) {
    keel_model_config mc = tiny();
    int32_t tok[B * 13];
    tokens_of(&mc, tok);
    keel_model_options opts = {.own_params = true, .bf16 = r->bf16, .unit = r->unit,
                               .checkpoint_blocks = r->ckpt ? KEEL_CHECKPOINT_ALL : 0, .lora = &r->lc};
    keel_model *m;
    if (keel_model_build_with(&mc, B, &opts, &m) != KEEL_OK) abort();
    keel_model_init_weights(m, 3);
    const keel_model_layout *ll = keel_model_lora_layout(m);
    *n = ll->n_params;
    float *p = keel_model_lora_params(m);
    if (r->adapters) memcpy(p, r->adapters, sizeof(float) * (size_t)*n);
    else {
        keel_lora_init_range(ll, 9, 0, *n, p);
        for (int i = 0; i < ll->n_tensors; i++) /* B random too */
            if (strstr(ll->tensors[i].name, "lora_B"))
                for (int64_t j = 0; j < ll->tensors[i].rows * ll->tensors[i].cols; j++)
                    p[ll->tensors[i].offset + j] = 0.05f * (float)sin(0.7 * (double)j + i);
    }
    keel_model_zero_grads(m);
    if (r->keys) keel_model_set_dropout_keys(m, r->keys, B);
    double loss = keel_model_forward(m, tok, NULL, B, 1.0f / (B * mc.max_seq_len));
    keel_model_backward(m);
    if (adapters) *adapters = keel_xmalloc(sizeof(float) * (size_t)*n, "adapters");
    if (adapters) memcpy(*adapters, p, sizeof(float) * (size_t)*n);
    *grads = keel_xmalloc(sizeof(float) * (size_t)*n, "adapter grads");
    memcpy(*grads, keel_model_lora_grads(m), sizeof(float) * (size_t)*n);
    keel_model_free(m);
    return loss * (1.0 / (B * mc.max_seq_len));
}

/* The first adapted matrix at or after stream `at` (l * KEEL_LORA_TARGETS +
 * target): its index, with *W the base's matrix and *ia its A's tensor; -1
 * when none is left. */
static int next_adapter(const keel_model_layout *lay, const keel_model_layout *ll, int at, const keel_tensor_info **W,
                        int *ia) {
    static const int TENSOR[KEEL_LORA_TARGETS] = {1, 2, 3, 4, 6, 7, 8}; /* q k v o gate up down in a block */
    for (; at < lay->L * KEEL_LORA_TARGETS; at++)
        if ((*ia = ll->lora_a[at]) >= 0) {
            *W = &lay->tensors[1 + at / KEEL_LORA_TARGETS * KEEL_BLOCK_TENSORS + TENSOR[at % KEEL_LORA_TARGETS]];
            return at;
        }
    return -1;
}

/* The plain model with W + s·B·A merged into every targeted matrix: its loss
 * and each adapter's gradient from its matrix's, dB = s G Aᵀ, dA = s Bᵀ G. */
static double merged_step(const lora_run *r, const float *adapters, double *want, int64_t n) {
    keel_model_config mc = tiny();
    int32_t tok[B * 13];
    tokens_of(&mc, tok);
    keel_model_options opts = {.own_params = true, .bf16 = r->bf16, .unit = r->unit};
    keel_model *m;
    keel_model_build_with(&mc, B, &opts, &m);
    keel_model_init_weights(m, 3);
    const keel_model_layout *lay = keel_model_get_layout(m);
    keel_model_layout ll;
    char why[256];
    keel_lora_layout_init(&ll, lay, &r->lc, why, sizeof why);
    float *w = keel_model_params(m), s = (float)(r->lc.alpha / r->lc.rank);
    int R = r->lc.rank;
    const keel_tensor_info *W;
    int ia;
    for (int at = 0; (at = next_adapter(lay, &ll, at, &W, &ia)) >= 0; at++) {
        const float *A = adapters + ll.tensors[ia].offset, *Bm = adapters + ll.tensors[ia + 1].offset;
        for (int64_t o = 0; o < W->rows; o++)
            for (int64_t i = 0; i < W->cols; i++) {
                double acc = 0;
                for (int k = 0; k < R; k++) acc += (double)Bm[o * R + k] * A[k * W->cols + i];
                w[W->offset + o * W->cols + i] += (float)(s * acc);
            }
    }
    keel_model_params_changed(m);
    keel_model_zero_grads(m);
    double loss = keel_model_forward(m, tok, NULL, B, 1.0f / (B * mc.max_seq_len));
    keel_model_backward(m);
    const float *g = keel_model_grads(m);
    memset(want, 0, sizeof(double) * (size_t)n);
    for (int at = 0; (at = next_adapter(lay, &ll, at, &W, &ia)) >= 0; at++) {
        const float *A = adapters + ll.tensors[ia].offset, *Bm = adapters + ll.tensors[ia + 1].offset;
        const float *G = g + W->offset;
        double *dA = want + ll.tensors[ia].offset, *dB = want + ll.tensors[ia + 1].offset;
        for (int64_t o = 0; o < W->rows; o++)
            for (int64_t i = 0; i < W->cols; i++)
                for (int k = 0; k < R; k++) {
                    dB[o * R + k] += s * (double)G[o * W->cols + i] * A[k * W->cols + i];
                    dA[k * W->cols + i] += s * (double)Bm[o * R + k] * G[o * W->cols + i];
                }
    }
    keel_model_layout_free(&ll);
    keel_model_free(m);
    return loss * (1.0 / (B * mc.max_seq_len));
}

/* Largest |got - want| over the largest |want|. */
static double rel_err(const float *got, const double *want, int64_t n) {
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        worst = testlib_worst(worst, fabs(got[i] - want[i]));
        scale = fabs(want[i]) > scale ? fabs(want[i]) : scale;
    }
    return worst / (scale > 0 ? scale : 1);
}

static void check_equivalent_merged(void) {
    for (int v = 0; v < 4; v++) {
        lora_run r = {.bf16 = v == 1, .ckpt = v == 2, .unit = v == 3 ? KEEL_UNIT_MATRIX : KEEL_UNIT_BLOCK,
                      .lc = {.on = true, .rank = 4, .alpha = 8, .targets = (1u << KEEL_LORA_TARGETS) - 1}};
        if (v == 3) r.lc.targets = 1u << KEEL_LORA_Q | 1u << KEEL_LORA_V | 1u << KEEL_LORA_DOWN;
        const char *what = (const char *[]){"fp32", "bf16", "fp32, checkpointing", "fp32, matrix units"}[v];
        float *adapters, *grads;
        int64_t n;
        double loss = lora_step(&r, &adapters, &grads, &n);
        double *want = keel_xmalloc(sizeof(double) * (size_t)n, "want");
        double merged = merged_step(&r, adapters, want, n);
        double tol = r.bf16 ? 3e-2 : 2e-4;
        EXPECT(fabs(loss - merged) < (r.bf16 ? 1e-2 : 1e-5), "%s: loss %.7f = the merged model's %.7f", what, loss,
               merged);
        double e = rel_err(grads, want, n);
        EXPECT(e < tol, "%s: the adapters' gradients are s·G·Aᵀ and s·Bᵀ·G of the merged model's (rel err %.2g)",
               what, e);
        keel_free(want);
        keel_free(adapters);
        keel_free(grads);
    }
}

static void check_zero_b_is_base(void) {
    keel_model_config mc = tiny();
    int32_t tok[B * 13];
    tokens_of(&mc, tok);
    keel_lora_config lc = {.on = true, .rank = 8, .alpha = 16, .targets = (1u << KEEL_LORA_TARGETS) - 1};
    double loss[2];
    for (int with = 0; with < 2; with++) {
        keel_model *m;
        keel_model_build_with(&mc, B, &(keel_model_options){.own_params = true, .lora = with ? &lc : NULL}, &m);
        keel_model_init_weights(m, 3);
        if (with) keel_lora_init_range(keel_model_lora_layout(m), 1, 0, keel_model_lora_layout(m)->n_params,
                                       keel_model_lora_params(m));
        if (with) EXPECT(keel_model_grads(m) == NULL && keel_model_lora_grads(m), "the base has no gradients, the adapters have");
        loss[with] = keel_model_forward(m, tok, NULL, B, 0.0f);
        keel_model_free(m);
    }
    EXPECT(loss[0] == loss[1], "freshly initialised adapters (B = 0) leave the loss bit-identical (%.9g, %.9g)",
           loss[0], loss[1]);
}

static void check_dropout(void) {
    uint64_t keys[B] = {11, 12}, other[B] = {11, 99};
    lora_run r = {.lc = {.on = true, .rank = 4, .alpha = 8, .dropout = 0.3,
                         .targets = 1u << KEEL_LORA_Q | 1u << KEEL_LORA_UP | 1u << KEEL_LORA_DOWN},
                  .keys = keys};
    float *a0, *g0, *g1, *g2, *g3;
    int64_t n;
    double l0 = lora_step(&r, &a0, &g0, &n);
    double l1 = lora_step(&r, NULL, &g1, &n);
    r.ckpt = true;
    double l2 = lora_step(&r, NULL, &g2, &n);
    r.ckpt = false;
    r.keys = other;
    double l3 = lora_step(&r, NULL, &g3, &n);
    EXPECT(l0 == l1 && !memcmp(g0, g1, sizeof(float) * (size_t)n), "dropout: the same keys, the same loss and gradients");
    EXPECT(l0 == l2 && !memcmp(g0, g2, sizeof(float) * (size_t)n),
           "dropout: recomputed blocks draw the same masks (bit-identical with checkpointing)");
    EXPECT(l0 != l3, "dropout: another sequence key, another loss (%.9g, %.9g)", l0, l3);

    /* a central difference on a few elements of A: the masks hold still */
    r.keys = keys;
    const keel_model_layout *ll = NULL;
    keel_model_config mc = tiny();
    keel_model *m;
    keel_model_build_with(&mc, B, &(keel_model_options){.own_params = true, .lora = &r.lc}, &m);
    ll = keel_model_lora_layout(m);
    int64_t picks[3] = {ll->tensors[0].offset + 5, ll->tensors[2].offset + 17, ll->tensors[4].offset + 40};
    keel_model_free(m);
    double worst = 0;
    for (int i = 0; i < 3; i++) {
        float *ad = keel_xmalloc(sizeof(float) * (size_t)n, "adapters"), *g;
        double h = 1e-2, lp, lm;
        memcpy(ad, a0, sizeof(float) * (size_t)n);
        ad[picks[i]] += (float)h;
        r.adapters = ad;
        lp = lora_step(&r, NULL, &g, &n);
        keel_free(g);
        ad[picks[i]] -= (float)(2 * h);
        lm = lora_step(&r, NULL, &g, &n);
        keel_free(g);
        double fd = (lp - lm) / (2 * h);
        worst = testlib_worst(worst, fabs(fd - g0[picks[i]]) / (fabs(fd) + 1e-4));
        keel_free(ad);
    }
    EXPECT(worst < 0.05, "dropout: dA agrees with central differences (worst rel err %.3g)", worst);
    keel_free(a0), keel_free(g0), keel_free(g1), keel_free(g2), keel_free(g3);

    enum { N = 1 << 16 };
    float *x = keel_xmalloc(sizeof(float) * N, "x"), *y = keel_xmalloc(sizeof(float) * N, "y");
    for (int i = 0; i < N; i++) x[i] = 1.0f;
    keel_scale_masked(y, x, N, 2.0f, 0.25f, 42, false);
    int dropped = 0;
    bool values = true;
    for (int i = 0; i < N; i++) dropped += y[i] == 0.0f, values &= y[i] == 0.0f || y[i] == 2.0f;
    EXPECT(values && fabs(dropped / (double)N - 0.25) < 0.01, "the mask drops %.4f of the elements at p = 0.25",
           dropped / (double)N);
    keel_scale_masked(x, x, N, 1.0f, 0.25f, 42, true); /* in place, accumulating: 1 + kept */
    bool same = true;
    for (int i = 0; i < N; i++) same &= x[i] == (y[i] == 0.0f ? 1.0f : 2.0f);
    EXPECT(same, "in place and accumulating: the same mask for the same key");
    keel_free(x);
    keel_free(y);
}

#define TRAJECTORY_TOL 1e-4 /* test_golden_pytorch.c's: relative, each step's loss and gradient norm */

static float *read_f32(const char *path, int64_t n) {
    float *v = keel_xmalloc(sizeof(float) * (size_t)n, path);
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(v, sizeof(float), (size_t)n, f) : 0;
    if (f) fclose(f);
    EXPECT(got == (size_t)n, "%s: %zu of %lld floats (regenerate with tests/reference/make_lora_golden.py)", path,
           got, (long long)n);
    return v;
}

static void check_peft_trajectory(const char *src) {
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/tests/reference/fixtures/llama_micro", src);
    keel_config cfg;
    keel_config_defaults(&cfg);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (keel_config_load_file(&cfg, path) != KEEL_OK || keel_config_finalize(&cfg) != KEEL_OK) {
        EXPECT(false, "%s loads", path);
        return;
    }
    snprintf(path, sizeof path, "%s/lora.json", dir);
    size_t len;
    char *text = NULL;
    if (keel_read_file(path, &text, &len) != KEEL_OK) {
        EXPECT(false, "%s: missing (tests/reference/make_lora_golden.py)", path);
        return;
    }
    cJSON *ref = cJSON_Parse(text);
    const cJSON *lc = cJSON_GetObjectItem(ref, "lora"), *traj = cJSON_GetObjectItem(ref, "trajectory");
    cfg.train.lora = (keel_lora_config){.on = true, .rank = cJSON_GetObjectItem(lc, "rank")->valueint,
                                        .alpha = cJSON_GetObjectItem(lc, "alpha")->valuedouble,
                                        .targets = (1u << KEEL_LORA_TARGETS) - 1};
    const keel_model_config *mc = &cfg.model;
    int B = cfg.train.micro_batch_size, T = mc->max_seq_len;
    keel_model *m;
    keel_model_build_with(mc, B, &(keel_model_options){.own_params = true, .lora = &cfg.train.lora}, &m);
    const keel_model_layout *lay = keel_model_get_layout(m), *ll = keel_model_lora_layout(m);
    snprintf(path, sizeof path, "%s/weights.f32", dir);
    float *w = read_f32(path, lay->n_params);
    memcpy(keel_model_params(m), w, sizeof(float) * (size_t)lay->n_params);
    keel_model_params_changed(m);
    int32_t *tokens = keel_xmalloc(sizeof(int32_t) * (size_t)B * (T + 1), "tokens");
    snprintf(path, sizeof path, "%s/tokens.i32", dir);
    FILE *f = fopen(path, "rb");
    EXPECT(f && fread(tokens, sizeof(int32_t), (size_t)B * (T + 1), f) == (size_t)B * (T + 1), "%s", path);
    if (f) fclose(f);

    int64_t n = ll->n_params;
    float *params = keel_model_lora_params(m), *grads = keel_model_lora_grads(m);
    keel_lora_init_range(ll, (uint64_t)cJSON_GetObjectItem(ref, "seed")->valuedouble, 0, n, params);
    snprintf(path, sizeof path, "%s/lora_init.f32", dir);
    float *want_init = read_f32(path, n);
    EXPECT(n == cJSON_GetObjectItem(ref, "n_adapter_params")->valueint && !memcmp(params, want_init, sizeof(float) * (size_t)n),
           "PEFT: keel's initial adapters (%lld) are the fixture's bit for bit", (long long)n);

    keel_optim *opt;
    keel_optim_build(&cfg.train, ll, 0, n, NULL, &opt);
    const cJSON *losses = cJSON_GetObjectItem(traj, "loss"), *norms = cJSON_GetObjectItem(traj, "grad_norm");
    double worst = 0;
    bool ok = cJSON_GetArraySize(losses) == cfg.train.steps;
    for (int step = 0; step < cfg.train.steps && ok; step++) {
        keel_model_zero_grads(m);
        double loss = keel_model_forward(m, tokens, NULL, B, 1.0f / (float)(B * T)) / (B * T);
        keel_model_backward(m);
        double norm = sqrt(keel_optim_sumsq(opt, grads));
        keel_optim_update(opt, params, grads, step, keel_lr_at(&cfg.train, step), keel_clip_scale(norm, cfg.train.grad_clip));
        double wl = cJSON_GetArrayItem(losses, step)->valuedouble, wn = cJSON_GetArrayItem(norms, step)->valuedouble;
        worst = testlib_worst(worst, fabs(loss - wl) / wl);
        worst = testlib_worst(worst, fabs(norm - wn) / wn);
        if (step == 0 || step == cfg.train.steps - 1)
            printf("     step %d: loss keel %.7f PEFT %.7f, grad norm keel %.6f PEFT %.6f\n", step + 1, loss, wl, norm, wn);
    }
    EXPECT(ok && worst <= TRAJECTORY_TOL, "PEFT: 10 LoRA steps follow PEFT + transformers (worst rel err %.2e, tol %.0e)",
           worst, TRAJECTORY_TOL);
    snprintf(path, sizeof path, "%s/lora_final.f32", dir);
    float *want_final = read_f32(path, n);
    double err = 0, scale = 0;
    for (int64_t i = 0; i < n; i++)
        err = testlib_worst(err, fabs(params[i] - want_final[i])), scale = fmax(scale, fabs(want_final[i]));
    EXPECT(err / scale < 1e-3, "PEFT: the adapters end at PEFT's (max err %.2e of max %.3f)", err, scale);
    keel_optim_free(opt);
    keel_free(want_init), keel_free(want_final), keel_free(w), keel_free(tokens), keel_free(text);
    cJSON_Delete(ref);
    keel_model_free(m);
    keel_config_free(&cfg);
}

int main(void) {
    keel_kernels_init(2);
    check_layout();
    check_init();
    check_zero_b_is_base();
    check_equivalent_merged();
    check_dropout();
    const char *src = getenv("KEEL_SRC");
    if (src) check_peft_trajectory(src);
    else EXPECT(false, "KEEL_SRC (the repository root) is set");
    keel_kernels_shutdown();
    return test_summary("test_lora");
}
