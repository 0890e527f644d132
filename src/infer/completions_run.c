/* infer/completions_run.c: a batch of completions requests run on the model
 * (infer_completions_run in infer/completions.h) — each prompt's ids checked
 * against the model, every prompt of the batch generated in one
 * keel_infer_generate call, echoed prompts scored in one keel_infer_score
 * call, and each request's answer written. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "infer/completions.h"

/* What generation made for one prompt. */
typedef struct {
    char *text;
    size_t len;
    const char *finish;
    int32_t *ids;      /* the new ids, the stop token last when one ended it */
    int n;
    double *lp;        /* with logprobs: (n), and k alternatives each */
    int32_t *top;
    double *top_lp;
} generated;

/* One prompt of the batch. */
typedef struct {
    int req;           /* its request, and its place there */
    int index;
    keel_ids ids;      /* BOS (added) and its ids */
    int added;         /* 1 when keel put BOS before a text prompt */
    generated gen;
    double *score_lp;  /* echo with logprobs: (n - 1) and k alternatives each */
    int32_t *score_top;
    double *score_top_lp;
} prompt_run;

typedef struct {
    prompt_run *runs;
    int k;             /* alternatives a token comes with */
    bool logprobs;
} run_ctx;

static void push_id(keel_ids *ids, int32_t id) {
    if (ids->n == ids->cap) {
        ids->cap = ids->cap ? 2 * ids->cap : 64;
        ids->ids = keel_xrealloc(ids->ids, sizeof(int32_t) * ids->cap, "prompt ids");
    }
    ids->ids[ids->n++] = id;
}

/* "the prompt" or "prompt 3 of 5", for messages */
static void prompt_name(char *out, size_t n, int index, int of) {
    if (of == 1) snprintf(out, n, "the prompt");
    else snprintf(out, n, "prompt %d of %d", index + 1, of);
}

/* A prompt's ids from its text (BOS first, when the model has one and the
 * text does not start with it) or as sent, checked against the vocabulary and the context: one line naming it
 * when they do not fit (never cut). */
static keel_status prepare(const keel_infer_model *m, const completion_request *req, int index, prompt_run *r) {
    const keel_gen_prompt *p = &req->prompts[index];
    int V = m->cfg.model.vocab_size, T = m->cfg.model.max_seq_len;
    char name[64];
    prompt_name(name, sizeof name, index, req->n_prompts);
    if (p->text) {
        keel_ids enc = {0};
        keel_status st = keel_tokenizer_encode(m->tok, p->text, p->text_len, &enc);
        if (st != KEEL_OK) return st;
        /* BOS first, unless the text starts with BOS's own text already (lm-eval's
         * tokenized_requests=False sends it so, as transformers' pipelines do) */
        if (m->bos >= 0 && (enc.n == 0 || enc.ids[0] != m->bos)) push_id(&r->ids, m->bos), r->added = 1;
        for (size_t j = 0; j < enc.n; j++) push_id(&r->ids, enc.ids[j]);
        keel_ids_free(&enc);
    } else {
        for (int j = 0; j < p->n_ids; j++) {
            if (p->ids[j] >= V) {
                keel_errorf("%s: token id %d is outside the vocabulary [0, %d)", name, p->ids[j], V);
                return KEEL_ERR_INPUT;
            }
            push_id(&r->ids, p->ids[j]);
        }
    }
    int n = (int)r->ids.n;
    if (n == 0) {
        keel_errorf("%s is empty and the model has no BOS to start from; give it some text", name);
        return KEEL_ERR_INPUT;
    }
    if (n > T || (req->max_tokens > 0 && n >= T)) {
        keel_errorf("%s has %d tokens: the model's context is %d tokens (model.max_seq_len)%s; nothing is cut: "
                    "shorten it", name, n, T,
                    req->max_tokens > 0 ? ", with room for at least one new token" : "");
        return KEEL_ERR_INPUT;
    }
    return KEEL_OK;
}

static void *copy(const void *src, size_t bytes, const char *what) {
    void *dst = keel_xmalloc(bytes ? bytes : 1, what);
    if (bytes) memcpy(dst, src, bytes);
    return dst;
}

/* keel_gen_fn: a prompt's text, ids and logprobs once it is done. */
static void on_generated(void *arg, const keel_gen_update *u) {
    if (!u->done) return;
    run_ctx *ctx = arg;
    generated *g = &ctx->runs[u->prompt].gen;
    g->text = copy(u->text, u->len + 1, "completion");
    g->len = u->len;
    g->finish = u->finish_reason;
    g->n = u->n_ids + (u->stop_id >= 0);
    g->ids = copy(u->ids, sizeof(int32_t) * (size_t)u->n_ids, "completion ids");
    if (u->stop_id >= 0) g->ids = keel_xrealloc(g->ids, sizeof(int32_t) * (size_t)g->n, "completion ids"),
                         g->ids[g->n - 1] = u->stop_id;
    if (!ctx->logprobs) return;
    size_t k = (size_t)ctx->k;
    g->lp = copy(u->logprobs, sizeof(double) * (size_t)g->n, "logprobs");
    g->top = copy(u->top_ids, sizeof(int32_t) * (size_t)g->n * k, "logprobs");
    g->top_lp = copy(u->top_logprobs, sizeof(double) * (size_t)g->n * k, "logprobs");
}

/* Generation's params for the batch (the requests decode alike). */
static keel_gen_params params_of(const completion_request *q, int batch, bool bf16) {
    keel_gen_params g = keel_gen_defaults();
    g.max_new_tokens = q->max_tokens, g.temperature = q->temperature, g.top_p = q->top_p, g.top_k = q->top_k;
    g.stop = (const char *const *)q->stop, g.n_stop = q->n_stop, g.ignore_eos = q->ignore_eos;
    g.logprobs = q->logprobs >= 0, g.top_logprobs = q->logprobs > 0 ? q->logprobs : 0;
    g.batch = batch, g.bf16 = bf16;
    return g;
}

/* Every prompt's new tokens, in one call. */
static keel_status generate_all(keel_infer_model *m, prompt_run *runs, int n, completion_request *const *reqs,
                                const keel_gen_params *g, run_ctx *ctx, uint64_t fallback_seed) {
    keel_gen_prompt *gp = keel_xcalloc(sizeof *gp * (size_t)n, "prompts");
    for (int i = 0; i < n; i++) {
        const completion_request *q = reqs[runs[i].req];
        gp[i] = (keel_gen_prompt){.ids = runs[i].ids.ids, .n_ids = (int)runs[i].ids.n, .seeded = true,
                                  .seed = q->has_seed ? q->seed : fallback_seed + (uint64_t)runs[i].req,
                                  .seed_index = runs[i].index};
    }
    keel_status st = keel_infer_generate(m, gp, n, g, on_generated, ctx, NULL);
    keel_free(gp);
    return st;
}

/* The echoed prompts' log-probabilities (with logprobs), in one call. */
static keel_status score_echoes(keel_infer_model *m, prompt_run *runs, int n, completion_request *const *reqs,
                                const keel_gen_params *g, int k) {
    keel_score_request *sr = keel_xcalloc(sizeof *sr * (size_t)(n > 0 ? n : 1), "score requests");
    int ns = 0;
    for (int i = 0; i < n; i++) {
        prompt_run *r = &runs[i];
        const completion_request *q = reqs[r->req];
        if (!q->echo || q->logprobs < 0 || r->ids.n < 2) continue;
        size_t scored = r->ids.n - 1;
        r->score_lp = keel_xmalloc(sizeof(double) * scored, "prompt logprobs");
        if (k) {
            r->score_top = keel_xmalloc(sizeof(int32_t) * scored * (size_t)k, "prompt logprobs");
            r->score_top_lp = keel_xmalloc(sizeof(double) * scored * (size_t)k, "prompt logprobs");
        }
        sr[ns++] = (keel_score_request){.ids = r->ids.ids, .n = (int)r->ids.n, .from = 1, .logprob = r->score_lp,
                                        .top_id = r->score_top, .top_logprob = r->score_top_lp, .n_top = k};
    }
    keel_status st = ns ? keel_infer_score(m, sr, ns, g) : KEEL_OK;
    keel_free(sr);
    return st;
}

/* Append n entries of src (NULL: fill) to dst at *at. */
static void append_tokens(completion_choice *c, int k, const int32_t *ids, const double *lp, const int32_t *top,
                          const double *top_lp, int n) {
    for (int t = 0; t < n; t++, c->n_tokens++) {
        c->tokens[c->n_tokens] = ids[t];
        c->logprob[c->n_tokens] = lp ? lp[t] : NAN;
        for (int j = 0; j < k; j++) {
            c->top_id[(size_t)c->n_tokens * k + j] = top ? top[(size_t)t * k + j] : -1;
            c->top_logprob[(size_t)c->n_tokens * k + j] = top_lp ? top_lp[(size_t)t * k + j] : NAN;
        }
    }
}

/* A prompt's choice: echo's prompt first (text and tokens), then what was generated. */
static void choice_of(const keel_infer_model *m, const completion_request *q, const prompt_run *r,
                      completion_choice *c) {
    const keel_gen_prompt *p = &q->prompts[r->index];
    char *prompt_text = NULL;
    size_t prompt_len = 0;
    if (q->echo && p->text) prompt_text = copy(p->text, p->text_len + 1, "prompt text"), prompt_len = p->text_len;
    else if (q->echo && keel_tokenizer_decode_len(m->tok, r->ids.ids, r->ids.n, &prompt_text, &prompt_len) != KEEL_OK)
        prompt_text = NULL, prompt_len = 0;
    const generated *g = &r->gen;
    c->len = prompt_len + g->len, c->prompt_len = prompt_len;
    c->text = keel_xmalloc(c->len + 1, "choice text");
    if (prompt_len) memcpy(c->text, prompt_text, prompt_len);
    if (g->len) memcpy(c->text + prompt_len, g->text, g->len);
    c->text[c->len] = 0;
    free(prompt_text);
    c->finish_reason = g->finish ? g->finish : "length";
    c->prompt_tokens = (int)r->ids.n, c->completion_tokens = g->n;
    if (q->logprobs < 0) return;
    int k = q->logprobs, echo = q->echo ? (int)r->ids.n : 0, total = echo + g->n;
    c->tokens = keel_xmalloc(sizeof(int32_t) * (size_t)(total ? total : 1), "choice tokens");
    c->logprob = keel_xmalloc(sizeof(double) * (size_t)(total ? total : 1), "choice logprobs");
    c->top_id = keel_xmalloc(sizeof(int32_t) * (size_t)(total ? total : 1) * (size_t)(k ? k : 1), "choice logprobs");
    c->top_logprob = keel_xmalloc(sizeof(double) * (size_t)(total ? total : 1) * (size_t)(k ? k : 1), "choice logprobs");
    if (echo) {
        append_tokens(c, k, r->ids.ids, NULL, NULL, NULL, 1); /* the first token: nothing before it */
        append_tokens(c, k, r->ids.ids + 1, r->score_lp, r->score_top, r->score_top_lp, echo - 1);
        c->added_tokens = r->added;
    }
    append_tokens(c, k, g->ids, g->lp, g->top, g->top_lp, g->n);
}

static void run_free(prompt_run *r) {
    keel_ids_free(&r->ids);
    keel_free(r->gen.text), keel_free(r->gen.ids), keel_free(r->gen.lp), keel_free(r->gen.top),
        keel_free(r->gen.top_lp);
    keel_free(r->score_lp), keel_free(r->score_top), keel_free(r->score_top_lp);
}

static char *error_answer(const char *type, const char *param) {
    return infer_completion_error(keel_last_error(), type, param);
}

void infer_completions_run(keel_infer_model *m, completion_request *const *reqs, int n, const keel_serve_options *o,
                           uint64_t seed, const char *id_prefix, unsigned *status, char **answer) {
    int total = 0;
    for (int i = 0; i < n; i++) total += reqs[i]->n_prompts;
    prompt_run *runs = keel_xcalloc(sizeof *runs * (size_t)(total > 0 ? total : 1), "prompts");
    bool *ok = keel_xcalloc(sizeof(bool) * (size_t)(n > 0 ? n : 1), "requests");
    int kept = 0;
    for (int i = 0; i < n; i++) { /* a request with a prompt that does not fit is answered 400 alone */
        status[i] = 0, answer[i] = NULL, ok[i] = true;
        int first = kept;
        for (int p = 0; p < reqs[i]->n_prompts && ok[i]; p++) {
            runs[kept] = (prompt_run){.req = i, .index = p};
            ok[i] = prepare(m, reqs[i], p, &runs[kept++]) == KEEL_OK;
        }
        if (ok[i]) continue;
        status[i] = 400, answer[i] = error_answer("invalid_request_error", "prompt");
        while (kept > first) run_free(&runs[--kept]);
    }
    const completion_request *q = NULL;
    for (int i = 0; i < n && !q; i++)
        if (ok[i]) q = reqs[i];
    keel_status st = KEEL_OK;
    if (q) {
        keel_gen_params g = params_of(q, o->batch, o->bf16);
        run_ctx ctx = {.runs = runs, .k = g.top_logprobs, .logprobs = g.logprobs};
        if (q->max_tokens > 0) st = generate_all(m, runs, kept, reqs, &g, &ctx, seed);
        if (st == KEEL_OK) st = score_echoes(m, runs, kept, reqs, &g, g.top_logprobs);
    }
    for (int i = 0, r = 0; i < n; i++) {
        if (!ok[i]) continue;
        if (st != KEEL_OK) {
            status[i] = 500, answer[i] = error_answer("server_error", NULL);
            continue;
        }
        completion_choice *choices = keel_xcalloc(sizeof *choices * (size_t)reqs[i]->n_prompts, "choices");
        for (int p = 0; p < reqs[i]->n_prompts; p++, r++) choice_of(m, reqs[i], &runs[r], &choices[p]);
        char id[96];
        snprintf(id, sizeof id, "%s-%d", id_prefix, i);
        status[i] = 200;
        answer[i] = infer_completion_answer(reqs[i], choices, m->tok, id, (long long)time(NULL), o->model_name);
        for (int p = 0; p < reqs[i]->n_prompts; p++) infer_completion_choice_free(&choices[p]);
        keel_free(choices);
    }
    for (int r = 0; r < kept; r++) run_free(&runs[r]);
    keel_free(runs);
    keel_free(ok);
}
