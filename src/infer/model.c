/* infer/model.c: a model to use from any path keel writes or reads — a run's
 * final weights, a Hugging Face directory, a checkpoint — with its tokenizer
 * and stop ids (keel_infer_load in keel/infer.h). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "keel/ckpt.h"
#include "keel/hf.h"
#include "keel/infer.h"
#include "keel/model.h"
#include "keel/run.h"

/* The generation config's stop ids, from the file at path. */
static keel_status read_generation_config(const char *path, keel_infer_model *m) {
    char *text = NULL, why[256];
    size_t len = 0;
    if (keel_read_regular(path, (size_t)1 << 20, &text, &len, why, sizeof why) != KEEL_OK) {
        keel_errorf("%s: cannot read the generation config: %s", path, why);
        return KEEL_ERR_IO;
    }
    int bos;
    keel_status st = keel_hf_generation_config(text, len, path, m->cfg.model.vocab_size, &bos, m->eos, &m->n_eos);
    keel_free(text);
    return st;
}

/* A Hugging Face directory: config.json beside model.safetensors or its index. */
static bool is_hf_dir(const char *path) {
    char a[4200], b[4200], c[4200];
    snprintf(a, sizeof a, "%s/config.json", path);
    snprintf(b, sizeof b, "%s/model.safetensors", path);
    snprintf(c, sizeof c, "%s/model.safetensors.index.json", path);
    return keel_path_exists(a) && (keel_path_exists(b) || keel_path_exists(c));
}

static keel_status load_hf(const char *path, keel_infer_model *m, char **tokenizer, char **generation) {
    keel_hf_reader *r = NULL;
    keel_status st = keel_hf_open(path, &m->cfg.model, &r);
    if (st != KEEL_OK) return st;
    keel_model_layout lay;
    keel_model_layout_init(&lay, &m->cfg.model);
    m->params = keel_xmalloc(sizeof(float) * (size_t)lay.n_params, "parameters");
    st = keel_hf_read(r, 0, lay.n_params, m->params);
    keel_model_layout_free(&lay);
    keel_hf_close(r);
    const char *kinds[2] = {"tokenizer.json", "tokenizer.model"};
    for (int k = 0; k < 2 && !*tokenizer; k++) {
        char *p = keel_path_join(path, kinds[k]);
        if (access(p, R_OK) == 0) *tokenizer = p;
        else keel_free(p);
    }
    char *g = keel_path_join(path, "generation_config.json");
    if (keel_path_exists(g)) *generation = g;
    else keel_free(g);
    snprintf(m->what, sizeof m->what, "Hugging Face directory %s", path);
    return st;
}

static keel_status load_run_weights(const char *path, const char *weights, keel_infer_model *m, char **tokenizer,
                                    char **generation) {
    keel_config_free(&m->cfg);
    keel_status st = keel_run_load_config(path, &m->cfg);
    if (st != KEEL_OK) return st;
    keel_model_layout lay;
    keel_model_layout_init(&lay, &m->cfg.model);
    m->params = keel_xmalloc(sizeof(float) * (size_t)lay.n_params, "parameters");
    st = keel_weights_load(weights, m->params, lay.n_params);
    keel_model_layout_free(&lay);
    if (!*tokenizer) *tokenizer = keel_ckpt_find_tokenizer(NULL, &m->cfg);
    *generation = keel_ckpt_find_carried(NULL, &m->cfg, "generation_config.json");
    snprintf(m->what, sizeof m->what, "the final weights of run %s", path);
    return st;
}

static keel_status load_checkpoint(const char *path, keel_infer_model *m, char **tokenizer, char **generation) {
    keel_ckpt ck;
    keel_status st = keel_ckpt_open_any(path, &ck);
    if (st != KEEL_OK) return st;
    keel_config_free(&m->cfg);
    st = keel_ckpt_load_config(&ck, &m->cfg);
    keel_ckpt_merged *merged = NULL; /* LoRA adapters: merged into their base */
    if (st == KEEL_OK && m->cfg.train.lora.on && (st = keel_ckpt_verify_all(&ck)) == KEEL_OK)
        st = keel_ckpt_merged_open(&ck, &m->cfg, &merged);
    if (st == KEEL_OK) {
        keel_model_layout lay;
        keel_model_layout_init(&lay, &m->cfg.model);
        m->params = keel_xmalloc(sizeof(float) * (size_t)lay.n_params, "parameters");
        if (merged) st = keel_ckpt_merged_read(merged, 0, lay.n_params, m->params);
        else st = keel_ckpt_load_params(&ck, &lay, m->params); /* verifies every file */
        keel_model_layout_free(&lay);
        keel_ckpt *carrier = merged ? keel_ckpt_merged_base(merged) : &ck; /* an import's tokenizer: the base's */
        if (!*tokenizer) *tokenizer = keel_ckpt_find_tokenizer(carrier, &m->cfg);
        *generation = keel_ckpt_find_carried(carrier, &m->cfg, "generation_config.json");
        snprintf(m->what, sizeof m->what, "%s %s (step %lld)%s%s", merged ? "LoRA checkpoint" : "checkpoint", ck.dir,
                 (long long)ck.step, merged ? " merged into its base " : "", merged ? m->cfg.init_from : "");
    }
    keel_ckpt_merged_close(merged);
    keel_ckpt_close(&ck);
    return st;
}

keel_status keel_infer_load(const char *path, const char *tokenizer, keel_infer_model *out) {
    keel_infer_model *m = out;
    memset(m, 0, sizeof *m);
    keel_config_defaults(&m->cfg);
    m->bos = -1;
    char weights[4200], *tok_path = tokenizer ? keel_xstrdup(tokenizer) : NULL, *generation = NULL;
    keel_run_path(weights, sizeof weights, path, KEEL_RUN_WEIGHTS);
    keel_status st;
    if (keel_path_exists(weights)) st = load_run_weights(path, weights, m, &tok_path, &generation);
    else if (is_hf_dir(path)) st = load_hf(path, m, &tok_path, &generation);
    else st = load_checkpoint(path, m, &tok_path, &generation);
    int V = m->cfg.model.vocab_size;
    if (st == KEEL_OK && tok_path) {
        st = keel_tokenizer_load(tok_path, &m->tok);
        if (st == KEEL_OK && keel_tokenizer_vocab_size(m->tok) > V) {
            keel_errorf("%s: the tokenizer has %d tokens, more than the model's vocab_size %d: it is another "
                        "model's; pass the model's own with --tokenizer", tok_path, keel_tokenizer_vocab_size(m->tok), V);
            st = KEEL_ERR_INPUT;
        }
        if (st == KEEL_OK) m->bos = keel_tokenizer_bos_id(m->tok);
    }
    if (st == KEEL_OK && generation) st = read_generation_config(generation, m);
    if (st == KEEL_OK && m->n_eos == 0 && m->tok && keel_tokenizer_eos_id(m->tok) >= 0)
        m->eos[m->n_eos++] = keel_tokenizer_eos_id(m->tok);
    keel_free(generation);
    if (st != KEEL_OK) {
        keel_free(tok_path);
        keel_infer_model_free(m);
        return st;
    }
    m->tokenizer_path = tok_path;
    return KEEL_OK;
}

void keel_infer_model_free(keel_infer_model *m) {
    keel_free(m->params);
    keel_tokenizer_free(m->tok);
    keel_free(m->tokenizer_path);
    keel_config_free(&m->cfg);
    memset(m, 0, sizeof *m);
    m->bos = -1;
}
