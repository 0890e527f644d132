/* keel_infer_score: the log-likelihoods of a sequence's tokens equal the
 * training forward's per-sequence cross-entropy (summed over every token,
 * from = 1), for requests batched past the cache's slots and cut into steps
 * that split sequences (prefill_rows 7, batch 2, 5 requests of different
 * lengths); scoring from a later token gives the tail of the same numbers;
 * the top token is the greedy one (keel_infer_generate at temperature 0 picks
 * it); the top 5 tokens come most likely first, the top one first of them;
 * greedy generation's logprobs (each new token's and its top 3) are scoring's
 * of the same sequence; bad requests are refused before anything runs. */
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

/* greedy generation with logprobs: the ids, each one's log-probability and its top 3, when done */
enum { GEN_NEW = 6, GEN_TOP = 3 };
static int32_t gen_ids[GEN_NEW + 1];
static double gen_lp[GEN_NEW + 1], gen_top_lp[(GEN_NEW + 1) * GEN_TOP];
static int32_t gen_top[(GEN_NEW + 1) * GEN_TOP];
static int gen_n;
static void on_logprobs(void *ctx, const keel_gen_update *u) {
    (void)ctx;
    if (!u->done) return;
    gen_n = u->n_ids + (u->stop_id >= 0);
    for (int t = 0; t < gen_n; t++) {
        gen_ids[t] = t < u->n_ids ? u->ids[t] : u->stop_id;
        gen_lp[t] = u->logprobs[t];
        for (int j = 0; j < GEN_TOP; j++)
            gen_top[t * GEN_TOP + j] = u->top_ids[t * GEN_TOP + j], gen_top_lp[t * GEN_TOP + j] = u->top_logprobs[t * GEN_TOP + j];
    }
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
        r[i] = (keel_score_request){ids[i], lens[i], 1, lp[i], top[i], top_lp[i], 1};
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
    keel_score_request late = {ids[2], lens[2], 5, tail, NULL, NULL, 0};
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
    /* the top 5 of request 4: the top one first, most likely first, the token among them when it beats the 5th */
    int32_t top5[T * 5];
    double top5_lp[T * 5], lp4[T];
    keel_score_request five = {ids[4], lens[4], 1, lp4, top5, top5_lp, 5};
    EXPECT(keel_infer_score(&im, &five, 1, &g) == KEEL_OK, "scoring with the top 5");
    bool five_ok = true;
    for (int t = 0; t < lens[4] - 1; t++) {
        const int32_t *k = top5 + t * 5;
        const double *kl = top5_lp + t * 5;
        five_ok &= k[0] == top[4][t] && kl[0] == top_lp[4][t] && lp4[t] == lp[4][t];
        bool seen = false;
        for (int j = 0; j < 5; j++) {
            if (j) five_ok &= kl[j] <= kl[j - 1] && k[j] != k[j - 1];
            if (k[j] == ids[4][t + 1]) seen = true, five_ok &= kl[j] == lp4[t];
        }
        five_ok &= seen || lp4[t] <= kl[4];
    }
    EXPECT(five_ok, "the top 5: the top token first, in order, the scored token among them when it beats the 5th");
    /* greedy generation's logprobs are scoring's of the sequence it made */
    keel_gen_params lg = g;
    lg.max_new_tokens = GEN_NEW, lg.logprobs = true, lg.top_logprobs = GEN_TOP, lg.ignore_eos = true;
    keel_gen_prompt gp = {.ids = ids[1], .n_ids = 2};
    EXPECT(keel_infer_generate(&im, &gp, 1, &lg, on_logprobs, NULL, NULL) == KEEL_OK && gen_n == GEN_NEW,
           "generate %d tokens with logprobs (%d)", GEN_NEW, gen_n);
    int32_t seq_ids[2 + GEN_NEW], s_top[GEN_NEW * GEN_TOP];
    double s_lp[GEN_NEW], s_top_lp[GEN_NEW * GEN_TOP];
    memcpy(seq_ids, ids[1], sizeof(int32_t) * 2);
    memcpy(seq_ids + 2, gen_ids, sizeof(int32_t) * GEN_NEW);
    keel_score_request again = {seq_ids, 2 + GEN_NEW, 2, s_lp, s_top, s_top_lp, GEN_TOP};
    EXPECT(keel_infer_score(&im, &again, 1, &g) == KEEL_OK, "score what generation made");
    double gen_worst = 0;
    bool gen_tops = true;
    for (int t = 0; t < GEN_NEW; t++) {
        gen_worst = testlib_worst(gen_worst, fabs(gen_lp[t] - s_lp[t]));
        gen_tops &= gen_top[t * GEN_TOP] == gen_ids[t]; /* greedy: the new token is the top one */
        for (int j = 0; j < GEN_TOP; j++) {
            gen_tops &= gen_top[t * GEN_TOP + j] == s_top[t * GEN_TOP + j];
            gen_worst = testlib_worst(gen_worst, fabs(gen_top_lp[t * GEN_TOP + j] - s_top_lp[t * GEN_TOP + j]));
        }
    }
    EXPECT(gen_worst < 1e-5 && gen_tops, "generation's logprobs and top 3 are scoring's (%.2g), the greedy token first",
           gen_worst);
    /* bad requests */
    int32_t oov[3] = {1, V, 2};
    keel_score_request bad[4] = {{ids[0], T + 2, 1, tail, NULL, NULL, 0}, {ids[0], 4, 4, tail, NULL, NULL, 0},
                                 {oov, 3, 1, tail, NULL, NULL, 0}, {ids[0], 4, 1, tail, NULL, NULL, 2}};
    for (int i = 0; i < 4; i++) EXPECT(keel_infer_score(&im, &bad[i], 1, &g) == KEEL_ERR_INPUT, "bad request %d refused", i);
    keel_model_free(m);
    keel_infer_model_free(&im);
    keel_kernels_shutdown();
    return test_summary("score");
}
