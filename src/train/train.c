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
#include <unistd.h>

#include "keel/ckpt.h"
#include "keel/data.h"
#include "keel/dist.h"
#include "keel/fsdp.h"
#include "keel/kernels.h"
#include "keel/model.h"
#include "keel/obs.h"
#include "keel/optim.h"
#include "keel/resil.h"
#include "keel/train.h"
#include "train/trainer.h"

static volatile sig_atomic_t g_stop_signal;
static void on_stop_signal(int sig) { g_stop_signal = sig; }

/* SIGINT, SIGTERM, SIGUSR1: stop after the current step (checkpointing first).
 * Caught from the start, so a stop during set-up ends the run after one step. */
static const int STOP_SIGNALS[3] = {SIGINT, SIGTERM, SIGUSR1};
static void catch_stop_signals(struct sigaction old[3]) {
    struct sigaction sa = {.sa_handler = on_stop_signal};
    sigemptyset(&sa.sa_mask);
    g_stop_signal = 0;
    for (int i = 0; i < 3; i++) sigaction(STOP_SIGNALS[i], &sa, &old[i]);
}
static void restore_stop_signals(const struct sigaction old[3]) {
    for (int i = 0; i < 3; i++) sigaction(STOP_SIGNALS[i], &old[i], NULL);
}

/* fsdp.mixed_precision bf16 runs bf16 GEMMs on bf16 instructions where the
 * CPU has them and emulates them elsewhere (the same math, no faster than fp32). */
static bool want_bf16(const keel_config *cfg) { return !strcmp(cfg->fsdp.mixed_precision, "bf16"); }
static bool want_bf16_reduce(const keel_config *cfg) { return !strcmp(cfg->fsdp.reduce_dtype, "bf16"); }

static bool bf16_usable(const keel_config *cfg) {
    if (!want_bf16(cfg)) return false;
    const char *path;
    if (keel_bf16_native(&path))
        keel_log_info("fsdp.mixed_precision bf16: bf16 GEMMs through %s, fp32 master weights and "
                      "optimizer", path);
    else
        keel_log_warn("fsdp.mixed_precision bf16: bf16 GEMMs %s, no faster than fp32; fp32 "
                      "master weights and optimizer", path);
    return true;
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
    int64_t params, grads, optimizer, gathered, activations;
} memory_plan;

/* One rank's memory: everything full on one process; under FSDP the fp32
 * state is sharded and the gathered units and unit gradients are added. */
static memory_plan plan_memory(const keel_config *cfg, const keel_model_layout *lay, int world_size) {
    keel_model_options opts = {.checkpoint_activations = cfg->fsdp.activation_checkpointing,
                               .bf16 = want_bf16(cfg)};
    memory_plan m = {.activations = keel_model_activation_bytes(lay, cfg->train.micro_batch_size, &opts)};
    keel_fsdp_strategy strategy = KEEL_FSDP_FULL_SHARD;
    keel_fsdp_strategy_parse(cfg->fsdp.strategy, &strategy); /* validated by finalize */
    if (world_size == 1) {
        m.params = m.grads = 4 * lay->n_params;
        m.gathered = opts.bf16 ? 2 * lay->n_params : 0; /* the bf16 copy */
    } else {
        int K = cfg->fsdp.shard_group_size ? cfg->fsdp.shard_group_size : 2;
        int shard_ranks = strategy == KEEL_FSDP_NO_SHARD       ? 1
                          : strategy == KEEL_FSDP_HYBRID_SHARD ? K
                                                               : world_size;
        keel_fsdp_plan plan;
        keel_fsdp_plan_init(&plan, lay, shard_ranks);
        m.params = m.grads = 4 * plan.shard_total;
        m.gathered = keel_fsdp_transient_bytes(&plan, strategy, opts.bf16, want_bf16_reduce(cfg));
        keel_fsdp_plan_free(&plan);
    }
    m.optimizer = 2 * m.params;
    return m;
}

static int64_t plan_total(const memory_plan *m) {
    return m->params + m->grads + m->optimizer + m->gathered + m->activations;
}

int64_t keel_train_memory_need(const keel_config *cfg, int world_size) {
    keel_model_layout lay;
    keel_model_layout_init(&lay, &cfg->model);
    memory_plan m = plan_memory(cfg, &lay, world_size);
    keel_model_layout_free(&lay);
    return plan_total(&m);
}

/* parameters, AdamW m and v in fp32, padded shards (keel/ckpt.h) */
int64_t keel_train_checkpoint_bytes(const keel_config *cfg, int world_size) {
    keel_model_layout lay;
    keel_model_layout_init(&lay, &cfg->model);
    keel_fsdp_plan plan;
    keel_fsdp_plan_init(&plan, &lay, world_size);
    int64_t bytes = 12 * plan.shard_total * world_size;
    keel_fsdp_plan_free(&plan);
    keel_model_layout_free(&lay);
    return bytes;
}

static double gib(int64_t bytes) { return (double)bytes / (1024.0 * 1024 * 1024); }

keel_status keel_train_dry_run(const keel_config *cfg, int world_size) {
    keel_model_layout lay;
    keel_model_layout_init(&lay, &cfg->model);
    memory_plan m = plan_memory(cfg, &lay, world_size);
    printf("model: dim %d, %d layers, %d heads (%d kv), head size %d, ffn %d, vocab %d, seq %d\n",
           lay.C, lay.L, lay.NH, lay.NKV, lay.HS, lay.F, lay.V, lay.T);
    printf("parameters: %lld (%.3f B)\n", (long long)lay.n_params, (double)lay.n_params / 1e9);
    printf("training FLOPs per token: %.3e\n", keel_model_flops_per_token(&lay));
    printf("memory per rank (%s GEMMs, %s, micro-batch %d):\n", cfg->fsdp.mixed_precision,
           world_size == 1 ? "one process" : cfg->fsdp.strategy, cfg->train.micro_batch_size);
    printf("  parameters      %10.3f GiB\n  gradients       %10.3f GiB\n  AdamW m+v       %10.3f GiB\n"
           "  compute copies  %10.3f GiB\n  activations     %10.3f GiB\n  total           %10.3f GiB "
           "x %d rank(s) (this machine has %.1f GiB available)\n",
           gib(m.params), gib(m.grads), gib(m.optimizer), gib(m.gathered), gib(m.activations),
           gib(plan_total(&m)), world_size, gib((int64_t)mem_available_bytes()));
    keel_model_layout_free(&lay);
    return KEEL_OK;
}

/* All ranks of a local launch share this machine; under Slurm each node
 * holds its own (checked per rank). */
static keel_status check_memory(const keel_config *cfg, int world_size) {
    keel_model_layout lay;
    keel_model_layout_init(&lay, &cfg->model);
    int K = cfg->fsdp.shard_group_size ? cfg->fsdp.shard_group_size : 2;
    if (world_size > 1 && !strcmp(cfg->fsdp.strategy, "hybrid_shard") &&
        (K > world_size || world_size % K != 0)) {
        keel_model_layout_free(&lay);
        keel_errorf("%s: fsdp.shard_group_size %d does not divide --nproc %d; pick a divisor",
                    cfg->source ? cfg->source : "config", K, world_size);
        return KEEL_ERR_INPUT;
    }
    memory_plan m = plan_memory(cfg, &lay, world_size);
    keel_model_layout_free(&lay);
    int local_ranks = getenv("SLURM_JOB_ID") ? 1 : world_size;
    int64_t need = plan_total(&m) * local_ranks;
    uint64_t avail = mem_available_bytes();
    if (avail && (uint64_t)need > avail) {
        keel_errorf("%s: this run needs %.1f GiB (%d rank(s) here) but %.1f GiB is available; lower "
                    "train.micro_batch_size or the model size (`keel train --dry-run` shows the "
                    "breakdown)", cfg->source ? cfg->source : "config", gib(need), local_ranks,
                    gib((int64_t)avail));
        return KEEL_ERR_INPUT;
    }
    return KEEL_OK;
}

/* Sequences per optimizer step over all ranks. */
int64_t trainer_global_batch(const trainer *t) {
    return (int64_t)t->cfg->train.micro_batch_size * t->cfg->train.grad_accum_steps * t->world_size;
}

/* One optimizer step: accumulate over micro-batches, clip, AdamW. Returns the mean loss. */
static double train_step(trainer *t, int step, double *grad_norm_out) {
    const keel_config *cfg = t->cfg;
    const keel_model_layout *lay = keel_model_get_layout(t->model);
    int B = cfg->train.micro_batch_size, T = lay->T, accum = cfg->train.grad_accum_steps;
    int64_t G = trainer_global_batch(t);
    float grad_scale = 1.0f / (float)(G * T);
    double loss_sum = 0;
    if (t->fsdp) keel_fsdp_zero_grads(t->fsdp);
    else keel_model_zero_grads(t->model);
    /* Data windows the supervisor skipped (a step that diverged twice) shift the rest. */
    uint64_t window = (uint64_t)step;
    for (int i = 0; i < t->n_skips; i++) window += t->skips[i] <= step;
    /* Rank r takes its contiguous slice of the step's G samples (DESIGN §4). */
    for (int micro = 0; micro < accum; micro++) {
        uint64_t first = (uint64_t)t->rank * B * accum + (uint64_t)micro * B;
        keel_data_fetch(t->train, window, (uint64_t)G, first, B, t->tokens);
        loss_sum += keel_model_forward(t->model, t->tokens, B, grad_scale);
        if (t->fsdp) keel_fsdp_set_reduce(t->fsdp, micro == accum - 1); /* reduce once per step */
        keel_model_backward(t->model);
        keel_heartbeat_beat(t->heartbeat, "train", step, 0);
    }
    double sumsq;
    float *params, *grads;
    if (t->fsdp) {
        keel_fsdp_finish_grads(t->fsdp);
        keel_fsdp_grad_sumsq(t->fsdp, &sumsq);
        keel_comm_allreduce_scalar(t->world, &loss_sum, KEEL_COMM_SUM);
        params = keel_fsdp_master(t->fsdp), grads = keel_fsdp_grads(t->fsdp);
    } else {
        params = keel_model_params(t->model), grads = keel_model_grads(t->model);
        sumsq = keel_sumsq(grads, lay->n_params);
    }
    double norm = sqrt(sumsq);
    *grad_norm_out = norm;
    trainer_ckpt_before_update(t); /* a save may still be copying the state */
    keel_optim_update(t->opt, params, grads, step, keel_lr_at(&cfg->train, step),
                      keel_clip_scale(norm, cfg->train.grad_clip));
    if (t->fsdp) keel_fsdp_invalidate(t->fsdp);
    else keel_model_params_changed(t->model);
    return loss_sum / (double)(G * T);
}

/* Mean loss over the same validation samples every time: the first
 * eval_batches global batches (G sequences each) of the val order, capped by
 * the split's size, each rank taking its slice — so the set depends on G, not
 * on how it is split over ranks and micro-batches. Every rank runs the same
 * number of forward passes (they are collective). */
static double evaluate(trainer *t, uint64_t *tokens_out) {
    const keel_model_layout *lay = keel_model_get_layout(t->model);
    int B = t->cfg->train.micro_batch_size;
    uint64_t per_rank = (uint64_t)t->cfg->train.eval_batches * B * t->cfg->train.grad_accum_steps;
    uint64_t n = keel_data_n_samples(t->val) / (uint64_t)t->world_size;
    if (per_rank > n) per_rank = n;
    uint64_t total = per_rank * (uint64_t)t->world_size;
    double loss = 0;
    for (uint64_t done = 0; done < per_rank; done += (uint64_t)B) {
        int rows = (int)(per_rank - done < (uint64_t)B ? per_rank - done : (uint64_t)B);
        keel_data_fetch(t->val, 0, total, (uint64_t)t->rank * per_rank + done, rows, t->tokens);
        loss += keel_model_forward(t->model, t->tokens, rows, 0.0f);
    }
    if (t->world) keel_comm_allreduce_scalar(t->world, &loss, KEEL_COMM_SUM);
    *tokens_out = total * (uint64_t)lay->T;
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

/* What each rank holds, by category (summary.json "ranks"). */
enum { MEM_PARAMS, MEM_GRADS, MEM_OPTIMIZER, MEM_COMPUTE, MEM_ACTIVATIONS, MEM_CKPT, MEM_PEAK_RSS,
       MEM_FIELDS };
static const char *MEM_NAMES[MEM_FIELDS] = {"params_bytes", "grads_bytes", "optimizer_bytes",
                                            "compute_copy_bytes", "activation_bytes",
                                            "checkpoint_buffer_bytes", "peak_rss_bytes"};

static void rank_memory(trainer *t, double out[MEM_FIELDS]) {
    const keel_model_layout *lay = keel_model_get_layout(t->model);
    int64_t params = 4 * lay->n_params, compute = t->bf16 ? 2 * lay->n_params : 0;
    if (t->fsdp) {
        keel_fsdp_stats st;
        keel_fsdp_get_stats(t->fsdp, &st);
        params = st.master_bytes;
        compute = st.gathered_bytes + st.unit_grad_bytes;
    }
    out[MEM_PARAMS] = (double)params;
    out[MEM_GRADS] = (double)params;
    out[MEM_OPTIMIZER] = (double)keel_optim_state_bytes(t->opt);
    out[MEM_COMPUTE] = (double)compute;
    keel_model_options opts = {.checkpoint_activations = t->cfg->fsdp.activation_checkpointing,
                               .bf16 = t->bf16};
    out[MEM_ACTIVATIONS] = (double)keel_model_activation_bytes(lay, t->cfg->train.micro_batch_size, &opts);
    out[MEM_CKPT] = (double)trainer_ckpt_buffer_bytes(t);
    out[MEM_PEAK_RSS] = (double)keel_peak_rss_bytes();
}

static keel_status write_summary(trainer *t, const float *params, const double *memory,
                                 const char *status, int steps_done, double final_loss,
                                 double final_val_loss, double wall_s) {
    const keel_model_layout *lay = keel_model_get_layout(t->model);
    char xxh[17];
    keel_params_xxh3_hex(params, lay->n_params, xxh);
    double median_tps = 0;
    int timed = steps_done - t->start_step; /* steps this process ran */
    if (timed > 0) {
        qsort(t->step_tps + t->start_step, (size_t)timed, sizeof(double), cmp_double);
        median_tps = t->step_tps[t->start_step + timed / 2];
    }
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "status", status);
    cJSON_AddNumberToObject(s, "steps", steps_done);
    cJSON_AddNumberToObject(s, "final_loss", final_loss);
    if (!isnan(final_val_loss)) cJSON_AddNumberToObject(s, "final_val_loss", final_val_loss);
    cJSON_AddStringToObject(s, "params_xxh3", xxh);
    cJSON_AddNumberToObject(s, "n_params", (double)lay->n_params);
    cJSON_AddNumberToObject(s, "peak_rss_bytes", (double)keel_peak_rss_bytes());
    cJSON_AddNumberToObject(s, "tokens", (double)steps_done * (double)trainer_global_batch(t) * lay->T);
    cJSON_AddNumberToObject(s, "world_size", t->world_size);
    cJSON_AddNumberToObject(s, "wall_s", wall_s);
    cJSON_AddNumberToObject(s, "tokens_per_s_median", median_tps);
    cJSON_AddNumberToObject(s, "mfu_median", median_tps * t->flops_per_token / t->peak_flops);
    cJSON_AddNumberToObject(s, "threads", t->threads);
    cJSON_AddNumberToObject(s, "peak_flops", t->peak_flops);
    cJSON_AddStringToObject(s, "mixed_precision", t->bf16 ? "bf16" : "fp32");
    cJSON_AddStringToObject(s, "keel_version", KEEL_VERSION);
    cJSON *ranks = cJSON_AddArrayToObject(s, "ranks");
    for (int r = 0; r < t->world_size; r++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "rank", r);
        for (int i = 0; i < MEM_FIELDS; i++)
            cJSON_AddNumberToObject(o, MEM_NAMES[i], memory[r * MEM_FIELDS + i]);
        cJSON_AddItemToArray(ranks, o);
    }
    keel_status st = write_json_file(t->run_dir, "summary.json", s);
    cJSON_Delete(s);
    return st;
}

/* Seconds the leader's compute thread has spent blocked on FSDP communication. */
static double comm_wait_s(const trainer *t) {
    if (!t->fsdp) return 0;
    keel_fsdp_stats st;
    keel_fsdp_get_stats(t->fsdp, &st);
    return st.gather_wait_s + st.reduce_wait_s;
}

static void log_step(trainer *t, int step, double loss, double lr, double norm, double step_s,
                     double exposed_comm_s, double ckpt_stall_s, double val_loss) {
    const keel_model_layout *lay = keel_model_get_layout(t->model);
    double tokens = (double)trainer_global_batch(t) * lay->T;
    double tps = tokens / step_s;
    t->step_tps[step] = tps;
    t->peak_flops = keel_peak_revise(t->peak_flops, tps * t->flops_per_token, t->world_size, t->bf16);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "step", step + 1);
    cJSON_AddNumberToObject(o, "loss", loss);
    cJSON_AddNumberToObject(o, "lr", lr);
    cJSON_AddNumberToObject(o, "grad_norm", norm);
    cJSON_AddNumberToObject(o, "tokens", tokens * (step + 1));
    cJSON_AddNumberToObject(o, "tokens_per_s", tps);
    cJSON_AddNumberToObject(o, "mfu", tps * t->flops_per_token / t->peak_flops);
    cJSON_AddNumberToObject(o, "step_s", step_s);
    if (t->fsdp) cJSON_AddNumberToObject(o, "comm_wait_s", exposed_comm_s);
    if (ckpt_stall_s > 0) cJSON_AddNumberToObject(o, "ckpt_stall_s", ckpt_stall_s);
    if (!isnan(val_loss)) cJSON_AddNumberToObject(o, "val_loss", val_loss);
    char *text = cJSON_PrintUnformatted(o);
    keel_jsonl_write(t->metrics, text);
    free(text);
    cJSON_Delete(o);
}

/* Validation that needs no writing: memory, data, tokenizer. */
/* init_from: a checkpoint of the config's model. */
static keel_status check_init_from(const keel_config *cfg) {
    if (!cfg->init_from) return KEEL_OK;
    keel_ckpt ck;
    keel_status st = keel_ckpt_open(cfg->init_from, &ck);
    if (st != KEEL_OK) return st;
    keel_model_layout lay;
    keel_model_layout_init(&lay, &cfg->model);
    st = keel_ckpt_check_layout(&ck, &lay);
    keel_model_layout_free(&lay);
    keel_ckpt_close(&ck);
    return st;
}

/* The parameters of cfg->init_from into full (every checkpoint file verified). */
static keel_status load_init_from(const keel_config *cfg, const keel_model_layout *lay, float *full) {
    keel_ckpt ck;
    keel_status st = keel_ckpt_open(cfg->init_from, &ck);
    if (st != KEEL_OK) return st;
    st = keel_ckpt_load_params(&ck, lay, full);
    if (st == KEEL_OK) keel_log_info("parameters from %s (step %lld)", cfg->init_from, (long long)ck.step);
    keel_ckpt_close(&ck);
    return st;
}

static keel_status open_inputs(trainer *t) {
    const keel_config *cfg = t->cfg;
    t->n_skips = keel_resil_skipped_steps(t->run_dir, &t->skips);
    keel_status st = check_memory(cfg, t->world_size);
    if (st == KEEL_OK) st = check_init_from(cfg);
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
    int step = t->start_step;
    const char *status = "completed";
    keel_status st = KEEL_OK;
    keel_progress_init(&t->progress, stdout, cfg->train.steps);
    /* three times the loss of a uniform guess: no training run comes back from there */
    double max_loss = cfg->resilience.max_loss > 0 ? cfg->resilience.max_loss
                                                   : 3 * log((double)cfg->model.vocab_size);
    for (; step < cfg->train.steps; step++) {
        double t0 = keel_now_s(), wait0 = comm_wait_s(t), norm;
        loss = train_step(t, step, &norm);
        double step_s = keel_now_s() - t0, step_wait_s = comm_wait_s(t) - wait0;
        if (!isfinite(loss) || !isfinite(norm) || loss > max_loss) {
            if (t->leader) {
                keel_progress_end(&t->progress);
                keel_event(t->run_dir, "diverged", step + 1, "loss %g, gradient norm %g (resilience.max_loss %g)",
                           loss, norm, max_loss);
            }
            keel_errorf("step %d: loss %g, gradient norm %g: %s; lower train.lr or raise train.warmup_steps",
                        step + 1, loss, norm, isfinite(loss) && isfinite(norm)
                            ? "the loss exceeds resilience.max_loss, training diverged" : "not finite");
            status = "diverged";
            st = KEEL_ERR_NUMERIC;
            break;
        }
        val_loss = NAN;
        if (t->val && (step + 1) % cfg->train.eval_every == 0) {
            uint64_t n;
            last_val = val_loss = evaluate(t, &n);
        }
        /* every rank must stop at the same step: the boundary agrees on signals */
        bool stop = g_stop_signal != 0;
        trainer_ckpt_boundary(t, step + 1, step + 1 == cfg->train.steps, &stop);
        keel_heartbeat_beat(t->heartbeat, "train", step + 1, 0);
        double stall_s = trainer_ckpt_take_stall(t);
        if (t->leader) {
            log_step(t, step, loss, keel_lr_at(&cfg->train, step), norm, step_s, step_wait_s, stall_s,
                     val_loss);
            double tps = (double)trainer_global_batch(t) * lay->T / step_s;
            keel_progress_step(&t->progress, step + 1, loss, tps,
                               tps * t->flops_per_token / t->peak_flops, keel_now_s() - start);
            if (!isnan(val_loss))
                keel_progress_note(&t->progress, "step %d: val loss %.4f", step + 1, val_loss);
        }
        if (stop) {
            /* saved at the boundary (when checkpointing is on): resume-me; else plain failure */
            bool saved = trainer_ckpt_saved_step(t) == step + 1;
            if (t->leader)
                keel_progress_note(&t->progress, "stopped after step %d on a signal%s", step + 1,
                                   saved ? ", checkpoint saved: run the same command again to resume"
                                         : " without a checkpoint (checkpointing is off)");
            status = "interrupted";
            st = saved ? KEEL_ERR_STOPPED : KEEL_ERR_IO;
            step++;
            break;
        }
    }
    float *params = keel_model_params(t->model), *gathered = NULL;
    double *memory = keel_xmalloc(sizeof(double) * MEM_FIELDS * (size_t)t->world_size, "memory report");
    rank_memory(t, memory + t->rank * MEM_FIELDS);
    if (t->fsdp) { /* collective: every rank takes part, the leader writes */
        params = gathered = keel_xmalloc(sizeof(float) * (size_t)lay->n_params, "full parameters");
        keel_fsdp_gather_full(t->fsdp, gathered);
        keel_comm_allgather(t->world, memory + t->rank * MEM_FIELDS, memory, MEM_FIELDS, KEEL_COMM_F64);
    }
    if (t->leader) {
        keel_progress_end(&t->progress);
        char path[4096];
        path_join(path, sizeof path, t->run_dir, "weights.bin");
        keel_status wst = keel_weights_save(path, params, lay->n_params);
        keel_status sst = write_summary(t, params, memory, status, step, loss, last_val,
                                        keel_now_s() - start);
        if (st == KEEL_OK) st = wst != KEEL_OK ? wst : sst;
    }
    keel_free(gathered);
    keel_free(memory);
    return st;
}

/* Create the run directory (if new) and write the resolved config into it
 * (atomically replacing a resumed run's: each checkpoint keeps its own). */
static keel_status create_run_dir(const keel_config *cfg, const char *run_dir) {
    keel_status st = make_dirs(run_dir);
    if (st != KEEL_OK) return st;
    char path[4096];
    char *resolved = keel_config_to_json(cfg);
    size_t len = strlen(resolved);
    resolved = keel_xrealloc(resolved, len + 2, "config text");
    memcpy(resolved + len, "\n", 2);
    path_join(path, sizeof path, run_dir, "config.json");
    st = keel_write_file_atomic(path, resolved, len + 1);
    free(resolved);
    return st;
}

/* Model, optimizer and buffers; under FSDP the model holds no parameters of
 * its own and the optimizer works on this rank's shard. */
static keel_status build_state(trainer *t) {
    const keel_config *cfg = t->cfg;
    keel_status st = KEEL_OK;
    int B = cfg->train.micro_batch_size;
    keel_model_options opts = {.own_params = !t->world,
                               .checkpoint_activations = cfg->fsdp.activation_checkpointing,
                               .bf16 = t->bf16};
    keel_model_build_with(&cfg->model, B, &opts, &t->model);
    /* A run directory with checkpoints resumes from one of them (or stops when
     * none is usable): initializing the parameters first would be wasted time
     * on every restart. */
    int64_t *steps;
    bool resuming = keel_ckpt_list(t->run_dir, &steps) > 0;
    keel_free(steps);
    if (t->world) {
        keel_fsdp_strategy strategy;
        keel_fsdp_strategy_parse(cfg->fsdp.strategy, &strategy); /* validated by finalize */
        st = keel_fsdp_build(t->model, t->world, strategy, cfg->fsdp.shard_group_size, &t->fsdp);
        KEEL_CHECK(st == KEEL_OK, "fsdp setup failed after validation");
        keel_fsdp_set_prefetch(t->fsdp, cfg->fsdp.prefetch);
        keel_fsdp_set_reduce_bf16(t->fsdp, want_bf16_reduce(cfg));
        const keel_model_layout *lay = keel_model_get_layout(t->model);
        if (!resuming) {
            float *full = keel_xmalloc(sizeof(float) * (size_t)lay->n_params, "initial parameters");
            if (cfg->init_from) st = load_init_from(cfg, lay, full);
            else keel_model_init_params(lay, cfg->train.seed, full); /* same on every rank */
            keel_fsdp_load_full(t->fsdp, full);
            keel_free(full);
        }
        const keel_fsdp_plan *plan = keel_fsdp_get_plan(t->fsdp);
        keel_param_range *ranges;
        int n = keel_fsdp_param_ranges(plan, keel_fsdp_shard_rank(t->fsdp), &ranges);
        keel_optim_build_ranges(&cfg->train, lay, ranges, n, plan->shard_total, &t->opt);
        keel_free(ranges);
    } else {
        const keel_model_layout *lay = keel_model_get_layout(t->model);
        if (!resuming && cfg->init_from) st = load_init_from(cfg, lay, keel_model_params(t->model));
        else if (!resuming) keel_model_init_weights(t->model, cfg->train.seed);
        keel_model_params_changed(t->model);
        keel_optim_build(&cfg->train, lay, 0, lay->n_params, &t->opt);
    }
    return st;
}

/* Everything after validation and the run directory: shared by a
 * single-process run and by every rank of a distributed one. */
static keel_status run(trainer *t) {
    const keel_config *cfg = t->cfg;
    char path[4096];
    keel_status st = KEEL_OK;
    if (t->leader) {
        path_join(path, sizeof path, t->run_dir, "metrics.jsonl");
        if ((st = keel_jsonl_open(path, &t->metrics)) != KEEL_OK) return st;
    }
    t->bf16 = bf16_usable(cfg);
    if ((st = build_state(t)) != KEEL_OK) return st;
    trainer_ckpt_init(t);
    if ((st = trainer_ckpt_resume(t)) != KEEL_OK) return st;
    if (t->start_step >= cfg->train.steps) {
        if (t->leader)
            keel_log_info("%s is already trained to step %d (train.steps %d): nothing to do; raise "
                          "train.steps to go on", t->run_dir, t->start_step, cfg->train.steps);
        return KEEL_OK;
    }
    const keel_model_layout *lay = keel_model_get_layout(t->model);
    t->tokens = keel_xmalloc(sizeof(int32_t) * (size_t)cfg->train.micro_batch_size * (lay->T + 1), "tokens");
    t->step_tps = keel_xcalloc(sizeof(double) * (size_t)(cfg->train.steps + 1), "step rates");
    t->flops_per_token = keel_model_flops_per_token(lay);
    /* each rank measures its core; a rank that shared its core while measuring
     * would understate the peak (and overstate MFU), so the ranks take the best */
    double rank_peak = keel_peak_flops(t->bf16);
    if (t->world) keel_comm_allreduce_scalar(t->world, &rank_peak, KEEL_COMM_MAX);
    t->peak_flops = rank_peak * t->world_size;
    keel_log_info("rank %d of %d (pid %d): training %lld parameters for %d steps, %lld tokens per "
                  "step, %d thread(s) (%s peak %.0f GF/s over all ranks); run directory %s", t->rank,
                  t->world_size, (int)getpid(), (long long)lay->n_params, cfg->train.steps,
                  (long long)trainer_global_batch(t) * lay->T, t->threads, t->bf16 ? "bf16" : "fp32",
                  t->peak_flops / 1e9, t->run_dir);
    /* A file-size limit (RLIMIT_FSIZE) makes a write fail with EFBIG, which a
     * checkpoint reports, instead of killing the process. */
    signal(SIGXFSZ, SIG_IGN);
    keel_heartbeat_beat(t->heartbeat, "ready", t->start_step, 0);
    return train_loop(t);
}

static void free_trainer(trainer *t) {
    keel_jsonl_close(t->metrics);
    keel_data_close(t->train);
    keel_data_close(t->val);
    trainer_ckpt_free(t);
    keel_optim_free(t->opt);
    keel_fsdp_free(t->fsdp);
    keel_model_free(t->model);
    keel_free(t->tokens);
    keel_free(t->step_tps);
    keel_free(t->skips);
}

/* A new or empty directory, or a run to resume (trainer_check_resume). */
static keel_status check_run_dir(keel_config *cfg, const char *run_dir, int world_size) {
    bool resuming;
    keel_status st = trainer_check_resume(cfg, run_dir, world_size, &resuming);
    return st != KEEL_OK || resuming ? st : check_run_dir_free(run_dir);
}

keel_status keel_train_run(keel_config *cfg, const char *run_dir) {
    trainer t = {.cfg = cfg, .run_dir = run_dir, .world_size = 1, .leader = true};
    struct sigaction old[3];
    catch_stop_signals(old);
    keel_status st = check_run_dir(cfg, run_dir, 1);
    if (st == KEEL_OK) st = open_inputs(&t);
    if (st == KEEL_OK) st = create_run_dir(cfg, run_dir);
    if (st == KEEL_OK) {
        t.threads = keel_kernels_init(cfg->train.threads);
        st = run(&t);
        keel_kernels_shutdown();
    }
    free_trainer(&t);
    restore_stop_signals(old);
    return st;
}

keel_status keel_train_prepare_run_dir(keel_config *cfg, const char *run_dir, int world_size) {
    trainer t = {.cfg = cfg, .run_dir = run_dir, .world_size = world_size, .leader = true};
    keel_status st = check_run_dir(cfg, run_dir, world_size);
    if (st == KEEL_OK) st = open_inputs(&t);
    if (st == KEEL_OK) st = create_run_dir(cfg, run_dir);
    char logs[4096];
    path_join(logs, sizeof logs, run_dir, "logs");
    if (st == KEEL_OK) st = make_dirs(logs);
    free_trainer(&t);
    return st;
}

keel_status keel_train_worker(const char *run_dir) {
    struct sigaction old[3];
    catch_stop_signals(old);
    static keel_comm *world; /* static: a failed rank exits without finalizing (below) */
    keel_status st = keel_comm_init(&world);
    if (st != KEEL_OK) return st;
    trainer t = {.run_dir = run_dir, .world = world, .rank = keel_comm_rank(world),
                 .world_size = keel_comm_size(world)};
    t.leader = t.rank == 0;
    t.heartbeat = keel_heartbeat_open(run_dir, t.rank);
    keel_heartbeat_beat(t.heartbeat, "init", 0, 0);
    /* Every rank logs to RUN/logs/rank-R.log; the leader also keeps the terminal. */
    char path[4096];
    snprintf(path, sizeof path, "%s/logs/rank-%d.log", run_dir, t.rank);
    FILE *log = fopen(path, "a");
    if (log && !t.leader) {
        dup2(fileno(log), STDOUT_FILENO);
        dup2(fileno(log), STDERR_FILENO);
    } else if (log) {
        keel_log_set_file(log);
    }
    keel_config cfg;
    keel_config_defaults(&cfg);
    path_join(path, sizeof path, run_dir, "config.json");
    st = keel_config_load_file(&cfg, path);
    if (st == KEEL_OK) st = keel_config_finalize(&cfg);
    t.cfg = &cfg;
    if (st == KEEL_OK) st = open_inputs(&t);
    if (st == KEEL_OK) {
        /* Ranks share the machine's cores unless train.threads says otherwise. */
        int threads = cfg.train.threads;
        if (threads == 0) {
            long cores = sysconf(_SC_NPROCESSORS_ONLN);
            threads = cores / t.world_size > 1 ? (int)(cores / t.world_size) : 1;
        }
        t.threads = keel_kernels_init(threads);
        st = run(&t);
        keel_kernels_shutdown();
    }
    free_trainer(&t);
    keel_config_free(&cfg);
    keel_log_set_file(NULL);
    if (log) fclose(log);
    keel_heartbeat_beat(t.heartbeat, "exit", -1, keel_status_exit_code(st));
    keel_heartbeat_close(t.heartbeat);
    restore_stop_signals(old);
    /* A rank that failed validation cannot finalize with the others: MPI is
     * fail-stop here, so exiting non-zero ends the job. */
    if (st == KEEL_OK) keel_comm_finalize(world);
    return st;
}
