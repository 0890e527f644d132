/* run/watch.c: ranks watched by their heartbeats (keel/run.h) — the rules
 * for a dead, frozen or stuck rank, shared by the supervisor and by the ranks
 * of a Slurm task-mode run, which watch each other. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "keel/run.h"

void keel_watch_init(keel_watch *w, const keel_resilience_config *rc, int nproc, double launched_unix,
                     double slowest_gap_s) {
    *w = (keel_watch){.rc = rc, .nproc = nproc, .launched_unix = launched_unix, .slowest_gap_s = slowest_gap_s,
                      .last_step = -1};
    w->hb = keel_xcalloc(sizeof *w->hb * (size_t)nproc, "heartbeats");
    w->have = keel_xcalloc(sizeof(bool) * (size_t)nproc, "heartbeats");
}

void keel_watch_free(keel_watch *w) {
    keel_free(w->hb);
    keel_free(w->have);
    w->hb = NULL, w->have = NULL;
}

void keel_watch_read(keel_watch *w, const char *run_dir) {
    for (int r = 0; r < w->nproc; r++) {
        keel_heartbeat_info x;
        if (!keel_heartbeat_read(run_dir, r, &x)) continue;
        if (w->slurm_step[0] && strcmp(x.slurm_step, w->slurm_step)) continue; /* an earlier attempt's */
        if (w->have[r] && !strcmp(x.phase, "train") && !strcmp(w->hb[r].phase, "train"))
            w->slowest_gap_s = fmax(w->slowest_gap_s, x.progress_unix_s - w->hb[r].progress_unix_s);
        w->hb[r] = x;
        w->have[r] = true;
    }
    const keel_heartbeat_info *h = &w->hb[0];
    if (w->have[0] && !strcmp(h->phase, "train") && h->step != w->last_step && h->step > h->start_step + 1 &&
        h->step_s > 0)
        w->step_s[w->n_step_s++ % KEEL_WATCH_WINDOW] = h->step_s;
    if (w->have[0]) w->last_step = h->step;
}

/* Whether rank r's pid is this machine's to read. */
static bool local(const keel_watch *w, int r, bool all_local, const char *node) {
    return w->have[r] && w->hb[r].pid > 0 && (all_local || (node && !strcmp(w->hb[r].node, node)));
}

bool keel_watch_dead(const keel_watch *w, bool all_local, const char *node, keel_watch_finding *f) {
    for (int r = 0; r < w->nproc; r++)
        if (w->have[r] && !strcmp(w->hb[r].phase, "exit")) return false;
    for (int r = 0; r < w->nproc; r++)
        if (local(w, r, all_local, node) && !keel_pid_alive(w->hb[r].pid)) {
            f->rank = r;
            f->onset_unix = w->hb[r].unix_s;
            snprintf(f->cause, sizeof f->cause, "rank %d (pid %d) died in step %lld", r, w->hb[r].pid,
                     (long long)w->hb[r].step + 1);
            return true;
        }
    return false;
}

/* The slow limit: configured, or fitted from the progress seen (10x the
 * longest gap, at least 60 s); a launch that has not finished a step yet
 * gets at least 120 s (data, checkpoint load, MPI start-up). It holds before
 * steps are steady and while a rank checkpoints or evaluates (disks). */
static double slow_limit(const keel_watch *w) {
    double limit = w->rc->hang_timeout_s;
    if (limit <= 0) limit = fmax(60, 10 * w->slowest_gap_s);
    bool started = w->have[0] && w->hb[0].first_step_unix_s > 0;
    return started ? limit : fmax(limit, 120);
}

/* The fast one, once steps are steady: hang_factor x the median step, at
 * least hang_floor_s; 0 before. */
static double steady_limit(const keel_watch *w) {
    if (w->rc->hang_timeout_s > 0) return w->rc->hang_timeout_s;
    if (w->n_step_s < KEEL_WATCH_STEADY) return 0;
    double x[KEEL_WATCH_WINDOW];
    int n = w->n_step_s < KEEL_WATCH_WINDOW ? w->n_step_s : KEEL_WATCH_WINDOW;
    memcpy(x, w->step_s, sizeof(double) * (size_t)n);
    return fmax(w->rc->hang_floor_s, w->rc->hang_factor * keel_median(x, n));
}

/* Waits on disks or start-up, not on peers: the slow limit holds for every rank. */
static bool slow_phase(const keel_heartbeat_info *h) {
    return strcmp(h->phase, "train") || !strcmp(h->doing, "checkpoint") || !strcmp(h->doing, "eval");
}

/* Where a rank was at its last heartbeat, in words. */
static void describe_where(const keel_heartbeat_info *h, char *out, size_t n) {
    if (!strcmp(h->doing, "train")) snprintf(out, n, "between steps %lld and %lld", (long long)h->step,
                                             (long long)h->step + 1);
    else if (!strcmp(h->phase, "train")) snprintf(out, n, "in %s of step %lld", h->doing, (long long)h->step + 1);
    else snprintf(out, n, "in its %s phase", h->phase[0] ? h->phase : "start-up");
}

bool keel_watch_hung(const keel_watch *w, double now, bool all_local, const char *node, keel_watch_finding *f) {
    double slow = slow_limit(w), fast = steady_limit(w);
    bool any_slow = false;
    for (int r = 0; r < w->nproc; r++) any_slow |= !w->have[r] || slow_phase(&w->hb[r]);
    double beat_limit = fast > 0 ? fast : slow, progress_limit = fast > 0 && !any_slow ? fast : slow;
    int frozen = -1, stuck = -1, stopped = -1;
    double frozen_age = 0, stuck_age = 0;
    uint64_t k = 0; /* the lowest collective a rank's comm thread runs */
    for (int r = 0; r < w->nproc; r++) {
        const keel_heartbeat_info *h = &w->hb[r];
        double beat_age = now - (w->have[r] ? fmax(h->unix_s, w->launched_unix) : w->launched_unix);
        double progress_age = now - (w->have[r] ? fmax(h->progress_unix_s, w->launched_unix) : w->launched_unix);
        double limit = w->have[r] ? beat_limit : slow;
        /* a rank that said "exit" beats no more: it is leaving (its exit code tells how) */
        bool beats = !w->have[r] || strcmp(h->phase, "exit");
        if (beats && beat_age > limit && beat_age > frozen_age) frozen = r, frozen_age = beat_age;
        if (progress_age > progress_limit && progress_age > stuck_age) stuck = r, stuck_age = progress_age;
        if (w->have[r] && h->coll_running > 0 && (k == 0 || h->coll_running < k)) k = h->coll_running;
        if (local(w, r, all_local, node) && keel_pid_state(h->pid) == 'T') stopped = r;
    }
    if (frozen < 0 && stuck < 0) return false;
    int n;
    char where[96];
    if (frozen >= 0) {
        f->rank = stopped >= 0 ? stopped : frozen;
        f->onset_unix = w->hb[frozen].unix_s;
        describe_where(&w->hb[frozen], where, sizeof where);
        n = snprintf(f->cause, sizeof f->cause, "rank %d stopped beating %.1f s ago (hang timeout %.1f s), %s", frozen,
                     frozen_age, beat_limit, where);
    } else {
        int never = -1, waiting = 0;
        for (int r = 0; r < w->nproc && k > 0; r++) {
            if (w->hb[r].coll_issued < k && never < 0) never = r;
            waiting += w->hb[r].coll_running == k;
        }
        f->rank = never >= 0 ? never : stuck;
        const keel_heartbeat_info *h = &w->hb[f->rank];
        f->onset_unix = h->progress_unix_s;
        describe_where(h, where, sizeof where);
        double age = now - fmax(h->progress_unix_s, w->launched_unix);
        if (never >= 0)
            n = snprintf(f->cause, sizeof f->cause, "rank %d never arrived at collective #%llu, which %d other rank(s) "
                         "run; it made no progress for %.1f s (hang timeout %.1f s), %s", never,
                         (unsigned long long)k, waiting, age, progress_limit, where);
        else
            n = snprintf(f->cause, sizeof f->cause, "no progress from rank %d for %.1f s (hang timeout %.1f s), %s%s",
                         stuck, age, progress_limit, where,
                         k > 0 ? "; every rank has issued the collective the others run: the network or MPI is stuck"
                               : "");
    }
    if (stopped >= 0 && n > 0 && (size_t)n < sizeof f->cause)
        snprintf(f->cause + n, sizeof f->cause - (size_t)n, "; rank %d (pid %d) is stopped (SIGSTOP or a "
                 "debugger)", stopped, w->hb[stopped].pid);
    return true;
}
