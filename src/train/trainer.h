/* train/trainer.h: the training loop's state, shared by train.c (the loop,
 * run directory, metrics) and the files it calls: packed.c (the state in a
 * checkpoint file's layout), saving.c, snapshots.c, resume.c, profile.c,
 * gather.c, samples.c.
 * Internal to the train module. */
#ifndef KEEL_TRAINER_H
#define KEEL_TRAINER_H

#include "keel/comm.h"
#include "keel/data.h"
#include "keel/fsdp.h"
#include "keel/model.h"
#include "keel/monitor.h"
#include "keel/optim.h"
#include "keel/run.h"
#include "train/packed.h"

typedef struct trainer_saving trainer_saving;
typedef struct trainer_snap trainer_snap;
typedef struct trainer_sampler trainer_sampler;

typedef struct {
    const keel_config *cfg;
    const char *run_dir;
    keel_comm *world;       /* NULL in a single-process run */
    keel_fsdp *fsdp;        /* the trained set's sharded state when world is set: the model's, or with
                               train.lora the adapters' */
    keel_fsdp *base;        /* train.lora under FSDP: the frozen base's (gathered only); else NULL */
    char base_id[17];       /* train.lora: the base's keel_ckpt_identity, recorded in every checkpoint */
    int rank, world_size;
    bool leader;            /* rank 0 writes metrics, summary, weights and progress */
    bool supervised;        /* a worker under keel's supervisor, which reports the run's end */
    const keel_backend *be; /* the model's ("device"): its tensors, and under FSDP the shards and optimizer */
    keel_model *model;
    keel_optim *opt;
    keel_data *train, *val;
    keel_jsonl *metrics;
    keel_progress progress;
    int32_t *tokens;        /* (B, T+1) */
    uint8_t *flags;         /* (B, T+1) their KEEL_TOKEN_* flags, when the data have a loss mask or
                               data.document_mask is on; else NULL */
    uint64_t *source_rows;  /* data.sources: rows each source gave the first sources_counted steps */
    int sources_counted;
    int threads;
    bool bf16;              /* bf16 GEMMs (fsdp.mixed_precision, where the CPU has them) */
    double flops_per_token, peak_flops;
    double *step_tps;       /* (steps) tokens/s of each step, for the median */
    double sync_s;          /* the last step's final reductions (gradients, norm, loss): waits on peers */
    int64_t allocs_after_first_step; /* the backend's allocations then; -1 before */
    int start_step;         /* 0, or the step of the checkpoint or snapshot this run resumed from */
    const char *restored_from; /* where the state came from: "disk", "memory" or "none" */
    trainer_packed packed;  /* the state as saves, snapshots and resumes copy it (packed.c) */
    trainer_saving *saving; /* checkpoint saves (saving.c) */
    trainer_snap *snap;     /* in-memory snapshots (snapshots.c) */
    trainer_sampler *sampler; /* train.sample_every (samples.c); NULL when off */
    keel_heartbeat *heartbeat; /* RUN/heartbeats/rank-R for the supervisor (workers only) */
    keel_run_state state;   /* RUN/supervisor.json: the data windows to skip */
    struct {                /* train.profile_steps: steps [first, end) of this launch (0-based) */
        int first, end, done;
        double step_s;      /* the profiled steps' time */
        bool now, reported; /* now: the current step is profiled (its work and its metrics line) */
        /* the comm thread's work in them, beside the calling thread's: its counters at the step's
         * start, and the steps' share summed (transfer_s, peer_wait_s, cpu_s, bytes) */
        keel_comm_stats comm_at, comm;
    } profile;
    struct {                /* $KEEL_FAULT: a fault injected on purpose (chaos tests) */
        int sig, step, rank;/* as it begins step `step` (1-based): raise sig, or hang (-1); rank -1: every rank */
    } fault;
} trainer;

/* The parameters training updates, saves and snapshots: the model's, or
 * with train.lora the adapters' (the base is frozen and read from init_from). */
static inline const keel_model_layout *trainer_layout(const trainer *t) {
    const keel_model_layout *lora = keel_model_lora_layout(t->model);
    return lora ? lora : keel_model_get_layout(t->model);
}
static inline float *trainer_own_params(const trainer *t) {
    return keel_model_lora_layout(t->model) ? keel_model_lora_params(t->model) : keel_model_params(t->model);
}
static inline float *trainer_own_grads(const trainer *t) {
    return keel_model_lora_layout(t->model) ? keel_model_lora_grads(t->model) : keel_model_grads(t->model);
}

/* Sequences per optimizer step over all ranks. */
static inline int64_t trainer_global_batch(const trainer *t) {
    return (int64_t)t->cfg->train.micro_batch_size * t->cfg->train.grad_accum_steps * t->world_size;
}

#endif
