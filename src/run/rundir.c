/* run/rundir.c: creating and validating a run directory, and the resume
 * decision: a new run, or the same model's run to go on with. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "keel/backend.h"
#include "keel/ckpt.h"
#include "keel/data.h"
#include "keel/fsdp.h"
#include "keel/run.h"

void keel_run_path(char *out, size_t n, const char *run_dir, const char *name) {
    snprintf(out, n, "%s/%s", run_dir, name);
}

void keel_run_rank_log_path(char *out, size_t n, const char *run_dir, int rank) {
    snprintf(out, n, "%s/%s/rank-%d.log", run_dir, KEEL_RUN_LOGS, rank);
}

static const char *source(const keel_config *cfg) { return cfg->source ? cfg->source : "config"; }

/* A run directory must be new or empty: nothing in it is ever overwritten. */
static keel_status check_free(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return KEEL_OK;
        keel_errorf("%s: cannot use as run directory: %s", dir, strerror(errno));
        return KEEL_ERR_INPUT;
    }
    struct dirent *e;
    bool empty = true;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = false;
    closedir(d);
    if (!empty) {
        keel_errorf("%s: run directory already exists and is not empty; pass a new --run-dir "
                    "(keel never overwrites a run)", dir);
        return KEEL_ERR_INPUT;
    }
    return KEEL_OK;
}

/* ---- the resume decision ---------------------------------------------------- */

/* Keys a resumed run may change: how long, how parallel, how often it saves,
 * where it runs (a checkpoint written on a GPU resumes on CPUs, and back). */
static const char *const RESUMABLE[] = {"device", "train.steps", "train.threads", "train.eval_every",
                                        "train.eval_batches", "train.micro_batch_size",
                                        "train.grad_accum_steps", "fsdp", "checkpoint",
                                        "resilience", "metrics", NULL};

static void drop(cJSON *root, const char *dotted) {
    char buf[128];
    snprintf(buf, sizeof buf, "%s", dotted);
    char *dot = strchr(buf, '.');
    if (!dot) {
        cJSON_DeleteItemFromObjectCaseSensitive(root, buf);
        return;
    }
    *dot = 0;
    cJSON *sec = cJSON_GetObjectItemCaseSensitive(root, buf);
    if (sec) cJSON_DeleteItemFromObjectCaseSensitive(sec, dot + 1);
}

/* cfg's JSON without the keys a resume may change (caller frees). */
static cJSON *fixed_part(const keel_config *cfg) {
    char *text = keel_config_to_json(cfg);
    cJSON *j = cJSON_Parse(text);
    free(text);
    for (int i = 0; RESUMABLE[i]; i++) drop(j, RESUMABLE[i]);
    /* LoRA's base may move: what it holds is checked by identity (check_lora_base) */
    if (cfg->train.lora.on) drop(j, "init_from");
    return j;
}

uint64_t keel_run_state_key(const keel_config *cfg, int64_t global_batch) {
    cJSON *j = fixed_part(cfg);
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    XXH3_state_t *x = XXH3_createState();
    KEEL_CHECK(x && XXH3_64bits_reset(x) == XXH_OK, "XXH3 state");
    XXH3_64bits_update(x, text, strlen(text));
    XXH3_64bits_update(x, &global_batch, sizeof global_batch);
    uint64_t key = XXH3_64bits_digest(x);
    XXH3_freeState(x);
    free(text);
    return key;
}

/* The first dotted key whose value differs between a and b, or false. */
static bool first_difference(const cJSON *a, const cJSON *b, const char *prefix, char *out, size_t n) {
    const cJSON *x;
    cJSON_ArrayForEach(x, a) {
        char key[256];
        snprintf(key, sizeof key, "%s%s%s", prefix, *prefix ? "." : "", x->string);
        const cJSON *y = cJSON_GetObjectItemCaseSensitive(b, x->string);
        if (cJSON_IsObject(x) && cJSON_IsObject(y)) {
            if (first_difference(x, y, key, out, n)) return true;
        } else if (!y || !cJSON_Compare(x, y, true)) {
            snprintf(out, n, "%s", key);
            return true;
        }
    }
    cJSON_ArrayForEach(x, b)
        if (!cJSON_GetObjectItemCaseSensitive(a, x->string)) {
            snprintf(out, n, "%s%s%s", prefix, *prefix ? "." : "", x->string);
            return true;
        }
    return false;
}

/* cfg may differ from the run's saved config only in RESUMABLE keys. */
static keel_status check_same_run(const keel_config *cfg, const char *run_dir) {
    keel_config saved;
    keel_status st = keel_run_load_config(run_dir, &saved);
    if (st != KEEL_OK) {
        keel_config_free(&saved);
        return st;
    }
    cJSON *a = fixed_part(&saved), *b = fixed_part(cfg);
    char key[256];
    bool differs = first_difference(a, b, "", key, sizeof key);
    cJSON_Delete(a);
    cJSON_Delete(b);
    keel_config_free(&saved);
    if (!differs) return KEEL_OK;
    keel_errorf("%s: this run directory holds a run whose %s differs from the config given; a "
                "resumed run may only change train.steps/threads/eval_*/micro_batch_size/"
                "grad_accum_steps, fsdp.* and checkpoint.* (use a new --run-dir to start over)",
                run_dir, key);
    return KEEL_ERR_INPUT;
}

/* Same global batch as the newest readable checkpoint: the accumulation that
 * keeps it on world_size ranks becomes cfg's. */
static keel_status keep_global_batch(keel_config *cfg, const char *run_dir, const int64_t *steps, int n,
                                     int world_size) {
    for (int i = 0; i < n; i++) {
        char dir[4096];
        keel_ckpt_dir(dir, sizeof dir, run_dir, steps[i], false);
        keel_ckpt ck;
        keel_error_capture(true);
        keel_status st = keel_ckpt_open(dir, &ck);
        keel_error_capture(false);
        if (st != KEEL_OK) continue; /* damaged: resume reports it and uses an older one */
        int64_t per_accum = (int64_t)cfg->train.micro_batch_size * world_size, G = ck.global_batch;
        keel_ckpt_close(&ck);
        if (G % per_accum != 0) {
            keel_errorf("%s: its checkpoints have a global batch of %lld sequences, which %d rank(s) x "
                        "train.micro_batch_size %d cannot make up; pick a micro-batch size that divides "
                        "%lld / %d", run_dir, (long long)G, world_size, cfg->train.micro_batch_size,
                        (long long)G, world_size);
            return KEEL_ERR_INPUT;
        }
        if (cfg->train.grad_accum_steps != (int)(G / per_accum)) {
            keel_log_info("resuming with train.grad_accum_steps %lld (was %d) to keep the global batch "
                          "of %lld sequences on %d rank(s)", (long long)(G / per_accum),
                          cfg->train.grad_accum_steps, (long long)G, world_size);
            cfg->train.grad_accum_steps = (int)(G / per_accum);
        }
        return KEEL_OK;
    }
    return KEEL_OK;
}

/* New or empty, or a run of the same model to resume (*resuming); in a
 * later round of the same job, also one a failed round ended before its
 * first checkpoint. */
static keel_status check_dir(keel_config *cfg, const char *run_dir, int world_size, bool later_round,
                             bool *resuming) {
    char path[4200];
    *resuming = false;
    keel_run_path(path, sizeof path, run_dir, KEEL_RUN_CONFIG);
    if (!keel_path_exists(path)) return check_free(run_dir);
    int64_t *steps;
    int n = keel_ckpt_list(run_dir, &steps);
    keel_run_path(path, sizeof path, run_dir, KEEL_RUN_SUMMARY);
    keel_status st = KEEL_OK;
    if (n == 0 && !later_round && keel_path_exists(path)) { /* it ended and left nothing to resume from */
        keel_errorf("%s: run directory already exists and holds a finished run without checkpoints; "
                    "pass a new --run-dir (keel never overwrites a run)", run_dir);
        st = KEEL_ERR_INPUT;
    }
    if (st == KEEL_OK) st = check_same_run(cfg, run_dir);
    if (st == KEEL_OK) st = keep_global_batch(cfg, run_dir, steps, n, world_size);
    keel_free(steps);
    *resuming = st == KEEL_OK;
    return st;
}

/* ---- inputs ------------------------------------------------------------------ */

static double gib(double bytes) { return bytes / (1024.0 * 1024 * 1024); }

/* Before launching: all ranks of a local run share this machine; in a Slurm
 * allocation they spread evenly over the nodes that are not spares. */
static int planned_ranks_per_node(const keel_config *cfg, int world_size) {
    const char *nodes = getenv("SLURM_JOB_NUM_NODES");
    if (!getenv("SLURM_JOB_ID") || !nodes || atoi(nodes) <= 0) return world_size;
    int active = atoi(nodes) - cfg->resilience.spares;
    return active > 0 ? (world_size + active - 1) / active : world_size;
}

/* A rank's bytes on a device: the model's state, activations and workspaces; the host keeps the rest. */
static double on_device(const keel_fsdp_memory *m) {
    return (double)(m->params + m->grads + m->optimizer + m->gathered + m->activations + m->workspaces);
}

/* What the run needs at K checkpointed blocks: a rank's bytes on its
 * device (device), or the host's for its ranks here. */
static double need_at(const keel_config *cfg, int world_size, int ranks_here, bool device, int K) {
    keel_config c = *cfg;
    c.fsdp.activation_checkpointing = K;
    keel_fsdp_memory m;
    keel_fsdp_memory_plan_run(&c, world_size, world_size > 1, (world_size + ranks_here - 1) / ranks_here, &m);
    if (device) return on_device(&m);
    double need = (double)keel_fsdp_memory_total(&m) * ranks_here;
    if (cfg->device != KEEL_BACKEND_CPU) need -= on_device(&m) * ranks_here; /* each rank's is on its GPU */
    return need;
}

/* The refusal's first fix: the fewest checkpointed blocks above the
 * config's that fit in `have` (memory falls as K grows), as "checkpoint
 * ..., or "; empty when none does. */
static void blocks_that_fit(const keel_config *cfg, int world_size, int ranks_here, bool device, double have,
                            char *out, size_t n) {
    out[0] = 0;
    int L = cfg->model.n_layers;
    for (int K = keel_config_checkpoint_blocks(cfg) + 1; K <= L; K++)
        if (need_at(cfg, world_size, ranks_here, device, K) <= have) {
            char v[16];
            keel_config_format_checkpointing(K == L ? KEEL_CHECKPOINT_ALL : K, v, sizeof v);
            snprintf(out, n, "checkpoint the first %d of %d blocks (--set fsdp.activation_checkpointing=%s), or ", K,
                     L, v);
            return;
        }
}

keel_status keel_run_check_device_memory(const keel_config *cfg, int world_size, int ranks_here,
                                         const keel_backend *be) {
    if (be->host_memory) return KEEL_OK; /* the host check counted it */
    int K = keel_config_checkpoint_blocks(cfg);
    double need = need_at(cfg, world_size, ranks_here, true, K), free_b = (double)be->memory_free();
    if (free_b > 0 && need > free_b) {
        char fix[160];
        blocks_that_fit(cfg, world_size, ranks_here, true, free_b, fix, sizeof fix);
        keel_errorf("%s: this run needs %.1f GiB of %s memory per rank but %.1f GiB is free: %slower "
                    "train.micro_batch_size, use more ranks or a smaller model (`keel plan` weighs them, `keel "
                    "train --dry-run` shows the breakdown)", source(cfg), gib(need), be->name, gib(free_b), fix);
        return KEEL_ERR_INPUT;
    }
    return KEEL_OK;
}

keel_status keel_run_check_memory(const keel_config *cfg, int world_size, int ranks_here) {
    keel_parallel_dims dims;
    char why[256];
    if (keel_parallel_dims_resolve(cfg->fsdp.strategy, cfg->fsdp.shard_group_size, world_size, &dims, why,
                                   sizeof why) != KEEL_OK) {
        keel_errorf("%s: %s", source(cfg), why);
        return KEEL_ERR_INPUT;
    }
    int K = keel_config_checkpoint_blocks(cfg);
    double need = need_at(cfg, world_size, ranks_here, false, K), avail = (double)keel_mem_available_bytes();
    if (avail > 0 && need > avail) {
        char fix[160];
        blocks_that_fit(cfg, world_size, ranks_here, false, avail, fix, sizeof fix);
        keel_errorf("%s: this run needs %.1f GiB (%d rank(s) here) but %.1f GiB is available: %slower "
                    "train.micro_batch_size or the model size (`keel train --dry-run` shows the breakdown)",
                    source(cfg), gib(need), ranks_here, gib(avail), fix);
        return KEEL_ERR_INPUT;
    }
    return KEEL_OK;
}

/* train.lora resuming in run_dir: the base at init_from (ck) is the one the
 * newest checkpoint's adapters were trained on. */
static keel_status check_lora_base(const keel_config *cfg, const char *run_dir, const keel_ckpt *base) {
    int64_t *steps;
    int n = run_dir ? keel_ckpt_list(run_dir, &steps) : 0;
    if (n <= 0) return KEEL_OK;
    char dir[4096], id[17];
    keel_ckpt_dir(dir, sizeof dir, run_dir, steps[0], false);
    keel_free(steps);
    keel_ckpt ck;
    keel_error_capture(true); /* a damaged newest checkpoint is the resume's to report */
    keel_status opened = keel_ckpt_open(dir, &ck);
    keel_error_capture(false);
    if (opened != KEEL_OK) return KEEL_OK;
    const char *want = keel_ckpt_lora_base_id(&ck);
    keel_ckpt_identity(base, id);
    keel_status st = KEEL_OK;
    if (want && strcmp(want, id) != 0) {
        keel_errorf("init_from %s is not the base %s's adapters were trained on (its identity %s, theirs %s): it "
                    "changed; point init_from at that base or a copy of it (the manifest's lora.base names where it was)",
                    cfg->init_from, dir, id, want);
        st = KEEL_ERR_INPUT;
    }
    keel_ckpt_close(&ck);
    return st;
}

/* train.lora.init_from: adapters of this rank and these targets, trained on
 * the base at init_from (base). */
static keel_status check_lora_init(const keel_config *cfg, const keel_ckpt *base) {
    const char *path = cfg->train.lora.init_from;
    keel_ckpt ck;
    keel_status st = keel_ckpt_open_any(path, &ck);
    if (st != KEEL_OK) return st;
    keel_config theirs;
    st = keel_ckpt_load_config(&ck, &theirs); /* theirs needs keel_config_free, also on failure */
    const keel_lora_config *a = &cfg->train.lora, *b = &theirs.train.lora;
    char id[17];
    keel_ckpt_identity(base, id);
    const char *want = st == KEEL_OK ? keel_ckpt_lora_base_id(&ck) : NULL;
    if (st != KEEL_OK) {
    } else if (!b->on) {
        keel_errorf("train.lora.init_from %s holds a whole model, not LoRA adapters; give it as init_from (the "
                    "base) or name an adapter checkpoint", path);
        st = KEEL_ERR_INPUT;
    } else if (a->rank != b->rank || a->targets != b->targets) {
        char ours[128], its[128];
        keel_lora_targets_format(a->targets, ours, sizeof ours);
        keel_lora_targets_format(b->targets, its, sizeof its);
        keel_errorf("train.lora.init_from %s holds adapters of rank %d on %s; set train.lora.rank and "
                    "train.lora.targets to those (this run has rank %d on %s)", path, b->rank, its, a->rank, ours);
        st = KEEL_ERR_INPUT;
    } else if (want && strcmp(want, id) != 0) {
        keel_errorf("train.lora.init_from %s was trained on another base than init_from %s (identities %s and %s); "
                    "set init_from to its base (its manifest's lora.base names it)", path, cfg->init_from, want, id);
        st = KEEL_ERR_INPUT;
    }
    keel_config_free(&theirs);
    keel_ckpt_close(&ck);
    return st;
}

keel_status keel_run_check_init_from(const keel_config *cfg, const char *run_dir) {
    const char *src = cfg->source ? cfg->source : "config";
    if (cfg->train.lora.on && !cfg->init_from) {
        keel_errorf("%s: train.lora trains adapters on a frozen base, and init_from names none; set init_from to "
                    "the base's checkpoint (e.g. from `keel ckpt import --from-hf`), or train.lora to false", src);
        return KEEL_ERR_INPUT;
    }
    if (!cfg->init_from) return KEEL_OK;
    keel_model_layout lay, adapters;
    keel_model_layout_init(&lay, &cfg->model);
    if (cfg->train.lora.on) { /* the rank fits every target */
        char why[256];
        keel_status st = keel_lora_layout_init(&adapters, &lay, &cfg->train.lora, why, sizeof why);
        if (st != KEEL_OK) {
            keel_errorf("%s: %s", src, why);
            keel_model_layout_free(&lay);
            return st;
        }
        keel_model_layout_free(&adapters);
    }
    keel_ckpt ck;
    keel_status st = keel_ckpt_open_any(cfg->init_from, &ck);
    if (st != KEEL_OK) {
        keel_model_layout_free(&lay);
        return st;
    }
    st = keel_ckpt_check_layout(&ck, &lay);
    if (st == KEEL_OK && cfg->train.lora.on) st = check_lora_base(cfg, run_dir, &ck);
    if (st == KEEL_OK && cfg->train.lora.on && cfg->train.lora.init_from) st = check_lora_init(cfg, &ck);
    keel_model_layout_free(&lay);
    keel_ckpt_close(&ck);
    return st;
}

/* The data and tokenizer open (then close): the training split and, when
 * validation is on, the val split if there is one. */
static keel_status check_data(const keel_config *cfg) {
    const char *splits[2] = {"train", cfg->train.eval_every > 0 ? "val" : NULL};
    keel_status st = KEEL_OK;
    for (int i = 0; i < 2 && splits[i] && st == KEEL_OK; i++) {
        keel_data *d = NULL;
        st = keel_data_open(&cfg->data, splits[i], cfg->model.max_seq_len, cfg->model.vocab_size,
                            cfg->train.seed, &d);
        keel_data_close(d);
    }
    return st;
}

/* ---- the directory ------------------------------------------------------------ */

keel_status keel_run_write_file(const char *run_dir, const char *name, const char *text) {
    char path[4200];
    keel_run_path(path, sizeof path, run_dir, name);
    size_t len = strlen(text);
    char *line = keel_xmalloc(len + 2, "run file");
    memcpy(line, text, len);
    memcpy(line + len, "\n", 2);
    keel_status st = keel_write_file_atomic(path, line, len + 1);
    keel_free(line);
    return st;
}

static keel_status create(const keel_config *cfg, const char *run_dir) {
    char logs[4200];
    keel_run_path(logs, sizeof logs, run_dir, KEEL_RUN_LOGS);
    keel_status st = keel_mkdirs(logs);
    if (st != KEEL_OK) return st;
    char *resolved = keel_config_to_json(cfg);
    st = keel_run_write_file(run_dir, KEEL_RUN_CONFIG, resolved);
    free(resolved);
    return st;
}

/* In-memory snapshots are worth having, not worth a run that no longer
 * fits: when they are what would not fit here, they are turned off (the
 * ranks read that from config.json) and failures resume from disk. */
static void fit_snapshots(keel_config *cfg, int world_size, int ranks_here) {
    keel_fsdp_memory m;
    keel_fsdp_memory_plan_run(cfg, world_size, world_size > 1, (world_size + ranks_here - 1) / ranks_here, &m);
    double need = (double)keel_fsdp_memory_total(&m) * ranks_here, snap = (double)m.snapshot * ranks_here,
           avail = (double)keel_mem_available_bytes();
    if (snap == 0 || avail <= 0 || need <= avail || need - snap > avail) return;
    keel_log_warn("in-memory snapshots off: their %.1f GiB (%d rank(s) here) do not fit beside the run's %.1f GiB in "
                  "the %.1f GiB available; a failure resumes from the last checkpoint (resilience."
                  "snapshot_every_steps)", gib(snap), ranks_here, gib(need - snap), gib(avail));
    cfg->resilience.snapshot_every_steps = 0;
}

keel_status keel_run_prepare(keel_config *cfg, const char *run_dir, int world_size) {
    return keel_run_prepare_nodes(cfg, run_dir, world_size, planned_ranks_per_node(cfg, world_size), false);
}

keel_status keel_run_prepare_nodes(keel_config *cfg, const char *run_dir, int world_size, int ranks_per_node,
                                   bool later_round) {
    bool resuming;
    keel_status st = check_dir(cfg, run_dir, world_size, later_round, &resuming);
    if (st == KEEL_OK) fit_snapshots(cfg, world_size, ranks_per_node);
    if (st == KEEL_OK) st = keel_run_check_memory(cfg, world_size, ranks_per_node);
    if (st == KEEL_OK) st = keel_run_check_init_from(cfg, run_dir);
    if (st == KEEL_OK) st = check_data(cfg);
    if (st == KEEL_OK) st = create(cfg, run_dir);
    return st;
}

keel_status keel_run_load_config(const char *run_dir, keel_config *cfg) {
    char path[4200];
    keel_run_path(path, sizeof path, run_dir, KEEL_RUN_CONFIG);
    keel_config_defaults(cfg);
    keel_status st = keel_config_load_file(cfg, path);
    if (st == KEEL_OK) st = keel_config_finalize(cfg);
    return st;
}
