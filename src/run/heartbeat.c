/* run/heartbeat.c: each rank's progress marker, RUN/heartbeats/rank-R.
 *
 * One fixed-width text line rewritten in place (pwrite at offset 0, no
 * rename: a write costs a few microseconds). Phase changes are written at
 * once; a beat thread rewrites the line every KEEL_BEAT_INTERVAL_S with what
 * the rank is doing and where it is in the sequence of collectives, so that
 * a process that stops beating is frozen or dead, and one that beats without
 * progress is stuck — in its own work, or waiting on a peer that never
 * arrived. The supervisor reads it to tell the two apart and name the rank,
 * to find the ranks' pids, and to learn how a rank ended. A reader that
 * races a write sees a line without its closing " end" and tries again on
 * its next poll. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "keel/run.h"

#define LINE_BYTES 1024 /* the longest line (a 63-byte node, 20-digit counts) is ~620 */

const double keel_step_bucket_s[KEEL_STEP_BUCKETS] = {0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300};

struct keel_heartbeat {
    pthread_mutex_t mu;         /* everything below: the rank's threads and the beat thread write */
    int fd;
    int pid;
    double first_step_unix_s;
    int64_t start_step, last_step;
    double last_write_unix_s, progress_unix_s;
    char phase[16], doing[16];
    char node[64], slurm_step[32];
    keel_heartbeat_info stats;  /* the step fields only */
    double last_done_mono_s, last_done_cpu_s;
    /* the beat thread */
    bool threaded, stop;
    pthread_t thread;
    pthread_cond_t stop_cv;
    keel_heartbeat_sampler sampler;
    void *sampler_ctx;
    uint64_t coll_issued, coll_running, coll_waiting;
    double ready_unix_s, restore_s; /* when state was loaded; how long loading took */
    char restore_source[16];        /* where from: "disk", "none" */
};

static void heartbeat_path(char *out, size_t n, const char *run_dir, int rank) {
    snprintf(out, n, "%s/heartbeats/rank-%d", run_dir, rank);
}

keel_heartbeat *keel_heartbeat_open(const char *run_dir, int rank) {
    char path[4096];
    snprintf(path, sizeof path, "%s/heartbeats", run_dir);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        keel_log_warn("%s: cannot create: %s; the supervisor cannot see this rank's progress", path,
                      strerror(errno));
        return NULL;
    }
    heartbeat_path(path, sizeof path, run_dir, rank);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        keel_log_warn("%s: cannot write: %s; the supervisor cannot see this rank's progress", path,
                      strerror(errno));
        return NULL;
    }
    keel_heartbeat *hb = keel_xcalloc(sizeof *hb, "heartbeat");
    pthread_mutex_init(&hb->mu, NULL);
    pthread_cond_init(&hb->stop_cv, NULL);
    hb->fd = fd;
    hb->pid = (int)getpid();
    hb->start_step = -1;
    snprintf(hb->restore_source, sizeof hb->restore_source, "none");
    keel_node_name(hb->node, sizeof hb->node);
    const char *job = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
    snprintf(hb->slurm_step, sizeof hb->slurm_step, "%s%s%s", job && step ? job : "-",
             job && step ? "." : "", job && step ? step : "");
    return hb;
}

/* The line from the state now (under hb->mu). */
static void write_line(keel_heartbeat *hb, int exit_code) {
    double now = keel_unix_s();
    hb->last_write_unix_s = now;
    const keel_heartbeat_info *x = &hb->stats;
    char buckets[24 * (KEEL_STEP_BUCKETS + 1)]; /* 20 digits and a comma each at most: fits */
    size_t at = 0;
    for (int b = 0; b <= KEEL_STEP_BUCKETS; b++)
        at += (size_t)snprintf(buckets + at, sizeof buckets - at, "%s%llu", b ? "," : "",
                               (unsigned long long)x->step_buckets[b]);
    char line[LINE_BYTES];
    int n = snprintf(line, sizeof line, "keelhb3 phase=%s step=%lld start=%lld unix=%.3f first=%.3f "
                     "pid=%d code=%d node=%s slurm_step=%s step_s=%.6f compute_s=%.6f step_unix=%.3f rss=%llu cpu=%.3f "
                     "util=%.4f hist=%s sum=%.6f progress=%.3f doing=%s issued=%llu running=%llu waiting=%llu "
                     "ready=%.3f restore_s=%.3f source=%s end",
                     hb->phase, (long long)hb->last_step, (long long)hb->start_step, now, hb->first_step_unix_s,
                     hb->pid, exit_code, hb->node, hb->slurm_step, x->step_s, x->compute_s, x->step_unix_s,
                     (unsigned long long)x->rss_bytes, x->cpu_s, x->cpu_util, buckets, x->step_sum_s,
                     hb->progress_unix_s, hb->coll_waiting ? "wait" : hb->doing[0] ? hb->doing : hb->phase,
                     (unsigned long long)hb->coll_issued, (unsigned long long)hb->coll_running,
                     (unsigned long long)hb->coll_waiting, hb->ready_unix_s, hb->restore_s, hb->restore_source);
    if (n < 0 || n >= LINE_BYTES - 1) return;
    memset(line + n, ' ', (size_t)(LINE_BYTES - 1 - n));
    line[LINE_BYTES - 1] = '\n';
    keel_pwrite_all(hb->fd, line, LINE_BYTES, 0, NULL); /* failing: nothing to do but go on */
}

void keel_heartbeat_beat(keel_heartbeat *hb, const char *phase, int64_t step, int exit_code) {
    if (!hb) return;
    pthread_mutex_lock(&hb->mu);
    double now = keel_unix_s();
    if (step < 0) step = hb->last_step;
    hb->last_step = step;
    hb->progress_unix_s = now;
    snprintf(hb->phase, sizeof hb->phase, "%s", phase);
    hb->doing[0] = 0;
    if (!strcmp(phase, "ready")) hb->start_step = step, hb->ready_unix_s = now;
    if (hb->first_step_unix_s == 0 && hb->start_step >= 0 && step > hb->start_step)
        hb->first_step_unix_s = now;
    write_line(hb, exit_code);
    pthread_mutex_unlock(&hb->mu);
}

void keel_heartbeat_restored(keel_heartbeat *hb, double seconds, const char *source) {
    if (!hb) return;
    pthread_mutex_lock(&hb->mu);
    hb->restore_s = seconds;
    snprintf(hb->restore_source, sizeof hb->restore_source, "%s", source);
    pthread_mutex_unlock(&hb->mu);
}

void keel_heartbeat_progress(keel_heartbeat *hb, const char *doing) {
    if (!hb) return;
    pthread_mutex_lock(&hb->mu);
    double now = keel_unix_s();
    hb->progress_unix_s = now;
    snprintf(hb->doing, sizeof hb->doing, "%s", doing);
    /* without a beat thread (a single process), at most one write a second */
    if (!hb->threaded && hb->phase[0] && now - hb->last_write_unix_s >= 1.0) write_line(hb, 0);
    pthread_mutex_unlock(&hb->mu);
}

static void *beat_thread(void *arg) {
    keel_heartbeat *hb = arg;
    pthread_mutex_lock(&hb->mu);
    while (!hb->stop) {
        if (hb->sampler) hb->sampler(hb->sampler_ctx, &hb->coll_issued, &hb->coll_running, &hb->coll_waiting);
        if (hb->phase[0] && strcmp(hb->phase, "exit")) write_line(hb, 0);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        double t = until.tv_sec + until.tv_nsec * 1e-9 + KEEL_BEAT_INTERVAL_S;
        until.tv_sec = (time_t)t;
        until.tv_nsec = (long)((t - (double)until.tv_sec) * 1e9);
        pthread_cond_timedwait(&hb->stop_cv, &hb->mu, &until);
    }
    pthread_mutex_unlock(&hb->mu);
    return NULL;
}

void keel_heartbeat_start_beating(keel_heartbeat *hb, keel_heartbeat_sampler sampler, void *ctx) {
    if (!hb || hb->threaded) return;
    pthread_mutex_lock(&hb->mu);
    hb->sampler = sampler;
    hb->sampler_ctx = ctx;
    pthread_mutex_unlock(&hb->mu);
    if (pthread_create(&hb->thread, NULL, beat_thread, hb) == 0) hb->threaded = true;
    else keel_log_warn("heartbeat: cannot start the beat thread; beats come with progress only");
}

void keel_heartbeat_step_done(keel_heartbeat *hb, double step_s, double compute_s, int threads) {
    if (!hb) return;
    pthread_mutex_lock(&hb->mu);
    keel_heartbeat_info *x = &hb->stats;
    double mono = keel_now_s(), cpu = keel_cpu_s();
    /* CPU use since the previous step's end (the first: over this step's time) */
    double wall = hb->last_done_mono_s > 0 ? mono - hb->last_done_mono_s : step_s;
    double used = hb->last_done_mono_s > 0 ? cpu - hb->last_done_cpu_s : 0;
    if (hb->last_done_mono_s > 0 && wall > 0 && threads > 0) x->cpu_util = fmin(1.0, used / (wall * threads));
    hb->last_done_mono_s = mono;
    hb->last_done_cpu_s = cpu;
    x->step_s = step_s;
    x->compute_s = compute_s;
    x->step_unix_s = keel_unix_s();
    x->rss_bytes = keel_rss_bytes();
    x->cpu_s = cpu;
    int b = 0;
    while (b < KEEL_STEP_BUCKETS && step_s > keel_step_bucket_s[b]) b++;
    x->step_buckets[b]++;
    x->step_sum_s += step_s;
    pthread_mutex_unlock(&hb->mu);
}

void keel_heartbeat_close(keel_heartbeat *hb) {
    if (!hb) return;
    if (hb->threaded) {
        pthread_mutex_lock(&hb->mu);
        hb->stop = true;
        pthread_cond_signal(&hb->stop_cv);
        pthread_mutex_unlock(&hb->mu);
        pthread_join(hb->thread, NULL);
    }
    close(hb->fd);
    pthread_cond_destroy(&hb->stop_cv);
    pthread_mutex_destroy(&hb->mu);
    keel_free(hb);
}

bool keel_heartbeat_read(const char *run_dir, int rank, keel_heartbeat_info *out) {
    char path[4096], line[LINE_BYTES + 1];
    memset(out, 0, sizeof *out);
    heartbeat_path(path, sizeof path, run_dir, rank);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    keel_status got = keel_pread_all(fd, line, LINE_BYTES, 0, NULL);
    close(fd);
    if (got != KEEL_OK) return false;
    line[LINE_BYTES] = 0;
    long long step, start;
    unsigned long long rss;
    unsigned long long issued, running, waiting;
    char buckets[512];
    int end = 0;
    if (sscanf(line, "keelhb3 phase=%15s step=%lld start=%lld unix=%lf first=%lf pid=%d code=%d "
               "node=%63s slurm_step=%31s step_s=%lf compute_s=%lf step_unix=%lf rss=%llu cpu=%lf util=%lf hist=%511s "
               "sum=%lf progress=%lf doing=%15s issued=%llu running=%llu waiting=%llu ready=%lf restore_s=%lf "
               "source=%15s end%n", out->phase, &step, &start, &out->unix_s, &out->first_step_unix_s, &out->pid,
               &out->exit_code, out->node, out->slurm_step, &out->step_s, &out->compute_s, &out->step_unix_s, &rss,
               &out->cpu_s, &out->cpu_util, buckets, &out->step_sum_s, &out->progress_unix_s, out->doing, &issued,
               &running, &waiting, &out->ready_unix_s, &out->restore_s, out->restore_source, &end) != 25 ||
        end == 0)
        return false;
    out->coll_issued = issued, out->coll_running = running, out->coll_waiting = waiting;
    out->step = step;
    out->start_step = start;
    out->rss_bytes = rss;
    char *p = buckets;
    for (int b = 0; b <= KEEL_STEP_BUCKETS; b++) {
        char *next;
        out->step_buckets[b] = strtoull(p, &next, 10);
        if (next == p || (b < KEEL_STEP_BUCKETS && *next != ',')) return false;
        p = next + 1;
    }
    return true;
}

void keel_heartbeat_clear(const char *run_dir, int ranks) {
    char path[4096];
    for (int r = 0; r < ranks; r++) {
        heartbeat_path(path, sizeof path, run_dir, r);
        unlink(path);
    }
}
