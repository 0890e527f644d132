/* run/heartbeat.c: each rank's progress marker, RUN/heartbeats/rank-R.
 *
 * One fixed-width text line rewritten in place (pwrite at offset 0, no
 * rename: a beat costs a few microseconds, so ranks beat on every
 * micro-batch). The supervisor reads it to tell a hung rank (a beat older
 * than the hang timeout) from a slow one, to find the ranks' pids, and to
 * learn how a rank ended. A reader that races a write sees a line without
 * its closing " end" and tries again on its next poll. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "keel/run.h"

#define LINE_BYTES 1024 /* the longest line (a 63-byte node, 20-digit counts) is ~620 */

const double keel_step_bucket_s[KEEL_STEP_BUCKETS] = {0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300};

struct keel_heartbeat {
    int fd;
    int pid;
    double first_step_unix_s;
    int64_t start_step, last_step;
    double last_beat_unix_s;
    char phase[16];
    char node[64], slurm_step[32];
    keel_heartbeat_info stats;  /* the step fields only */
    double last_done_mono_s, last_done_cpu_s;
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
    hb->fd = fd;
    hb->pid = (int)getpid();
    hb->start_step = -1;
    keel_node_name(hb->node, sizeof hb->node);
    const char *job = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
    snprintf(hb->slurm_step, sizeof hb->slurm_step, "%s%s%s", job && step ? job : "-",
             job && step ? "." : "", job && step ? step : "");
    return hb;
}

void keel_heartbeat_beat(keel_heartbeat *hb, const char *phase, int64_t step, int exit_code) {
    if (!hb) return;
    double now = keel_unix_s();
    if (step < 0) step = hb->last_step;
    hb->last_step = step;
    hb->last_beat_unix_s = now;
    snprintf(hb->phase, sizeof hb->phase, "%s", phase);
    if (!strcmp(phase, "ready")) hb->start_step = step;
    if (hb->first_step_unix_s == 0 && hb->start_step >= 0 && step > hb->start_step)
        hb->first_step_unix_s = now;
    const keel_heartbeat_info *x = &hb->stats;
    char buckets[24 * (KEEL_STEP_BUCKETS + 1)]; /* 20 digits and a comma each at most: fits */
    size_t at = 0;
    for (int b = 0; b <= KEEL_STEP_BUCKETS; b++)
        at += (size_t)snprintf(buckets + at, sizeof buckets - at, "%s%llu", b ? "," : "",
                               (unsigned long long)x->step_buckets[b]);
    char line[LINE_BYTES];
    int n = snprintf(line, sizeof line, "keelhb2 phase=%s step=%lld start=%lld unix=%.3f first=%.3f "
                     "pid=%d code=%d node=%s slurm_step=%s step_s=%.6f compute_s=%.6f step_unix=%.3f rss=%llu cpu=%.3f "
                     "util=%.4f hist=%s sum=%.6f end",
                     phase, (long long)step, (long long)hb->start_step, now, hb->first_step_unix_s,
                     hb->pid, exit_code, hb->node, hb->slurm_step, x->step_s, x->compute_s, x->step_unix_s,
                     (unsigned long long)x->rss_bytes, x->cpu_s, x->cpu_util, buckets, x->step_sum_s);
    if (n < 0 || n >= LINE_BYTES - 1) return;
    memset(line + n, ' ', (size_t)(LINE_BYTES - 1 - n));
    line[LINE_BYTES - 1] = '\n';
    keel_pwrite_all(hb->fd, line, LINE_BYTES, 0, NULL); /* failing: nothing to do but go on */
}

void keel_heartbeat_progress(keel_heartbeat *hb) {
    if (!hb || !hb->phase[0] || keel_unix_s() - hb->last_beat_unix_s < 1.0) return;
    char phase[sizeof hb->phase];
    memcpy(phase, hb->phase, sizeof phase);
    keel_heartbeat_beat(hb, phase, -1, 0);
}

void keel_heartbeat_step_done(keel_heartbeat *hb, double step_s, double compute_s, int threads) {
    if (!hb) return;
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
}

void keel_heartbeat_close(keel_heartbeat *hb) {
    if (!hb) return;
    close(hb->fd);
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
    char buckets[512];
    int end = 0;
    if (sscanf(line, "keelhb2 phase=%15s step=%lld start=%lld unix=%lf first=%lf pid=%d code=%d "
               "node=%63s slurm_step=%31s step_s=%lf compute_s=%lf step_unix=%lf rss=%llu cpu=%lf util=%lf hist=%511s "
               "sum=%lf end%n", out->phase, &step, &start, &out->unix_s, &out->first_step_unix_s, &out->pid,
               &out->exit_code, out->node, out->slurm_step, &out->step_s, &out->compute_s, &out->step_unix_s, &rss,
               &out->cpu_s, &out->cpu_util, buckets, &out->step_sum_s, &end) != 17 || end == 0)
        return false;
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
