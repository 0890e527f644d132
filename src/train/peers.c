/* train/peers.c: ranks of a Slurm task-mode run watch each other
 * (train/peers.h), as the supervisor watches the ranks of `keel train
 * --nproc`: the same rules (keel_watch), read from the heartbeats every rank
 * writes to the shared run directory. Without it a rank whose peer died
 * waits in a collective for good (MPI is fail-stop here, and a step whose
 * srun lacks --kill-on-bad-exit is not ended for it). */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "keel/monitor.h"
#include "train/peers.h"
#include "train/stop.h"

#define PEERS_POLL_S 0.5
#define PEERS_STOP_POLL_S 0.2 /* after a stop signal: Slurm ending the step for a failed task sends it */

struct trainer_peers {
    const char *run_dir;
    int rank, world_size;
    keel_heartbeat *self;
    keel_watch w;
    char node[64];
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
};

/* A peer that left with an error code of its own — not a stop (every rank
 * agrees on it), nor a peer's loss (that rank named the lost one). */
static bool gone_with_error(const keel_watch *w, int me, keel_watch_finding *f) {
    for (int r = 0; r < w->nproc; r++) {
        const keel_heartbeat_info *h = &w->hb[r];
        if (r == me || !w->have[r] || strcmp(h->phase, "exit") || h->exit_code == 0 ||
            h->exit_code == KEEL_EXIT_RESUME || h->exit_code == KEEL_EXIT_PEER_LOST)
            continue;
        f->rank = r;
        f->onset_unix = h->unix_s;
        snprintf(f->cause, sizeof f->cause, "rank %d exited with code %d in step %lld", r, h->exit_code,
                 (long long)h->step + 1);
        return true;
    }
    return false;
}

/* A peer that finished (exit 0) or stopped on request: the run is ending, what is left is this rank's own. */
static bool ending(const keel_watch *w) {
    for (int r = 0; r < w->nproc; r++)
        if (w->have[r] && !strcmp(w->hb[r].phase, "exit") &&
            (w->hb[r].exit_code == 0 || w->hb[r].exit_code == KEEL_EXIT_RESUME))
            return true;
    return false;
}

/* After a stop signal: a peer that has not beaten since it came (a beat
 * every 0.5 s: more than two missed) was killed or lost with its node —
 * Slurm ends the step for it (--kill-on-bad-exit) — and the survivors name
 * it before their stop deadline (at least 2 s). A stop the user asked for
 * reaches every rank, and each goes on beating while it finishes its step. */
static bool gone_before_stop(const keel_watch *w, int me, double now, keel_watch_finding *f) {
    double stop = trainer_stop_signal_unix();
    if (stop <= 0 || now < stop + 1.2) return false;
    for (int r = 0; r < w->nproc; r++) {
        const keel_heartbeat_info *h = &w->hb[r];
        if (r == me || !w->have[r] || !strcmp(h->phase, "exit") || h->unix_s >= stop) continue;
        f->rank = r;
        f->onset_unix = h->unix_s;
        snprintf(f->cause, sizeof f->cause, "rank %d has not beaten for %.1f s, since before the stop signal came "
                 "(killed, or its node lost)", r, now - h->unix_s);
        return true;
    }
    return false;
}

/* What rank r was doing at its last beat, in a word or two. */
static const char *doing(const keel_heartbeat_info *h) { return h->doing[0] ? h->doing : h->phase; }

/* The first rank of this attempt to find a loss (its marker made first, O_EXCL,
 * in the shared run directory) writes the event: one per attempt. */
static bool first_to_find(const trainer_peers *p) {
    char path[4300];
    snprintf(path, sizeof path, "%s/heartbeats/peer_lost-%s", p->run_dir,
             p->w.slurm_step[0] ? p->w.slurm_step : "local");
    int fd = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0) return false;
    close(fd);
    return true;
}

static _Noreturn void lost(trainer_peers *p, const char *kind, const keel_watch_finding *f) {
    const keel_heartbeat_info *h = &p->w.hb[f->rank];
    const char *node = p->w.have[f->rank] ? h->node : "?";
    if (first_to_find(p))
        keel_event_with(p->run_dir, "peer_lost", p->w.have[f->rank] ? h->step + 1 : -1,
                        &(keel_event_fields){.cause = kind, .has_rank = true, .rank = f->rank, .node = node},
                        "rank %d on %s was lost while it was in %s: %s; rank %d ends this attempt (exit %d)",
                        f->rank, node, p->w.have[f->rank] ? doing(h) : "start-up", f->cause, p->rank,
                        KEEL_EXIT_PEER_LOST);
    keel_errorf("rank %d on %s was lost (%s): %s; ending this attempt so the step can be run again", f->rank, node,
                kind, f->cause);
    keel_heartbeat_beat(p->self, "exit", -1, KEEL_EXIT_PEER_LOST);
    fflush(NULL);
    _exit(KEEL_EXIT_PEER_LOST);
}

static void *watch_thread(void *arg) {
    trainer_peers *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += (long)((trainer_stop_requested() ? PEERS_STOP_POLL_S : PEERS_POLL_S) * 1e9);
        until.tv_sec += until.tv_nsec / 1000000000L, until.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&p->cv, &p->mu, &until);
        if (p->stop) break;
        pthread_mutex_unlock(&p->mu);
        keel_watch_read(&p->w, p->run_dir);
        keel_watch_finding f;
        if (ending(&p->w)) return NULL; /* nothing left to watch */
        /* a finding about this rank itself is its peers' to act on (its own beats stop while it is
         * frozen; its main thread stuck, they name it as the one that never arrived) */
        if (gone_with_error(&p->w, p->rank, &f)) lost(p, "crash", &f);
        if (gone_before_stop(&p->w, p->rank, keel_unix_s(), &f)) lost(p, "crash", &f);
        if (keel_watch_dead(&p->w, false, p->node, &f) && f.rank != p->rank) lost(p, "crash", &f);
        if (keel_watch_hung(&p->w, keel_unix_s(), false, p->node, &f) && f.rank != p->rank) lost(p, "hang", &f);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

trainer_peers *trainer_peers_watch(const keel_resilience_config *rc, const char *run_dir, int rank, int world_size,
                                   keel_heartbeat *self) {
    trainer_peers *p = keel_xcalloc(sizeof *p, "peer watch");
    p->run_dir = run_dir, p->rank = rank, p->world_size = world_size, p->self = self;
    keel_watch_init(&p->w, rc, world_size, keel_unix_s(), 0);
    const char *job = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
    if (job && step) snprintf(p->w.slurm_step, sizeof p->w.slurm_step, "%s.%s", job, step);
    keel_node_name(p->node, sizeof p->node);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    KEEL_CHECK(pthread_create(&p->thread, NULL, watch_thread, p) == 0, "peer watch thread");
    return p;
}

void trainer_peers_stop(trainer_peers *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    keel_watch_free(&p->w);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    keel_free(p);
}
