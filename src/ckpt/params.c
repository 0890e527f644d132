/* ckpt/params.c: checkpoints as a model's parameter set — what `keel ckpt`,
 * `keel eval` and init_from use: open a checkpoint or a run's newest good
 * one, its config, its parameters, and a parameter set written as a
 * one-file checkpoint. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "keel/ckpt.h"
#include "keel/fsdp.h"

keel_status keel_ckpt_verify_all(const keel_ckpt *c) {
    keel_status st = KEEL_OK;
    for (int j = 0; j < c->shard_ranks && st == KEEL_OK; j++) st = keel_ckpt_verify_file(c, j);
    for (int i = 0; i < c->n_carried && st == KEEL_OK; i++) st = keel_ckpt_verify_carried(c, i);
    return st;
}

keel_status keel_ckpt_verify_ranges(const keel_ckpt *c, const keel_param_range *ranges, int n) {
    bool *used = keel_xcalloc(sizeof(bool) * (size_t)c->shard_ranks, "checkpoint files");
    keel_ckpt_files_for(c, ranges, n, used);
    keel_status st = KEEL_OK;
    for (int j = 0; j < c->shard_ranks && st == KEEL_OK; j++)
        if (used[j]) st = keel_ckpt_verify_file(c, j);
    keel_free(used);
    return st;
}

keel_status keel_ckpt_open_any(const char *path, keel_ckpt *out) {
    char manifest[4200];
    snprintf(manifest, sizeof manifest, "%s/manifest.json", path);
    if (keel_path_exists(manifest)) return keel_ckpt_open(path, out);
    if (!keel_path_exists(path)) {
        keel_errorf("%s: no such checkpoint or run directory; give a run directory or one of its checkpoints "
                    "(RUN/checkpoints/step_N)", path);
        return KEEL_ERR_INPUT;
    }
    int64_t *steps;
    int n = keel_ckpt_list(path, &steps);
    keel_status st = KEEL_ERR_INPUT;
    for (int i = 0; i < n && st != KEEL_OK; i++) {
        char dir[4096];
        keel_ckpt_dir(dir, sizeof dir, path, steps[i], false);
        keel_error_capture(true);
        st = keel_ckpt_open(dir, out);
        if (st == KEEL_OK && (st = keel_ckpt_verify_all(out)) != KEEL_OK) keel_ckpt_close(out);
        keel_error_capture(false);
    }
    keel_free(steps);
    if (st != KEEL_OK)
        keel_errorf("%s: not a checkpoint (no manifest.json) and no good checkpoint under %s/checkpoints",
                    path, path);
    return st;
}

keel_status keel_ckpt_load_config(const keel_ckpt *c, keel_config *cfg) {
    keel_config_defaults(cfg);
    char *json = keel_ckpt_config_json(c);
    if (!json) {
        keel_errorf("%s/manifest.json: the manifest has no config", c->dir);
        return KEEL_ERR_INPUT;
    }
    char origin[4200];
    snprintf(origin, sizeof origin, "%s/manifest.json", c->dir);
    keel_status st = keel_config_load_string(cfg, json, origin);
    free(json);
    if (st == KEEL_OK) st = keel_config_finalize(cfg);
    if (st == KEEL_OK) { /* the files hold that model, or its adapters: a read never falls outside them */
        keel_model_layout lay, adapters;
        keel_model_layout_init(&lay, &cfg->model);
        char why[256];
        if (!cfg->train.lora.on) st = keel_ckpt_check_layout(c, &lay);
        else if ((st = keel_lora_layout_init(&adapters, &lay, &cfg->train.lora, why, sizeof why)) != KEEL_OK)
            keel_errorf("%s: %s", origin, why);
        else st = keel_ckpt_check_layout(c, &adapters), keel_model_layout_free(&adapters);
        keel_model_layout_free(&lay);
    }
    return st;
}

keel_status keel_ckpt_need_model(const keel_ckpt *c, const keel_config *cfg) {
    if (!cfg->train.lora.on) return KEEL_OK;
    keel_errorf("%s holds LoRA adapters (train.lora), not a whole model; use its run's weights.bin (the base "
                "with the adapters merged) instead", c->dir);
    return KEEL_ERR_INPUT;
}

keel_status keel_ckpt_load_model(const char *path, keel_config *cfg, float **params, int64_t *step) {
    keel_ckpt ck;
    *params = NULL;
    keel_config_defaults(cfg);
    keel_status st = keel_ckpt_open_any(path, &ck);
    if (st != KEEL_OK) return st;
    keel_config_free(cfg);
    st = keel_ckpt_load_config(&ck, cfg);
    if (st == KEEL_OK) st = keel_ckpt_need_model(&ck, cfg);
    if (st == KEEL_OK) {
        keel_model_layout lay;
        keel_model_layout_init(&lay, &cfg->model);
        *params = keel_try_malloc(sizeof(float) * (size_t)lay.n_params);
        if (!*params) {
            keel_errorf("%s: its %lld parameters need more memory than there is", ck.dir, (long long)lay.n_params);
            st = KEEL_ERR_INPUT;
        } else {
            st = keel_ckpt_load_params(&ck, &lay, *params);
        }
        keel_model_layout_free(&lay);
    }
    if (st != KEEL_OK) {
        keel_free(*params);
        *params = NULL;
    }
    if (step) *step = ck.step;
    keel_ckpt_close(&ck);
    return st;
}

keel_status keel_ckpt_read_params(void *ckpt, int64_t begin, int64_t len, float *dst) {
    return keel_ckpt_read(ckpt, 0, begin, len, dst);
}

/* The parameters array of a one-rank plan, in file order: each unit's tensors
 * read from the source through a buffer of the largest tensor, then the
 * unit's padding. */
static keel_status append_params(keel_ckpt_writer *w, const char *out, const keel_model_layout *lay,
                                 const keel_fsdp_plan *plan, keel_param_source read, void *ctx) {
    int64_t largest = 0;
    const char *name = "";
    for (int i = 0; i < lay->n_tensors; i++)
        if (lay->tensors[i].rows * lay->tensors[i].cols > largest)
            largest = lay->tensors[i].rows * lay->tensors[i].cols, name = lay->tensors[i].name;
    float *buf = keel_try_malloc(sizeof(float) * (size_t)largest);
    if (!buf) {
        keel_errorf("%s: tensor %s (%lld values) needs more memory than this machine has; write this "
                    "model on a larger one", out, name, (long long)largest);
        return KEEL_ERR_INPUT;
    }
    keel_status st = KEEL_OK;
    for (int u = 0, i = 0; u < plan->n_units && st == KEEL_OK; u++) {
        for (; i < lay->n_tensors && lay->tensors[i].unit == u && st == KEEL_OK; i++) {
            const keel_tensor_info *t = &lay->tensors[i];
            st = read(ctx, t->offset, t->rows * t->cols, buf);
            if (st == KEEL_OK) st = keel_ckpt_shard_append(w, buf, t->rows * t->cols);
        }
        if (st == KEEL_OK) st = keel_ckpt_shard_append(w, NULL, plan->units[u].shard - plan->units[u].logical);
    }
    keel_free(buf);
    return st;
}

/* The first ancestor of path (path itself included) that does not exist,
 * into out ("" when its parent exists): what a failure must remove again. */
static void first_missing(const char *path, char *out, size_t n) {
    char p[4200];
    snprintf(p, sizeof p, "%s", path);
    out[0] = '\0';
    for (;;) {
        char *slash = strrchr(p, '/');
        if (!slash || slash == p) return;
        *slash = '\0';
        if (keel_path_exists(p)) return;
        snprintf(out, n, "%s", p);
    }
}

/* Remove dir's ancestors up to and including top (made for this write); rmdir
 * keeps any that are not empty. */
static void remove_up_to(const char *dir, const char *top) {
    if (!top[0]) return;
    char p[4200];
    snprintf(p, sizeof p, "%s", dir);
    for (char *slash; (slash = strrchr(p, '/')) && slash != p && strlen(p) > strlen(top);) {
        *slash = '\0';
        rmdir(p);
    }
}

/* The carried files into tmp (made by then), each durably; their manifest
 * entries into carried. */
static keel_status write_carried(const char *tmp, const keel_ckpt_carry *carry, int n, keel_ckpt_carried *carried) {
    KEEL_CHECK(n >= 0 && n <= KEEL_CKPT_MAX_CARRIED, "%d carried files", n);
    keel_status st = KEEL_OK;
    for (int i = 0; i < n && st == KEEL_OK; i++) {
        KEEL_CHECK(strlen(carry[i].name) < sizeof carried[i].name && !strchr(carry[i].name, '/'),
                   "carried file name %s", carry[i].name);
        char *path = keel_path_join(tmp, carry[i].name);
        st = keel_write_file_atomic(path, carry[i].data, carry[i].bytes);
        keel_free(path);
        snprintf(carried[i].name, sizeof carried[i].name, "%s", carry[i].name);
        carried[i].bytes = (int64_t)carry[i].bytes;
        carried[i].xxh3 = XXH3_64bits(carry[i].data, carry[i].bytes);
    }
    return st;
}

/* out: one file of one shard rank holding lay's parameters from read (AdamW
 * m and v zero), the carried files, cfg as its config; base_id: a LoRA
 * checkpoint's record of its base (cfg's init_from), else NULL. */
static keel_status write_params(const char *out, const keel_config *cfg, const keel_model_layout *lay,
                                const char *base_id, keel_param_source read, void *ctx, const keel_ckpt_carry *carry,
                                int n_carry) {
    if (keel_path_exists(out)) {
        keel_errorf("%s already exists; pick a new --out (keel never overwrites a checkpoint)", out);
        return KEEL_ERR_INPUT;
    }
    keel_fsdp_plan plan;
    keel_fsdp_plan_init(&plan, lay, 1);
    char tmp[4200], made[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    first_missing(tmp, made, sizeof made);
    keel_ckpt_writer *w;
    keel_ckpt_file file;
    keel_ckpt_carried carried[KEEL_CKPT_MAX_CARRIED];
    keel_status st = keel_ckpt_shard_begin(tmp, 0, 1, 0, plan.shard_total, &w);
    if (st == KEEL_OK && (st = write_carried(tmp, carry, n_carry, carried)) != KEEL_OK) keel_ckpt_shard_abort(w);
    if (st == KEEL_OK) {
        keel_status wst = append_params(w, out, lay, &plan, read, ctx);
        for (int a = 1; a < KEEL_CKPT_ARRAYS && wst == KEEL_OK; a++) wst = keel_ckpt_shard_append(w, NULL, plan.shard_total);
        if (wst != KEEL_OK) { /* the source's failure was one line already (a write's is said at finish) */
            keel_ckpt_shard_abort(w);
            st = wst;
        } else {
            st = keel_ckpt_shard_finish(w, &file);
        }
    }
    if (st == KEEL_OK) {
        char *config = keel_config_to_json(cfg);
        keel_ckpt_meta meta = {.step = 0, .global_batch = 0, .world_size = 1, .strategy = "import",
                               .plan = &plan, .files = &file, .config_json = config,
                               .seed = cfg->train.seed, .next_lr = 0, .carried = carried, .n_carried = n_carry,
                               .lora_base = base_id ? cfg->init_from : NULL, .lora_base_id = base_id};
        char *manifest = keel_ckpt_manifest_json(&meta);
        st = keel_ckpt_commit_dir(tmp, out, manifest);
        free(manifest);
        free(config);
    }
    if (st != KEEL_OK) { /* leave nothing behind: out.tmp and the parents made for it */
        keel_ckpt_remove_tree(tmp);
        remove_up_to(tmp, made);
    }
    keel_fsdp_plan_free(&plan);
    return st;
}

keel_status keel_ckpt_write_model(const char *out, const keel_config *cfg, keel_param_source read, void *ctx,
                                  const keel_ckpt_carry *carry, int n_carry) {
    keel_model_layout lay;
    keel_model_layout_init(&lay, &cfg->model);
    keel_status st = write_params(out, cfg, &lay, NULL, read, ctx, carry, n_carry);
    keel_model_layout_free(&lay);
    return st;
}

keel_status keel_ckpt_write_adapters(const char *out, const keel_config *cfg, const char *base_id,
                                     keel_param_source read, void *ctx) {
    keel_model_layout lay, lora;
    char why[256];
    keel_model_layout_init(&lay, &cfg->model);
    keel_status st = keel_lora_layout_init(&lora, &lay, &cfg->train.lora, why, sizeof why);
    if (st != KEEL_OK) keel_errorf("%s: %s", out, why);
    else st = write_params(out, cfg, &lora, base_id, read, ctx, NULL, 0), keel_model_layout_free(&lora);
    keel_model_layout_free(&lay);
    return st;
}

int64_t keel_ckpt_bytes(const keel_model_config *model, int world_size) {
    keel_model_layout lay;
    keel_model_layout_init(&lay, model);
    keel_fsdp_plan plan;
    keel_fsdp_plan_init(&plan, &lay, world_size);
    int64_t bytes = (KEEL_CKPT_HEADER_BYTES + (int64_t)sizeof(float) * KEEL_CKPT_ARRAYS * plan.shard_total) *
                    world_size;
    keel_fsdp_plan_free(&plan);
    keel_model_layout_free(&lay);
    return bytes;
}

char *keel_ckpt_init_from_carried(const char *init_from, const char *name) {
    if (!init_from) return NULL;
    char manifest[4200];
    snprintf(manifest, sizeof manifest, "%s/manifest.json", init_from);
    if (!keel_path_exists(manifest)) return NULL; /* a run directory: its saves carry nothing */
    keel_ckpt ck;
    keel_error_capture(true);
    char *path = NULL;
    if (keel_ckpt_open(init_from, &ck) == KEEL_OK) {
        for (int i = 0; i < ck.n_carried && !path; i++)
            if (!strcmp(ck.carried[i].name, name) && keel_ckpt_verify_carried(&ck, i) == KEEL_OK)
                path = keel_path_join(ck.dir, name);
        keel_ckpt_close(&ck);
    }
    keel_error_capture(false);
    return path;
}

char *keel_ckpt_find_carried(const keel_ckpt *ck, const keel_config *cfg, const char *name) {
    char *path = ck ? keel_ckpt_carried_path(ck, name) : NULL;
    return path ? path : keel_ckpt_init_from_carried(cfg->init_from, name);
}

char *keel_ckpt_find_tokenizer(const keel_ckpt *ck, const keel_config *cfg) {
    const char *kinds[2] = {"tokenizer.json", "tokenizer.model"};
    char *path = NULL;
    for (int k = 0; k < 2 && !path && ck; k++) path = keel_ckpt_carried_path(ck, kinds[k]);
    if (!path && cfg->data.tokenizer && access(cfg->data.tokenizer, R_OK) == 0) path = keel_xstrdup(cfg->data.tokenizer);
    for (int k = 0; k < 2 && !path; k++) path = keel_ckpt_init_from_carried(cfg->init_from, kinds[k]);
    return path;
}

/* ---- a LoRA checkpoint's adapters merged into its base -------------------------- */

struct keel_ckpt_merged {
    keel_ckpt base;
    const keel_ckpt *adapters;
    keel_model_layout lay, lora;
    int unit;          /* the unit in buf, -1 none */
    float *buf, *adapter_buf;
};

keel_status keel_ckpt_merged_open(const keel_ckpt *adapters, const keel_config *cfg, keel_ckpt_merged **out) {
    *out = NULL;
    if (!cfg->train.lora.on) {
        keel_errorf("%s holds a whole model, not LoRA adapters: there is nothing to merge", adapters->dir);
        return KEEL_ERR_INPUT;
    }
    keel_ckpt_merged *m = keel_xcalloc(sizeof *m, "merged model");
    keel_status st = keel_ckpt_open_any(cfg->init_from, &m->base);
    if (st != KEEL_OK) {
        keel_free(m);
        return st;
    }
    char id[17], why[256];
    keel_ckpt_identity(&m->base, id);
    const char *want = keel_ckpt_lora_base_id(adapters);
    if (want && strcmp(want, id) != 0) {
        keel_errorf("%s: its base %s changed since the adapters were trained (identity %s, theirs %s); point the "
                    "run's init_from at that base", adapters->dir, cfg->init_from, id, want);
        st = KEEL_ERR_INPUT;
    }
    keel_model_layout_init(&m->lay, &cfg->model);
    if (st == KEEL_OK) st = keel_ckpt_check_layout(&m->base, &m->lay);
    if (st == KEEL_OK) st = keel_ckpt_verify_all(&m->base);
    if (st == KEEL_OK && keel_lora_layout_init(&m->lora, &m->lay, &cfg->train.lora, why, sizeof why) != KEEL_OK) {
        keel_errorf("%s: %s", adapters->dir, why);
        st = KEEL_ERR_INPUT;
    }
    if (st != KEEL_OK) {
        keel_ckpt_close(&m->base);
        keel_model_layout_free(&m->lay);
        keel_free(m);
        return st;
    }
    m->adapters = adapters;
    m->unit = -1;
    int64_t most = 1, most_a = 1;
    for (int u = 0; u < m->lay.n_units; u++) {
        most = m->lay.unit_size[u] > most ? m->lay.unit_size[u] : most;
        most_a = m->lora.unit_size[u] > most_a ? m->lora.unit_size[u] : most_a;
    }
    m->buf = keel_xmalloc(sizeof(float) * (size_t)most, "a unit of the merged model");
    m->adapter_buf = keel_xmalloc(sizeof(float) * (size_t)most_a, "a unit's adapters");
    *out = m;
    return KEEL_OK;
}

keel_status keel_ckpt_merged_read(void *ctx, int64_t begin, int64_t len, float *dst) {
    keel_ckpt_merged *m = ctx;
    while (len > 0) {
        int u = 0;
        while (begin >= m->lay.unit_offset[u] + m->lay.unit_size[u]) u++;
        if (u != m->unit) {
            keel_status st = keel_ckpt_read(&m->base, 0, m->lay.unit_offset[u], m->lay.unit_size[u], m->buf);
            if (st == KEEL_OK && m->lora.unit_size[u] > 0)
                st = keel_ckpt_read(m->adapters, 0, m->lora.unit_offset[u], m->lora.unit_size[u], m->adapter_buf);
            if (st != KEEL_OK) return st;
            keel_lora_merge_unit(&m->lay, &m->lora, u, m->buf, m->adapter_buf);
            m->unit = u;
        }
        int64_t end = m->lay.unit_offset[u] + m->lay.unit_size[u], n = end - begin < len ? end - begin : len;
        memcpy(dst, m->buf + (begin - m->lay.unit_offset[u]), sizeof(float) * (size_t)n);
        begin += n, len -= n, dst += n;
    }
    return KEEL_OK;
}

keel_ckpt *keel_ckpt_merged_base(keel_ckpt_merged *m) { return &m->base; }

void keel_ckpt_merged_close(keel_ckpt_merged *m) {
    if (!m) return;
    keel_ckpt_close(&m->base);
    keel_model_layout_free(&m->lay);
    keel_model_layout_free(&m->lora);
    keel_free(m->buf);
    keel_free(m->adapter_buf);
    keel_free(m);
}
