/* train/samples.c: text samples while training — every train.sample_every
 * steps the model completes train.sample_prompts (keel_infer_generate on
 * the CPU, from a copy of the parameters, with its own seeded generators) and
 * the leader appends {"step", "prompt", "completion", ...} lines to
 * RUN/samples.jsonl, which the dashboard and `keel status` show. Nothing the
 * training computes is touched: its parameters are read, never written, and
 * its data order and random numbers are not drawn from. */
#include <cjson/cJSON.h>
#include <string.h>

#include "keel/ckpt.h"
#include "keel/infer.h"
#include "train/gather.h"
#include "train/samples.h"

struct trainer_sampler {
    keel_tokenizer *tok;
    char *tokenizer_path;
    keel_gen_prompt *prompts;
    int n;
    keel_jsonl *out;      /* the leader's RUN/samples.jsonl */
    int step;             /* the step being sampled */
    double started;
    keel_heartbeat *heartbeat;
};

keel_status trainer_samples_init(trainer *t) {
    const keel_train_config *tc = &t->cfg->train;
    if (tc->sample_every <= 0) return KEEL_OK;
    char *path = keel_ckpt_find_tokenizer(NULL, t->cfg);
    if (!path) {
        keel_errorf("train.sample_every %d needs a tokenizer to write text: set data.tokenizer (the tokenizer.model "
                    "or tokenizer.json the data were prepared with), or train.sample_every to 0", tc->sample_every);
        return KEEL_ERR_INPUT;
    }
    trainer_sampler *s = t->sampler = keel_xcalloc(sizeof *s, "sampler");
    s->tokenizer_path = path;
    keel_status st = keel_tokenizer_load(path, &s->tok);
    if (st != KEEL_OK) return st;
    static const char *const none[] = {"", NULL};
    const char *const *p = tc->sample_prompts ? (const char *const *)tc->sample_prompts : none;
    while (p[s->n]) s->n++;
    s->prompts = keel_xcalloc(sizeof *s->prompts * (size_t)s->n, "sample prompts");
    int bos = keel_tokenizer_bos_id(s->tok), T = t->cfg->model.max_seq_len;
    for (int i = 0; i < s->n; i++) {
        s->prompts[i].text = p[i];
        keel_ids ids = {0};
        st = keel_tokenizer_encode(s->tok, p[i], strlen(p[i]), &ids);
        int n = (int)ids.n + (bos >= 0);
        keel_ids_free(&ids);
        if (st != KEEL_OK) return st;
        if (n == 0 || n >= T) {
            keel_errorf("train.sample_prompts[%d] is %d tokens: %s", i, n,
                        n ? "no room left for a new token in model.max_seq_len; shorten it"
                          : "empty, and the tokenizer has no BOS to start from; give it some text");
            return KEEL_ERR_INPUT;
        }
    }
    if (t->leader) {
        char out[4200];
        keel_run_path(out, sizeof out, t->run_dir, KEEL_RUN_SAMPLES);
        st = keel_jsonl_open(out, &s->out);
    }
    return st;
}

void trainer_samples_free(trainer *t) {
    trainer_sampler *s = t->sampler;
    if (!s) return;
    keel_tokenizer_free(s->tok);
    keel_free(s->tokenizer_path);
    keel_free(s->prompts); /* the texts are the config's */
    keel_jsonl_close(s->out);
    keel_free(s);
    t->sampler = NULL;
}

static keel_status copy_piece(void *params, int64_t at, const float *values, int64_t n) {
    memcpy((float *)params + at, values, sizeof(float) * (size_t)n);
    return KEEL_OK;
}

/* A prompt done: its line (the leader); every token: a sign of progress. */
static void on_update(void *ctx, const keel_gen_update *u) {
    trainer_sampler *s = ctx;
    keel_heartbeat_progress(s->heartbeat, "sample");
    if (!u->done || !s->out) return;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "step", s->step);
    cJSON_AddStringToObject(o, "prompt", s->prompts[u->prompt].text);
    cJSON_AddStringToObject(o, "completion", u->text);
    cJSON_AddNumberToObject(o, "tokens", u->n_ids);
    cJSON_AddStringToObject(o, "finish_reason", u->finish_reason);
    cJSON_AddNumberToObject(o, "seconds", keel_now_s() - s->started);
    cJSON_AddNumberToObject(o, "unix_s", keel_unix_s());
    char *line = cJSON_PrintUnformatted(o);
    keel_jsonl_write(s->out, line);
    cJSON_free(line);
    cJSON_Delete(o);
}

void trainer_samples_boundary(trainer *t, int step) {
    trainer_sampler *s = t->sampler;
    const keel_train_config *tc = &t->cfg->train;
    if (!s || step % tc->sample_every != 0) return;
    s->step = step, s->started = keel_now_s(), s->heartbeat = t->heartbeat;
    keel_heartbeat_progress(t->heartbeat, "sample");
    int64_t allocs0 = t->be->allocations(), cpu_allocs0 = keel_backend_cpu()->allocations();
    const keel_model_layout *lay = keel_model_get_layout(t->model);
    float *params = keel_xmalloc(sizeof(float) * (size_t)lay->n_params, "the model for samples");
    keel_status st = trainer_each_param(t, true, copy_piece, params);
    keel_infer_model m = {.params = params, .tok = s->tok, .bos = keel_tokenizer_bos_id(s->tok)};
    m.cfg.model = t->cfg->model; /* the rest of m.cfg stays empty: only the model's shape is read */
    if (keel_tokenizer_eos_id(s->tok) >= 0) m.eos[m.n_eos++] = keel_tokenizer_eos_id(s->tok);
    keel_gen_params g = keel_gen_defaults();
    g.max_new_tokens = tc->sample_max_tokens, g.temperature = tc->sample_temperature, g.seed = tc->sample_seed;
    if (st == KEEL_OK) st = keel_infer_generate(&m, s->prompts, s->n, &g, on_update, s, NULL);
    keel_free(params);
    if (st != KEEL_OK && t->leader) keel_log_warn("step %d: no samples (said above); training goes on", step);
    /* the decoder's buffers are the sample's, not a step's (summary.json's backend_allocations_in_steps) */
    if (t->allocs_after_first_step >= 0)
        t->allocs_after_first_step += t->be->allocations() - allocs0 +
                                      (t->be != keel_backend_cpu() ? keel_backend_cpu()->allocations() - cpu_allocs0 : 0);
}
