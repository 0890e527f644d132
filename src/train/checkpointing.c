/* train/checkpointing.c: when and what a run saves, the commit protocol over
 * ranks, and resume (DESIGN §5).
 *
 * What is saved: each shard rank's optimizer state — parameters, AdamW m and
 * v — in the layout of its shard plan (one process: a plan of one rank).
 * Ranks that replicate a shard (NO_SHARD, HYBRID_SHARD) save it once: world
 * ranks 0 .. shard_ranks-1 write, one file each.
 *
 * How: at a step boundary where a save is due, every writer starts a
 * background thread that copies its arrays into a host buffer and then
 * writes and fsyncs the file into step_N.tmp. The copy runs alongside the
 * next step's forward and backward, which only read the arrays; the
 * optimizer update waits for it (trainer_ckpt_before_update), so the loop
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
#include "train/trainer.h"

struct trainer_ckpt {
    bool enabled;
    keel_fsdp_plan own_plan;       /* one process: the plan of one shard rank */
    const keel_fsdp_plan *plan;    /* the layout files follow */
    int file_rank;                 /* the file this rank writes, or -1 */
    float *arrays[KEEL_CKPT_ARRAYS];/* live parameters, m, v */
    const keel_backend *be;         /* whose memory the arrays are */
    keel_param_range *ranges;      /* canonical ranges this rank holds */
    int n_ranges;
    float *host;                   /* packed copy of the arrays (async, or one process) */
    double last_save_s;
    int last_saved_step;
    int last_committed_step;  /* every rank wrote its file (the leader commits it) */
    double stall_s;                /* held up since trainer_ckpt_take_stall */
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
static const float *file_array(const trainer_ckpt *c, int a) {
    return c->host ? c->host + (int64_t)a * c->plan->shard_total : c->arrays[a];
}

void trainer_ckpt_init(trainer *t) {
    trainer_ckpt *c = keel_xcalloc(sizeof *c, "checkpointing");
    const keel_checkpoint_config *cc = &t->cfg->checkpoint;
    c->enabled = cc->every_steps > 0 || cc->every_seconds > 0;
    const keel_model_layout *lay = keel_model_get_layout(t->model);
    c->be = keel_optim_backend(t->opt);
    c->arrays[1] = keel_optim_m(t->opt);
    c->arrays[2] = keel_optim_v(t->opt);
    if (t->fsdp) {
        c->plan = keel_fsdp_get_plan(t->fsdp);
        c->arrays[0] = keel_fsdp_master(t->fsdp);
        c->n_ranges = keel_fsdp_param_ranges(c->plan, keel_fsdp_shard_rank(t->fsdp), &c->ranges);
        c->file_rank = t->rank < c->plan->shard_ranks ? keel_fsdp_shard_rank(t->fsdp) : -1;
    } else {
        keel_fsdp_plan_init(&c->own_plan, lay, 1);
        c->plan = &c->own_plan;
        c->arrays[0] = keel_model_params(t->model);
        c->ranges = keel_xmalloc(sizeof(keel_param_range) * (size_t)lay->n_units, "ranges");
        for (int u = 0; u < lay->n_units; u++)
            c->ranges[c->n_ranges++] = (keel_param_range){lay->unit_offset[u], lay->unit_size[u],
                                                          lay->unit_offset[u]};
        c->file_rank = 0;
    }
    /* One process packs (its buffers have no padding); async needs a copy;
     * so does memory the writer cannot read (a device's). */
    if (c->enabled && c->file_rank >= 0 && (!t->fsdp || cc->async || !c->be->host_memory)) {
        size_t bytes = sizeof(float) * KEEL_CKPT_ARRAYS * (size_t)c->plan->shard_total;
        c->host = keel_xcalloc(bytes, "checkpoint host buffer");
        c->be->pin(c->host, bytes, "checkpoint host buffer");
    }
    c->last_save_s = keel_now_s();
    c->last_saved_step = -1;
    t->ckpt = c;
}

static void join(trainer_ckpt *c) {
    if (c->thread_live) pthread_join(c->thread, NULL);
    c->thread_live = false;
}

void trainer_ckpt_free(trainer *t) {
    trainer_ckpt *c = t->ckpt;
    if (!c) return;
    join(c);
    if (c->plan == &c->own_plan) keel_fsdp_plan_free(&c->own_plan);
    keel_free(c->ranges);
    c->be->unpin(c->host);
    keel_free(c->host);
    keel_free(c);
    t->ckpt = NULL;
}

/* The file position of canonical range r (inside one unit) in this rank's file. */
static int64_t file_offset(const trainer_ckpt *c, const keel_param_range *r) {
    for (int u = 0; u < c->plan->n_units; u++) {
        const keel_fsdp_unit *x = &c->plan->units[u];
        if (r->begin >= x->offset && r->begin < x->offset + x->logical)
            return x->shard_offset + (r->begin - x->offset) % x->shard;
    }
    KEEL_CHECK(false, "range at %lld is in no unit", (long long)r->begin);
    return 0;
}

typedef struct {
    trainer_ckpt *c;
    char dir[4096];
    int64_t step;
} write_job;

/* Copy the live arrays into `dst` in the file's layout (padding untouched),
 * or (unpack) back. async: copies that overlap what comes next (the
 * backend's copies_wait says when they are done). */
static void pack_copies(const trainer_ckpt *c, float *dst, bool async) {
    for (int a = 0; a < KEEL_CKPT_ARRAYS; a++)
        for (int i = 0; i < c->n_ranges; i++) {
            const keel_param_range *r = &c->ranges[i];
            (async ? c->be->to_host_async : c->be->to_host)(dst + (int64_t)a * c->plan->shard_total + file_offset(c, r),
                                                           c->arrays[a] + r->buffer_offset, sizeof(float) * (size_t)r->len);
        }
}
static void pack(const trainer_ckpt *c, float *dst) { pack_copies(c, dst, false); }
void trainer_ckpt_pack_copies(const trainer *t, float *dst, bool async) { pack_copies(t->ckpt, dst, async); }

static void unpack(const trainer_ckpt *c, const float *src) {
    for (int a = 0; a < KEEL_CKPT_ARRAYS; a++)
        for (int i = 0; i < c->n_ranges; i++) {
            const keel_param_range *r = &c->ranges[i];
            c->be->to_device(c->arrays[a] + r->buffer_offset,
                             src + (int64_t)a * c->plan->shard_total + file_offset(c, r), sizeof(float) * (size_t)r->len);
        }
}

int64_t trainer_ckpt_packed_floats(const trainer *t) { return KEEL_CKPT_ARRAYS * t->ckpt->plan->shard_total; }
void trainer_ckpt_unpack(trainer *t, const float *src) { unpack(t->ckpt, src); }

void trainer_ckpt_clear(trainer *t) {
    const trainer_ckpt *c = t->ckpt;
    for (int a = 0; a < KEEL_CKPT_ARRAYS; a++)
        for (int i = 0; i < c->n_ranges; i++)
            c->be->zero(c->arrays[a] + c->ranges[i].buffer_offset, sizeof(float) * (size_t)c->ranges[i].len);
}

static void *write_thread(void *arg) {
    write_job *job = arg;
    trainer_ckpt *c = job->c;
    double t0 = keel_now_s();
    if (c->host && !c->be->host_memory) c->be->copies_wait(); /* issued by start_save */
    else if (c->host) pack(c, c->host);
    atomic_store(&c->copied, true);
    const float *arrays[KEEL_CKPT_ARRAYS];
    for (int a = 0; a < KEEL_CKPT_ARRAYS; a++) arrays[a] = file_array(c, a);
    keel_error_capture(true);
    c->write_status = keel_ckpt_write_shard(job->dir, c->file_rank, c->plan->shard_ranks, job->step,
                                            arrays, c->plan->shard_total, &c->file);
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
    trainer_ckpt *c = t->ckpt;
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
    if (c->host && !c->be->host_memory) pack_copies(c, c->host, true);
    KEEL_CHECK(pthread_create(&c->thread, NULL, write_thread, job) == 0, "checkpoint thread");
    c->thread_live = true;
}

void trainer_ckpt_before_update(trainer *t) {
    trainer_ckpt *c = t->ckpt;
    if (!c->pending || atomic_load(&c->copied)) return;
    double t0 = keel_now_s();
    while (!atomic_load(&c->copied)) {
        struct timespec ts = {0, 200000}; /* 0.2 ms */
        nanosleep(&ts, NULL);
    }
    c->stall_s += keel_now_s() - t0;
}

int trainer_ckpt_saved_step(const trainer *t) { return t->ckpt->last_committed_step; }

int64_t trainer_ckpt_buffer_bytes(const trainer *t) {
    const trainer_ckpt *c = t->ckpt;
    return c->host ? (int64_t)sizeof(float) * KEEL_CKPT_ARRAYS * c->plan->shard_total : 0;
}

double trainer_ckpt_take_stall(trainer *t) {
    double s = t->ckpt->stall_s;
    t->ckpt->stall_s = 0;
    return s;
}

/* Each rank's write result: checksum (two halves), bytes, failed, seconds. */
#define RESULT 5

/* Wait for this rank's write, gather every writer's result, and (leader)
 * commit the checkpoint or report the failure. Collective. */
static void finish_save(trainer *t) {
    trainer_ckpt *c = t->ckpt;
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
        keel_ckpt_file *files = keel_xmalloc(sizeof(keel_ckpt_file) * (size_t)c->plan->shard_ranks, "files");
        for (int j = 0; j < c->plan->shard_ranks; j++) /* file j comes from world rank j */
            files[j] = (keel_ckpt_file){((uint64_t)all[RESULT * j] << 32) | (uint64_t)all[RESULT * j + 1],
                                        (int64_t)all[RESULT * j + 2]};
        char *config = keel_config_to_json(t->cfg);
        keel_ckpt_meta meta = {.step = c->pending_step, .global_batch = trainer_global_batch(t),
                               .world_size = W, .strategy = t->world ? keel_strategy_name(t->cfg->fsdp.strategy) : "single",
                               .plan = c->plan, .files = files, .config_json = config,
                               .seed = t->cfg->train.seed,
                               .next_lr = keel_lr_at(&t->cfg->train, c->pending_step)};
        char *manifest = keel_ckpt_manifest_json(&meta);
        keel_status st = keel_ckpt_commit(t->run_dir, c->pending_step, manifest);
        if (st == KEEL_OK) {
            int64_t bytes = 0;
            for (int j = 0; j < c->plan->shard_ranks; j++) bytes += files[j].bytes;
            double mb = (double)bytes / 1e6;
            keel_progress_note(&t->progress, "checkpoint after step %d committed (%.0f MB, %d file(s))",
                               c->pending_step, mb, c->plan->shard_ranks);
            keel_event_with(t->run_dir, "checkpoint_committed", c->pending_step,
                            &(keel_event_fields){.has_seconds = true, .seconds = write_s, .bytes = bytes},
                            "%d file(s), %.0f MB, written in %.2f s", c->plan->shard_ranks, mb, write_s);
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

void trainer_ckpt_boundary(trainer *t, int steps_done, bool last, bool *stop) {
    trainer_ckpt *c = t->ckpt;
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

/* Range r of array a from a checkpoint into the live array: straight in on
 * the host, else through a host buffer a piece at a time. */
static keel_status read_range(const trainer_ckpt *c, keel_ckpt *ck, int a, const keel_param_range *r) {
    float *live = c->arrays[a] + r->buffer_offset;
    if (c->be->host_memory) return keel_ckpt_read(ck, a, r->begin, r->len, live);
    enum { PIECE = 1 << 24 };
    int64_t piece = r->len < PIECE ? r->len : PIECE;
    float *host = keel_xmalloc(sizeof(float) * (size_t)(piece > 0 ? piece : 1), "checkpoint read");
    keel_status st = KEEL_OK;
    for (int64_t at = 0; at < r->len && st == KEEL_OK; at += piece) {
        int64_t len = r->len - at < piece ? r->len - at : piece;
        st = keel_ckpt_read(ck, a, r->begin + at, len, host);
        if (st == KEEL_OK) c->be->to_device(live + at, host, sizeof(float) * (size_t)len);
    }
    keel_free(host);
    return st;
}

keel_status trainer_ckpt_resume(trainer *t) {
    trainer_ckpt *c = t->ckpt;
    t->start_step = 0;
    t->restored_from = "none";
    if (t->leader) keel_ckpt_clean_tmp(t->run_dir); /* saves that never committed */
    if (t->world) keel_comm_barrier(t->world);
    int64_t *steps;
    int n = keel_ckpt_list(t->run_dir, &steps);
    const keel_model_layout *lay = keel_model_get_layout(t->model);
    keel_status result = KEEL_OK;
    double t0 = keel_now_s();
    int64_t disk = n > 0 ? steps[0] : 0;
    if (trainer_snap_resume(t, disk)) n = 0; /* memory is as new or newer */
    for (int i = 0; i < n; i++) {
        char dir[4096];
        keel_ckpt_dir(dir, sizeof dir, t->run_dir, steps[i], false);
        keel_ckpt ck;
        keel_error_capture(true);
        keel_status st = keel_ckpt_open(dir, &ck);
        bool opened = st == KEEL_OK;
        if (st == KEEL_OK) st = keel_ckpt_check_layout(&ck, lay);
        if (st == KEEL_OK && ck.global_batch != trainer_global_batch(t)) {
            keel_errorf("%s: saved with a global batch of %lld sequences, this run has %lld (train."
                        "micro_batch_size x grad_accum_steps x ranks)", dir, (long long)ck.global_batch,
                        (long long)trainer_global_batch(t));
            st = KEEL_ERR_INPUT;
        }
        if (st == KEEL_OK) { /* verify the files this rank reads, then read */
            st = keel_ckpt_verify_ranges(&ck, c->ranges, c->n_ranges);
            for (int a = 0; a < KEEL_CKPT_ARRAYS && st == KEEL_OK; a++)
                for (int r = 0; r < c->n_ranges && st == KEEL_OK; r++) st = read_range(c, &ck, a, &c->ranges[r]);
        }
        keel_error_capture(false);
        char why[1024];
        snprintf(why, sizeof why, "%s", keel_last_error());
        if (opened) keel_ckpt_close(&ck);
        double bad = st != KEEL_OK;
        if (t->world) keel_comm_allreduce_scalar(t->world, &bad, KEEL_COMM_MAX);
        if (bad == 0) {
            t->start_step = (int)steps[i];
            t->restored_from = "disk";
            if (t->leader) {
                double s = keel_now_s() - t0;
                keel_log_info("resuming from %s (step %lld), verified and loaded in %.2f s", dir,
                              (long long)steps[i], s);
                keel_event(t->run_dir, "resumed", steps[i], "from %s on %d rank(s); load_s %.3f", dir,
                           t->world_size, s);
            }
            break;
        }
        if (st != KEEL_OK) {
            keel_log_warn("checkpoint %s is not usable: %s", dir, why[0] ? why : "another rank failed");
            if (t->leader || why[0])
                keel_event(t->run_dir, "checkpoint_damaged", steps[i], "%s", why[0] ? why : "another rank failed");
        }
        /* the arrays may hold a partial read: the next candidate overwrites them all */
        if (i + 1 == n) {
            keel_errorf("%s: no usable checkpoint among %d; move the damaged ones aside to start over",
                        t->run_dir, n);
            result = KEEL_ERR_INPUT;
        }
    }
    keel_free(steps);
    if (t->start_step > 0) {
        c->last_saved_step = t->start_step;
        c->last_committed_step = strcmp(t->restored_from, "memory") ? t->start_step : (int)disk;
        if (t->fsdp) keel_fsdp_invalidate(t->fsdp);
        else keel_model_params_changed(t->model);
    }
    return result;
}
