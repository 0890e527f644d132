/* train/train.c: the training loop — one process, or one rank of many (a
 * worker under the supervisor, or a Slurm task) — and what it writes to the
 * run directory: metrics, summary, final weights. */
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
#include "keel/comm.h"
#include "keel/fsdp.h"
#include "keel/kernels.h"
#include "keel/model.h"
#include "keel/monitor.h"
#include "keel/optim.h"
#include "keel/run.h"
#include "keel/train.h"
#include "train/gather.h"
#include "train/peers.h"
#include "train/profile.h"
#include "train/resume.h"
#include "train/samples.h"
#include "train/saving.h"
#include "train/snapshots.h"
#include "train/startup.h"
#include "train/stop.h"
#include "train/trainer.h"

/* fsdp.mixed_precision bf16 runs bf16 GEMMs on bf16 instructions where the
 * CPU has them and emulates them elsewhere (the same math, no faster than fp32). */
static bool want_bf16(const keel_config *cfg) { return cfg->fsdp.mixed_precision == KEEL_DTYPE_BF16; }

static bool bf16_usable(const keel_config *cfg, const keel_backend *be) {
    if (!want_bf16(cfg)) return false;
    const char *path;
    if (be->kind == KEEL_BACKEND_CUDA)
        keel_log_info("fsdp.mixed_precision bf16: bf16 GEMMs through cuBLASLt, fp32 master weights and optimizer");
    else if (keel_bf16_native(&path))
        keel_log_info("fsdp.mixed_precision bf16: bf16 GEMMs through %s, fp32 master weights and "
                      "optimizer", path);
    else
        keel_log_warn("fsdp.mixed_precision bf16: bf16 GEMMs %s, no faster than fp32; fp32 "
                      "master weights and optimizer", path);
    return true;
}

static double gib(int64_t bytes) { return (double)bytes / (1024.0 * 1024 * 1024); }

keel_status keel_train_dry_run(const keel_config *cfg, int world_size) {
    keel_parallel_dims dims;
    char why[256];
    if (keel_parallel_dims_resolve(cfg->fsdp.strategy, cfg->fsdp.shard_group_size, world_size, &dims, why,
                                   sizeof why) != KEEL_OK) {
        keel_errorf("%s", why);
        return KEEL_ERR_INPUT;
    }
    keel_model_layout lay;
    keel_model_layout_init(&lay, &cfg->model);
    keel_fsdp_memory m;
    keel_fsdp_memory_plan(cfg, world_size, &m);
    printf("model: dim %d, %d layers, %d heads (%d kv), head size %d, ffn %d, vocab %d, seq %d\n",
           lay.C, lay.L, lay.NH, lay.NKV, lay.HS, lay.F, lay.V, lay.T);
    printf("parameters: %lld (%.3f B)\n", (long long)lay.n_params, (double)lay.n_params / 1e9);
    keel_model_layout lora;
    bool lora_on = cfg->train.lora.on && keel_lora_layout_init(&lora, &lay, &cfg->train.lora, why, sizeof why) == KEEL_OK;
    if (lora_on) {
        char targets[128];
        keel_lora_targets_format(cfg->train.lora.targets, targets, sizeof targets);
        printf("trained: %lld LoRA adapter parameters (rank %d on %s), the base frozen\n", (long long)lora.n_params,
               cfg->train.lora.rank, targets);
    }
    printf("training FLOPs per token: %.3e\n", keel_model_train_flops_per_token(&lay, lora_on ? &lora : NULL));
    if (lora_on) keel_model_layout_free(&lora);
    printf("memory per rank (%s GEMMs, %s, micro-batch %d):\n", keel_dtype_name(cfg->fsdp.mixed_precision),
           world_size == 1 ? "one process" : keel_strategy_name(cfg->fsdp.strategy), cfg->train.micro_batch_size);
    keel_fsdp_memory_item items[KEEL_FSDP_MEMORY_CATEGORIES];
    keel_fsdp_memory_items(&m, items);
    for (int i = 0; i < KEEL_FSDP_MEMORY_CATEGORIES; i++)
        printf("  %-18s %10.3f GiB\n", items[i].what, gib(items[i].bytes));
    printf("  %-18s %10.3f GiB x %d rank(s) (this machine has %.1f GiB available)\n", "total",
           gib(keel_fsdp_memory_total(&m)), world_size, gib((int64_t)keel_mem_available_bytes()));
    keel_model_layout_free(&lay);
    return KEEL_OK;
}

/* Seconds the leader's compute has spent blocked on FSDP communication: the
 * host's waits, and a device's compute stream's (timed on the device). */
static double comm_wait_s(const trainer *t) {
    if (!t->fsdp) return 0;
    keel_fsdp_stats st;
    keel_fsdp_get_stats(t->fsdp, &st);
    return st.gather_wait_s + st.reduce_wait_s + st.device_wait_s;
}

/* train.lora.dropout's masks: sequence `first + b` of the step's global
 * batch draws from a key of (seed, step, its place in the batch), so the
 * masks do not depend on the ranks or micro-batches it is split into, and a
 * resumed run draws the same ones. */
static void set_dropout_keys(trainer *t, int step, uint64_t first, int B) {
    if (!t->cfg->train.lora.on || t->cfg->train.lora.dropout <= 0) return;
    uint64_t keys[B];
    for (int b = 0; b < B; b++)
        keys[b] = keel_hash64(keel_hash64(keel_hash64(t->cfg->train.seed ^ 0x6C6F7261ull /* "lora" */) + (uint64_t)step) +
                              first + (uint64_t)b);
    keel_model_set_dropout_keys(t->model, keys, B);
}

/* One optimizer step: accumulate over micro-batches, clip, AdamW. Returns the mean loss
 * over the step's targets trained on (all G*T of them, or those a loss mask keeps). */
static double train_step(trainer *t, int step, double *grad_norm_out) {
    const keel_config *cfg = t->cfg;
    int B = cfg->train.micro_batch_size, accum = cfg->train.grad_accum_steps;
    int64_t G = trainer_global_batch(t);
    /* Data windows the supervisor skipped (a step that diverged twice) shift the rest. */
    uint64_t window = keel_run_data_window(&t->state, step);
    /* the mean over the whole step's trained targets, whichever rank and micro-batch holds
     * them; a step of masked targets only trains nothing (its gradient is 0) */
    uint64_t targets = keel_data_step_targets(t->train, window, (uint64_t)G);
    double divisor = targets ? (double)targets : 1.0;
    float grad_scale = 1.0f / (float)divisor;
    double loss_sum = 0;
    if (t->fsdp) keel_fsdp_zero_grads(t->fsdp);
    else keel_model_zero_grads(t->model);
    /* Rank r takes its contiguous slice of the step's G samples (DESIGN §4). */
    for (int micro = 0; micro < accum; micro++) {
        uint64_t first = (uint64_t)t->rank * B * accum + (uint64_t)micro * B;
        keel_data_fetch(t->train, window, (uint64_t)G, first, B, t->tokens, t->flags);
        set_dropout_keys(t, step, first, B);
        loss_sum += keel_model_forward(t->model, t->tokens, t->flags, B, grad_scale);
        keel_model_backward(t->model);
        keel_heartbeat_beat(t->heartbeat, "train", step, 0);
    }
    double sumsq;
    float *params, *grads;
    t->sync_s = 0;
    if (t->fsdp) {
        /* the last gradients, the norm and the loss: waits on every peer (less the reductions'
         * waits, which comm_wait_s counts already) */
        double t0 = keel_now_s(), wait0 = comm_wait_s(t);
        keel_fsdp_finish_grads(t->fsdp);
        keel_fsdp_grad_sumsq(t->fsdp, &sumsq);
        keel_comm_allreduce_scalar(t->world, &loss_sum, KEEL_COMM_SUM);
        t->sync_s = fmax(0, keel_now_s() - t0 - (comm_wait_s(t) - wait0));
        params = keel_fsdp_master(t->fsdp), grads = keel_fsdp_grads(t->fsdp);
    } else {
        params = trainer_own_params(t), grads = trainer_own_grads(t);
        sumsq = keel_optim_sumsq(t->opt, grads);
    }
    double norm = sqrt(sumsq);
    *grad_norm_out = norm;
    trainer_save_before_update(t); /* a save may still be copying the state */
    trainer_snap_before_update(t); /* so may a snapshot */
    keel_heartbeat_progress(t->heartbeat, "optimizer");
    keel_optim_update(t->opt, params, grads, step, keel_lr_at(&cfg->train, step),
                      keel_clip_scale(norm, cfg->train.grad_clip));
    if (t->fsdp) keel_fsdp_invalidate(t->fsdp);
    else if (!keel_model_lora_layout(t->model)) keel_model_params_changed(t->model); /* adapters are read as they are */
    return loss_sum / divisor;
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
    double loss = 0, targets = 0;
    keel_heartbeat_progress(t->heartbeat, "eval");
    for (uint64_t done = 0; done < per_rank; done += (uint64_t)B) {
        int rows = (int)(per_rank - done < (uint64_t)B ? per_rank - done : (uint64_t)B);
        keel_data_fetch(t->val, 0, total, (uint64_t)t->rank * per_rank + done, rows, t->tokens, t->flags);
        loss += keel_model_forward(t->model, t->tokens, t->flags, rows, 0.0f);
        targets += t->flags ? (double)keel_data_targets_in(t->flags, rows, lay->T) : (double)rows * lay->T;
    }
    if (t->world) {
        keel_comm_allreduce_scalar(t->world, &loss, KEEL_COMM_SUM);
        keel_comm_allreduce_scalar(t->world, &targets, KEEL_COMM_SUM);
    }
    *tokens_out = (uint64_t)targets;
    return targets > 0 ? loss / targets : 0.0;
}

/* What each rank holds, by category (summary.json "ranks"). */
enum { MEM_PARAMS, MEM_GRADS, MEM_OPTIMIZER, MEM_COMPUTE, MEM_ACTIVATIONS, MEM_CKPT, MEM_SNAPSHOT, MEM_PEAK_RSS,
       MEM_ALLOCS, MEM_FIELDS };
static const char *MEM_NAMES[MEM_FIELDS] = {"params_bytes", "grads_bytes", "optimizer_bytes",
                                            "compute_copy_bytes", "activation_bytes",
                                            "checkpoint_buffer_bytes", "snapshot_bytes", "peak_rss_bytes",
                                            "backend_allocations_in_steps"};

static void rank_memory(trainer *t, double out[MEM_FIELDS]) {
    const keel_model_layout *lay = keel_model_get_layout(t->model), *trained = trainer_layout(t);
    bool lora = trained != lay; /* + the frozen base's parameters, without gradients */
    int64_t params = 4 * (lay->n_params + (lora ? trained->n_params : 0)), grads = 4 * trained->n_params;
    int64_t compute = t->bf16 ? 2 * lay->n_params : 0;
    if (t->fsdp) { /* the trained set's runtime, and a LoRA base's */
        params = grads = compute = 0;
        keel_fsdp *sets[2] = {t->fsdp, t->base};
        for (int i = 0; i < 2 && sets[i]; i++) {
            keel_fsdp_stats st;
            keel_fsdp_get_stats(sets[i], &st);
            params += st.master_bytes;
            grads += st.grad_bytes;
            compute += st.gathered_bytes + st.unit_grad_bytes;
        }
    }
    out[MEM_PARAMS] = (double)params;
    out[MEM_GRADS] = (double)grads;
    out[MEM_OPTIMIZER] = (double)keel_optim_state_bytes(t->opt);
    out[MEM_COMPUTE] = (double)compute;
    keel_model_options opts = {.checkpoint_blocks = keel_config_checkpoint_blocks(t->cfg),
                               .bf16 = t->bf16, .document_mask = t->cfg->data.document_mask,
                               .lora = &t->cfg->train.lora};
    out[MEM_ACTIVATIONS] = (double)keel_model_activation_bytes(lay, t->cfg->train.micro_batch_size, &opts);
    out[MEM_CKPT] = (double)trainer_save_buffer_bytes(t);
    out[MEM_SNAPSHOT] = (double)trainer_snap_bytes(t);
    out[MEM_PEAK_RSS] = (double)keel_peak_rss_bytes();
    /* after this launch's first step (which may size a kernel's scratch) */
    out[MEM_ALLOCS] = t->allocs_after_first_step < 0 ? 0 : (double)(t->be->allocations() - t->allocs_after_first_step);
}

/* Bring t->source_rows up to the first `steps` steps (the data windows they trained on; a resumed
 * run counts its earlier steps' on the first call). NULL without data.sources. */
static const uint64_t *count_sources(trainer *t, int steps) {
    int n = keel_data_n_sources(t->train);
    if (n == 0) return NULL;
    if (!t->source_rows) t->source_rows = keel_xcalloc(sizeof *t->source_rows * (size_t)n, "rows per source");
    for (; t->sources_counted < steps; t->sources_counted++)
        keel_data_count_sources(t->train, keel_run_data_window(&t->state, t->sources_counted),
                                (uint64_t)trainer_global_batch(t), t->source_rows);
    return t->source_rows;
}

static keel_status write_summary(trainer *t, const char *xxh, const double *memory, const char *status,
                                 int steps_done, double final_loss, double final_val_loss, double wall_s) {
    const keel_model_layout *lay = keel_model_get_layout(t->model);
    double median_tps = 0;
    int timed = 0; /* steps this process ran, less the profiled ones */
    for (int i = t->start_step; i < steps_done; i++)
        if (!isnan(t->step_tps[i])) t->step_tps[t->start_step + timed++] = t->step_tps[i];
    if (timed > 0) median_tps = keel_median(t->step_tps + t->start_step, timed);
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "status", status);
    cJSON_AddNumberToObject(s, "steps", steps_done);
    cJSON_AddNumberToObject(s, "final_loss", final_loss);
    if (!isnan(final_val_loss)) cJSON_AddNumberToObject(s, "final_val_loss", final_val_loss);
    cJSON_AddStringToObject(s, "params_xxh3", xxh);
    cJSON_AddNumberToObject(s, "n_params", (double)lay->n_params);
    cJSON_AddNumberToObject(s, "trained_params", (double)trainer_layout(t)->n_params); /* the adapters with LoRA */
    cJSON_AddNumberToObject(s, "peak_rss_bytes", (double)keel_peak_rss_bytes());
    cJSON_AddNumberToObject(s, "tokens", (double)steps_done * (double)trainer_global_batch(t) * lay->T);
    const uint64_t *rows = count_sources(t, steps_done);
    if (rows) {
        cJSON *sources = cJSON_AddArrayToObject(s, "sources");
        for (int i = 0; i < keel_data_n_sources(t->train); i++) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "path", keel_data_source_path(t->train, i));
            cJSON_AddNumberToObject(o, "weight", keel_data_source_weight(t->train, i));
            cJSON_AddNumberToObject(o, "tokens", (double)rows[i] * lay->T);
            cJSON_AddItemToArray(sources, o);
        }
    }
    cJSON_AddNumberToObject(s, "world_size", t->world_size);
    cJSON_AddNumberToObject(s, "wall_s", wall_s);
    cJSON_AddNumberToObject(s, "tokens_per_s_median", median_tps);
    if (t->peak_flops > 0) cJSON_AddNumberToObject(s, "mfu_median", median_tps * t->flops_per_token / t->peak_flops);
    cJSON_AddNumberToObject(s, "threads", t->threads);
    cJSON_AddNumberToObject(s, "peak_flops", t->peak_flops);
    cJSON_AddStringToObject(s, "mixed_precision", t->bf16 ? "bf16" : "fp32");
    cJSON_AddStringToObject(s, "device", t->be ? t->be->name : "cpu");
    cJSON_AddStringToObject(s, "keel_version", KEEL_VERSION);
    cJSON *ranks = cJSON_AddArrayToObject(s, "ranks");
    for (int r = 0; r < t->world_size; r++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "rank", r);
        for (int i = 0; i < MEM_FIELDS; i++)
            cJSON_AddNumberToObject(o, MEM_NAMES[i], memory[r * MEM_FIELDS + i]);
        cJSON_AddItemToArray(ranks, o);
    }
    char *text = cJSON_Print(s);
    cJSON_Delete(s);
    keel_status st = keel_run_write_file(t->run_dir, KEEL_RUN_SUMMARY, text);
    free(text);
    return st;
}

static void log_step(trainer *t, int step, double loss, double lr, double norm, double step_s,
                     double exposed_comm_s, double ckpt_stall_s, double snapshot_stall_s, double val_loss) {
    const keel_model_layout *lay = keel_model_get_layout(t->model);
    double tokens = (double)trainer_global_batch(t) * lay->T;
    double tps = tokens / step_s;
    t->step_tps[step] = t->profile.now ? NAN : tps; /* a profiled step's time is not the run's */
    if (t->be->kind == KEEL_BACKEND_CPU) /* a measured yardstick can be wrong; a datasheet's is not revised */
        t->peak_flops = keel_peak_revise(t->peak_flops, tps * t->flops_per_token, t->world_size, t->bf16);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "step", step + 1);
    cJSON_AddNumberToObject(o, "loss", loss);
    cJSON_AddNumberToObject(o, "lr", lr);
    cJSON_AddNumberToObject(o, "grad_norm", norm);
    cJSON_AddNumberToObject(o, "tokens", tokens * (step + 1));
    const uint64_t *rows = count_sources(t, step + 1);
    if (rows) { /* per source, in data.sources' order, like "tokens" since the run began */
        cJSON *a = cJSON_AddArrayToObject(o, "source_tokens");
        for (int i = 0; i < keel_data_n_sources(t->train); i++)
            cJSON_AddItemToArray(a, cJSON_CreateNumber((double)rows[i] * lay->T));
    }
    cJSON_AddNumberToObject(o, "tokens_per_s", tps);
    if (t->peak_flops > 0) cJSON_AddNumberToObject(o, "mfu", tps * t->flops_per_token / t->peak_flops);
    cJSON_AddNumberToObject(o, "step_s", step_s);
    if (t->fsdp) cJSON_AddNumberToObject(o, "comm_wait_s", exposed_comm_s);
    if (ckpt_stall_s > 0) cJSON_AddNumberToObject(o, "ckpt_stall_s", ckpt_stall_s);
    if (snapshot_stall_s > 0) cJSON_AddNumberToObject(o, "snapshot_stall_s", snapshot_stall_s);
    if (!isnan(val_loss)) cJSON_AddNumberToObject(o, "val_loss", val_loss);
    if (t->profile.now) cJSON_AddBoolToObject(o, "profiled", true);
    char *text = cJSON_PrintUnformatted(o);
    keel_jsonl_write(t->metrics, text);
    free(text);
    cJSON_Delete(o);
}

typedef struct {
    const keel_model_layout *lay;
    uint64_t seed;
} init_fill;

/* A fresh initialisation: the model's, or an adapter set's (PEFT's). */
static keel_status fill_initial(void *ctx, int64_t begin, int64_t len, float *dst) {
    const init_fill *x = ctx;
    if (x->lay->lora.on) keel_lora_init_range(x->lay, x->seed, begin, len, dst);
    else keel_model_init_range(x->lay, x->seed, begin, len, dst);
    return KEEL_OK;
}

static keel_status fill_from_checkpoint(void *ck, int64_t begin, int64_t len, float *dst) {
    return keel_ckpt_read(ck, 0, begin, len, dst);
}

/* init_from's parameters — the model's, or with train.lora the frozen base's:
 * every rank reads only the ranges it holds, from files it has verified (one
 * process: all of them). */
static keel_status load_init_from(trainer *t) {
    const keel_model_layout *lay = keel_model_get_layout(t->model);
    keel_fsdp *f = keel_model_lora_layout(t->model) ? t->base : t->fsdp; /* NULL: one process */
    keel_ckpt ck;
    keel_status st = keel_ckpt_open_any(t->cfg->init_from, &ck);
    if (st != KEEL_OK) return st;
    if (f) {
        keel_param_range *ranges;
        int n = keel_fsdp_param_ranges(keel_fsdp_get_plan(f), keel_fsdp_shard_rank(f), &ranges);
        st = keel_ckpt_check_layout(&ck, lay);
        if (st == KEEL_OK) st = keel_ckpt_verify_ranges(&ck, ranges, n);
        if (st == KEEL_OK) st = keel_fsdp_fill(f, fill_from_checkpoint, &ck);
        keel_free(ranges);
    } else if (t->be->host_memory) {
        st = keel_ckpt_load_params(&ck, lay, keel_model_params(t->model));
    } else { /* through the host */
        float *host = keel_xmalloc(sizeof(float) * (size_t)lay->n_params, "init_from parameters");
        st = keel_ckpt_load_params(&ck, lay, host);
        if (st == KEEL_OK) t->be->to_device(keel_model_params(t->model), host, sizeof(float) * (size_t)lay->n_params);
        keel_free(host);
    }
    if (st == KEEL_OK && t->leader)
        keel_log_info("%s from %s (step %lld)", keel_model_lora_layout(t->model) ? "the frozen base" : "parameters",
                      t->cfg->init_from, (long long)ck.step);
    keel_ckpt_identity(&ck, t->base_id); /* what the adapters' checkpoints record */
    keel_ckpt_close(&ck);
    return st;
}

/* train.lora.init_from's adapters (checked by keel_run_check_init_from):
 * every rank reads the ranges it holds. */
static keel_status load_adapters(trainer *t) {
    const keel_model_layout *lora = keel_model_lora_layout(t->model);
    keel_ckpt ck;
    keel_status st = keel_ckpt_open_any(t->cfg->train.lora.init_from, &ck);
    if (st != KEEL_OK) return st;
    st = keel_ckpt_check_layout(&ck, lora);
    if (st == KEEL_OK && t->fsdp) {
        keel_param_range *ranges;
        int n = keel_fsdp_param_ranges(keel_fsdp_get_plan(t->fsdp), keel_fsdp_shard_rank(t->fsdp), &ranges);
        st = keel_ckpt_verify_ranges(&ck, ranges, n);
        if (st == KEEL_OK) st = keel_fsdp_fill(t->fsdp, fill_from_checkpoint, &ck);
        keel_free(ranges);
    } else if (st == KEEL_OK) { /* one process: through the host where the backend's memory is not */
        size_t bytes = sizeof(float) * (size_t)lora->n_params;
        float *host = t->be->host_memory ? keel_model_lora_params(t->model) : keel_xmalloc(bytes, "adapters");
        st = keel_ckpt_load_params(&ck, lora, host);
        if (!t->be->host_memory) {
            if (st == KEEL_OK) t->be->to_device(keel_model_lora_params(t->model), host, bytes);
            keel_free(host);
        }
    }
    if (st == KEEL_OK && t->leader)
        keel_log_info("adapters from %s (step %lld)", t->cfg->train.lora.init_from, (long long)ck.step);
    keel_ckpt_close(&ck);
    return st;
}

/* The parameters a new run starts from: init_from's, or a fresh
 * initialisation of which each rank computes only its shard; with
 * train.lora fresh adapters (the base is load_base's). */
static keel_status initial_params(trainer *t) {
    const keel_model_layout *lay = trainer_layout(t);
    init_fill x = {lay, t->cfg->train.seed};
    keel_status st = KEEL_OK;
    if (t->cfg->init_from && !lay->lora.on) st = load_init_from(t);
    else if (lay->lora.on && t->cfg->train.lora.init_from) st = load_adapters(t);
    else if (t->fsdp) st = keel_fsdp_fill(t->fsdp, fill_initial, &x);
    else if (lay->lora.on) fill_initial(&x, 0, lay->n_params, keel_model_lora_params(t->model));
    else keel_model_init_weights(t->model, t->cfg->train.seed);
    if (!t->fsdp) keel_model_params_changed(t->model);
    return st;
}

/* train.lora: the frozen base, from init_from at every launch (a resume
 * restores the adapters alone). */
static keel_status load_base(trainer *t) {
    if (!keel_model_lora_layout(t->model)) return KEEL_OK;
    keel_status st = load_init_from(t);
    if (!t->fsdp) keel_model_params_changed(t->model);
    return st;
}

/* data.document_mask needs a backend that masks and document starts in every shard. */
static keel_status check_document_mask(const trainer *t) {
    const char *data = t->cfg->data.path ? t->cfg->data.path : "data.sources";
    if (!t->be->document_masking) {
        keel_errorf("data.document_mask: the %s backend has no document masking yet; set data.document_mask to "
                    "false, or train on the CPU", t->be->name);
        return KEEL_ERR_INPUT;
    }
    if (!t->cfg->data.path && !t->cfg->data.sources.n) {
        keel_errorf("data.document_mask: the synthetic source has no documents; set data.path (from `keel data "
                    "prepare`) or data.document_mask to false");
        return KEEL_ERR_INPUT;
    }
    if (!keel_data_has_doc_starts(t->train) || (t->val && !keel_data_has_doc_starts(t->val))) {
        keel_errorf("data.document_mask: %s has token shards without document starts (prepared by a keel older "
                    "than this one); prepare the data again with `keel data prepare`, or set data.document_mask "
                    "to false", data);
        return KEEL_ERR_INPUT;
    }
    return KEEL_OK;
}

static keel_status open_inputs(trainer *t) {
    const keel_config *cfg = t->cfg;
    keel_status st = keel_run_state_read(t->run_dir, &t->state);
    int ranks_here = t->world ? keel_comm_local_size(t->world) : 1;
    /* the device first: a rank binds to its GPU before anything touches one */
    if (st == KEEL_OK) st = keel_backend_get(cfg->device, &t->be);
    if (st == KEEL_OK) trainer_profile_init(t);
    if (st == KEEL_OK && t->world) st = t->be->attach(t->world);
    if (st == KEEL_OK) st = keel_run_check_memory(cfg, t->world_size, ranks_here);
    if (st == KEEL_OK) st = keel_run_check_device_memory(cfg, t->world_size, ranks_here, t->be);
    if (st == KEEL_OK) st = keel_run_check_init_from(cfg, t->run_dir);
    if (st == KEEL_OK)
        st = keel_data_open(&cfg->data, "train", cfg->model.max_seq_len, cfg->model.vocab_size,
                            cfg->train.seed, &t->train);
    if (st == KEEL_OK && cfg->train.eval_every > 0) {
        st = keel_data_open(&cfg->data, "val", cfg->model.max_seq_len, cfg->model.vocab_size,
                            cfg->train.seed, &t->val);
        if (st == KEEL_OK && !t->val)
            keel_log_warn("train.eval_every is %d but %s has no val split: no validation loss "
                          "(prepare the data with --val-fraction)", cfg->train.eval_every,
                          cfg->data.path ? cfg->data.path : "data.sources");
    }
    if (st == KEEL_OK && cfg->data.document_mask) st = check_document_mask(t);
    if (st == KEEL_OK) st = trainer_samples_init(t);
    return st;
}

static keel_status append_weights(void *w, int64_t at, const float *values, int64_t n) {
    (void)at;
    return w ? keel_weights_append(w, values, n) : KEEL_OK; /* NULL: its begin failed, and said so */
}

/* RUN/weights.bin, streamed a piece at a time: under FSDP every rank gathers
 * each unit (collective) and the leader appends it, so no process holds more
 * than its shard and one unit. *xxh3 (leader) gets the parameters' XXH3. */
static keel_status save_weights(trainer *t, char xxh3[17]) {
    const keel_model_layout *lay = keel_model_get_layout(t->model);
    keel_weights_writer *w = NULL;
    keel_status st = KEEL_OK;
    char path[4096];
    keel_run_path(path, sizeof path, t->run_dir, KEEL_RUN_WEIGHTS);
    if (t->leader) st = keel_weights_begin(path, lay->n_params, &w);
    keel_status sent = trainer_each_param(t, false, append_weights, w); /* collective: even after a failed begin */
    if (!t->leader) return KEEL_OK;
    if (st == KEEL_OK) st = sent;
    if (st == KEEL_OK) return keel_weights_commit(w, xxh3);
    keel_weights_abort(w);
    return st;
}

/* The end of a run: the final weights, then summary.json with every rank's
 * memory — its peak RSS taken after the weights were saved, so it is the
 * process's real peak (collective: every rank takes part, the leader writes). */
static keel_status finish(trainer *t, const char *status, int steps_done, double loss, double val_loss,
                          double wall_s) {
    char xxh3[17] = "";
    keel_status st = save_weights(t, xxh3);
    double *memory = keel_xmalloc(sizeof(double) * MEM_FIELDS * (size_t)t->world_size, "memory report");
    rank_memory(t, memory + t->rank * MEM_FIELDS);
    if (t->fsdp) keel_comm_allgather(t->world, memory + t->rank * MEM_FIELDS, memory, MEM_FIELDS, KEEL_COMM_F64);
    if (t->leader) {
        keel_progress_end(&t->progress);
        keel_status sst = write_summary(t, xxh3, memory, status, steps_done, loss, val_loss, wall_s);
        if (st == KEEL_OK) st = sst;
    }
    keel_free(memory);
    return st;
}

/* Every rank saw the same all-reduced loss: the leader records it, each says why. */
static void report_divergence(trainer *t, int step, double loss, double norm, double max_loss) {
    if (t->leader) {
        keel_progress_end(&t->progress);
        keel_event(t->run_dir, "diverged", step + 1, "loss %g, gradient norm %g (resilience.max_loss %g)", loss,
                   norm, max_loss);
    }
    keel_errorf("step %d: loss %g, gradient norm %g: %s; lower train.lr or raise train.warmup_steps", step + 1,
                loss, norm, isfinite(loss) && isfinite(norm) ? "the loss exceeds resilience.max_loss, training diverged"
                                                             : "not finite");
}

/* A unit's forward or backward is done: the heartbeat stays fresh through
 * steps that take minutes (a 7B-width layer at T = 4096 on a CPU). */
static void beat_within_step(void *heartbeat, const char *doing) { keel_heartbeat_progress(heartbeat, doing); }

/* The beat thread's view of the collectives: issued, running, waited for. */
static void sample_comm(void *world, uint64_t *issued, uint64_t *running, uint64_t *waiting) {
    keel_comm_stats s;
    keel_comm_get_stats(world, &s);
    *issued = s.issued, *running = s.running, *waiting = s.waiting;
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
        if (t->fault.sig && step + 1 == t->fault.step && (t->fault.rank < 0 || t->fault.rank == t->rank)) {
            if (t->fault.sig > 0) raise(t->fault.sig);
            else for (;;) pause(); /* hang: until the supervisor kills the process */
        }
        bool profiled = trainer_profile_begin(t, step);
        double t0 = keel_now_s(), wait0 = comm_wait_s(t), norm;
        trainer_stop_deadline(true);
        loss = train_step(t, step, &norm);
        if (t->allocs_after_first_step < 0) t->allocs_after_first_step = t->be->allocations();
        double step_s = keel_now_s() - t0, step_wait_s = comm_wait_s(t) - wait0;
        if (profiled) trainer_profile_end(t, step_s);
        if (!isfinite(loss) || !isfinite(norm) || loss > max_loss) {
            report_divergence(t, step, loss, norm, max_loss);
            status = "diverged";
            st = KEEL_ERR_NUMERIC;
            break;
        }
        val_loss = NAN;
        if (t->val && (step + 1) % cfg->train.eval_every == 0) {
            uint64_t n;
            last_val = val_loss = evaluate(t, &n);
        }
        trainer_samples_boundary(t, step + 1);
        /* every rank must stop at the same step: the boundary agrees on signals */
        bool stop = trainer_stop_requested(), last = step + 1 == cfg->train.steps;
        if (t->world) trainer_stop_grace_after(step_s); /* a stop's deadline */
        /* the last step's save and the final weights wait on the slowest disk: not a hang */
        if (last) keel_heartbeat_beat(t->heartbeat, "finish", step + 1, 0);
        keel_heartbeat_progress(t->heartbeat, "checkpoint"); /* a save due here waits on disks, not peers */
        trainer_save_boundary(t, step + 1, last, &stop);
        trainer_snap_boundary(t, step + 1, last || stop);
        /* compute: the step less its waits on peers (FSDP collectives, the step's last reductions) */
        keel_heartbeat_step_done(t->heartbeat, step_s, fmax(0, step_s - step_wait_s - t->sync_s), t->threads);
        keel_heartbeat_beat(t->heartbeat, last || stop ? "finish" : "train", step + 1, 0);
        double stall_s = trainer_save_take_stall(t), snap_stall_s = trainer_snap_take_stall(t);
        if (t->leader) {
            log_step(t, step, loss, keel_lr_at(&cfg->train, step), norm, step_s, step_wait_s, stall_s,
                     snap_stall_s, val_loss);
            double tps = (double)trainer_global_batch(t) * lay->T / step_s;
            keel_progress_step(&t->progress, step + 1, loss, tps,
                               t->peak_flops > 0 ? tps * t->flops_per_token / t->peak_flops : NAN,
                               keel_now_s() - start);
            if (!isnan(val_loss))
                keel_progress_note(&t->progress, "step %d: val loss %.4f", step + 1, val_loss);
            if (profiled) trainer_profile_report(t, false);
        }
        if (stop) {
            /* resumable when a checkpoint exists (saved at this boundary, or an older one); the
             * supervisor, where there is one, says so in the run's last line */
            char line[512];
            const keel_checkpoint_config *cc = &cfg->checkpoint;
            int code = keel_run_stopped(step + 1, trainer_save_committed_step(t),
                                        cc->every_steps > 0 || cc->every_seconds > 0, line, sizeof line);
            if (t->leader && !t->supervised) keel_progress_note(&t->progress, "%s", line);
            status = "interrupted";
            st = code == KEEL_EXIT_RESUME ? KEEL_ERR_STOPPED : KEEL_ERR_IO;
            step++;
            break;
        }
    }
    trainer_stop_deadline(false); /* the final weights wait on disks */
    trainer_profile_report(t, true); /* a run stopped inside the window: what it profiled */
    keel_status fst = finish(t, status, step, loss, last_val, keel_now_s() - start);
    return st != KEEL_OK ? st : fst;
}


/* Model, optimizer and buffers; under FSDP the model holds no parameters of
 * its own and the optimizer works on this rank's shard. */
static keel_status build_state(trainer *t) {
    const keel_config *cfg = t->cfg;
    keel_status st = KEEL_OK;
    int B = cfg->train.micro_batch_size;
    keel_model_options opts = {.own_params = !t->world,
                               .checkpoint_blocks = keel_config_checkpoint_blocks(cfg),
                               .bf16 = t->bf16,
                               .unit = cfg->fsdp.unit,
                               .backend = t->be,
                               .document_mask = cfg->data.document_mask,
                               .lora = &cfg->train.lora};
    if ((st = keel_model_build_with(&cfg->model, B, &opts, &t->model)) != KEEL_OK) return st;
    const keel_model_layout *lay = trainer_layout(t);
    if (t->world) {
        keel_fsdp_strategy strategy = cfg->fsdp.strategy;
        int group = cfg->fsdp.shard_group_size;
        if (lay->lora.on) { /* the frozen base, and the adapters chained to it */
            st = keel_fsdp_build_set(t->model, t->world, strategy, group, KEEL_FSDP_SET_FROZEN_BASE, &t->base);
            if (st == KEEL_OK)
                st = keel_fsdp_build_set(t->model, t->world, strategy, group, KEEL_FSDP_SET_ADAPTERS, &t->fsdp);
            if (st == KEEL_OK) keel_fsdp_chain_adapters(t->base, t->fsdp);
        } else {
            st = keel_fsdp_build(t->model, t->world, strategy, group, &t->fsdp);
        }
        KEEL_CHECK(st == KEEL_OK, "fsdp setup failed after validation");
        keel_fsdp_set_prefetch(t->base ? t->base : t->fsdp, cfg->fsdp.prefetch);
        keel_fsdp_set_reduce_bf16(t->fsdp, cfg->fsdp.reduce_dtype == KEEL_DTYPE_BF16); /* before: fp32 sums in windows */
        keel_fsdp_set_node_windows(t->base ? t->base : t->fsdp, cfg->fsdp.node_windows);
        const keel_fsdp_plan *plan = keel_fsdp_get_plan(t->fsdp);
        keel_param_range *ranges;
        int n = keel_fsdp_param_ranges(plan, keel_fsdp_shard_rank(t->fsdp), &ranges);
        keel_optim_build_ranges(&cfg->train, lay, ranges, n, plan->shard_total, t->be, &t->opt);
        keel_free(ranges);
    } else {
        keel_optim_build(&cfg->train, lay, 0, lay->n_params, t->be, &t->opt);
    }
    return st;
}

/* $KEEL_FAULT=ACTION@STEP[:RANK]: the rank (every rank when none is named),
 * as it begins step STEP, in every launch that gets there, does ACTION — kill
 * (SIGKILL itself), stop (SIGSTOP itself: frozen, no beats) or hang (its main
 * thread blocks for good while its beat thread goes on: a deadlock in its own
 * work). A real fault at a step chosen in advance, for chaos tests. */
static keel_status parse_fault(trainer *t) {
    const char *env = getenv("KEEL_FAULT");
    t->fault.sig = 0;
    if (!env || !*env) return KEEL_OK;
    char action[8] = "";
    int step = 0, rank = -1, end = 0;
    int got = sscanf(env, "%7[a-z]@%d%n:%d%n", action, &step, &end, &rank, &end);
    int sig = !strcmp(action, "kill")   ? SIGKILL
              : !strcmp(action, "stop") ? SIGSTOP
              : !strcmp(action, "hang") ? -1
                                        : 0;
    if (got < 2 || env[end] || !sig || step < 1 || (got == 3 && rank < 0)) {
        keel_errorf("KEEL_FAULT=%s: expected kill@STEP, stop@STEP or hang@STEP, optionally :RANK (e.g. kill@7:1); "
                    "unset it to train without an injected fault", env);
        return KEEL_ERR_INPUT;
    }
    t->fault.sig = sig, t->fault.step = step, t->fault.rank = rank;
    if (rank < 0 || rank == t->rank)
        keel_log_warn("KEEL_FAULT=%s: this rank will %s as it begins step %d", env,
                      sig == SIGKILL ? "kill itself" : sig == SIGSTOP ? "stop itself" : "block for good", step);
    return KEEL_OK;
}

/* Everything after validation and the run directory: shared by a
 * single-process run and by every rank of a distributed one. */
static keel_status run(trainer *t) {
    const keel_config *cfg = t->cfg;
    char path[4096];
    keel_status st = KEEL_OK;
    if (t->leader) {
        keel_run_path(path, sizeof path, t->run_dir, KEEL_RUN_METRICS);
        if ((st = keel_jsonl_open(path, &t->metrics)) != KEEL_OK) return st;
    }
    if ((st = parse_fault(t)) != KEEL_OK) return st;
    if (t->be->kind != KEEL_BACKEND_CPU) keel_log_info("device %s: the model and optimizer run there", t->be->name);
    t->bf16 = bf16_usable(cfg, t->be);
    if ((st = build_state(t)) != KEEL_OK) return st;
    trainer_packed_init(&t->packed, t->model, t->opt, t->fsdp);
    trainer_save_init(t);
    trainer_snap_init(t);
    double restore0 = keel_now_s();
    if ((st = trainer_resume(t)) != KEEL_OK) return st;
    /* parameters are initialized only when nothing was resumed: wasted time on every restart otherwise */
    if (t->start_step == 0 && (st = initial_params(t)) != KEEL_OK) return st;
    if ((st = load_base(t)) != KEEL_OK) return st;
    keel_heartbeat_restored(t->heartbeat, keel_now_s() - restore0, t->restored_from);
    if (t->start_step >= cfg->train.steps) {
        if (t->leader)
            keel_log_info("%s is already trained to step %d (train.steps %d): nothing to do; raise "
                          "train.steps to go on", t->run_dir, t->start_step, cfg->train.steps);
        return KEEL_OK;
    }
    const keel_model_layout *lay = keel_model_get_layout(t->model);
    t->tokens = keel_xmalloc(sizeof(int32_t) * (size_t)cfg->train.micro_batch_size * (lay->T + 1), "tokens");
    if (keel_data_has_mask(t->train) || (t->val && keel_data_has_mask(t->val)) || cfg->data.document_mask)
        t->flags = keel_xmalloc((size_t)cfg->train.micro_batch_size * (lay->T + 1), "the tokens' flags");
    t->step_tps = keel_xcalloc(sizeof(double) * (size_t)(cfg->train.steps + 1), "step rates");
    t->flops_per_token = keel_model_train_flops_per_token(lay, keel_model_lora_layout(t->model));
    /* each rank measures its core; a rank that shared its core while measuring
     * would understate the peak (and overstate MFU), so the ranks take the best */
    double rank_peak = t->be->peak_flops(t->bf16);
    if (t->world) keel_comm_allreduce_scalar(t->world, &rank_peak, KEEL_COMM_MAX);
    t->peak_flops = rank_peak * t->world_size;
    keel_log_info("rank %d of %d (pid %d): training %lld %s for %d steps, %lld tokens per "
                  "step, %d thread(s) (%s peak %.0f GF/s over all ranks); run directory %s", t->rank,
                  t->world_size, (int)getpid(), (long long)trainer_layout(t)->n_params,
                  keel_model_lora_layout(t->model) ? "adapter parameters (LoRA, the base frozen)" : "parameters",
                  cfg->train.steps,
                  (long long)trainer_global_batch(t) * lay->T, t->threads, t->bf16 ? "bf16" : "fp32",
                  t->peak_flops / 1e9, t->run_dir);
    /* A file-size limit (RLIMIT_FSIZE) makes a write fail with EFBIG, which a
     * checkpoint reports, instead of killing the process. */
    signal(SIGXFSZ, SIG_IGN);
    keel_model_set_progress(t->model, beat_within_step, t->heartbeat);
    keel_heartbeat_beat(t->heartbeat, "ready", t->start_step, 0);
    return train_loop(t);
}

static void free_trainer(trainer *t, keel_status st) {
    keel_jsonl_close(t->metrics);
    trainer_samples_free(t);
    keel_data_close(t->train);
    keel_data_close(t->val);
    trainer_snap_free(t, st == KEEL_OK);
    trainer_save_free(t);
    trainer_packed_free(&t->packed);
    keel_optim_free(t->opt);
    keel_fsdp_free(t->fsdp);
    keel_fsdp_free(t->base);
    keel_model_free(t->model);
    keel_free(t->tokens);
    keel_free(t->flags);
    keel_free(t->source_rows);
    keel_free(t->step_tps);
    keel_run_state_free(&t->state);
}

keel_status keel_train_run(keel_config *cfg, const char *run_dir, keel_metrics_server *endpoint) {
    trainer t = {.cfg = cfg, .run_dir = run_dir, .world_size = 1, .leader = true, .allocs_after_first_step = -1};
    trainer_stop_handlers saved;
    trainer_stop_catch(&saved, 0, false);
    keel_status st = keel_run_prepare(cfg, run_dir, 1);
    if (st == KEEL_OK) keel_metrics_publish(endpoint);
    if (st == KEEL_OK) { /* rank 0's heartbeat: keel status and the metrics read it as for --nproc */
        t.heartbeat = keel_heartbeat_open(run_dir, 0);
        keel_heartbeat_beat(t.heartbeat, "init", 0, 0);
        st = open_inputs(&t);
    }
    if (st == KEEL_OK) {
        t.threads = keel_kernels_init(cfg->train.threads);
        st = run(&t);
        keel_kernels_shutdown();
    }
    keel_heartbeat_beat(t.heartbeat, "exit", -1, keel_status_exit_code(st));
    keel_heartbeat_close(t.heartbeat);
    free_trainer(&t, st);
    trainer_stop_restore(&saved);
    return st;
}

/* A relaunch after a failure: the supervisor's mpi health check is the job's
 * first collective, on the ranks that will train (KEEL_MPI_PROBE_ENV). */
static keel_status check_mpi(trainer *t) {
    keel_heartbeat_progress(t->heartbeat, "mpi check");
    char detail[256];
    double bus;
    bool ok = keel_comm_probe(t->world, &bus, detail, sizeof detail);
    /* the check keeps its name (resilience.health_checks' mpi) whichever transport runs it */
    const char *over = keel_comm_transport();
    bool mpi = !strcmp(over, "mpi");
    if (t->leader)
        keel_event(t->run_dir, "health", -1, "ranks %d: mpi %s%s%s%s: %s", t->world_size, ok ? "pass" : "fail",
                   mpi ? "" : " (over ", mpi ? "" : over, mpi ? "" : ")", detail);
    if (ok) return KEEL_OK;
    keel_errorf("the %s all-reduce check failed: %s", mpi ? "MPI" : over, detail);
    return KEEL_ERR_UNHEALTHY;
}

static keel_status worker(keel_comm *world, const char *run_dir, keel_config *cfg, bool supervised);

/* MPI's start-up and a first barrier with the other ranks, within the
 * start-up deadline (train/startup.h). */
static keel_status start_mpi(const keel_resilience_config *rc, keel_comm **world) {
    trainer_startup_arm(trainer_startup_timeout(rc));
    trainer_startup_stage(strcmp(keel_comm_transport(), "gloo")
                              ? "MPI's start-up (MPI_Init_thread: the launcher wiring up the ranks)"
                              : "Gloo's start-up (the ranks meeting through KEEL_STORE and connecting)");
    keel_status st = keel_comm_init(world);
    if (st == KEEL_OK) {
        char what[128];
        snprintf(what, sizeof what, "the first collective with the other %d rank(s) (a barrier)",
                 keel_comm_size(*world) - 1);
        trainer_startup_stage(what);
        st = keel_comm_barrier(*world);
    }
    trainer_startup_done();
    return st;
}

keel_status keel_train_worker(const char *run_dir) {
    static keel_comm *world; /* static: a failed rank exits without finalizing (worker) */
    keel_config cfg = {0};
    keel_status st = keel_run_load_config(run_dir, &cfg);
    if (st == KEEL_OK) st = start_mpi(&cfg.resilience, &world);
    if (st != KEEL_OK) {
        keel_config_free(&cfg);
        return st;
    }
    return worker(world, run_dir, &cfg, true);
}

bool keel_train_is_task(void) {
    const char *tasks = getenv("SLURM_STEP_NUM_TASKS");
    return getenv("SLURM_STEP_ID") && tasks && atoi(tasks) > 1;
}

keel_status keel_train_task(keel_config *cfg, const char *run_dir, keel_metrics_server *endpoint) {
    static keel_comm *world;
    keel_status st = start_mpi(&cfg->resilience, &world);
    if (st != KEEL_OK) return st;
    /* rank 0 makes or resumes the run directory; its verdict is everyone's */
    double verdict = 0;
    if (keel_comm_rank(world) == 0) verdict = keel_run_prepare(cfg, run_dir, keel_comm_size(world));
    keel_comm_allreduce_scalar(world, &verdict, KEEL_COMM_MAX);
    if (verdict != 0) return (keel_status)verdict; /* rank 0 said why */
    keel_metrics_publish(endpoint);
    /* as every rank of a run, the run directory's config: rank 0 wrote it, so a rank that cannot
     * read it does not share the directory (task mode needs a shared filesystem) */
    keel_config resolved = {0};
    char path[4096], node[64];
    keel_run_path(path, sizeof path, run_dir, KEEL_RUN_CONFIG);
    keel_node_name(node, sizeof node);
    bool shared = access(path, R_OK) == 0;
    double missing = !shared;
    keel_comm_allreduce_scalar(world, &missing, KEEL_COMM_SUM);
    if (missing > 0) {
        if (!shared)
            keel_errorf("%s: not there on node %s, where rank 0 wrote it: a Slurm step's ranks need a run "
                        "directory every node shares (a shared filesystem); give --run-dir on one", path, node);
        return KEEL_ERR_INPUT;
    }
    if ((st = keel_run_load_config(run_dir, &resolved)) != KEEL_OK) return st;
    return worker(world, run_dir, &resolved, false);
}

/* A peer lost under Gloo: this rank ends (exit 78) saying so, so the watcher
 * names the rank that died (keel_watch_dead, the supervisor's classify). */
static void say_peer_lost(void *heartbeat) { keel_heartbeat_beat(heartbeat, "exit", -1, KEEL_EXIT_PEER_LOST); }

/* One rank: cfg is the run directory's config (freed here). */
static keel_status worker(keel_comm *world, const char *run_dir, keel_config *cfg, bool supervised) {
    /* until a step is done: set-up and the first step (the supervisor's first-step bound) */
    trainer_stop_handlers saved;
    trainer_stop_catch(&saved, 120 * 1000, true);
    keel_status st = KEEL_OK;
    trainer t = {.run_dir = run_dir, .world = world, .rank = keel_comm_rank(world),
                 .world_size = keel_comm_size(world), .supervised = supervised, .allocs_after_first_step = -1};
    t.leader = t.rank == 0;
    t.heartbeat = keel_heartbeat_open(run_dir, t.rank);
    keel_heartbeat_beat(t.heartbeat, "init", 0, 0);
    keel_heartbeat_start_beating(t.heartbeat, sample_comm, world);
    keel_comm_on_peer_lost(world, say_peer_lost, t.heartbeat);
    /* Every rank logs to RUN/logs/rank-R.log; the leader also keeps the terminal. */
    char path[4096];
    keel_run_rank_log_path(path, sizeof path, run_dir, t.rank);
    FILE *log = fopen(path, "a");
    if (log && !t.leader) {
        dup2(fileno(log), STDOUT_FILENO);
        dup2(fileno(log), STDERR_FILENO);
    } else if (log) {
        keel_log_set_file(log);
    }
    if (getenv(KEEL_MPI_PROBE_ENV)) st = check_mpi(&t);
    t.cfg = cfg;
    if (st == KEEL_OK) st = open_inputs(&t);
    /* a Slurm task has no supervisor: the ranks watch each other */
    trainer_peers *peers = st == KEEL_OK && !supervised
                               ? trainer_peers_watch(&cfg->resilience, run_dir, t.rank, t.world_size, t.heartbeat)
                               : NULL;
    if (st == KEEL_OK) {
        /* The ranks on this machine share its cores unless train.threads says
         * otherwise — or the launcher already bound this rank to its share. */
        int threads = cfg->train.threads, allowed = keel_cores_allowed();
        if (threads == 0 && allowed < keel_cores_online()) threads = allowed;
        else if (threads == 0) threads = allowed / keel_comm_local_size(world) > 1 ? allowed / keel_comm_local_size(world) : 1;
        t.threads = keel_kernels_init(threads);
        st = run(&t);
        keel_kernels_shutdown();
    }
    trainer_peers_stop(peers);
    free_trainer(&t, st);
    keel_config_free(cfg);
    keel_log_set_file(NULL);
    if (log) fclose(log);
    keel_heartbeat_beat(t.heartbeat, "exit", -1, keel_status_exit_code(st));
    keel_heartbeat_close(t.heartbeat);
    trainer_stop_restore(&saved);
    /* A rank that failed validation cannot finalize with the others: MPI is
     * fail-stop here, so exiting non-zero ends the job. */
    if (st == KEEL_OK) keel_comm_finalize(world);
    return st;
}
