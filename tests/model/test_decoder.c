/* The decoder (keel_decoder, generation against a KV cache) computes the
 * training forward's numbers. A row of T + 1 tokens: the sum over positions
 * of -log softmax(decoder logits)[next token] equals keel_model_forward's
 * summed cross-entropy, with the prompt fed all at once, in chunks of 5, and
 * a token at a time (the cache carrying the rest), within fp32 rounding; the
 * three feeds' logits agree row by row; two sequences interleaved in the
 * same steps get the logits each gets alone; restarting a sequence at
 * position 0 forgets its old cache. fp32 and bf16 (against the bf16 model),
 * untied and tied embeddings, grouped-query heads. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "keel/kernels.h"
#include "keel/model.h"
#include "../testlib.h"

enum { T = 24, V = 61 };

static keel_model_config config(bool tied) {
    return (keel_model_config){.dim = 32, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .vocab_size = V,
                               .multiple_of = 16, .norm_eps = 1e-5, .rope_theta = 10000, .max_seq_len = T,
                               .tie_embeddings = tied};
}

/* Σ_t -log softmax(logits row t)[tokens[t + 1]] over T rows */
static double nll(const float *logits, const int32_t *tokens) {
    double sum = 0;
    for (int t = 0; t < T; t++) {
        const float *z = logits + (size_t)t * V;
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < V; j++) mx = fmax(mx, z[j]);
        for (int j = 0; j < V; j++) s += exp(z[j] - mx);
        sum += mx + log(s) - z[tokens[t + 1]];
    }
    return sum;
}

/* The logits of rows 0..T-1 of `tokens` as sequence `seq`, fed `chunk` rows a step. */
static void feed(keel_decoder *d, const int32_t *tokens, int seq, int chunk, float *logits) {
    int32_t s[T], p[T], rows[T];
    for (int t0 = 0; t0 < T; t0 += chunk) {
        int n = T - t0 < chunk ? T - t0 : chunk;
        for (int i = 0; i < n; i++) s[i] = seq, p[i] = t0 + i, rows[i] = i;
        keel_decoder_step(d, tokens + t0, s, p, n, rows, n, logits + (size_t)t0 * V);
    }
}

static double max_diff(const float *a, const float *b, size_t n) {
    double w = 0;
    for (size_t i = 0; i < n; i++) w = fmax(w, fabs((double)a[i] - b[i]));
    return w;
}

int main(void) {
    keel_kernels_init(2);
    static float whole[T * V], chunks[T * V], single[T * V], other[T * V], both[2 * T * V];
    int32_t a[T + 1], b[T + 1];
    for (int i = 0; i <= T; i++) a[i] = (i * 37 + 5) % V, b[i] = (i * 13 + 29) % V;
    for (int tied = 0; tied < 2; tied++)
        for (int bf16 = 0; bf16 < 2; bf16++) {
            const char *what = bf16 ? "bf16" : "fp32";
            keel_model_config mc = config(tied);
            keel_model *m;
            keel_model_build_with(&mc, 1, &(keel_model_options){.own_params = true, .bf16 = bf16}, &m);
            keel_model_init_weights(m, 5);
            const keel_model_layout *lay = keel_model_get_layout(m);
            double want = keel_model_forward(m, a, NULL, 1, 0.0f);
            float *params = keel_xmalloc(sizeof(float) * (size_t)lay->n_params, "params");
            memcpy(params, keel_model_params(m), sizeof(float) * (size_t)lay->n_params);
            keel_decoder *d;
            EXPECT(keel_decoder_build(&mc, params, &(keel_decoder_options){.bf16 = bf16, .max_seqs = 2,
                                                                          .max_len = T, .max_rows = T}, &d) == KEEL_OK,
                   "%s decoder builds", what);
            feed(d, a, 0, T, whole);
            feed(d, a, 0, 5, chunks);
            feed(d, a, 1, 1, single);
            double got = nll(whole, a), tol = bf16 ? 1e-3 : 1e-4;
            EXPECT(fabs(got - want) <= tol * fabs(want), "%s%s: decoder NLL %.7f = the training forward's %.7f",
                   what, tied ? " tied" : "", got, want);
            EXPECT(max_diff(whole, chunks, T * V) < 1e-4 && max_diff(whole, single, T * V) < 1e-4,
                   "%s: prompt at once, in chunks of 5 and a token at a time agree (%.2g, %.2g)", what,
                   max_diff(whole, chunks, T * V), max_diff(whole, single, T * V));
            /* b alone as sequence 1 (restarted: its old cache was a's), then a and b interleaved */
            feed(d, b, 1, T, other);
            for (int t = 0; t < T; t++) {
                int32_t tok[2] = {a[t], b[t]}, s[2] = {0, 1}, p[2] = {t, t}, rows[2] = {0, 1};
                float two[2 * V];
                keel_decoder_step(d, tok, s, p, 2, rows, 2, two);
                memcpy(both + (size_t)t * V, two, sizeof(float) * V);
                memcpy(both + (size_t)(T + t) * V, two + V, sizeof(float) * V);
            }
            EXPECT(max_diff(both, whole, T * V) < 1e-4 && max_diff(both + T * V, other, T * V) < 1e-4,
                   "%s: two sequences in the same steps get their own logits (%.2g, %.2g)", what,
                   max_diff(both, whole, T * V), max_diff(both + T * V, other, T * V));
            keel_decoder_free(d);
            keel_free(params);
            keel_model_free(m);
        }
    keel_kernels_shutdown();
    return test_summary("decoder");
}
