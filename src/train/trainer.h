/* train/trainer.h: the training loop's state, shared by train.c (the loop,
 * run directory, metrics) and checkpointing.c (save, commit, resume).
 * Internal to the train module. */
#ifndef KEEL_TRAINER_H
#define KEEL_TRAINER_H

#include "keel/data.h"
#include "keel/dist.h"
#include "keel/fsdp.h"
#include "keel/model.h"
#include "keel/obs.h"
#include "keel/optim.h"
#include "keel/run.h"

typedef struct trainer_ckpt trainer_ckpt;
typedef struct trainer_snap trainer_snap;

typedef struct {
    const keel_config *cfg;
    const char *run_dir;
    keel_comm *world;       /* NULL in a single-process run */
    keel_fsdp *fsdp;        /* FULL_SHARD state when world is set */
    int rank, world_size;
    bool leader;            /* rank 0 writes metrics, summary, weights and progress */
    const keel_backend *be; /* the model's ("device"): its tensors, and under FSDP the shards and optimizer */
    keel_model *model;
    keel_optim *opt;
    keel_data *train, *val;
    keel_jsonl *metrics;
    keel_progress progress;
    int32_t *tokens;        /* (B, T+1) */
    int threads;
    bool bf16;              /* bf16 GEMMs (fsdp.mixed_precision, where the CPU has them) */
    double flops_per_token, peak_flops;
    double *step_tps;       /* (steps) tokens/s of each step, for the median */
    double sync_s;          /* the last step's final reductions (gradients, norm, loss): waits on peers */
    int64_t allocs_after_first_step; /* the backend's allocations then; -1 before */
    int start_step;         /* 0, or the step of the checkpoint or snapshot this run resumed from */
    const char *restored_from; /* where the state came from: "disk", "memory" or "none" */
    trainer_ckpt *ckpt;     /* checkpoint saving (checkpointing.c) */
    trainer_snap *snap;     /* in-memory snapshots (snapshots.c) */
    keel_heartbeat *heartbeat; /* RUN/heartbeats/rank-R for the supervisor (workers only) */
    keel_run_state state;   /* RUN/supervisor.json: the data windows to skip */
    struct {                /* train.profile_steps: steps [first, end) of this launch (0-based) */
        int first, end, done;
        double step_s;      /* the profiled steps' time */
        bool now, reported; /* now: the current step is profiled (its work and its metrics line) */
    } profile;
    struct {                /* $KEEL_FAULT: a fault injected on purpose (chaos tests) */
        int sig, step, rank;/* as it begins step `step` (1-based): raise sig, or hang (-1); rank -1: every rank */
    } fault;
} trainer;

/* Sequences per optimizer step over all ranks. */
int64_t trainer_global_batch(const trainer *t);

/* ---- profile.c: train.profile_steps ----------------------------------------
 * The backend becomes keel_backend_profiled's (with the key set: before the
 * model is built), and the window covers the steps after the launch's first
 * (its warm-up: first GEMM plans, lazy loading), or the first when it is the
 * only one. The leader writes RUN/profile.json and prints a table as the
 * window's last step ends, or at the end of a run stopped inside it. */
void trainer_profile_init(trainer *t);
/* Around a step's work: true when step is profiled (its window is open until
 * trainer_profile_end). */
bool trainer_profile_begin(trainer *t, int step);
void trainer_profile_end(trainer *t, double step_s);
/* The report, once: when the window is complete, or (final) whatever it holds. */
void trainer_profile_report(trainer *t, bool final);

/* ---- checkpointing.c ---------------------------------------------------------
 * Every function here is collective: all ranks call it at the same point. */
void trainer_ckpt_init(trainer *t);
void trainer_ckpt_free(trainer *t);
/* Load the newest in-memory snapshot every rank holds, when it is at least as
 * new as the newest checkpoint, else the newest committed checkpoint that
 * verifies (resharding as needed), into the optimizer state; t->start_step
 * becomes its step (0 if none) and t->restored_from says which. A damaged one
 * is reported (log line + event) and the next is tried. */
keel_status trainer_ckpt_resume(trainer *t);
/* The step boundary after steps_done steps: agree on a stop signal, save if
 * due (or when `last` — the end of training or a stop — and checkpointing is
 * on), commit a finished background save. *stop becomes true if any rank got
 * a signal. */
void trainer_ckpt_boundary(trainer *t, int steps_done, bool last, bool *stop);
/* Whether this rank now waits on its peers (true: a stop signal's deadline
 * runs, train.c) or on disks (false: a save takes what it takes). */
void trainer_stop_deadline(bool on_peers);
/* Before the optimizer changes the arrays: wait until a save has copied them. */
void trainer_ckpt_before_update(trainer *t);
/* The step of the last checkpoint this run committed or resumed from (0: none). */
int trainer_ckpt_saved_step(const trainer *t);
/* Bytes of the host buffer async saves copy into (0 without one). */
int64_t trainer_ckpt_buffer_bytes(const trainer *t);
/* The state in the layout of this rank's checkpoint file (parameters, m, v
 * of its shard, padding included): its floats, a copy into dst (async: the
 * backend's to_host_async, done at its copies_wait), a copy back, and every
 * array zeroed. Not collective. */
int64_t trainer_ckpt_packed_floats(const trainer *t);
void trainer_ckpt_pack_copies(const trainer *t, float *dst, bool async);
void trainer_ckpt_unpack(trainer *t, const float *src);
void trainer_ckpt_clear(trainer *t);
/* Seconds the loop was held up by checkpointing since the last call. */
double trainer_ckpt_take_stall(trainer *t);

/* ---- snapshots.c: in-memory snapshots -----------------------------------------
 * Collective like the above, except free. Off (every call a no-op) outside
 * the supervisor or with resilience.snapshot_every_steps 0. */
void trainer_snap_init(trainer *t);
/* completed: the run is over, its segments go too. Not collective. */
void trainer_snap_free(trainer *t, bool completed);
/* Load the newest snapshot every rank can get (its own, or its buddy's
 * replica) that is at least as new as the newest checkpoint `disk`; true
 * when loaded (t->start_step, t->restored_from set). */
bool trainer_snap_resume(trainer *t, int64_t disk);
/* Before the update: wait for the snapshot's copy, send it to the buddy. */
void trainer_snap_before_update(trainer *t);
/* The step boundary after steps_done steps (after trainer_ckpt_boundary):
 * commit the buddy's replica, snapshot if due (never at the last step or a stop). */
void trainer_snap_boundary(trainer *t, int steps_done, bool last_or_stop);
/* Bytes of this rank's segments: its own and the replica it keeps. */
int64_t trainer_snap_bytes(const trainer *t);
/* Seconds the loop waited on snapshots since the last call. */
double trainer_snap_take_stall(trainer *t);

#endif
