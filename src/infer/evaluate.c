/* infer/evaluate.c: multiple-choice accuracy and perplexity, scored the way
 * lm-evaluation-harness scores them (keel_infer_eval_task and
 * keel_infer_eval_text in keel/infer.h), on keel_infer_score. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "keel/infer.h"

static keel_status encode(const keel_infer_model *m, const char *text, size_t len, keel_ids *out) {
    return keel_tokenizer_encode(m->tok, text, len, out);
}

/* lm-eval's _encode_pair: the context's trailing whitespace moves onto the
 * continuation; the continuation's ids are those of context + continuation
 * past the context's own. *whole gets BOS (when the model has one) + the
 * pair's ids, *from the index of the continuation's first. */
static keel_status encode_pair(const keel_infer_model *m, const char *context, const char *continuation,
                               keel_ids *whole, int *from) {
    size_t cl = strlen(context), spaces = 0;
    while (spaces < cl && isspace((unsigned char)context[cl - 1 - spaces])) spaces++;
    size_t ctx_len = cl - spaces, cont_len = strlen(continuation);
    char *joined = keel_xmalloc(cl + cont_len + 1, "context and continuation");
    memcpy(joined, context, cl);
    memcpy(joined + cl, continuation, cont_len + 1);
    keel_ids ctx = {0}, pair = {0};
    keel_status st = encode(m, joined, ctx_len, &ctx);
    if (st == KEEL_OK) st = encode(m, joined, cl + cont_len, &pair);
    keel_free(joined);
    whole->n = 0;
    int bos = m->bos >= 0;
    for (size_t i = 0; st == KEEL_OK && i < pair.n + (size_t)bos; i++) {
        if (whole->n == whole->cap) {
            whole->cap = whole->cap ? 2 * whole->cap : 256;
            whole->ids = keel_xrealloc(whole->ids, sizeof(int32_t) * whole->cap, "ids");
        }
        whole->ids[whole->n++] = bos && i == 0 ? m->bos : pair.ids[i - (size_t)bos];
    }
    *from = bos + (int)(ctx.n < pair.n ? ctx.n : pair.n);
    keel_ids_free(&ctx);
    keel_ids_free(&pair);
    return st;
}

static keel_status need_tokenizer(const keel_infer_model *m, const char *what) {
    if (m->tok) return KEEL_OK;
    keel_errorf("%s needs the model's tokenizer and %s has none (none carried or configured); pass --tokenizer FILE",
                what, m->what);
    return KEEL_ERR_INPUT;
}

void keel_task_summarize(const keel_task_item *items, int n, const int *pred, const int *pred_norm,
                         keel_task_result *res) {
    double acc = 0, acc_norm = 0;
    for (int i = 0; i < n; i++) acc += pred[i] == items[i].answer, acc_norm += pred_norm[i] == items[i].answer;
    res->n = n;
    res->acc = n ? acc / n : 0, res->acc_norm = n ? acc_norm / n : 0;
    /* lm-eval's mean_stderr: the sample standard deviation over sqrt(n) */
    res->acc_stderr = n > 1 ? sqrt(res->acc * (1 - res->acc) / (n - 1)) : 0;
    res->acc_norm_stderr = n > 1 ? sqrt(res->acc_norm * (1 - res->acc_norm) / (n - 1)) : 0;
}

keel_status keel_infer_eval_task(keel_infer_model *m, const keel_task_item *items, int n, const char *delimiter,
                                 const keel_gen_params *g, keel_task_result *res, keel_task_sample_fn fn,
                                 void *ctx) {
    keel_status st = need_tokenizer(m, "keel eval --task");
    if (st != KEEL_OK) return st;
    int total = 0;
    for (int i = 0; i < n; i++) total += items[i].n_choices;
    keel_score_request *r = keel_xcalloc(sizeof *r * (size_t)total, "requests");
    keel_ids *ids = keel_xcalloc(sizeof *ids * (size_t)total, "request ids");
    double *loglik = keel_xcalloc(sizeof(double) * (size_t)total, "log-likelihoods");
    bool *greedy = keel_xcalloc(sizeof(bool) * (size_t)total, "greedy flags");
    char *cont = NULL;
    size_t cont_cap = 0;
    for (int i = 0, k = 0; i < n && st == KEEL_OK; i++)
        for (int c = 0; c < items[i].n_choices && st == KEEL_OK; c++, k++) {
            size_t need = strlen(delimiter) + strlen(items[i].choices[c]) + 1;
            if (need > cont_cap) cont = keel_xrealloc(cont, cont_cap = need, "continuation");
            snprintf(cont, need, "%s%s", delimiter, items[i].choices[c]);
            int from;
            st = encode_pair(m, items[i].context, cont, &ids[k], &from);
            if (st == KEEL_OK && (from < 1 || from >= (int)ids[k].n)) {
                keel_errorf("question %d, choice %d: %s; give the question a context or the model a BOS", i + 1, c + 1,
                            from >= (int)ids[k].n ? "the choice encodes to no tokens" : "nothing comes before the choice");
                st = KEEL_ERR_INPUT;
            }
            r[k] = (keel_score_request){.ids = ids[k].ids, .n = (int)ids[k].n, .from = from};
        }
    keel_free(cont);
    /* every request's scores in one buffer */
    int64_t scored = 0;
    for (int k = 0; k < total && st == KEEL_OK; k++) scored += r[k].n - r[k].from;
    double *lp = keel_xmalloc(sizeof(double) * (size_t)(scored > 0 ? scored : 1) * 2, "scores");
    int32_t *top = keel_xmalloc(sizeof(int32_t) * (size_t)(scored > 0 ? scored : 1), "scores");
    for (int64_t k = 0, at = 0; k < total && st == KEEL_OK; at += r[k].n - r[k].from, k++)
        r[k].logprob = lp + at, r[k].top_id = top + at, r[k].top_logprob = lp + scored + at;
    if (st == KEEL_OK) st = keel_infer_score(m, r, total, g);
    int *pred = keel_xmalloc(sizeof(int) * (size_t)(n > 0 ? n : 1) * 2, "predictions"), *pred_norm = pred + n;
    for (int i = 0, k = 0; i < n && st == KEEL_OK; k += items[i].n_choices, i++) {
        double best = -INFINITY, best_norm = -INFINITY;
        pred[i] = pred_norm[i] = 0;
        for (int c = 0; c < items[i].n_choices; c++) {
            const keel_score_request *q = &r[k + c];
            double ll = 0;
            bool all_top = true;
            for (int t = 0; t < q->n - q->from; t++) {
                ll += q->logprob[t];
                all_top &= q->top_id[t] == q->ids[q->from + t];
            }
            loglik[k + c] = ll, greedy[k + c] = all_top;
            size_t bytes = strlen(items[i].choices[c]);
            double norm = ll / (double)(bytes ? bytes : 1);
            if (ll > best) best = ll, pred[i] = c;
            if (norm > best_norm) best_norm = norm, pred_norm[i] = c;
        }
        if (fn)
            fn(ctx, &(keel_task_sample){.item = i, .loglik = loglik + k, .greedy = greedy + k,
                                        .n_choices = items[i].n_choices, .pred = pred[i], .pred_norm = pred_norm[i]});
    }
    if (st == KEEL_OK) keel_task_summarize(items, n, pred, pred_norm, res);
    keel_free(pred);
    for (int k = 0; k < total; k++) keel_ids_free(&ids[k]);
    keel_free(ids), keel_free(r), keel_free(loglik), keel_free(greedy), keel_free(lp), keel_free(top);
    return st;
}

keel_status keel_ppl_finish(keel_ppl_result *res) {
    if (res->tokens <= 0) {
        keel_errorf("keel eval --text: the documents hold no token to score (each needs two ids, BOS included)");
        return KEEL_ERR_INPUT;
    }
    res->token_perplexity = exp(-res->loglik / (double)res->tokens);
    res->byte_perplexity = res->bytes ? exp(-res->loglik / (double)res->bytes) : NAN;
    res->word_perplexity = res->words ? exp(-res->loglik / (double)res->words) : NAN;
    res->bits_per_byte = res->bytes ? -res->loglik / (double)res->bytes / log(2) : NAN;
    return KEEL_OK;
}

keel_status keel_infer_eval_text(keel_infer_model *m, const char *const *docs, int n, const keel_gen_params *g,
                                 keel_ppl_result *res) {
    keel_status st = need_tokenizer(m, "keel eval --text");
    if (st != KEEL_OK) return st;
    *res = (keel_ppl_result){.docs = n};
    int T = m->cfg.model.max_seq_len, bos = m->bos >= 0;
    keel_ids *ids = keel_xcalloc(sizeof *ids * (size_t)(n > 0 ? n : 1), "document ids");
    int windows = 0;
    for (int i = 0; i < n && st == KEEL_OK; i++) {
        size_t len = strlen(docs[i]);
        keel_ids enc = {0};
        st = encode(m, docs[i], len, &enc);
        ids[i].n = 0;
        ids[i].cap = enc.n + 1;
        ids[i].ids = keel_xmalloc(sizeof(int32_t) * ids[i].cap, "ids");
        if (bos) ids[i].ids[ids[i].n++] = m->bos;
        memcpy(ids[i].ids + ids[i].n, enc.ids, sizeof(int32_t) * enc.n);
        ids[i].n += enc.n;
        keel_ids_free(&enc);
        res->bytes += (int64_t)len;
        for (size_t b = 0; b < len; b++)
            res->words += !isspace((unsigned char)docs[i][b]) && (b == 0 || isspace((unsigned char)docs[i][b - 1]));
        if (ids[i].n >= 2) windows += (int)((ids[i].n - 2) / (size_t)T + 1);
    }
    /* lm-eval's rolling windows (context_len 1): ids 1.. of each document
     * predicted T at a time, each window with the T ids before its last as
     * input, so a short last window still sees a whole context */
    keel_score_request *r = keel_xcalloc(sizeof *r * (size_t)(windows > 0 ? windows : 1), "windows");
    double *lp = keel_xmalloc(sizeof(double) * (size_t)(windows > 0 ? windows : 1) * (size_t)T, "scores");
    int w = 0;
    for (int i = 0; i < n && st == KEEL_OK; i++)
        for (size_t p0 = 1; p0 < ids[i].n; p0 += (size_t)T, w++) {
            size_t p1 = p0 + (size_t)T - 1 < ids[i].n - 1 ? p0 + (size_t)T - 1 : ids[i].n - 1;
            size_t a = p1 > (size_t)T ? p1 - (size_t)T : 0;
            r[w] = (keel_score_request){.ids = ids[i].ids + a, .n = (int)(p1 - a + 1), .from = (int)(p0 - a),
                                        .logprob = lp + (size_t)w * T};
            res->tokens += (int64_t)(p1 - p0 + 1);
        }
    if (st == KEEL_OK) st = keel_infer_score(m, r, windows, g);
    for (int k = 0; k < windows && st == KEEL_OK; k++)
        for (int t = 0; t < r[k].n - r[k].from; t++) res->loglik += r[k].logprob[t];
    for (int i = 0; i < n; i++) keel_ids_free(&ids[i]);
    keel_free(ids), keel_free(r), keel_free(lp);
    return st;
}
