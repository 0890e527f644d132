/* train/train.c: the single-rank training loop and its run directory. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "keel/ckpt.h"
#include "keel/data.h"
#include "keel/kernels.h"
#include "keel/model.h"
#include "keel/obs.h"
#include "keel/optim.h"
#include "keel/train.h"

static volatile sig_atomic_t g_stop_signal;
static void on_stop_signal(int sig) { g_stop_signal = sig; }

typedef struct {
    const keel_config *cfg;
    const char *run_dir;
    keel_model *model;
    keel_optim *opt;
    keel_data *train, *val;
    keel_jsonl *metrics;
    keel_progress progress;
    int32_t *tokens;        /* (B, T+1) */
    int threads;
    double flops_per_token, peak_flops;
    double *step_tps;       /* (steps) tokens/s of each step, for the median */
} trainer;

double keel_peak_flops(void) {
    const char *env = getenv("KEEL_PEAK_FLOPS");
    if (env && atof(env) > 0) return atof(env);
    return keel_measure_peak_flops();
}

static void path_join(char *out, size_t n, const char *dir, const char *name) {
    snprintf(out, n, "%s/%s", dir, name);
}

/* A run directory must be new or empty: nothing in it is ever overwritten. */
static keel_status check_run_dir_free(const char *dir) {
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

static keel_status make_dirs(const char *dir) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) goto fail;
            *p = '/';
        }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) goto fail;
    return KEEL_OK;
fail:
    keel_errorf("%s: cannot create run directory: %s", buf, strerror(errno));
    return KEEL_ERR_IO;
}

static uint64_t mem_available_bytes(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}

typedef struct {
    int64_t params, grads, optimizer, activations;
} memory_plan;

static memory_plan plan_memory(const keel_model_layout *lay, int B) {
    int64_t p = lay->n_params * (int64_t)sizeof(float);
    return (memory_plan){p, p, 2 * p, keel_model_activation_bytes(lay, B)};
}

static double gib(int64_t bytes) { return (double)bytes / (1024.0 * 1024 * 1024); }

keel_status keel_train_dry_run(const keel_config *cfg) {
    keel_model_layout lay;
    keel_model_layout_init(&lay, &cfg->model);
    memory_plan m = plan_memory(&lay, cfg->train.micro_batch_size);
    printf("model: dim %d, %d layers, %d heads (%d kv), head size %d, ffn %d, vocab %d, seq %d\n",
           lay.C, lay.L, lay.NH, lay.NKV, lay.HS, lay.F, lay.V, lay.T);
    printf("parameters: %lld (%.3f B)\n", (long long)lay.n_params, (double)lay.n_params / 1e9);
    printf("training FLOPs per token: %.3e\n", keel_model_flops_per_token(&lay));
    printf("memory on one rank (fp32, micro-batch %d):\n", cfg->train.micro_batch_size);
    printf("  parameters   %10.3f GiB\n  gradients    %10.3f GiB\n  AdamW m+v    %10.3f GiB\n"
           "  activations  %10.3f GiB\n  total        %10.3f GiB (this machine has %.1f GiB available)\n",
           gib(m.params), gib(m.grads), gib(m.optimizer), gib(m.activations),
           gib(m.params + m.grads + m.optimizer + m.activations), gib((int64_t)mem_available_bytes()));
    keel_model_layout_free(&lay);
    return KEEL_OK;
}

static keel_status check_memory(const keel_config *cfg) {
    keel_model_layout lay;
    keel_model_layout_init(&lay, &cfg->model);
    memory_plan m = plan_memory(&lay, cfg->train.micro_batch_size);
    keel_model_layout_free(&lay);
    int64_t need = m.params + m.grads + m.optimizer + m.activations;
    uint64_t avail = mem_available_bytes();
    if (avail && (uint64_t)need > avail) {
        keel_errorf("%s: this model needs %.1f GiB on one rank but %.1f GiB is available; lower "
                    "train.micro_batch_size or the model size (`keel train --dry-run` shows the "
                    "breakdown)", cfg->source ? cfg->source : "config", gib(need), gib((int64_t)avail));
        return KEEL_ERR_INPUT;
    }
    return KEEL_OK;
}

static int64_t global_batch(const keel_config *cfg) {
    return (int64_t)cfg->train.micro_batch_size * cfg->train.grad_accum_steps;
}

/* One optimizer step: accumulate over micro-batches, clip, AdamW. Returns the mean loss. */
static double train_step(trainer *t, int step, double *grad_norm_out) {
    const keel_config *cfg = t->cfg;
    const keel_model_layout *lay = keel_model_get_layout(t->model);
    int B = cfg->train.micro_batch_size, T = lay->T;
    int64_t G = global_batch(cfg);
    float grad_scale = 1.0f / (float)(G * T);
    double loss_sum = 0;
    keel_model_zero_grads(t->model);
    for (int micro = 0; micro < cfg->train.grad_accum_steps; micro++) {
        keel_data_fetch(t->train, (uint64_t)step, (uint64_t)G, (uint64_t)micro * B, B, t->tokens);
        loss_sum += keel_model_forward(t->model, t->tokens, B, grad_scale);
        keel_model_backward(t->model);
    }
    float *grads = keel_model_grads(t->model);
    double norm = sqrt(keel_sumsq(grads, lay->n_params));
    *grad_norm_out = norm;
    keel_optim_update(t->opt, keel_model_params(t->model), grads, step, keel_lr_at(&cfg->train, step),
                      keel_clip_scale(norm, cfg->train.grad_clip));
    return loss_sum / (double)(G * T);
}

/* Mean loss over the same eval_batches micro-batches of the val split every time. */
static double evaluate(trainer *t, uint64_t *tokens_out) {
    const keel_model_layout *lay = keel_model_get_layout(t->model);
    int B = t->cfg->train.micro_batch_size;
    uint64_t n = keel_data_n_samples(t->val);
    uint64_t want = (uint64_t)t->cfg->train.eval_batches * B;
    if (want > n) want = n;
    double loss = 0;
    for (uint64_t first = 0; first < want; first += (uint64_t)B) {
        int rows = (int)(want - first < (uint64_t)B ? want - first : (uint64_t)B);
        keel_data_fetch(t->val, 0, want, first, rows, t->tokens);
        loss += keel_model_forward(t->model, t->tokens, rows, 0.0f);
    }
    *tokens_out = want * (uint64_t)lay->T;
    return loss / (double)*tokens_out;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static keel_status write_json_file(const char *dir, const char *name, cJSON *obj) {
    char path[4096];
    path_join(path, sizeof path, dir, name);
    char *text = cJSON_Print(obj);
    size_t len = strlen(text);
    text = keel_xrealloc(text, len + 2, "json text");
    text[len] = '\n';
    text[len + 1] = 0;
    keel_status st = keel_write_file_atomic(path, text, len + 1);
    free(text);
    return st;
}

static keel_status write_summary(trainer *t, const char *status, int steps_done, double final_loss,
                                 double final_val_loss, double wall_s) {
    const keel_model_layout *lay = keel_model_get_layout(t->model);
    char xxh[17];
    keel_params_xxh3_hex(keel_model_params(t->model), lay->n_params, xxh);
    double median_tps = 0;
    if (steps_done > 0) {
        qsort(t->step_tps, (size_t)steps_done, sizeof(double), cmp_double);
        median_tps = t->step_tps[steps_done / 2];
    }
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "status", status);
    cJSON_AddNumberToObject(s, "steps", steps_done);
    cJSON_AddNumberToObject(s, "final_loss", final_loss);
    if (!isnan(final_val_loss)) cJSON_AddNumberToObject(s, "final_val_loss", final_val_loss);
    cJSON_AddStringToObject(s, "params_xxh3", xxh);
    cJSON_AddNumberToObject(s, "n_params", (double)lay->n_params);
    cJSON_AddNumberToObject(s, "peak_rss_bytes", (double)keel_peak_rss_bytes());
    cJSON_AddNumberToObject(s, "tokens", (double)steps_done * (double)global_batch(t->cfg) * lay->T);
    cJSON_AddNumberToObject(s, "wall_s", wall_s);
    cJSON_AddNumberToObject(s, "tokens_per_s_median", median_tps);
    cJSON_AddNumberToObject(s, "mfu_median", median_tps * t->flops_per_token / t->peak_flops);
    cJSON_AddNumberToObject(s, "threads", t->threads);
    cJSON_AddNumberToObject(s, "peak_flops", t->peak_flops);
    cJSON_AddStringToObject(s, "keel_version", KEEL_VERSION);
    keel_status st = write_json_file(t->run_dir, "summary.json", s);
    cJSON_Delete(s);
    return st;
}

static void log_step(trainer *t, int step, double loss, double lr, double norm, double step_s,
                     double val_loss) {
    const keel_model_layout *lay = keel_model_get_layout(t->model);
    double tokens = (double)global_batch(t->cfg) * lay->T;
    double tps = tokens / step_s;
    t->step_tps[step] = tps;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "step", step + 1);
    cJSON_AddNumberToObject(o, "loss", loss);
    cJSON_AddNumberToObject(o, "lr", lr);
    cJSON_AddNumberToObject(o, "grad_norm", norm);
    cJSON_AddNumberToObject(o, "tokens", tokens * (step + 1));
    cJSON_AddNumberToObject(o, "tokens_per_s", tps);
    cJSON_AddNumberToObject(o, "mfu", tps * t->flops_per_token / t->peak_flops);
    cJSON_AddNumberToObject(o, "step_s", step_s);
    if (!isnan(val_loss)) cJSON_AddNumberToObject(o, "val_loss", val_loss);
    char *text = cJSON_PrintUnformatted(o);
    keel_jsonl_write(t->metrics, text);
    free(text);
    cJSON_Delete(o);
}

/* Validation that needs no writing: run dir, memory, data, tokenizer. */
static keel_status open_inputs(trainer *t) {
    const keel_config *cfg = t->cfg;
    keel_status st = check_run_dir_free(t->run_dir);
    if (st == KEEL_OK) st = check_memory(cfg);
    if (st == KEEL_OK)
        st = keel_data_open(&cfg->data, "train", cfg->model.max_seq_len, cfg->model.vocab_size,
                            cfg->train.seed, &t->train);
    if (st == KEEL_OK && cfg->train.eval_every > 0) {
        st = keel_data_open(&cfg->data, "val", cfg->model.max_seq_len, cfg->model.vocab_size,
                            cfg->train.seed, &t->val);
        if (st == KEEL_OK && !t->val)
            keel_log_warn("train.eval_every is %d but %s has no val split: no validation loss "
                          "(prepare the data with --val-fraction)", cfg->train.eval_every,
                          cfg->data.path);
    }
    return st;
}

static keel_status train_loop(trainer *t) {
    const keel_config *cfg = t->cfg;
    const keel_model_layout *lay = keel_model_get_layout(t->model);
    double start = keel_now_s(), loss = NAN, val_loss = NAN, last_val = NAN;
    int step = 0;
    const char *status = "completed";
    keel_status st = KEEL_OK;
    keel_progress_init(&t->progress, stdout, cfg->train.steps);
    for (; step < cfg->train.steps; step++) {
        if (g_stop_signal) {
            keel_progress_note(&t->progress, "stopping at step %d on signal %d", step, (int)g_stop_signal);
            status = "interrupted";
            st = KEEL_ERR_IO;
            break;
        }
        double t0 = keel_now_s(), norm;
        loss = train_step(t, step, &norm);
        double step_s = keel_now_s() - t0;
        if (!isfinite(loss) || !isfinite(norm)) {
            keel_progress_end(&t->progress);
            keel_errorf("step %d: loss %g, gradient norm %g are not finite; lower train.lr or raise "
                        "train.warmup_steps", step + 1, loss, norm);
            status = "diverged";
            st = KEEL_ERR_NUMERIC;
            break;
        }
        val_loss = NAN;
        if (t->val && (step + 1) % cfg->train.eval_every == 0) {
            uint64_t n;
            last_val = val_loss = evaluate(t, &n);
        }
        log_step(t, step, loss, keel_lr_at(&cfg->train, step), norm, step_s, val_loss);
        double tps = (double)global_batch(cfg) * lay->T / step_s;
        keel_progress_step(&t->progress, step + 1, loss, tps, tps * t->flops_per_token / t->peak_flops,
                           keel_now_s() - start);
        if (!isnan(val_loss))
            keel_progress_note(&t->progress, "step %d: val loss %.4f", step + 1, val_loss);
    }
    keel_progress_end(&t->progress);
    char path[4096];
    path_join(path, sizeof path, t->run_dir, "weights.bin");
    keel_status wst = keel_weights_save(path, keel_model_params(t->model), lay->n_params);
    keel_status sst = write_summary(t, status, step, loss, last_val, keel_now_s() - start);
    if (st == KEEL_OK) st = wst != KEEL_OK ? wst : sst;
    return st;
}

keel_status keel_train_run(const keel_config *cfg, const char *run_dir) {
    trainer t = {.cfg = cfg, .run_dir = run_dir};
    keel_status st = open_inputs(&t);
    if (st != KEEL_OK) goto done;
    if ((st = make_dirs(run_dir)) != KEEL_OK) goto done;
    char path[4096];
    char *resolved = keel_config_to_json(cfg);
    size_t len = strlen(resolved);
    resolved = keel_xrealloc(resolved, len + 2, "config text");
    memcpy(resolved + len, "\n", 2);
    path_join(path, sizeof path, run_dir, "config.json");
    st = keel_write_file_atomic(path, resolved, len + 1);
    free(resolved);
    if (st != KEEL_OK) goto done;
    path_join(path, sizeof path, run_dir, "metrics.jsonl");
    if ((st = keel_jsonl_open(path, &t.metrics)) != KEEL_OK) goto done;

    t.threads = keel_kernels_init(cfg->train.threads);
    keel_model_build(&cfg->model, cfg->train.micro_batch_size, &t.model);
    keel_model_init_weights(t.model, cfg->train.seed);
    const keel_model_layout *lay = keel_model_get_layout(t.model);
    keel_optim_build(&cfg->train, lay, 0, lay->n_params, &t.opt);
    t.tokens = keel_xmalloc(sizeof(int32_t) * (size_t)cfg->train.micro_batch_size * (lay->T + 1), "tokens");
    t.step_tps = keel_xcalloc(sizeof(double) * (size_t)(cfg->train.steps + 1), "step rates");
    t.flops_per_token = keel_model_flops_per_token(lay);
    t.peak_flops = keel_peak_flops();
    keel_log_info("training %lld parameters for %d steps, %lld tokens per step, %d thread(s) "
                  "(fp32 peak %.0f GF/s); run directory %s", (long long)lay->n_params,
                  cfg->train.steps, (long long)global_batch(cfg) * lay->T, t.threads,
                  t.peak_flops / 1e9, run_dir);

    struct sigaction sa = {.sa_handler = on_stop_signal}, old_int, old_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    st = train_loop(&t);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    keel_kernels_shutdown();
done:
    keel_jsonl_close(t.metrics);
    keel_data_close(t.train);
    keel_data_close(t.val);
    keel_optim_free(t.opt);
    keel_model_free(t.model);
    keel_free(t.tokens);
    keel_free(t.step_tps);
    return st;
}
