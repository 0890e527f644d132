/* A model with bf16 GEMMs against the fp32 model on the same weights and
 * tokens: the loss within 1e-3 relative and every tensor's gradient within 5%
 * (relative L2) — bf16 keeps 8 bits of mantissa, so a wrong transpose or a
 * missed accumulation is far outside that. The second round scales every
 * parameter in place (norm weights x4), as an optimizer step would, and
 * announces it with keel_model_params_changed: a stale bf16 copy would miss
 * the loss by far more than the tolerance.
 * Tied and untied heads. The bf16 GEMMs and attention take the machine's
 * path; ctest also runs this as test_bf16_gradients_avx2 (KEEL_MAX_ISA=avx2:
 * emulated). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "keel/kernels.h"
#include "keel/model.h"
#include "../testlib.h"

static double rel_l2(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) num += (double)(a[i] - b[i]) * (a[i] - b[i]), den += (double)b[i] * b[i];
    return sqrt(num / (den + 1e-30));
}

static void check(bool tied) {
    keel_model_config mc = {.dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .vocab_size = 96,
                            .multiple_of = 32, .norm_eps = 1e-5, .rope_theta = 10000,
                            .max_seq_len = 32, .tie_embeddings = tied};
    int B = 2, T = mc.max_seq_len;
    int32_t tokens[2 * 33];
    for (int i = 0; i < 2 * 33; i++) tokens[i] = (i * 37 + 11) % mc.vocab_size;
    keel_model *m32, *m16;
    keel_model_options o32 = {.own_params = true}, o16 = {.own_params = true, .bf16 = true};
    keel_model_build_with(&mc, B, &o32, &m32);
    keel_model_build_with(&mc, B, &o16, &m16);
    const keel_model_layout *lay = keel_model_get_layout(m32);
    for (int round = 0; round < 2; round++) {
        if (round == 0) {
            keel_model_init_weights(m32, 5);
            keel_model_init_weights(m16, 5);
        } else { /* an update in place, as the optimizer does */
            float *p32 = keel_model_params(m32), *p16 = keel_model_params(m16);
            for (int i = 0; i < lay->n_tensors; i++) { /* sharper norms, so the loss moves */
                const keel_tensor_info *t = &lay->tensors[i];
                for (int64_t j = t->offset; j < t->offset + t->rows * t->cols; j++)
                    p32[j] = p16[j] = p32[j] * (t->cols == 1 ? 4.0f : 1.25f);
            }
            keel_model_params_changed(m16);
        }
        keel_model_zero_grads(m32);
        keel_model_zero_grads(m16);
        double l32 = keel_model_forward(m32, tokens, NULL, B, 1.0f / (float)(B * T));
        double l16 = keel_model_forward(m16, tokens, NULL, B, 1.0f / (float)(B * T));
        keel_model_backward(m32);
        keel_model_backward(m16);
        EXPECT(fabs(l16 - l32) <= 1e-3 * fabs(l32), "tied=%d round %d: loss bf16 %.6f fp32 %.6f", tied,
               round, l16 / (B * T), l32 / (B * T));
        double worst = 0;
        const char *name = "";
        for (int i = 0; i < lay->n_tensors; i++) {
            const keel_tensor_info *t = &lay->tensors[i];
            double e = rel_l2(keel_model_grads(m16) + t->offset, keel_model_grads(m32) + t->offset,
                              t->rows * t->cols);
            if (isnan(e) ? !isnan(worst) : e > worst) worst = e, name = t->name; /* a NaN stays */
        }
        EXPECT(worst <= 0.05, "tied=%d round %d: worst gradient rel L2 %.2e (%s)", tied, round, worst, name);
    }
    keel_model_free(m32);
    keel_model_free(m16);
}

int main(void) {
    keel_kernels_init(2);
    const char *path;
    keel_bf16_native(&path);
    printf("bf16 GEMMs at %s: %s\n", keel_isa_name(keel_isa_active()), path);
    check(false);
    check(true);
    keel_kernels_shutdown();
    return test_summary("test_bf16_gradients");
}
