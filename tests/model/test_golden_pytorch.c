/* Golden test against Hugging Face transformers: logits, loss, every parameter
 * gradient and a 10-step AdamW loss trajectory of a micro Llama 2 (GQA, untied
 * and tied heads), compared with fixtures written by
 * tests/reference/make_golden.py (LlamaForCausalLM, float32, eager attention).
 * A missing fixture is a failure, never a skip: regenerate with
 *     bash scripts/setup-torch.sh && /opt/keel-torch/bin/python tests/reference/make_golden.py
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "keel/kernels.h"
#include "keel/model.h"
#include "keel/optim.h"

#include "../testlib.h"

#define LOGITS_TOL 1e-5     /* max abs err / max |logit| */
#define LOSS_TOL 1e-5       /* relative */
#define GRAD_TOL 1e-4       /* per tensor: max abs err / max |grad| */
#define TRAJECTORY_TOL 1e-4 /* relative, each step's loss and gradient norm */

typedef struct {
    char dir[1024];
    keel_config cfg;
    cJSON *expected;
    int B, T, V;
    int64_t n_params;
    float *weights;   /* (n_params) */
    float *grads;     /* (n_params) d(mean loss)/d(params) */
    float *logits;    /* (B, T, V) */
    int32_t *tokens;  /* (B, T+1) */
} fixture;

/* Open dir/name, its path written to path (1200 bytes); NULL (and a FAIL
 * line) if the file is missing. */
static FILE *open_fixture_file(const char *dir, const char *name, char path[1200]) {
    snprintf(path, 1200, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) EXPECT(false, "%s: missing (regenerate with tests/reference/make_golden.py)", path);
    return f;
}

/* Read exactly `bytes` from dir/name into a new buffer; NULL (and a FAIL line)
 * if the file is missing or has another size. Caller frees. */
static void *read_exact(const char *dir, const char *name, size_t bytes) {
    char path[1200];
    FILE *f = open_fixture_file(dir, name, path);
    if (!f) return NULL;
    void *buf = malloc(bytes + 1);
    size_t got = fread(buf, 1, bytes + 1, f);
    fclose(f);
    if (got != bytes) {
        EXPECT(false, "%s: %zu bytes, expected %zu", path, got, bytes);
        free(buf);
        return NULL;
    }
    return buf;
}

static char *read_text(const char *dir, const char *name) {
    char path[1200];
    FILE *f = open_fixture_file(dir, name, path);
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    s[fread(s, 1, (size_t)n, f)] = '\0';
    fclose(f);
    return s;
}

/* obj[key], or NULL with a FAIL line naming what expected.json lacks. */
static const cJSON *need(const fixture *f, const cJSON *obj, const char *key) {
    const cJSON *item = obj ? cJSON_GetObjectItem(obj, key) : NULL;
    if (!item) EXPECT(false, "%s/expected.json: no \"%s\" (regenerate it)", f->dir, key);
    return item;
}

static void fixture_free(fixture *f) {
    cJSON_Delete(f->expected);
    keel_config_free(&f->cfg);
    free(f->weights);
    free(f->grads);
    free(f->logits);
    free(f->tokens);
}

static bool fixture_load(fixture *f, const char *src, const char *name) {
    memset(f, 0, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "%s/tests/reference/fixtures/%s", src, name);
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", f->dir);
    keel_config_defaults(&f->cfg);
    if (keel_config_load_file(&f->cfg, path) != KEEL_OK || keel_config_finalize(&f->cfg) != KEEL_OK) {
        EXPECT(false, "%s: cannot load (regenerate with tests/reference/make_golden.py)", path);
        return false;
    }
    char *text = read_text(f->dir, "expected.json");
    if (!text) return false;
    f->expected = cJSON_Parse(text);
    free(text);
    if (!f->expected) {
        EXPECT(false, "%s/expected.json: not JSON", f->dir);
        return false;
    }
    const cJSON *traj = need(f, f->expected, "trajectory");
    const cJSON *items[] = {need(f, f->expected, "B"), need(f, f->expected, "T"),
                            need(f, f->expected, "V"), need(f, f->expected, "n_params"),
                            need(f, f->expected, "mean_loss"), need(f, f->expected, "tensors"),
                            need(f, traj, "loss"), need(f, traj, "grad_norm"), need(f, traj, "lr")};
    for (size_t i = 0; i < sizeof items / sizeof items[0]; i++)
        if (!items[i]) return false;
    f->B = items[0]->valueint;
    f->T = items[1]->valueint;
    f->V = items[2]->valueint;
    f->n_params = (int64_t)items[3]->valuedouble;
    size_t N = (size_t)f->B * f->T;
    f->weights = read_exact(f->dir, "weights.f32", sizeof(float) * (size_t)f->n_params);
    f->grads = read_exact(f->dir, "grads.f32", sizeof(float) * (size_t)f->n_params);
    f->logits = read_exact(f->dir, "logits.f32", sizeof(float) * N * (size_t)f->V);
    f->tokens = read_exact(f->dir, "tokens.i32", sizeof(int32_t) * (size_t)f->B * (f->T + 1));
    return f->weights && f->grads && f->logits && f->tokens;
}

/* The layout must name and shape every tensor as transformers does. */
static bool check_layout(const fixture *f, const keel_model_layout *lay) {
    const cJSON *tensors = cJSON_GetObjectItem(f->expected, "tensors");
    bool ok = lay->n_params == f->n_params && cJSON_GetArraySize(tensors) == lay->n_tensors &&
              f->T == lay->T && f->V == lay->V;
    for (int i = 0; ok && i < lay->n_tensors; i++) {
        const cJSON *t = cJSON_GetArrayItem(tensors, i);
        const cJSON *name = cJSON_GetObjectItem(t, "name"), *rows = cJSON_GetObjectItem(t, "rows");
        const cJSON *cols = cJSON_GetObjectItem(t, "cols");
        ok = cJSON_IsString(name) && rows && cols && strcmp(name->valuestring, lay->tensors[i].name) == 0 &&
             rows->valueint == lay->tensors[i].rows && cols->valueint == lay->tensors[i].cols;
        if (!ok) printf("     tensor %d: keel has %s (%lld, %lld)\n", i, lay->tensors[i].name,
                        (long long)lay->tensors[i].rows, (long long)lay->tensors[i].cols);
    }
    EXPECT(ok, "layout: %d tensors, %lld params, F=%d, names and shapes match transformers",
           lay->n_tensors, (long long)lay->n_params, lay->F);
    return ok;
}

/* Logits (B*T, V) of keel's kernels composed exactly as model.c composes
 * them: keel/model.h has no accessor for the logits of a forward, so this is
 * the closest public path; the loss computed from these logits is required
 * to equal keel_model_forward's, which ties them to the model. */
static void keel_logits(const keel_model_layout *lay, const float *params, const int32_t *tokens,
                        int B, float *logits) {
    int T = lay->T, N = B * T, C = lay->C, F = lay->F, NH = lay->NH, NKV = lay->NKV, HS = lay->HS;
    int QD = NH * HS, KVD = NKV * HS;
    float eps = (float)lay->cfg.norm_eps;
    float *x = malloc(sizeof(float) * (size_t)N * C), *xn = malloc(sizeof(float) * (size_t)N * C);
    float *rstd = malloc(sizeof(float) * (size_t)N), *ao = malloc(sizeof(float) * (size_t)N * QD);
    float *q = malloc(sizeof(float) * (size_t)N * QD), *k = malloc(sizeof(float) * (size_t)N * KVD);
    float *v = malloc(sizeof(float) * (size_t)N * KVD);
    float *lse = malloc(sizeof(float) * (size_t)B * NH * T);
    float *gate = malloc(sizeof(float) * (size_t)N * F), *up = malloc(sizeof(float) * (size_t)N * F);
    float *h = malloc(sizeof(float) * (size_t)N * F), *rope = malloc(sizeof(float) * (size_t)T * HS);
    keel_rope_table(rope, T, HS, lay->cfg.rope_theta, &lay->cfg.rope_scaling);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            memcpy(x + (int64_t)(b * T + t) * C, params + (int64_t)tokens[b * (T + 1) + t] * C,
                   sizeof(float) * (size_t)C);
    for (int l = 0; l < lay->L; l++) {
        const float *norm1 = params + lay->unit_offset[1 + l], *wq = norm1 + C;
        const float *wk = wq + (int64_t)QD * C, *wv = wk + (int64_t)KVD * C;
        const float *wo = wv + (int64_t)KVD * C, *norm2 = wo + (int64_t)C * QD;
        const float *wgate = norm2 + C, *wup = wgate + (int64_t)F * C, *wdown = wup + (int64_t)F * C;
        keel_rmsnorm_forward(xn, rstd, x, norm1, N, C, eps);
        keel_matmul_forward(q, xn, wq, N, QD, C, false);
        keel_matmul_forward(k, xn, wk, N, KVD, C, false);
        keel_matmul_forward(v, xn, wv, N, KVD, C, false);
        keel_rope_forward(q, rope, B, T, NH, HS);
        keel_rope_forward(k, rope, B, T, NKV, HS);
        keel_attention_forward(ao, lse, q, k, v, NULL, B, T, NH, NKV, HS);
        keel_matmul_forward(x, ao, wo, N, C, QD, true);
        keel_rmsnorm_forward(xn, rstd, x, norm2, N, C, eps);
        keel_matmul_forward(gate, xn, wgate, N, F, C, false);
        keel_matmul_forward(up, xn, wup, N, F, C, false);
        keel_swiglu_forward(h, gate, up, (int64_t)N * F);
        keel_matmul_forward(x, h, wdown, N, C, F, true);
    }
    const float *normf = params + lay->unit_offset[lay->L + 1];
    const float *head = lay->cfg.tie_embeddings ? params : normf + C;
    keel_rmsnorm_forward(xn, rstd, x, normf, N, C, eps);
    keel_matmul_forward(logits, xn, head, N, lay->V, C, false);
    free(x); free(xn); free(rstd); free(ao); free(q); free(k); free(v); free(lse);
    free(gate); free(up); free(h); free(rope);
}

static double max_abs(const float *a, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i]));
    return m;
}

static double max_abs_diff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = testlib_worst(m, fabs((double)a[i] - (double)b[i]));
    return m;
}

static double rel(double got, double want) { return fabs(got - want) / fmax(fabs(want), 1e-30); }

static double check_logits_and_loss(const fixture *f, keel_model *m) {
    const keel_model_layout *lay = keel_model_get_layout(m);
    int N = f->B * f->T;
    int64_t n = (int64_t)N * f->V;
    float *logits = malloc(sizeof(float) * (size_t)n);
    keel_logits(lay, keel_model_params(m), f->tokens, f->B, logits);
    double err = max_abs_diff(logits, f->logits, n), scale = max_abs(f->logits, n);
    EXPECT(err / scale <= LOGITS_TOL, " logits: max_abs_err %.3e, max|logit| %.3f, ratio %.2e (tol %.0e)",
           err, scale, err / scale, LOGITS_TOL);

    int32_t *targets = malloc(sizeof(int32_t) * (size_t)N);
    for (int b = 0; b < f->B; b++)
        for (int t = 0; t < f->T; t++) targets[b * f->T + t] = f->tokens[b * (f->T + 1) + t + 1];
    double composed = keel_xent_forward_backward(logits, targets, N, f->V, 0.0f) / N;
    free(targets);
    free(logits);

    keel_model_zero_grads(m);
    double loss = keel_model_forward(m, f->tokens, NULL, f->B, 1.0f / (float)N) / N;
    double want = cJSON_GetObjectItem(f->expected, "mean_loss")->valuedouble;
    EXPECT(rel(loss, want) <= LOSS_TOL, " loss: keel %.9f transformers %.9f rel_err %.2e (tol %.0e)",
           loss, want, rel(loss, want), LOSS_TOL);
    EXPECT(rel(composed, loss) <= 1e-6, " composed-kernel loss %.9f = keel_model_forward loss (rel %.1e)",
           composed, rel(composed, loss));
    return loss;
}

static void check_grads(const fixture *f, keel_model *m) {
    const keel_model_layout *lay = keel_model_get_layout(m);
    keel_model_backward(m); /* after check_logits_and_loss's training forward */
    const float *grads = keel_model_grads(m);
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < lay->n_tensors; i++) {
        const keel_tensor_info *t = &lay->tensors[i];
        int64_t n = t->rows * t->cols;
        double err = max_abs_diff(grads + t->offset, f->grads + t->offset, n);
        double scale = max_abs(f->grads + t->offset, n), r = err / fmax(scale, 1e-30);
        EXPECT(r <= GRAD_TOL && scale > 0, " grad %-40s max|g| %.3e max_abs_err %.3e ratio %.2e", t->name,
               scale, err, r);
        if (r > worst) worst = r, worst_name = t->name;
    }
    printf("     worst gradient ratio %.2e (%s), tol %.0e\n", worst, worst_name, GRAD_TOL);
}

/* keel's own optimizer step, as src/train/train.c takes it, on the same batch. */
static void check_trajectory(const fixture *f, keel_model *m) {
    const keel_model_layout *lay = keel_model_get_layout(m);
    const keel_train_config *tc = &f->cfg.train;
    const cJSON *traj = cJSON_GetObjectItem(f->expected, "trajectory");
    const cJSON *losses = cJSON_GetObjectItem(traj, "loss"), *norms = cJSON_GetObjectItem(traj, "grad_norm");
    const cJSON *lrs = cJSON_GetObjectItem(traj, "lr");
    int steps = cJSON_GetArraySize(losses), N = f->B * f->T;
    if (steps != tc->steps) {
        EXPECT(false, " trajectory has %d steps, config train.steps = %d", steps, tc->steps);
        return;
    }
    float *params = keel_model_params(m), *grads = keel_model_grads(m);
    memcpy(params, f->weights, sizeof(float) * (size_t)f->n_params);
    keel_optim *opt;
    keel_optim_build(tc, lay, 0, lay->n_params, NULL, &opt);
    double worst = 0;
    for (int step = 0; step < steps; step++) {
        keel_model_zero_grads(m);
        double loss = keel_model_forward(m, f->tokens, NULL, f->B, 1.0f / (float)N) / N;
        keel_model_backward(m);
        double norm = sqrt(keel_sumsq(grads, lay->n_params)), lr = keel_lr_at(tc, step);
        keel_optim_update(opt, params, grads, step, lr, keel_clip_scale(norm, tc->grad_clip));
        double want = cJSON_GetArrayItem(losses, step)->valuedouble;
        double want_norm = cJSON_GetArrayItem(norms, step)->valuedouble;
        double want_lr = cJSON_GetArrayItem(lrs, step)->valuedouble;
        bool ok = rel(loss, want) <= TRAJECTORY_TOL && rel(norm, want_norm) <= TRAJECTORY_TOL &&
                  rel(lr, want_lr) <= 1e-12;
        EXPECT(ok, " step %2d lr %.6f loss keel %.7f transformers %.7f rel %.2e | grad_norm %.5f vs %.5f rel %.2e",
               step + 1, lr, loss, want, rel(loss, want), norm, want_norm, rel(norm, want_norm));
        worst = fmax(worst, rel(loss, want));
    }
    printf("     worst trajectory loss rel_err %.2e, tol %.0e\n", worst, TRAJECTORY_TOL);
    keel_optim_free(opt);
}

static void check_fixture(const char *src, const char *name) {
    printf("== %s\n", name);
    fixture f;
    if (!fixture_load(&f, src, name)) {
        fixture_free(&f);
        return;
    }
    keel_model *m;
    if (keel_model_build(&f.cfg.model, f.B, &m) != KEEL_OK) {
        EXPECT(false, "%s: keel_model_build failed", name);
        fixture_free(&f);
        return;
    }
    if (check_layout(&f, keel_model_get_layout(m))) {
        memcpy(keel_model_params(m), f.weights, sizeof(float) * (size_t)f.n_params);
        check_logits_and_loss(&f, m);
        check_grads(&f, m);
        check_trajectory(&f, m);
    }
    keel_model_free(m);
    fixture_free(&f);
}

int main(void) {
    const char *src = getenv("KEEL_SRC");
    if (!src) {
        printf("FAIL KEEL_SRC (the repository root) is not set\n");
        return 1;
    }
    keel_kernels_init(2);
    check_fixture(src, "llama_micro");
    check_fixture(src, "llama_micro_tied");
    keel_kernels_shutdown();
    return test_summary("test_golden_pytorch");
}
