/* infer/score.c: the log-likelihood of tokens given the ones before them
 * (keel_infer_score in keel/infer.h), batched on the decoder: requests take
 * the cache's slots in groups, and a group's tokens run in steps of up to
 * prefill_rows rows, a sequence's positions in order; only the rows whose
 * next token is scored go through the output head. */
#include <math.h>
#include <string.h>

#include "infer/logprobs.h"
#include "keel/infer.h"
#include "keel/model.h"

static keel_status check(const keel_infer_model *m, const keel_score_request *r, int i) {
    int V = m->cfg.model.vocab_size, T = m->cfg.model.max_seq_len;
    if (r->n_top < 0 || r->n_top > KEEL_MAX_TOP_LOGPROBS || (r->n_top > 1 && (!r->top_id || !r->top_logprob))) {
        keel_errorf("request %d: %d top tokens asked: 0 to %d, with both top_id and top_logprob for more than 1",
                    i + 1, r->n_top, KEEL_MAX_TOP_LOGPROBS);
        return KEEL_ERR_INPUT;
    }
    if (r->n < 2 || r->n > T + 1 || r->from < 1 || r->from >= r->n) {
        keel_errorf("request %d: %d tokens scored from %d: needs 2 to %d tokens (the context %d, model.max_seq_len, "
                    "plus the last) and something to score", i + 1, r->n, r->from, T + 1, T);
        return KEEL_ERR_INPUT;
    }
    for (int t = 0; t < r->n; t++)
        if (r->ids[t] < 0 || r->ids[t] >= V) {
            keel_errorf("request %d: token id %d is outside the vocabulary [0, %d)", i + 1, r->ids[t], V);
            return KEEL_ERR_INPUT;
        }
    return KEEL_OK;
}

/* log softmax(z)[target], and the k most likely tokens with their log-probabilities */
static void score_row(const float *z, int V, int32_t target, double *lp, int k, int32_t *top, double *top_lp) {
    int32_t best;
    double lse = infer_logsumexp(z, V, &best);
    *lp = (double)z[target] - lse;
    if (k == 1) {
        if (top) *top = best;
        if (top_lp) *top_lp = (double)z[best] - lse;
    } else if (top && top_lp) {
        infer_top_tokens(z, V, lse, k, top, top_lp);
    }
}

keel_status keel_infer_score(keel_infer_model *m, keel_score_request *r, int n, const keel_gen_params *g) {
    int V = m->cfg.model.vocab_size, longest = 0;
    for (int i = 0; i < n; i++) {
        keel_status st = check(m, &r[i], i);
        if (st != KEEL_OK) return st;
        if (r[i].n - 1 > longest) longest = r[i].n - 1;
    }
    if (n == 0) return KEEL_OK;
    int slots = n < g->batch ? n : g->batch, rows = g->prefill_rows;
    keel_decoder *d;
    keel_status st = keel_decoder_build(&m->cfg.model, m->params,
                                        &(keel_decoder_options){.bf16 = g->bf16, .max_seqs = slots,
                                                                .max_len = longest, .max_rows = rows},
                                        &d);
    if (st != KEEL_OK) return st;
    int32_t *tok = keel_xmalloc(sizeof(int32_t) * (size_t)rows * 4, "score rows");
    int32_t *seq = tok + rows, *pos = seq + rows, *want = pos + rows;
    int *req_of = keel_xmalloc(sizeof(int) * (size_t)rows, "score rows");
    float *logits = keel_xmalloc(sizeof(float) * (size_t)rows * V, "logits");
    for (int first = 0; first < n; first += slots) {
        int last = first + slots < n ? first + slots : n;
        int k = 0, w = 0;
        /* every position 0..n-2 of each request in the group, a sequence's in order */
        for (int i = first; i < last; i++)
            for (int t = 0; t < r[i].n - 1; t++) {
                tok[k] = r[i].ids[t], seq[k] = i - first, pos[k] = t, req_of[k] = i;
                if (t + 1 >= r[i].from) want[w++] = k;
                if (++k == rows || (i == last - 1 && t == r[i].n - 2)) {
                    keel_decoder_step(d, tok, seq, pos, k, want, w, logits);
                    for (int j = 0; j < w; j++) {
                        const keel_score_request *q = &r[req_of[want[j]]];
                        int at = pos[want[j]] + 1 - q->from; /* scoring token pos + 1 */
                        int k = q->n_top > 1 ? q->n_top : 1;
                        score_row(logits + (size_t)j * V, V, q->ids[pos[want[j]] + 1], &q->logprob[at], k,
                                  q->top_id ? &q->top_id[(size_t)at * k] : NULL,
                                  q->top_logprob ? &q->top_logprob[(size_t)at * k] : NULL);
                    }
                    k = w = 0;
                }
            }
    }
    keel_free(tok);
    keel_free(req_of);
    keel_free(logits);
    keel_decoder_free(d);
    return KEEL_OK;
}
