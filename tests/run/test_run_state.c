/* The run directory's shared state: supervisor.json round-trips (skipped
 * steps kept ascending without duplicates, excluded nodes), a damaged one is
 * one error line naming the file, a run without one has the empty state;
 * the data window a step trains on skips exactly the skipped steps' windows;
 * heartbeats written by a rank read back field by field, and progress beats
 * inside a step refresh the time at most once a second. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "keel/run.h"

#include "../testlib.h"

static void write_text(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

static void test_state(const char *dir) {
    keel_run_state s;
    EXPECT(keel_run_state_read(dir, &s) == KEEL_OK && s.n_skips == 0 && s.restarts == 0 && s.n_excluded == 0,
           "no supervisor.json: the empty state");
    s.restarts = 3;
    keel_run_state_skip(&s, 9);
    keel_run_state_skip(&s, 2);
    keel_run_state_skip(&s, 9);
    s.excluded_nodes = keel_xmalloc(sizeof(char *), "nodes");
    s.excluded_nodes[s.n_excluded++] = keel_xstrdup("n2");
    EXPECT(s.n_skips == 2 && s.skip_steps[0] == 2 && s.skip_steps[1] == 9, "skips kept ascending, no duplicates");
    EXPECT(keel_run_state_write(dir, &s) == KEEL_OK, "supervisor.json written");
    keel_run_state back;
    EXPECT(keel_run_state_read(dir, &back) == KEEL_OK && back.restarts == 3 && back.n_skips == 2 &&
               back.skip_steps[0] == 2 && back.skip_steps[1] == 9 && back.n_excluded == 1 &&
               !strcmp(back.excluded_nodes[0], "n2"), "supervisor.json round-trips");
    /* step numbers in skip_steps are 1-based (as events name them); indices 0-based */
    uint64_t want[] = {0, 2, 3, 4, 5, 6, 7, 8, 10, 11};
    bool windows_ok = true;
    for (int i = 0; i < 10; i++) windows_ok &= keel_run_data_window(&back, i) == want[i];
    EXPECT(windows_ok, "steps 2 and 9 skip their windows: index 1 takes window 2, index 8 window 10");
    keel_run_state_free(&s);
    keel_run_state_free(&back);

    write_text(dir, KEEL_RUN_SUPERVISOR, "{\"skip_data_steps\": [\"two\"]}");
    capture_begin();
    keel_status st = keel_run_state_read(dir, &back);
    const char *err = capture_end();
    EXPECT(st == KEEL_ERR_INPUT && count_lines(err) == 1 && strstr(err, "supervisor.json") &&
               strstr(err, "skip_data_steps"), "damaged supervisor.json: one line naming it: %s", err);
    write_text(dir, KEEL_RUN_SUPERVISOR, "not json");
    capture_begin();
    st = keel_run_state_read(dir, &back);
    err = capture_end();
    EXPECT(st == KEEL_ERR_INPUT && strstr(err, "not a JSON object"), "unparsable supervisor.json: %s", err);
}

/* A rank blocked on collective 9 while its comm thread runs collective 8. */
static void sample(void *ctx, uint64_t *issued, uint64_t *running, uint64_t *waiting) {
    (void)ctx;
    *issued = 9, *running = 8, *waiting = 9;
}

static void test_heartbeat(const char *dir) {
    keel_heartbeat_info info;
    EXPECT(!keel_heartbeat_read(dir, 1, &info), "no heartbeat before a rank beats");
    keel_heartbeat *hb = keel_heartbeat_open(dir, 1);
    EXPECT(hb != NULL, "heartbeat opened (creates RUN/heartbeats)");
    keel_heartbeat_beat(hb, "ready", 40, 0);
    keel_heartbeat_beat(hb, "train", 41, 0);
    keel_heartbeat_beat(hb, "train", -1, 0); /* repeats step 41 */
    EXPECT(keel_heartbeat_read(dir, 1, &info) && !strcmp(info.phase, "train") && info.step == 41 &&
               info.start_step == 40 && info.pid == (int)getpid() && info.first_step_unix_s > 0 && info.node[0],
           "beat reads back: phase %s step %lld start %lld pid %d node %s", info.phase, (long long)info.step,
           (long long)info.start_step, info.pid, info.node);
    /* progress inside a step: the same phase and step, a fresh time, at most one write a second */
    double t0 = info.unix_s;
    keel_heartbeat_progress(hb, "forward");
    keel_heartbeat_info again;
    EXPECT(keel_heartbeat_read(dir, 1, &again) && again.unix_s == t0, "progress within a second of a beat writes nothing");
    usleep(1100 * 1000);
    keel_heartbeat_progress(hb, "backward");
    EXPECT(keel_heartbeat_read(dir, 1, &again) && again.unix_s >= t0 + 1.0 && !strcmp(again.phase, "train") &&
               again.step == 41 && again.start_step == 40 && !strcmp(again.doing, "backward") &&
               fabs(again.progress_unix_s - again.unix_s) < 0.01,
           "progress after a second: phase %s doing %s step %lld, %.2f s newer", again.phase, again.doing,
           (long long)again.step, again.unix_s - t0);
    /* the beat thread: the line rewritten with the collectives and no new progress */
    keel_heartbeat_start_beating(hb, sample, NULL);
    usleep((useconds_t)(3 * KEEL_BEAT_INTERVAL_S * 1e6));
    keel_heartbeat_info beat;
    EXPECT(keel_heartbeat_read(dir, 1, &beat) && beat.unix_s > again.unix_s + KEEL_BEAT_INTERVAL_S &&
               beat.progress_unix_s == again.progress_unix_s && beat.coll_issued == 9 && beat.coll_running == 8 &&
               beat.coll_waiting == 9 && !strcmp(beat.doing, "wait"),
           "the beat thread writes without progress: %.2f s newer, progress %.2f s older, issued %llu running %llu "
           "waiting %llu doing %s", beat.unix_s - again.unix_s, beat.unix_s - beat.progress_unix_s,
           (unsigned long long)beat.coll_issued, (unsigned long long)beat.coll_running,
           (unsigned long long)beat.coll_waiting, beat.doing);
    keel_heartbeat_beat(hb, "exit", -1, 76);
    EXPECT(keel_heartbeat_read(dir, 1, &info) && !strcmp(info.phase, "exit") && info.exit_code == 76 &&
               info.step == 41, "exit beat carries the exit code");
    keel_heartbeat_close(hb);
    keel_heartbeat_clear(dir, 2);
    EXPECT(!keel_heartbeat_read(dir, 1, &info), "cleared");
}

int main(void) {
    char dir[256];
    if (!temp_dir_create(dir, sizeof dir, "run-state")) return 1;
    test_state(dir);
    test_heartbeat(dir);
    remove_tree(dir);
    return test_summary("test_run_state");
}
