/* The Prometheus text from a run directory: the leader's last step from
 * metrics.jsonl (a line still being written waits for the next scrape),
 * failures counted by their event's cause (an unknown cause as "other"),
 * restarts, recoveries, the newest checkpoint, drained nodes once each, and
 * per-rank series from heartbeats — step, memory, CPU and a cumulative step
 * time histogram — with label values escaped. Then a run directory with a
 * known value behind every family (a distinct number per field and per
 * cause, a step before the exporter started, a step redone after a rollback,
 * two ranks' heartbeats): every sample of the text — all of them, none left
 * unchecked — equals the value the run recorded, goodput within the bounds
 * of the wall time measured around it, and the dashboard's JSON too. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "keel/monitor.h"
#include "keel/run.h"

#include "../testlib.h"

static void append(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "a");
    fputs(text, f);
    fclose(f);
}

/* The value of the sample whose line starts with `series ` (NAN when absent). */
static double sample(const char *text, const char *series) {
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, series, n) && p[n] == ' ') return strtod(p + n + 1, NULL);
    return NAN;
}

/* ---- every family against the run's record ------------------------------------------ */

/* The series this part has checked: at the end, every sample of the text must be one. */
static char checked[128][256];
static int n_checked;

static void checked_add(const char *series) {
    if (n_checked < (int)(sizeof checked / sizeof *checked))
        snprintf(checked[n_checked++], sizeof checked[0], "%s", series);
}

/* The sample `series` equals want (within tol; 0 = exactly). */
static void expect_sample(const char *text, const char *series, double want, double tol) {
    double got = sample(text, series);
    EXPECT(fabs(got - want) <= tol, "%s = %.17g, the run recorded %.17g", series, got, want);
    checked_add(series);
}

static void expect_rank_sample(const char *text, const char *family, int rank, const char *node, double want) {
    char series[256];
    snprintf(series, sizeof series, "%s{rank=\"%d\",node=\"%s\"}", family, rank, node);
    expect_sample(text, series, want, 0);
}

/* One metrics.jsonl line; NAN = the key is absent. */
typedef struct {
    double step, loss, lr, grad_norm, tokens, tokens_per_s, mfu, step_s, comm_wait_s, ckpt_stall_s, val_loss;
} step_line;

static void append_step(const char *dir, const step_line *l) {
    char text[1024];
    int n = snprintf(text, sizeof text,
                     "{\"step\":%.17g,\"loss\":%.17g,\"lr\":%.17g,\"grad_norm\":%.17g,\"tokens\":%.17g,"
                     "\"tokens_per_s\":%.17g,\"mfu\":%.17g,\"step_s\":%.17g",
                     l->step, l->loss, l->lr, l->grad_norm, l->tokens, l->tokens_per_s, l->mfu, l->step_s);
    size_t room = sizeof text;
    if (!isnan(l->comm_wait_s)) n += snprintf(text + n, room - (size_t)n, ",\"comm_wait_s\":%.17g", l->comm_wait_s);
    if (!isnan(l->ckpt_stall_s)) n += snprintf(text + n, room - (size_t)n, ",\"ckpt_stall_s\":%.17g", l->ckpt_stall_s);
    if (!isnan(l->val_loss)) n += snprintf(text + n, room - (size_t)n, ",\"val_loss\":%.17g", l->val_loss);
    snprintf(text + n, room - (size_t)n, "}\n");
    append(dir, "metrics.jsonl", text);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void check_every_family(void) {
    char dir[256];
    if (!temp_dir_create(dir, sizeof dir, "exporter-values")) {
        failures++;
        return;
    }
    setenv("KEEL_NVML_LIB", "/nonexistent/libnvidia-ml.so.1", 1); /* no GPUs: keel_nvml_up is 0 (test_gpu_metrics) */
    /* metrics.jsonl: step 1 before the serving process started (its time is not this process's goodput),
     * then steps 2, 3, 3 again (a rollback: the redone step's time replaces the lost one's) and 4;
     * every field a different number on every line */
    const step_line before = {1, 7.5, 1e-4, 3.25, 64, 100, 0.125, 0.5, 0.0625, 0.03125, NAN};
    const step_line after[] = {
        {2, 6.75, 2e-4, 2.5, 128, 110, 0.13, 0.04, 0.01, NAN, 6.875},
        {3, 6.5, 3e-4, 2.25, 192, 120, 0.14, 0.03, NAN, 0.02, NAN},
        {3, 6.5, 3e-4, 2.25, 192, 130, 0.15, 0.05, 0.02, NAN, NAN},
        {4, 6.25, 3.75e-4, 0.875, 256, 140, 0.16, 0.02, 0.005, NAN, NAN},
    };
    const int n_after = (int)(sizeof after / sizeof *after);
    append_step(dir, &before);
    double t0 = now_s();
    keel_exporter *x = keel_exporter_new(dir);
    double t1 = now_s();
    for (int i = 0; i < n_after; i++) append_step(dir, &after[i]);

    /* events.jsonl: cause c (in the exporter's order) c + 1 times, so no two causes share a count;
     * health's 5 include the drains; 7 failures of causes the exporter does not list are "other" */
    static const char *const causes[] = {"crash", "hang", "diverged", "preempted", "health", "straggler"};
    char line[512];
    for (int c = 0; c < 6; c++)
        for (int k = 0; k < c + 1 - (c == 4 ? 3 : 0); k++) {
            snprintf(line, sizeof line, "{\"event\":\"failure\",\"step\":%d,\"cause\":\"%s\",\"detail\":\"x\"}\n", k,
                     causes[c]);
            append(dir, "events.jsonl", line);
        }
    append(dir, "events.jsonl",
           "{\"event\":\"node_drained\",\"cause\":\"health\",\"node\":\"n1\",\"detail\":\"x\"}\n"
           "{\"event\":\"node_excluded\",\"cause\":\"health\",\"node\":\"n2\",\"detail\":\"x\"}\n"
           "{\"event\":\"node_drained\",\"cause\":\"health\",\"node\":\"n1\",\"detail\":\"again\"}\n");
    for (int k = 0; k < 7; k++)
        append(dir, "events.jsonl",
               k % 2 ? "{\"event\":\"failure\",\"cause\":\"input_error\",\"detail\":\"x\"}\n"
                     : "{\"event\":\"failure\",\"cause\":\"cosmic_ray\",\"detail\":\"x\"}\n");
    const double recoveries[] = {3, 8, 1, 2, 6}; /* last 6; median of 1 2 3 6 8: 3 */
    for (int k = 0; k < 5; k++) {
        snprintf(line, sizeof line, "{\"event\":\"recovered\",\"step\":%d,\"seconds\":%g,\"detail\":\"x\"}\n", k,
                 recoveries[k]);
        append(dir, "events.jsonl", line);
    }
    append(dir, "events.jsonl",
           "{\"event\":\"restart\",\"seconds\":0.5,\"detail\":\"x\"}\n"
           "{\"event\":\"restart\",\"seconds\":0.25,\"detail\":\"x\"}\n"
           "{\"event\":\"checkpoint_committed\",\"step\":10,\"seconds\":0.5,\"bytes\":1000,\"detail\":\"x\"}\n"
           "{\"event\":\"checkpoint_committed\",\"step\":20,\"seconds\":0.75,\"bytes\":2048,\"detail\":\"x\"}\n"
           "{\"event\":\"checkpoint_failed\",\"step\":30,\"seconds\":9,\"bytes\":99,\"detail\":\"not committed\"}\n");

    /* heartbeats: two ranks, step times across the histogram's buckets (one under the first bound,
     * one over the last) */
    const double steps0[] = {0.004, 0.2, 12}, steps1[] = {0.3, 400};
    const double compute0[] = {0.003, 0.15, 11}, compute1[] = {0.25, 399};
    keel_heartbeat *hb0 = keel_heartbeat_open(dir, 0), *hb1 = keel_heartbeat_open(dir, 1);
    keel_heartbeat_beat(hb0, "ready", 0, 0);
    for (int k = 0; k < 3; k++) keel_heartbeat_step_done(hb0, steps0[k], compute0[k], 2);
    keel_heartbeat_progress(hb0, "forward");
    keel_heartbeat_beat(hb0, "train", 3, 0);
    keel_heartbeat_beat(hb1, "ready", 0, 0);
    for (int k = 0; k < 2; k++) keel_heartbeat_step_done(hb1, steps1[k], compute1[k], 1);
    keel_heartbeat_beat(hb1, "train", 2, 0);
    keel_heartbeat_info info[2];
    bool read_ok = keel_heartbeat_read(dir, 0, &info[0]) && keel_heartbeat_read(dir, 1, &info[1]);
    EXPECT(read_ok, "both heartbeats read back");

    usleep(250 * 1000); /* wall time for goodput: about twice the kept steps' 0.11 s */
    struct statvfs fs_before, fs_after;
    statvfs(dir, &fs_before);
    double t2 = now_s();
    char *t = keel_exporter_render(x);
    double t3 = now_s();
    statvfs(dir, &fs_after);

    /* the leader's last line, the last evaluation, and the sums over every line read */
    const step_line *last = &after[n_after - 1];
    expect_sample(t, "keel_step", last->step, 0);
    expect_sample(t, "keel_loss", last->loss, 0);
    expect_sample(t, "keel_learning_rate", last->lr, 0);
    expect_sample(t, "keel_grad_norm", last->grad_norm, 0);
    expect_sample(t, "keel_tokens_per_second", last->tokens_per_s, 0);
    expect_sample(t, "keel_mfu", last->mfu, 0);
    expect_sample(t, "keel_step_seconds", last->step_s, 0);
    expect_sample(t, "keel_tokens_total", last->tokens, 0);
    expect_sample(t, "keel_val_loss", after[0].val_loss, 0);
    double comm = before.comm_wait_s, stall = before.ckpt_stall_s;
    for (int i = 0; i < n_after; i++) {
        comm += isnan(after[i].comm_wait_s) ? 0 : after[i].comm_wait_s;
        stall += isnan(after[i].ckpt_stall_s) ? 0 : after[i].ckpt_stall_s;
    }
    expect_sample(t, "keel_exposed_communication_seconds_total", comm, 1e-15);
    expect_sample(t, "keel_checkpoint_stall_seconds_total", stall, 1e-15);

    /* goodput: the kept steps since this process started (2, the redone 3, 4) over its wall time,
     * which lies in [t2 - t1, t3 - t0] */
    double kept = after[0].step_s + after[2].step_s + after[3].step_s;
    double g_lo = kept / (t3 - t0), g_hi = kept / (t2 - t1), goodput = sample(t, "keel_goodput");
    EXPECT(goodput >= g_lo - 1e-12 && goodput <= g_hi + 1e-12,
           "keel_goodput = %.6f: %.2f s of kept steps over %.4f..%.4f s of wall time gives %.6f..%.6f", goodput, kept,
           t2 - t1, t3 - t0, g_lo, g_hi);
    checked_add("keel_goodput");

    /* events: failures by cause, restarts, recoveries, the newest committed checkpoint, drained nodes */
    char series[256];
    for (int c = 0; c < 6; c++) {
        snprintf(series, sizeof series, "keel_failures_total{cause=\"%s\"}", causes[c]);
        expect_sample(t, series, c + 1, 0);
    }
    expect_sample(t, "keel_failures_total{cause=\"other\"}", 7, 0);
    expect_sample(t, "keel_restarts_total", 2, 0);
    expect_sample(t, "keel_recovery_last_seconds", 6, 0);
    expect_sample(t, "keel_recovery_median_seconds", 3, 0);
    expect_sample(t, "keel_checkpoint_last_step", 20, 0);
    expect_sample(t, "keel_checkpoint_bytes", 2048, 0);
    expect_sample(t, "keel_checkpoint_save_seconds", 0.75, 0);
    expect_sample(t, "keel_drained_nodes", 2, 0);
    expect_sample(t, "keel_node_drained{node=\"n1\"}", 1, 0);
    expect_sample(t, "keel_node_drained{node=\"n2\"}", 1, 0);
    expect_sample(t, "keel_nvml_up", 0, 0);

    /* the run directory's filesystem (no checkpoints/ yet: the run directory's), read around the scrape */
    double free_before = (double)fs_before.f_bavail * (double)fs_before.f_frsize;
    double free_after = (double)fs_after.f_bavail * (double)fs_after.f_frsize;
    double free_mid = (free_before + free_after) / 2;
    expect_sample(t, "keel_checkpoint_dir_free_bytes", free_mid, fabs(free_before - free_after) / 2 + 0.001 * free_mid);

    /* heartbeats, rank by rank: what each rank recorded (as read back) and what the test gave it */
    const double *step_times[2] = {steps0, steps1}, *computes[2] = {compute0, compute1};
    const int n_steps[2] = {3, 2};
    for (int r = 0; r < 2 && read_ok; r++) {
        const keel_heartbeat_info *h = &info[r];
        EXPECT(h->step == n_steps[r] && h->step_s == step_times[r][n_steps[r] - 1] &&
                   h->compute_s == computes[r][n_steps[r] - 1] && h->rss_bytes > 1000000 && h->cpu_s > 0 &&
                   h->unix_s >= t1 && h->step_unix_s >= t1 && (r == 1 || h->progress_unix_s >= t1),
               "rank %d's heartbeat holds its step %lld, step %g s, compute %g s, RSS %llu, CPU %g s", r,
               (long long)h->step, h->step_s, h->compute_s, (unsigned long long)h->rss_bytes, h->cpu_s);
        expect_rank_sample(t, "keel_rank_step", r, h->node, (double)n_steps[r]);
        expect_rank_sample(t, "keel_rank_last_step_timestamp_seconds", r, h->node, h->step_unix_s);
        expect_rank_sample(t, "keel_rank_heartbeat_timestamp_seconds", r, h->node, h->unix_s);
        expect_rank_sample(t, "keel_rank_progress_timestamp_seconds", r, h->node, h->progress_unix_s);
        expect_rank_sample(t, "keel_rank_last_step_seconds", r, h->node, step_times[r][n_steps[r] - 1]);
        expect_rank_sample(t, "keel_rank_compute_seconds", r, h->node, computes[r][n_steps[r] - 1]);
        expect_rank_sample(t, "keel_rank_rss_bytes", r, h->node, (double)h->rss_bytes);
        expect_rank_sample(t, "keel_rank_cpu_utilization", r, h->node, h->cpu_util);
        expect_rank_sample(t, "keel_rank_cpu_seconds_total", r, h->node, h->cpu_s);
        /* the histogram: at each bound, the step times at or under it; +Inf, count and sum all of them */
        double sum = 0;
        for (int k = 0; k < n_steps[r]; k++) sum += step_times[r][k];
        for (int b = 0; b <= KEEL_STEP_BUCKETS; b++) {
            int under = 0;
            for (int k = 0; k < n_steps[r]; k++)
                under += b == KEEL_STEP_BUCKETS || step_times[r][k] <= keel_step_bucket_s[b];
            if (b < KEEL_STEP_BUCKETS)
                snprintf(series, sizeof series, "keel_rank_step_seconds_bucket{rank=\"%d\",node=\"%s\",le=\"%g\"}",
                         r, h->node, keel_step_bucket_s[b]);
            else
                snprintf(series, sizeof series, "keel_rank_step_seconds_bucket{rank=\"%d\",node=\"%s\",le=\"+Inf\"}",
                         r, h->node);
            expect_sample(t, series, under, 0);
        }
        expect_rank_sample(t, "keel_rank_step_seconds_count", r, h->node, n_steps[r]);
        snprintf(series, sizeof series, "keel_rank_step_seconds_sum{rank=\"%d\",node=\"%s\"}", r, h->node);
        expect_sample(t, series, sum, 1e-12 * sum);
    }
    EXPECT(keel_step_bucket_s[0] == 0.01 && keel_step_bucket_s[KEEL_STEP_BUCKETS - 1] == 300,
           "the histogram's buckets run from 0.01 to 300 s (docs/metrics.md)");

    /* nothing exported goes unchecked */
    int samples = 0, unchecked = 0;
    for (const char *p = t; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (*p == '#' || *p == '\n') continue;
        const char *end = strchr(p, '\n'), *space = end;
        while (space && space > p && *space != ' ') space--; /* a sample line: SERIES VALUE */
        if (!space || space == p) continue;
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(space - p), p);
        samples++;
        bool seen = false;
        for (int i = 0; i < n_checked && !seen; i++) seen = !strcmp(checked[i], name);
        if (!seen) {
            unchecked++;
            EXPECT(false, "exported but not checked against the run: %s", name);
        }
    }
    EXPECT(unchecked == 0 && samples == n_checked, "every one of the %d samples checked (%d checks)", samples,
           n_checked);
    keel_free(t);

    /* the dashboard's JSON reads the same record: the steps (the rollback replaced step 3's point), failures,
     * restarts, drained nodes, the newest checkpoint, and each rank */
    char *json = keel_exporter_json(x);
    cJSON *j = cJSON_Parse(json);
    const cJSON *steps = cJSON_GetObjectItem(j, "steps");
    const cJSON *step_col = cJSON_GetObjectItem(steps, "step"), *tps_col = cJSON_GetObjectItem(steps, "tokens_per_s");
    const cJSON *val_col = cJSON_GetObjectItem(steps, "val_loss");
    const double want_steps[] = {1, 2, 3, 4}, want_tps[] = {100, 110, 130, 140};
    bool columns = cJSON_GetArraySize(step_col) == 4 && cJSON_GetArraySize(tps_col) == 4;
    for (int i = 0; i < 4 && columns; i++)
        columns = cJSON_GetArrayItem(step_col, i)->valuedouble == want_steps[i] &&
                  cJSON_GetArrayItem(tps_col, i)->valuedouble == want_tps[i] &&
                  (i == 1 ? cJSON_GetArrayItem(val_col, i)->valuedouble == after[0].val_loss
                          : cJSON_IsNull(cJSON_GetArrayItem(val_col, i)));
    EXPECT(columns, "JSON steps: 1 2 3 4 with the redone step 3's tokens/s, val loss at step 2 only");
    const cJSON *fail = cJSON_GetObjectItem(j, "failures");
    bool by_cause = true;
    for (int c = 0; c < 6; c++) by_cause &= cJSON_GetObjectItem(fail, causes[c])->valuedouble == c + 1;
    EXPECT(by_cause && cJSON_GetObjectItem(j, "restarts")->valuedouble == 2 &&
               cJSON_GetObjectItem(j, "drained_nodes")->valuedouble == 2 &&
               cJSON_GetObjectItem(j, "checkpoint_step")->valuedouble == 20,
           "JSON failures by cause, restarts 2, drained nodes 2, checkpoint step 20");
    const cJSON *ranks = cJSON_GetObjectItem(j, "ranks");
    bool rank_rows = cJSON_GetArraySize(ranks) == 2;
    for (int r = 0; r < 2 && rank_rows; r++) {
        const cJSON *o = cJSON_GetArrayItem(ranks, r);
        rank_rows = cJSON_GetObjectItem(o, "rank")->valuedouble == r &&
                    cJSON_GetObjectItem(o, "step")->valuedouble == n_steps[r] &&
                    cJSON_GetObjectItem(o, "step_s")->valuedouble == step_times[r][n_steps[r] - 1] &&
                    cJSON_GetObjectItem(o, "compute_s")->valuedouble == computes[r][n_steps[r] - 1];
    }
    EXPECT(rank_rows, "JSON ranks: each rank's step, step and compute seconds");
    cJSON_Delete(j);
    free(json);

    keel_heartbeat_close(hb0);
    keel_heartbeat_close(hb1);
    keel_exporter_free(x);
    unsetenv("KEEL_NVML_LIB");
    remove_tree(dir);
}

/* A FIFO (nobody writing) where metrics.jsonl and events.jsonl should be: the exporter starts
 * and scrapes at once, with no step (a blocked open() would hang this test). */
static void check_fifo_run_dir(void) {
    char dir[256], path[400];
    if (!temp_dir_create(dir, sizeof dir, "exporter-fifo")) return;
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    bool made = mkfifo(path, 0600) == 0;
    snprintf(path, sizeof path, "%s/events.jsonl", dir);
    made &= mkfifo(path, 0600) == 0;
    keel_exporter *x = keel_exporter_new(dir);
    char *t = keel_exporter_render(x);
    EXPECT(made && t && !(sample(t, "keel_step") > 0), "FIFOs in the run directory: scraped at once, no step");
    keel_free(t);
    keel_exporter_free(x);
    remove_tree(dir);
}

int main(void) {
    char dir[256];
    if (!temp_dir_create(dir, sizeof dir, "exporter")) return 1;
    append(dir, "metrics.jsonl", "{\"step\":1,\"loss\":5.5,\"lr\":0.001,\"grad_norm\":2,\"tokens\":100,"
                                 "\"tokens_per_s\":50,\"mfu\":0.4,\"step_s\":2,\"comm_wait_s\":0.25}\n");
    keel_exporter *x = keel_exporter_new(dir);
    append(dir, "metrics.jsonl", "{\"step\":2,\"loss\":4.25,\"lr\":0.002,\"grad_norm\":1.5,\"tokens\":200,"
                                 "\"tokens_per_s\":60,\"mfu\":0.5,\"step_s\":1.5,\"comm_wait_s\":0.5,\"val_loss\":4.5}\n"
                                 "{\"step\":3,\"loss\":3.0");
    append(dir, "events.jsonl",
           "{\"event\":\"failure\",\"step\":3,\"cause\":\"crash\",\"rank\":1,\"node\":\"n1\",\"detail\":\"x\"}\n"
           "{\"event\":\"failure\",\"step\":5,\"cause\":\"hang\",\"detail\":\"x\"}\n"
           "{\"event\":\"failure\",\"step\":6,\"cause\":\"crash\",\"detail\":\"x\"}\n"
           "{\"event\":\"failure\",\"step\":6,\"cause\":\"cosmic_ray\",\"detail\":\"x\"}\n"
           "{\"event\":\"lost_work\",\"step\":6,\"steps\":2,\"detail\":\"no cause: not a failure\"}\n"
           "{\"event\":\"restart\",\"seconds\":1.5,\"detail\":\"x\"}\n"
           "{\"event\":\"recovered\",\"step\":4,\"seconds\":3,\"detail\":\"x\"}\n"
           "{\"event\":\"recovered\",\"step\":7,\"seconds\":5,\"detail\":\"x\"}\n"
           "{\"event\":\"recovered\",\"step\":9,\"seconds\":4,\"detail\":\"x\"}\n"
           "{\"event\":\"checkpoint_committed\",\"step\":8,\"seconds\":0.75,\"bytes\":4096,\"detail\":\"x\"}\n"
           "{\"event\":\"node_drained\",\"cause\":\"health\",\"node\":\"bad\\\"node\",\"detail\":\"x\"}\n"
           "{\"event\":\"node_drained\",\"cause\":\"health\",\"node\":\"bad\\\"node\",\"detail\":\"again\"}\n");
    keel_heartbeat *hb = keel_heartbeat_open(dir, 0);
    keel_heartbeat_beat(hb, "ready", 0, 0);
    keel_heartbeat_step_done(hb, 0.3, 0.25, 2);
    keel_heartbeat_step_done(hb, 7, 6.5, 2);
    keel_heartbeat_beat(hb, "train", 2, 0);

    char *t = keel_exporter_render(x);
    EXPECT(sample(t, "keel_step") == 2 && sample(t, "keel_loss") == 4.25 && sample(t, "keel_val_loss") == 4.5 &&
               sample(t, "keel_tokens_per_second") == 60 && sample(t, "keel_mfu") == 0.5,
           "the last whole line is step 2 (step %g, loss %g): the partial step 3 waits", sample(t, "keel_step"),
           sample(t, "keel_loss"));
    EXPECT(sample(t, "keel_exposed_communication_seconds_total") == 0.75, "communication waits add up: %g",
           sample(t, "keel_exposed_communication_seconds_total"));
    EXPECT(sample(t, "keel_failures_total{cause=\"crash\"}") == 2 && sample(t, "keel_failures_total{cause=\"hang\"}") == 1 &&
               sample(t, "keel_failures_total{cause=\"health\"}") == 2 &&
               sample(t, "keel_failures_total{cause=\"straggler\"}") == 0 &&
               sample(t, "keel_failures_total{cause=\"other\"}") == 1,
           "failures by cause: crash %g hang %g health %g other %g", sample(t, "keel_failures_total{cause=\"crash\"}"),
           sample(t, "keel_failures_total{cause=\"hang\"}"), sample(t, "keel_failures_total{cause=\"health\"}"),
           sample(t, "keel_failures_total{cause=\"other\"}"));
    EXPECT(sample(t, "keel_restarts_total") == 1 && sample(t, "keel_recovery_last_seconds") == 4 &&
               sample(t, "keel_recovery_median_seconds") == 4,
           "restarts %g, recovery last %g median %g", sample(t, "keel_restarts_total"),
           sample(t, "keel_recovery_last_seconds"), sample(t, "keel_recovery_median_seconds"));
    EXPECT(sample(t, "keel_checkpoint_last_step") == 8 && sample(t, "keel_checkpoint_bytes") == 4096 &&
               sample(t, "keel_checkpoint_save_seconds") == 0.75, "newest checkpoint");
    EXPECT(sample(t, "keel_drained_nodes") == 1 && sample(t, "keel_node_drained{node=\"bad\\\"node\"}") == 1,
           "a node drained twice counts once, its name escaped");
    char node[64];
    keel_node_name(node, sizeof node);
    char series[256];
    snprintf(series, sizeof series, "keel_rank_step{rank=\"0\",node=\"%s\"}", node);
    EXPECT(sample(t, series) == 2, "%s = %g", series, sample(t, series));
    snprintf(series, sizeof series, "keel_rank_step_seconds_bucket{rank=\"0\",node=\"%s\",le=\"0.5\"}", node);
    double le05 = sample(t, series);
    snprintf(series, sizeof series, "keel_rank_step_seconds_bucket{rank=\"0\",node=\"%s\",le=\"5\"}", node);
    double le5 = sample(t, series);
    snprintf(series, sizeof series, "keel_rank_step_seconds_bucket{rank=\"0\",node=\"%s\",le=\"+Inf\"}", node);
    double inf = sample(t, series);
    snprintf(series, sizeof series, "keel_rank_step_seconds_sum{rank=\"0\",node=\"%s\"}", node);
    EXPECT(le05 == 1 && le5 == 1 && inf == 2 && fabs(sample(t, series) - 7.3) < 1e-9,
           "histogram cumulative: le 0.5 %g, le 5 %g, +Inf %g, sum %g", le05, le5, inf, sample(t, series));
    snprintf(series, sizeof series, "keel_rank_compute_seconds{rank=\"0\",node=\"%s\"}", node);
    EXPECT(sample(t, series) == 6.5, "rank compute seconds %g", sample(t, series));
    snprintf(series, sizeof series, "keel_rank_rss_bytes{rank=\"0\",node=\"%s\"}", node);
    EXPECT(sample(t, series) > 1e6, "rank RSS %g", sample(t, series));
    EXPECT(strstr(t, "# TYPE keel_failures_total counter\n") && strstr(t, "# TYPE keel_rank_step_seconds histogram\n"),
           "types declared");
    keel_free(t);

    /* the rest of step 3 arrives: the next scrape takes it */
    append(dir, "metrics.jsonl", ",\"step_s\":1}\n");
    t = keel_exporter_render(x);
    EXPECT(sample(t, "keel_step") == 3 && sample(t, "keel_loss") == 3.0, "the completed line is read: step %g",
           sample(t, "keel_step"));
    EXPECT(sample(t, "keel_failures_total{cause=\"crash\"}") == 2, "events are not counted twice");
    double goodput = sample(t, "keel_goodput");
    EXPECT(goodput >= 0 && goodput <= 1, "goodput %g in [0, 1]", goodput);
    keel_free(t);
    keel_heartbeat_close(hb);
    keel_exporter_free(x);
    remove_tree(dir);
    check_every_family();
    check_fifo_run_dir();
    return test_summary("test_exporter");
}
