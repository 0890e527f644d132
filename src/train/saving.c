/* train/saving.c: when and what a run saves, and the commit protocol over
 * ranks (DESIGN §5; resume is train/resume.c).
 *
 * What is saved: each shard rank's optimizer state — parameters, AdamW m and
 * v — in the layout of its shard plan (train/packed.h; one process: a plan of
 * one rank).
 * Ranks that replicate a shard (NO_SHARD, HYBRID_SHARD) save it once: world
 * ranks 0 .. shard_ranks-1 write, one file each.
 *
 * How: at a step boundary where a save is due, every writer starts a
 * background thread that copies its arrays into a host buffer and then
 * writes and fsyncs the file into step_N.tmp. The copy runs alongside the
 * next step's forward and backward, which only read the arrays; the
 * optimizer update waits for it (trainer_save_before_update), so the loop
 * stalls only if the copy outlasts a forward and backward. At each later
 * boundary the ranks agree (one small all-reduce, shared with the stop
 * signal) whether every write has finished; then the file sizes and
 * checksums are all-gathered and the leader writes the manifest, renames the
 * directory (the commit), replaces LATEST and applies retention. At most one
 * save is in flight: a save that comes due while one is writing first waits
 * for it and commits it. A failed write (full disk, file-size limit) is an
 * error line and an event; the .tmp is removed and training goes on with the
 * older checkpoints intact.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "keel/ckpt.h"
#include "keel/train.h"
#include "train/saving.h"
#include "train/stop.h"

struct trainer_saving {
    bool enabled;
    const trainer_packed *state;   /* what is saved, in the files' layout */
    int file_rank;                 /* the file this rank writes, or -1 */
    float *host;                   /* packed copy of the arrays (async, or one process) */
    double last_save_s;
    int last_saved_step;
    int last_committed_step;  /* every rank wrote its file (the leader commits it) */
    double stall_s;                /* held up since trainer_save_take_stall */
    /* the save in flight */
    bool pending;
    int pending_step;
    pthread_t thread;
    bool thread_live;
    atomic_bool copied;            /* the arrays may change again */
    atomic_bool done;
    keel_status write_status;
    double write_s;                /* the thread's copy + write + fsync */
    char write_error[1024];
    keel_ckpt_file file;
};

/* Where array a's floats for the file come from. */
static const float *file_array(const trainer_saving *c, int a) {
    return c->host ? c->host + (int64_t)a * c->state->plan->shard_total : c->state->arrays[a];
}

void trainer_save_init(trainer *t) {
    trainer_saving *c = keel_xcalloc(sizeof *c, "checkpointing");
    const keel_checkpoint_config *cc = &t->cfg->checkpoint;
    c->enabled = cc->every_steps > 0 || cc->every_seconds > 0;
    c->state = &t->packed;
    const keel_backend *be = c->state->be;
    /* ranks that replicate a shard save it once: world ranks 0 .. shard_ranks-1 */
    c->file_rank = !t->fsdp ? 0 : t->rank < c->state->plan->shard_ranks ? keel_fsdp_shard_rank(t->fsdp) : -1;
    /* One process packs (its buffers have no padding); async needs a copy;
     * so does memory the writer cannot read (a device's). */
    if (c->enabled && c->file_rank >= 0 && (!t->fsdp || cc->async || !be->host_memory)) {
        size_t bytes = sizeof(float) * (size_t)trainer_packed_floats(c->state);
        c->host = keel_xcalloc(bytes, "checkpoint host buffer");
        be->pin(c->host, bytes, "checkpoint host buffer");
    }
    c->last_save_s = keel_now_s();
    c->last_saved_step = -1;
    t->saving = c;
}

static void join(trainer_saving *c) {
    if (c->thread_live) pthread_join(c->thread, NULL);
    c->thread_live = false;
}

void trainer_save_free(trainer *t) {
    trainer_saving *c = t->saving;
    if (!c) return;
    join(c);
    c->state->be->unpin(c->host);
    keel_free(c->host);
    keel_free(c);
    t->saving = NULL;
}

typedef struct {
    trainer_saving *c;
    char dir[4096];
    int64_t step;
} write_job;

static void *write_thread(void *arg) {
    write_job *job = arg;
    trainer_saving *c = job->c;
    double t0 = keel_now_s();
    if (c->host && !c->state->be->host_memory) c->state->be->copies_wait(); /* issued by start_save */
    else if (c->host) trainer_packed_copy_out(c->state, c->host, false);
    atomic_store(&c->copied, true);
    const float *arrays[KEEL_CKPT_ARRAYS];
    for (int a = 0; a < KEEL_CKPT_ARRAYS; a++) arrays[a] = file_array(c, a);
    keel_error_capture(true);
    c->write_status = keel_ckpt_write_shard(job->dir, c->file_rank, c->state->plan->shard_ranks, job->step,
                                            arrays, c->state->plan->shard_total, &c->file);
    snprintf(c->write_error, sizeof c->write_error, "%s", keel_last_error());
    keel_error_capture(false);
    c->write_s = keel_now_s() - t0;
    keel_free(job);
    atomic_store(&c->done, true);
    return NULL;
}

/* Begin saving the state after `step` steps on a thread (copy, write);
 * ranks that write nothing are done at once. Without a host buffer (a
 * synchronous FULL_SHARD save) the thread writes the live arrays and the
 * caller waits for it before anything changes them. */
static void start_save(trainer *t, int step) {
    trainer_saving *c = t->saving;
    c->pending = true;
    c->pending_step = step;
    c->last_saved_step = step;
    c->last_save_s = keel_now_s();
    c->write_status = KEEL_OK;
    c->write_error[0] = 0;
    memset(&c->file, 0, sizeof c->file);
    if (c->file_rank < 0) {
        atomic_store(&c->copied, true);
        atomic_store(&c->done, true);
        return;
    }
    write_job *job = keel_xmalloc(sizeof *job, "checkpoint job");
    job->c = c;
    job->step = step;
    keel_ckpt_dir(job->dir, sizeof job->dir, t->run_dir, step, true);
    atomic_store(&c->done, false);
    /* A backend is used from one thread: a device's copies are issued
     * here (into pinned memory, beside the next step's compute) and the
     * thread waits for them, then writes. Host memory is copied on the
     * thread, also overlapping the next step's forward and backward. */
    atomic_store(&c->copied, false);
    if (c->host && !c->state->be->host_memory) trainer_packed_copy_out(c->state, c->host, true);
    KEEL_CHECK(pthread_create(&c->thread, NULL, write_thread, job) == 0, "checkpoint thread");
    c->thread_live = true;
}

void trainer_save_before_update(trainer *t) {
    trainer_saving *c = t->saving;
    if (!c->pending || atomic_load(&c->copied)) return;
    double t0 = keel_now_s();
    while (!atomic_load(&c->copied)) {
        struct timespec ts = {0, 200000}; /* 0.2 ms */
        nanosleep(&ts, NULL);
    }
    c->stall_s += keel_now_s() - t0;
}

int trainer_save_committed_step(const trainer *t) { return t->saving->last_committed_step; }

void trainer_save_resumed(trainer *t, int step, int committed_step) {
    t->saving->last_saved_step = step;
    t->saving->last_committed_step = committed_step;
}

int64_t trainer_save_buffer_bytes(const trainer *t) {
    const trainer_saving *c = t->saving;
    return c->host ? (int64_t)sizeof(float) * trainer_packed_floats(c->state) : 0;
}

double trainer_save_take_stall(trainer *t) {
    double s = t->saving->stall_s;
    t->saving->stall_s = 0;
    return s;
}

/* Each rank's write result: checksum (two halves), bytes, failed, seconds. */
#define RESULT 5

/* Wait for this rank's write, gather every writer's result, and (leader)
 * commit the checkpoint or report the failure. Collective. */
static void finish_save(trainer *t) {
    trainer_saving *c = t->saving;
    const keel_fsdp_plan *plan = c->state->plan;
    join(c);
    int W = t->world_size;
    double mine[RESULT] = {(double)(c->file.xxh3 >> 32), (double)(c->file.xxh3 & 0xffffffffu),
                           (double)c->file.bytes, c->write_status != KEEL_OK, c->write_s};
    double *all = keel_xmalloc(sizeof(double) * RESULT * (size_t)W, "checkpoint results");
    if (t->world) keel_comm_allgather(t->world, mine, all, RESULT, KEEL_COMM_F64);
    else memcpy(all, mine, sizeof mine);
    c->pending = false;
    if (c->write_status != KEEL_OK) /* each failing rank says why in its own log */
        keel_errorf("%s", c->write_error);
    int failed = 0;
    double write_s = 0; /* the slowest writer's */
    for (int r = 0; r < W; r++) failed += all[RESULT * r + 3] != 0, write_s = fmax(write_s, all[RESULT * r + 4]);
    if (!failed) c->last_committed_step = c->pending_step;
    char tmp[4096];
    keel_ckpt_dir(tmp, sizeof tmp, t->run_dir, c->pending_step, true);
    if (t->leader && failed) {
        keel_log_warn("checkpoint at step %d was not saved (%d rank(s) failed to write); training "
                      "goes on, older checkpoints are intact", c->pending_step, failed);
        keel_event(t->run_dir, "checkpoint_failed", c->pending_step, "%d rank(s) could not write: %s",
                   failed, c->write_error[0] ? c->write_error : "see the ranks' logs");
        keel_ckpt_clean_tmp(t->run_dir);
    } else if (t->leader) {
        keel_ckpt_file *files = keel_xmalloc(sizeof(keel_ckpt_file) * (size_t)plan->shard_ranks, "files");
        for (int j = 0; j < plan->shard_ranks; j++) /* file j comes from world rank j */
            files[j] = (keel_ckpt_file){((uint64_t)all[RESULT * j] << 32) | (uint64_t)all[RESULT * j + 1],
                                        (int64_t)all[RESULT * j + 2]};
        char *config = keel_config_to_json(t->cfg);
        keel_ckpt_meta meta = {.step = c->pending_step, .global_batch = trainer_global_batch(t),
                               .world_size = W, .strategy = t->world ? keel_strategy_name(t->cfg->fsdp.strategy) : "single",
                               .plan = plan, .files = files, .config_json = config,
                               .seed = t->cfg->train.seed,
                               .next_lr = keel_lr_at(&t->cfg->train, c->pending_step),
                               .lora_base = t->cfg->train.lora.on ? t->cfg->init_from : NULL,
                               .lora_base_id = t->base_id};
        char *manifest = keel_ckpt_manifest_json(&meta);
        keel_status st = keel_ckpt_commit(t->run_dir, c->pending_step, manifest);
        if (st == KEEL_OK) {
            int64_t bytes = 0;
            for (int j = 0; j < plan->shard_ranks; j++) bytes += files[j].bytes;
            double mb = (double)bytes / 1e6;
            keel_progress_note(&t->progress, "checkpoint after step %d committed (%.0f MB, %d file(s))",
                               c->pending_step, mb, plan->shard_ranks);
            keel_event_with(t->run_dir, "checkpoint_committed", c->pending_step,
                            &(keel_event_fields){.has_seconds = true, .seconds = write_s, .bytes = bytes},
                            "%d file(s), %.0f MB, written in %.2f s", plan->shard_ranks, mb, write_s);
            keel_ckpt_retain(t->run_dir, t->cfg->checkpoint.keep_last, c->pending_step);
        } else {
            keel_event(t->run_dir, "checkpoint_failed", c->pending_step, "commit failed");
            keel_ckpt_clean_tmp(t->run_dir);
        }
        free(manifest);
        free(config);
        keel_free(files);
    }
    keel_free(all);
}

void trainer_save_boundary(trainer *t, int steps_done, bool last, bool *stop) {
    trainer_saving *c = t->saving;
    const keel_checkpoint_config *cc = &t->cfg->checkpoint;
    double t0 = keel_now_s();
    bool due = c->enabled && steps_done != c->last_saved_step &&
               (last || (cc->every_steps > 0 && steps_done % cc->every_steps == 0) ||
                (cc->every_seconds > 0 && t0 - c->last_save_s >= cc->every_seconds));
    /* one all-reduce: a stop signal, a save due, a write still going */
    double flags[3] = {*stop, due, c->pending && !atomic_load(&c->done)};
    if (t->world) keel_comm_allreduce(t->world, flags, flags, 3, KEEL_COMM_F64, KEEL_COMM_MAX);
    *stop = flags[0] != 0;
    if (*stop && c->enabled && steps_done != c->last_saved_step) flags[1] = 1; /* save before stopping */
    trainer_stop_deadline(false); /* the peers are all here; a save waits on disks */
    if (c->pending && (flags[2] == 0 || flags[1] != 0 || last || *stop)) finish_save(t);
    if (flags[1] != 0) {
        start_save(t, steps_done);
        if (!cc->async || last || *stop) finish_save(t);
    }
    if (flags[1] != 0 || c->pending) c->stall_s += keel_now_s() - t0;
}
