/* The output head in chunks of rows (keel_model_options.head_rows): forward
 * keeps the last chunk's logits gradient, backward recomputes the others'.
 * Chunks that do not divide the rows give the loss and gradients of the whole
 * (N, V) at once — the same per-row math, up to the GEMM library's rounding
 * of a block of rows and the head's weight gradient summing its rows in
 * another order; one chunk of all rows is the whole bit for bit — in fp32 and bf16, with accumulation over
 * micro-batches after an evaluation forward; and the logits buffer shrinks
 * to a chunk. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "keel/kernels.h"
#include "keel/model.h"
#include "../testlib.h"

static double step(bool bf16, int head_rows, float *grads, int64_t *bytes) {
    keel_model_config mc = {.dim = 32, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .vocab_size = 97,
                            .multiple_of = 16, .norm_eps = 1e-5, .rope_theta = 10000, .max_seq_len = 20};
    int B = 2, T = mc.max_seq_len;
    int32_t tokens[2 * 21];
    for (int i = 0; i < 2 * 21; i++) tokens[i] = (i * 29 + 11) % mc.vocab_size;
    keel_model_options opts = {.own_params = true, .bf16 = bf16, .head_rows = head_rows};
    keel_model *m;
    keel_model_build_with(&mc, B, &opts, &m);
    const keel_model_layout *lay = keel_model_get_layout(m);
    *bytes = keel_model_activation_bytes(lay, B, &opts);
    keel_model_init_weights(m, 3);
    keel_model_zero_grads(m);
    double loss = keel_model_forward(m, tokens, NULL, 1, 0.0f); /* an evaluation: one sequence, no backward */
    for (int micro = 0; micro < 2; micro++) {
        loss += keel_model_forward(m, tokens, NULL, B, 1.0f / (float)(2 * B * T));
        keel_model_backward(m);
    }
    memcpy(grads, keel_model_grads(m), sizeof(float) * (size_t)lay->n_params);
    keel_model_free(m);
    return loss;
}

int main(void) {
    keel_kernels_init(2);
    enum { MAX_PARAMS = 1 << 16 };
    static float whole[MAX_PARAMS], chunked[MAX_PARAMS];
    for (int bf16 = 0; bf16 < 2; bf16++) {
        const char *what = bf16 ? "bf16" : "fp32";
        int64_t b_whole, b_chunked;
        double l_whole = step(bf16, 0, whole, &b_whole);
        for (int rows = 7; rows <= 40; rows += 33) { /* 7: six chunks of 7 and one of 5 (N = 40); 40: one */
            double l = step(bf16, rows, chunked, &b_chunked);
            double worst = 0, scale = 0;
            for (int i = 0; i < MAX_PARAMS; i++) {
                worst = testlib_worst(worst, fabs((double)whole[i] - chunked[i]));
                scale = fmax(scale, fabs((double)whole[i]));
            }
            /* each row's logits in fp32 from a GEMM of fewer rows: ulps of difference */
            EXPECT(fabs(l - l_whole) <= 1e-7 * fabs(l_whole), "%s, %d rows a chunk: loss %.12f, whole %.12f", what,
                   rows, l, l_whole);
            /* fp32 sums of 40 rows in another order: a few ulps of the largest gradient */
            EXPECT(scale > 0 && worst <= 1e-6 * scale, "%s, %d rows a chunk: gradients within %.1e of the whole's "
                   "(largest %.3e)", what, rows, worst, scale);
            if (rows == 40) EXPECT(worst == 0, "%s: one chunk of all rows is the whole, bit for bit", what);
        }
        step(bf16, 7, chunked, &b_chunked);
        EXPECT(b_chunked < b_whole, "%s: %lld activation bytes with 7-row chunks, %lld with the whole logits", what,
               (long long)b_chunked, (long long)b_whole);
    }
    keel_kernels_shutdown();
    return test_summary("test_head_chunks");
}
