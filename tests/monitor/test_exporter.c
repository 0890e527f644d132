/* The Prometheus text from a run directory: the leader's last step from
 * metrics.jsonl (a line still being written waits for the next scrape),
 * failures counted by their event's cause (an unknown cause as "other"),
 * restarts, recoveries, the newest checkpoint, drained nodes once each, and
 * per-rank series from heartbeats — step, memory, CPU and a cumulative step
 * time histogram — with label values escaped. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    return test_summary("test_exporter");
}
