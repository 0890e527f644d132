/* keel_infer_score: the log-likelihoods of a sequence's tokens equal the
 * training forward's per-sequence cross-entropy (summed over every token,
 * from = 1), for requests batched past the cache's slots and cut into steps
 * that split sequences (prefill_rows 7, batch 2, 5 requests of different
 * lengths); scoring from a later token gives the tail of the same numbers;
 * the top token is the greedy one (keel_infer_generate at temperature 0 picks
 * it); bad requests are refused before anything runs. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "keel/infer.h"
#include "keel/kernels.h"
#include "keel/model.h"
#include "../testlib.h"

enum { T = 20, V = 67, N_REQ = 5 };

static int32_t first_new;
static void on_update(void *ctx, const keel_gen_update *u) {
    (void)ctx;
    if (u->n_ids == 1) first_new = u->ids[0];
}

int main(void) {
    keel_kernels_init(2);
    keel_infer_model im = {.bos = -1};
    keel_config_defaults(&im.cfg);
    im.cfg.model = (keel_model_config){.dim = 32, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .vocab_size = V,
                                       .multiple_of = 16, .norm_eps = 1e-5, .rope_theta = 10000, .max_seq_len = T};
    keel_model *m;
    keel_model_build(&im.cfg.model, 1, &m);
    keel_model_init_weights(m, 3);
    const keel_model_layout *lay = keel_model_get_layout(m);
    im.params = keel_xmalloc(sizeof(float) * (size_t)lay->n_params, "params");
    memcpy(im.params, keel_model_params(m), sizeof(float) * (size_t)lay->n_params);

    int lens[N_REQ] = {T + 1, 2, 9, T + 1, 13};
    int32_t ids[N_REQ][T + 1];
    double lp[N_REQ][T], tail[T], top_lp[N_REQ][T];
    int32_t top[N_REQ][T];
    keel_score_request r[N_REQ];
    for (int i = 0; i < N_REQ; i++) {
        for (int t = 0; t <= T; t++) ids[i][t] = (int32_t)((t * 31 + i * 17 + 3) % V);
        r[i] = (keel_score_request){ids[i], lens[i], 1, lp[i], top[i], top_lp[i]};
    }
    keel_gen_params g = keel_gen_defaults();
    g.batch = 2, g.prefill_rows = 7;
    EXPECT(keel_infer_score(&im, r, N_REQ, &g) == KEEL_OK, "5 requests score");
    for (int i = 0; i < N_REQ; i++) {
        if (lens[i] != T + 1) continue;
        double want = keel_model_forward(m, ids[i], NULL, 1, 0.0f), got = 0;
        for (int t = 0; t < T; t++) got -= lp[i][t];
        EXPECT(fabs(got - want) < 1e-4 * want, "request %d: -Σ logprob %.6f = the training loss %.6f", i, got, want);
    }
    bool tops_ok = true;
    for (int i = 0; i < N_REQ; i++)
        for (int t = 0; t < lens[i] - 1; t++) tops_ok &= top_lp[i][t] >= lp[i][t] - 1e-12 && top_lp[i][t] <= 0;
    EXPECT(tops_ok, "every top log-probability is at least the token's, and at most 0");
    /* scoring request 2 from token 5: the tail of its numbers */
    keel_score_request late = {ids[2], lens[2], 5, tail, NULL, NULL};
    EXPECT(keel_infer_score(&im, &late, 1, &g) == KEEL_OK, "scoring from token 5");
    double worst = 0;
    for (int t = 5; t < lens[2]; t++) worst = fmax(worst, fabs(tail[t - 5] - lp[2][t - 1]));
    EXPECT(worst < 1e-5, "scored from token 5: the same numbers (%.2g)", worst);
    /* the top token after request 0's first 9 tokens is greedy generation's first */
    keel_gen_prompt p = {.ids = ids[0], .n_ids = 9};
    g.max_new_tokens = 1;
    EXPECT(keel_infer_generate(&im, &p, 1, &g, on_update, NULL, NULL) == KEEL_OK, "generate one token");
    EXPECT(first_new == top[0][8], "greedy's token %d is the top one after 9 tokens (%d)", first_new,
           top[0][8]);
    /* bad requests */
    int32_t oov[3] = {1, V, 2};
    keel_score_request bad[3] = {{ids[0], T + 2, 1, tail, NULL, NULL}, {ids[0], 4, 4, tail, NULL, NULL},
                                 {oov, 3, 1, tail, NULL, NULL}};
    for (int i = 0; i < 3; i++) EXPECT(keel_infer_score(&im, &bad[i], 1, &g) == KEEL_ERR_INPUT, "bad request %d refused", i);
    keel_model_free(m);
    keel_infer_model_free(&im);
    keel_kernels_shutdown();
    return test_summary("score");
}
