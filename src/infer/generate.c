/* infer/generate.c: generation — prompts batched on the decoder's KV cache,
 * each sampled from its own seeded generator, stopped by EOS, stop tokens,
 * stop strings or length (keel_infer_generate in keel/infer.h).
 *
 * The schedule: up to `batch` prompts hold a cache slot each. The prompts
 * that take free slots are run whole first, together (prefill: their tokens
 * packed into steps of up to prefill_rows rows, so the GEMMs of 8 short
 * prompts are as large as those of one long one; the logits of a prompt's
 * last token give its first new token); then every prompt in a slot advances
 * one token per decode step, all in one step of the decoder, so a step reads
 * the weights once for the whole batch. A prompt that finishes frees its slot
 * for the next one waiting. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer/logprobs.h"
#include "keel/infer.h"
#include "keel/kernels.h"
#include "keel/model.h"

keel_gen_params keel_gen_defaults(void) {
    return (keel_gen_params){.max_new_tokens = 128, .temperature = 0, .top_k = 0, .top_p = 1, .seed = 0,
                             .batch = 8, .prefill_rows = 512, .add_bos = true};
}

keel_status keel_gen_check(const keel_gen_params *g) {
    const char *bad = NULL;
    char value[64];
    if (!(g->temperature >= 0 && g->temperature <= 1e6))
        bad = "--temperature", snprintf(value, sizeof value, "%g: must be 0 (greedy) or more", g->temperature);
    else if (!(g->top_p > 0 && g->top_p <= 1))
        bad = "--top-p", snprintf(value, sizeof value, "%g: must be in (0, 1]", g->top_p);
    else if (g->top_k < 0) bad = "--top-k", snprintf(value, sizeof value, "%d: must be 0 (off) or more", g->top_k);
    else if (g->max_new_tokens < 1)
        bad = "--max-new-tokens", snprintf(value, sizeof value, "%d: must be 1 or more", g->max_new_tokens);
    else if (g->batch < 1) bad = "--batch", snprintf(value, sizeof value, "%d: must be 1 or more", g->batch);
    else if (g->prefill_rows < 1)
        bad = "prefill rows", snprintf(value, sizeof value, "%d: must be 1 or more", g->prefill_rows);
    else if (g->top_logprobs < 0 || g->top_logprobs > KEEL_MAX_TOP_LOGPROBS)
        bad = "top logprobs", snprintf(value, sizeof value, "%d: must be 0 to %d", g->top_logprobs,
                                       KEEL_MAX_TOP_LOGPROBS);
    if (!bad) {
        for (int i = 0; i < g->n_stop; i++)
            if (!g->stop[i][0]) {
                keel_errorf("--stop: an empty stop string would stop before the first token; leave it out");
                return KEEL_ERR_INPUT;
            }
        return KEEL_OK;
    }
    keel_errorf("%s %s", bad, value);
    return KEEL_ERR_INPUT;
}

/* ---- sampling ------------------------------------------------------------- */

/* splitmix64: prompt i's generator starts from (seed, i) */
static uint64_t next_u64(uint64_t *s) { return keel_hash64(*s += 0x9E3779B97F4A7C15ull); }

static double uniform(uint64_t *s) { return (double)(next_u64(s) >> 11) / 9007199254740992.0; } /* [0, 1) */

typedef struct {
    float p;
    int32_t id;
} candidate;

/* most likely first; the lower id first on a tie */
static int by_p(const void *a, const void *b) {
    const candidate *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id - y->id;
}

static int32_t argmax(const float *z, int V) {
    int32_t best = 0;
    for (int j = 1; j < V; j++)
        if (z[j] > z[best]) best = j;
    return best;
}

/* One token from logits z (V), by g's rule; cand is V of scratch. */
static int32_t sample(const float *z, int V, const keel_gen_params *g, uint64_t *rng, candidate *cand) {
    if (g->temperature == 0) return argmax(z, V);
    float mx = z[argmax(z, V)];
    double sum = 0;
    for (int j = 0; j < V; j++) {
        cand[j] = (candidate){expf((float)((z[j] - mx) / g->temperature)), j};
        sum += cand[j].p;
    }
    int n = V;
    if ((g->top_k > 0 && g->top_k < V) || g->top_p < 1) {
        qsort(cand, (size_t)V, sizeof *cand, by_p);
        if (g->top_k > 0 && g->top_k < n) n = g->top_k;
        sum = 0;
        for (int j = 0; j < n; j++) sum += cand[j].p;
        if (g->top_p < 1) {
            double kept = 0;
            int m = 0;
            while (m < n && kept < g->top_p * sum) kept += cand[m++].p;
            n = m < 1 ? 1 : m, sum = kept > 0 ? kept : sum;
        }
    }
    double u = uniform(rng) * sum, acc = 0;
    for (int j = 0; j < n; j++) {
        acc += cand[j].p;
        if (u < acc) return cand[j].id;
    }
    return cand[n - 1].id;
}

/* ---- one prompt's state ----------------------------------------------------- */

typedef struct {
    int32_t *ids;        /* prompt, then the new tokens */
    int n_prompt, n, cap;
    uint64_t rng;
    char *text;          /* the new tokens decoded, stop strings cut */
    size_t len, ready;
    bool done;
    const char *finish;
    int32_t stop_id;     /* the stop token that ended it, or -1 */
    double *lp;          /* with g->logprobs: each new token's log-probability (the stop token's too) */
    int32_t *top_id;     /* and its top_logprobs most likely tokens */
    double *top_lp;
    int n_lp, lp_cap;
} seq_state;

static void push(seq_state *s, int32_t id) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->ids = keel_xrealloc(s->ids, sizeof(int32_t) * (size_t)s->cap, "token ids");
    }
    s->ids[s->n++] = id;
}

static bool stops_at(const keel_infer_model *m, const keel_gen_params *g, int32_t id) {
    for (int i = 0; i < m->n_eos && !g->ignore_eos; i++)
        if (m->eos[i] == id) return true;
    for (int i = 0; i < g->n_stop_ids; i++)
        if (g->stop_ids[i] == id) return true;
    return false;
}

/* The new tokens' text again; a stop string in it ends the prompt there.
 * ready: the text minus a tail that could still grow into a stop string or
 * is a character not yet whole (U+FFFD from partial bytes). */
static void update_text(const keel_infer_model *m, const keel_gen_params *g, seq_state *s) {
    if (!m->tok) return;
    char *text;
    size_t len;
    if (keel_tokenizer_decode_len(m->tok, s->ids + s->n_prompt, (size_t)(s->n - s->n_prompt), &text, &len) != KEEL_OK)
        return; /* ids below the tokenizer's size are checked on load; a padded id decodes to nothing */
    keel_free(s->text);
    s->text = text, s->len = len;
    for (int i = 0; i < g->n_stop; i++) { /* the earliest stop string cuts */
        const char *at = memmem(text, len, g->stop[i], strlen(g->stop[i]));
        if (at && (size_t)(at - text) < s->len) {
            s->len = (size_t)(at - text);
            s->done = true, s->finish = "stop";
        }
    }
    s->text[s->len] = '\0';
    size_t hold = 0;
    if (!s->done) {
        for (int i = 0; i < g->n_stop; i++) {
            size_t k = strlen(g->stop[i]);
            for (size_t h = k - 1 < s->len ? k - 1 : s->len; h > hold; h--)
                if (!memcmp(s->text + s->len - h, g->stop[i], h)) {
                    hold = h;
                    break;
                }
        }
        if (s->len >= 3 && !memcmp(s->text + s->len - 3, "\xEF\xBF\xBD", 3) && hold < 3) hold = 3;
    }
    s->ready = s->len - hold;
}

/* The new token's log-probability and the top_logprobs most likely tokens' from its logits z (V). */
static void record_logprobs(seq_state *s, const keel_gen_params *g, const float *z, int V, int32_t id) {
    if (!g->logprobs) return;
    size_t k = (size_t)g->top_logprobs;
    if (s->n_lp == s->lp_cap) {
        s->lp_cap = s->lp_cap ? 2 * s->lp_cap : 64;
        s->lp = keel_xrealloc(s->lp, sizeof(double) * (size_t)s->lp_cap, "logprobs");
        if (k) {
            s->top_id = keel_xrealloc(s->top_id, sizeof(int32_t) * (size_t)s->lp_cap * k, "top logprobs");
            s->top_lp = keel_xrealloc(s->top_lp, sizeof(double) * (size_t)s->lp_cap * k, "top logprobs");
        }
    }
    double lse = infer_logsumexp(z, V, NULL);
    s->lp[s->n_lp] = (double)z[id] - lse;
    if (k) infer_top_tokens(z, V, lse, (int)k, s->top_id + (size_t)s->n_lp * k, s->top_lp + (size_t)s->n_lp * k);
    s->n_lp++;
}

static void report(keel_gen_fn fn, void *ctx, int i, const seq_state *s, const keel_gen_params *g) {
    if (!fn) return;
    keel_gen_update u = {.prompt = i, .text = s->text ? s->text : "", .len = s->len, .ready = s->ready,
                         .ids = s->ids + s->n_prompt, .n_ids = s->n - s->n_prompt, .prompt_tokens = s->n_prompt,
                         .done = s->done, .finish_reason = s->finish, .stop_id = s->stop_id,
                         .logprobs = g->logprobs ? s->lp : NULL,
                         .top_ids = g->logprobs && g->top_logprobs ? s->top_id : NULL,
                         .top_logprobs = g->logprobs && g->top_logprobs ? s->top_lp : NULL};
    fn(ctx, &u);
}

/* A new token for prompt i from its logits; ends it on a stop or at the limit. */
static void advance(const keel_infer_model *m, const keel_gen_params *g, seq_state *s, int i, const float *z,
                    candidate *cand, int max_len, keel_gen_fn fn, void *ctx, keel_gen_stats *stats) {
    int32_t id = sample(z, m->cfg.model.vocab_size, g, &s->rng, cand);
    record_logprobs(s, g, z, m->cfg.model.vocab_size, id);
    if (stops_at(m, g, id)) s->done = true, s->finish = "stop", s->stop_id = id;
    else {
        push(s, id);
        update_text(m, g, s);
        if (!s->done && (s->n - s->n_prompt >= g->max_new_tokens || s->n >= max_len))
            s->done = true, s->finish = "length";
    }
    if (s->done) s->ready = s->len;
    report(fn, ctx, i, s, g);
    if (s->done && stats) stats->new_tokens += s->n - s->n_prompt;
}

/* ---- the prompts' ids ------------------------------------------------------- */

static keel_status prompt_ids(const keel_infer_model *m, const keel_gen_prompt *p, int i, const keel_gen_params *g,
                              seq_state *s) {
    int V = m->cfg.model.vocab_size, T = m->cfg.model.max_seq_len;
    if (p->text) {
        if (g->add_bos && m->bos >= 0) push(s, m->bos);
        if (!m->tok) {
            keel_errorf("prompt %d: the model has no tokenizer to encode text with (none carried or configured); "
                        "pass --tokenizer FILE", i + 1);
            return KEEL_ERR_INPUT;
        }
        keel_ids ids = {0};
        keel_status st = keel_tokenizer_encode(m->tok, p->text, p->text_len ? p->text_len : strlen(p->text), &ids);
        for (size_t j = 0; st == KEEL_OK && j < ids.n; j++) push(s, ids.ids[j]);
        keel_ids_free(&ids);
        if (st != KEEL_OK) return st;
    } else
        for (int j = 0; j < p->n_ids; j++) {
            if (p->ids[j] < 0 || p->ids[j] >= V) {
                keel_errorf("prompt %d: token id %d is outside the vocabulary [0, %d)", i + 1, p->ids[j], V);
                return KEEL_ERR_INPUT;
            }
            push(s, p->ids[j]);
        }
    if (s->n == 0) {
        keel_errorf("prompt %d is empty and %s; give it some text", i + 1,
                    g->add_bos ? "the model has no BOS to start from" : "--no-bos leaves it nothing to start from");
        return KEEL_ERR_INPUT;
    }
    if (s->n >= T) {
        keel_errorf("prompt %d has %d tokens: the model's context is %d (model.max_seq_len), with room for at least "
                    "one new token; shorten the prompt (nothing is cut silently)", i + 1, s->n, T);
        return KEEL_ERR_INPUT;
    }
    s->n_prompt = s->n;
    return KEEL_OK;
}

/* ---- the schedule ------------------------------------------------------------ */

keel_status keel_infer_generate(keel_infer_model *m, const keel_gen_prompt *prompts, int n, const keel_gen_params *g,
                                keel_gen_fn fn, void *ctx, keel_gen_stats *stats) {
    keel_status st = keel_gen_check(g);
    if (st != KEEL_OK) return st;
    if (stats) *stats = (keel_gen_stats){0};
    int V = m->cfg.model.vocab_size, T = m->cfg.model.max_seq_len;
    for (int i = 0; i < g->n_stop_ids; i++)
        if (g->stop_ids[i] < 0 || g->stop_ids[i] >= V) {
            keel_errorf("stop token id %d is outside the vocabulary [0, %d)", g->stop_ids[i], V);
            return KEEL_ERR_INPUT;
        }
    seq_state *seqs = keel_xcalloc(sizeof *seqs * (size_t)(n > 0 ? n : 1), "prompts");
    int longest = 0;
    for (int i = 0; i < n && st == KEEL_OK; i++) {
        const keel_gen_prompt *p = &prompts[i];
        seqs[i].rng = p->seeded ? p->seed ^ (0xD1B54A32D192ED03ull * (uint64_t)(p->seed_index + 1))
                                : g->seed ^ (0xD1B54A32D192ED03ull * (uint64_t)(i + 1));
        seqs[i].stop_id = -1;
        st = prompt_ids(m, &prompts[i], i, g, &seqs[i]);
        if (seqs[i].n > longest) longest = seqs[i].n;
    }
    keel_decoder *d = NULL;
    int slots = n < g->batch ? n : g->batch;
    int max_len = longest + g->max_new_tokens < T ? longest + g->max_new_tokens : T;
    int rows_max = g->prefill_rows > slots ? g->prefill_rows : slots; /* a prefill chunk, or a decode step */
    if (st == KEEL_OK && n > 0)
        st = keel_decoder_build(&m->cfg.model, m->params,
                                &(keel_decoder_options){.bf16 = g->bf16, .max_seqs = slots, .max_len = max_len,
                                                        .max_rows = rows_max},
                                &d);
    if (st != KEEL_OK || n == 0) goto done;
    {
        int32_t *rows = keel_xmalloc(sizeof(int32_t) * (size_t)rows_max * 4, "step rows");
        int32_t *ids = rows, *seq = ids + rows_max, *pos = seq + rows_max, *want = pos + rows_max;
        float *logits = keel_xmalloc(sizeof(float) * (size_t)slots * V, "logits");
        candidate *cand = keel_xmalloc(sizeof(candidate) * (size_t)V, "sampling scratch");
        int *slot_of = keel_xmalloc(sizeof(int) * (size_t)slots * 2, "slots"), *fresh = slot_of + slots;
        int next = 0, active = 0;
        for (int k = 0; k < slots; k++) slot_of[k] = -1;
        for (;;) {
            /* free slots take the next prompts, prefilled together: their rows
             * packed into steps of up to prefill_rows (a prompt's in order);
             * the logits of each one's last row give its first new token */
            int n_fresh = 0;
            for (int k = 0; k < slots && next < n; k++)
                if (slot_of[k] < 0) slot_of[k] = next++, fresh[n_fresh++] = k;
            if (n_fresh > 0) {
                double t0 = keel_now_s();
                for (int f = 0, t = 0, r = 0, w = 0, got = 0; f < n_fresh;) {
                    const seq_state *s = &seqs[slot_of[fresh[f]]];
                    ids[r] = s->ids[t], seq[r] = fresh[f], pos[r] = t;
                    if (t == s->n_prompt - 1) want[w++] = r;
                    if (++t == s->n_prompt) f++, t = 0;
                    if (++r == g->prefill_rows || f == n_fresh) {
                        keel_decoder_step(d, ids, seq, pos, r, want, w, logits + (size_t)got * V);
                        got += w, r = w = 0;
                    }
                }
                if (stats) stats->prefill_s += keel_now_s() - t0;
                for (int f = 0; f < n_fresh; f++) {
                    int k = fresh[f], i = slot_of[k];
                    seq_state *s = &seqs[i];
                    if (stats) stats->prompt_tokens += s->n_prompt;
                    advance(m, g, s, i, logits + (size_t)f * V, cand, max_len, fn, ctx, stats);
                    active++;
                    if (s->done) slot_of[k] = -1, active--;
                }
                continue; /* a prompt done at its first token has left its slot to the next */
            }
            if (active == 0) break;
            /* one decode step for every prompt in a slot */
            int r = 0;
            for (int k = 0; k < slots; k++)
                if (slot_of[k] >= 0) {
                    seq_state *s = &seqs[slot_of[k]];
                    ids[r] = s->ids[s->n - 1], seq[r] = k, pos[r] = s->n - 1, want[r] = r;
                    r++;
                }
            double t0 = keel_now_s();
            keel_decoder_step(d, ids, seq, pos, r, want, r, logits);
            if (stats) stats->decode_s += keel_now_s() - t0, stats->decode_tokens += r;
            for (int k = 0, row = 0; k < slots; k++) {
                if (slot_of[k] < 0) continue;
                seq_state *s = &seqs[slot_of[k]];
                advance(m, g, s, slot_of[k], logits + (size_t)row++ * V, cand, max_len, fn, ctx, stats);
                if (s->done) slot_of[k] = -1, active--;
            }
        }
        keel_free(rows);
        keel_free(logits);
        keel_free(cand);
        keel_free(slot_of);
    }
done:
    keel_decoder_free(d);
    for (int i = 0; i < n; i++)
        keel_free(seqs[i].ids), keel_free(seqs[i].text), keel_free(seqs[i].lp), keel_free(seqs[i].top_id),
            keel_free(seqs[i].top_lp);
    keel_free(seqs);
    return st;
}
