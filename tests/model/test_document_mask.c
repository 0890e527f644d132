/* Document masking (keel_model_options.document_mask): two documents packed
 * in one row, A at positions 0-6 and B at 7-16, train exactly as each does
 * alone at the start of a row. RoPE scores depend on positions' differences
 * only, so with attention kept inside each document the packed row's loss is
 * A's alone plus B's alone (the target that crosses from A into B masked
 * out) and its gradients their sum, up to fp32 rounding; without masking B
 * reads A and the loss is another. In fp32 and bf16; and a model built with
 * document masking but given no flags is the plain causal model bit for bit. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "keel/kernels.h"
#include "keel/model.h"
#include "../testlib.h"

enum { T = 16, ROW = T + 1, A_LEN = 7, B_LEN = ROW - A_LEN, MAX_PARAMS = 1 << 16 };

static keel_model *build(bool bf16, bool document_mask) {
    keel_model_config mc = {.dim = 32, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .vocab_size = 53,
                            .multiple_of = 16, .norm_eps = 1e-5, .rope_theta = 10000, .max_seq_len = T};
    keel_model_options opts = {.own_params = true, .bf16 = bf16, .document_mask = document_mask};
    keel_model *m;
    keel_model_build_with(&mc, 1, &opts, &m);
    keel_model_init_weights(m, 11);
    return m;
}

static double step(keel_model *m, const int32_t *tokens, const uint8_t *flags, float *grads) {
    keel_model_zero_grads(m);
    double loss = keel_model_forward(m, tokens, flags, 1, 1.0f);
    keel_model_backward(m);
    memcpy(grads, keel_model_grads(m), sizeof(float) * (size_t)keel_model_get_layout(m)->n_params);
    return loss;
}

int main(void) {
    keel_kernels_init(2);
    static float packed_g[MAX_PARAMS], a_g[MAX_PARAMS], b_g[MAX_PARAMS], plain_g[MAX_PARAMS];
    int32_t packed[ROW], alone_a[ROW], alone_b[ROW];
    uint8_t packed_f[ROW], a_f[ROW], b_f[ROW];
    for (int i = 0; i < ROW; i++) packed[i] = (i * 37 + 5) % 53;
    /* alone: the document at the row's start, then filler it never sees (causal) nor trains on */
    for (int i = 0; i < ROW; i++) {
        alone_a[i] = i < A_LEN ? packed[i] : 7;
        alone_b[i] = i < B_LEN ? packed[A_LEN + i] : 7;
        a_f[i] = (uint8_t)((i < A_LEN ? KEEL_TOKEN_TRAIN : 0) | (i == 0 || i == A_LEN ? KEEL_TOKEN_DOC_START : 0));
        b_f[i] = (uint8_t)((i < B_LEN ? KEEL_TOKEN_TRAIN : 0) | (i == 0 ? KEEL_TOKEN_DOC_START : 0));
        /* packed: B starts at A_LEN; its first token is no target (it would be predicted from A) */
        packed_f[i] = (uint8_t)((i == A_LEN ? 0 : KEEL_TOKEN_TRAIN) | (i == 0 || i == A_LEN ? KEEL_TOKEN_DOC_START : 0));
    }
    for (int bf16 = 0; bf16 < 2; bf16++) {
        const char *what = bf16 ? "bf16" : "fp32";
        keel_model *m = build(bf16, true);
        int64_t n = keel_model_get_layout(m)->n_params;
        EXPECT(n <= MAX_PARAMS, "%lld parameters fit", (long long)n);
        double l_packed = step(m, packed, packed_f, packed_g);
        double l_a = step(m, alone_a, a_f, a_g), l_b = step(m, alone_b, b_f, b_g);
        double worst = 0, scale = 0;
        for (int64_t i = 0; i < n; i++) {
            double sum = (double)a_g[i] + b_g[i];
            worst = testlib_worst(worst, fabs(packed_g[i] - sum));
            scale = fmax(scale, fabs(sum));
        }
        /* the same math at other absolute positions: RoPE's cos/sin round differently */
        double tol = bf16 ? 2e-2 : 1e-5;
        EXPECT(fabs(l_packed - (l_a + l_b)) <= tol * 1e-1 * (l_a + l_b), "%s: packed loss %.8f, A alone + B alone %.8f",
               what, l_packed, l_a + l_b);
        EXPECT(scale > 0 && worst <= tol * scale, "%s: packed gradients within %.2e of A's + B's (largest %.3e)", what,
               worst, scale);
        /* a model without masking reads A from B: another loss */
        keel_model *plain = build(bf16, false);
        double l_plain = step(plain, packed, packed_f, plain_g);
        EXPECT(fabs(l_plain - l_packed) > 1e-4 * l_packed, "%s: without document masking the loss is another "
               "(%.6f vs %.6f)", what, l_plain, l_packed);
        /* no flags: plain causal attention, bit for bit */
        double l_m = step(m, packed, NULL, packed_g), l_p = step(plain, packed, NULL, plain_g);
        EXPECT(l_m == l_p && memcmp(packed_g, plain_g, sizeof(float) * (size_t)n) == 0,
               "%s: given no flags, the masking model is the plain one bit for bit", what);
        keel_model_free(plain);
        keel_model_free(m);
    }
    keel_kernels_shutdown();
    return test_summary("test_document_mask");
}
