/* A loss mask (keel_model_forward's mask): a target whose mask byte is 0 adds
 * nothing to the loss or the gradients, one whose byte is 1 adds exactly what
 * it adds without a mask. Checked in fp32 and bf16 against the same model
 * without a mask: an all-ones mask is the unmasked step bit for bit; a random
 * mask's loss and gradients equal the sum of one-target masks' (the loss is a
 * sum over targets, and the gradient is linear in it); a mask of zeros gives a
 * zero loss and zero gradients; and the cross-entropy kernel, the reference's
 * too, gives a masked row (target -1) no loss and a zero gradient row. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "keel/kernels.h"
#include "keel/model.h"
#include "../testlib.h"

enum { B = 2, T = 12, ROW = T + 1, MAX_PARAMS = 1 << 16 };

static keel_model *build(bool bf16) {
    keel_model_config mc = {.dim = 32, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .vocab_size = 61,
                            .multiple_of = 16, .norm_eps = 1e-5, .rope_theta = 10000, .max_seq_len = T};
    keel_model_options opts = {.own_params = true, .bf16 = bf16};
    keel_model *m;
    keel_model_build_with(&mc, B, &opts, &m);
    keel_model_init_weights(m, 5);
    return m;
}

/* loss and gradients of one step over tokens with mask (NULL: none) */
static double step(keel_model *m, const int32_t *tokens, const uint8_t *mask, float *grads) {
    keel_model_zero_grads(m);
    double loss = keel_model_forward(m, tokens, mask, B, 1.0f);
    keel_model_backward(m);
    memcpy(grads, keel_model_grads(m), sizeof(float) * (size_t)keel_model_get_layout(m)->n_params);
    return loss;
}

static void xent_kernel(void) {
    enum { N = 5, V = 37 };
    for (int ref = 0; ref < 2; ref++) {
        float plain[N * V], masked[N * V];
        int32_t targets[N] = {3, 0, 36, 7, 20}, some[N] = {3, -1, 36, -1, 20};
        for (int i = 0; i < N * V; i++) plain[i] = masked[i] = (float)sin(i * 0.37) * 3;
        double (*xent)(float *, const int32_t *, int, int, float) =
            ref ? keel_ref_xent_forward_backward : keel_xent_forward_backward;
        double all = 0;
        float row[V];
        for (int r = 0; r < N; r++) { /* each row alone, for its own loss */
            memcpy(row, plain + r * V, sizeof row);
            double l = xent(row, targets + r, 1, V, 0.0f);
            if (some[r] >= 0) all += l;
        }
        xent(plain, targets, N, V, 0.5f);
        double l = xent(masked, some, N, V, 0.5f);
        const char *which = ref ? "reference" : "kernel";
        EXPECT(fabs(l - all) <= 1e-12 * all, "%s: masked loss %.15g, the kept rows' %.15g", which, l, all);
        for (int r = 0; r < N; r++) {
            int wrong = 0;
            for (int j = 0; j < V; j++) wrong += masked[r * V + j] != (some[r] < 0 ? 0.0f : plain[r * V + j]);
            EXPECT(wrong == 0, "%s: row %d (%s): %d of %d gradients differ from %s", which, r,
                   some[r] < 0 ? "masked" : "kept", wrong, V, some[r] < 0 ? "zero" : "the unmasked row's");
        }
    }
}

int main(void) {
    keel_kernels_init(2);
    xent_kernel();
    static float plain[MAX_PARAMS], got[MAX_PARAMS], sum[MAX_PARAMS], one_grads[MAX_PARAMS];
    int32_t tokens[B * ROW];
    uint8_t ones[B * ROW], zeros[B * ROW], mask[B * ROW], one[B * ROW];
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    int kept = 0;
    for (int i = 0; i < B * ROW; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        tokens[i] = (int32_t)((rng >> 33) % 61);
        ones[i] = 1, zeros[i] = 0;
        mask[i] = (rng >> 20) % 3 != 0; /* about two targets in three */
        kept += i % ROW != 0 && mask[i];
    }
    EXPECT(kept > 4 && kept < B * T - 4, "a mask that keeps some targets and drops others (%d of %d)", kept, B * T);
    for (int bf16 = 0; bf16 < 2; bf16++) {
        const char *what = bf16 ? "bf16" : "fp32";
        keel_model *m = build(bf16);
        int64_t n = keel_model_get_layout(m)->n_params;
        EXPECT(n <= MAX_PARAMS, "%lld parameters fit the test's arrays", (long long)n);
        double l_plain = step(m, tokens, NULL, plain);
        double l_ones = step(m, tokens, ones, got);
        EXPECT(l_ones == l_plain && memcmp(got, plain, sizeof(float) * (size_t)n) == 0,
               "%s: a mask of ones is no mask, bit for bit (loss %.15g vs %.15g)", what, l_ones, l_plain);
        double l_zeros = step(m, tokens, zeros, got);
        double gmax = 0;
        for (int64_t i = 0; i < n; i++) gmax = fmax(gmax, fabs(got[i]));
        EXPECT(l_zeros == 0 && gmax == 0, "%s: a mask of zeros: loss %g, largest gradient %g", what, l_zeros, gmax);

        double l_mask = step(m, tokens, mask, got), l_sum = 0;
        memset(sum, 0, sizeof(float) * (size_t)n);
        for (int i = 0; i < B * ROW; i++) {
            if (i % ROW == 0 || !mask[i]) continue; /* position 0 of a row is never a target */
            memset(one, 0, sizeof one);
            one[i] = 1;
            l_sum += step(m, tokens, one, one_grads);
            for (int64_t k = 0; k < n; k++) sum[k] += one_grads[k];
        }
        double worst = 0, scale = 0;
        for (int64_t k = 0; k < n; k++) {
            worst = testlib_worst(worst, fabs((double)got[k] - sum[k]));
            scale = fmax(scale, fabs((double)sum[k]));
        }
        /* fp32 sums in another order; in bf16 each run rounds its own gradients to bf16 (1.1e-2 seen) */
        EXPECT(fabs(l_mask - l_sum) <= 1e-6 * l_sum, "%s: masked loss %.10f, the kept targets' sum %.10f", what, l_mask,
               l_sum);
        EXPECT(scale > 0 && worst <= (bf16 ? 4e-2 : 1e-5) * scale,
               "%s: masked gradients within %.2e of the kept targets' sum (largest %.3e)", what, worst, scale);
        EXPECT(fabs(l_mask - l_plain) > 1e-3, "%s: the mask changes the loss (%.6f vs %.6f)", what, l_mask, l_plain);
        keel_model_free(m);
    }
    keel_kernels_shutdown();
    return test_summary("test_loss_mask");
}
