/* train/resume.c: where a launch resumes from (train/resume.h) — memory when
 * a snapshot every rank can get is at least as new as the newest checkpoint,
 * else disk, newest first, a damaged checkpoint reported and passed over. */
#include <stdio.h>
#include <string.h>

#include "keel/ckpt.h"
#include "train/resume.h"
#include "train/saving.h"
#include "train/snapshots.h"

/* Checkpoint `dir` into the state: its layout, global batch and checksums
 * checked first. */
static keel_status load_checkpoint(trainer *t, const char *dir) {
    keel_ckpt ck;
    keel_status st = keel_ckpt_open(dir, &ck);
    if (st != KEEL_OK) return st;
    st = keel_ckpt_check_layout(&ck, trainer_layout(t));
    if (st == KEEL_OK && ck.global_batch != trainer_global_batch(t)) {
        keel_errorf("%s: saved with a global batch of %lld sequences, this run has %lld (train."
                    "micro_batch_size x grad_accum_steps x ranks)", dir, (long long)ck.global_batch,
                    (long long)trainer_global_batch(t));
        st = KEEL_ERR_INPUT;
    }
    if (st == KEEL_OK) st = trainer_packed_read(&t->packed, &ck);
    keel_ckpt_close(&ck);
    return st;
}

/* The newest of the n checkpoints (newest first) that every rank loads. */
static keel_status resume_from_disk(trainer *t, const int64_t *steps, int n) {
    double t0 = keel_now_s();
    for (int i = 0; i < n; i++) {
        char dir[4096];
        keel_ckpt_dir(dir, sizeof dir, t->run_dir, steps[i], false);
        keel_error_capture(true);
        keel_status st = load_checkpoint(t, dir);
        keel_error_capture(false);
        char why[1024];
        snprintf(why, sizeof why, "%s", keel_last_error());
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
            return KEEL_OK;
        }
        if (st != KEEL_OK) {
            keel_log_warn("checkpoint %s is not usable: %s", dir, why[0] ? why : "another rank failed");
            if (t->leader || why[0])
                keel_event(t->run_dir, "checkpoint_damaged", steps[i], "%s", why[0] ? why : "another rank failed");
        }
        /* the arrays may hold a partial read: the next candidate overwrites them all */
    }
    keel_errorf("%s: no usable checkpoint among %d; move the damaged ones aside to start over", t->run_dir, n);
    return KEEL_ERR_INPUT;
}

keel_status trainer_resume(trainer *t) {
    t->start_step = 0;
    t->restored_from = "none";
    if (t->leader) keel_ckpt_clean_tmp(t->run_dir); /* saves that never committed */
    if (t->world) keel_comm_barrier(t->world);
    int64_t *steps;
    int n = keel_ckpt_list(t->run_dir, &steps);
    int64_t disk = n > 0 ? steps[0] : 0;
    keel_status st = KEEL_OK;
    if (!trainer_snap_resume(t, disk) && n > 0) st = resume_from_disk(t, steps, n);
    keel_free(steps);
    if (t->start_step > 0) {
        trainer_save_resumed(t, t->start_step, strcmp(t->restored_from, "memory") ? t->start_step : (int)disk);
        if (t->fsdp) keel_fsdp_invalidate(t->fsdp);
        else keel_model_params_changed(t->model);
    }
    return st;
}
