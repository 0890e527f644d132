/* run/state.c: RUN/supervisor.json — what the supervisor decided that
 * outlives a launch: restarts, skipped data windows, excluded nodes. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/run.h"

void keel_run_state_free(keel_run_state *s) {
    keel_free(s->skip_steps);
    for (int i = 0; i < s->n_excluded; i++) keel_free(s->excluded_nodes[i]);
    keel_free(s->excluded_nodes);
    memset(s, 0, sizeof *s);
}

void keel_run_state_skip(keel_run_state *s, int64_t step) {
    int at = 0;
    while (at < s->n_skips && s->skip_steps[at] < step) at++;
    if (at < s->n_skips && s->skip_steps[at] == step) return;
    s->skip_steps = keel_xrealloc(s->skip_steps, sizeof(int64_t) * (size_t)(s->n_skips + 1), "skipped steps");
    memmove(s->skip_steps + at + 1, s->skip_steps + at, sizeof(int64_t) * (size_t)(s->n_skips - at));
    s->skip_steps[at] = step;
    s->n_skips++;
}

uint64_t keel_run_data_window(const keel_run_state *s, int64_t step_index) {
    uint64_t window = (uint64_t)step_index;
    for (int i = 0; i < s->n_skips; i++) window += s->skip_steps[i] <= step_index + 1;
    return window;
}

static keel_status damaged(const char *path, const char *why) {
    keel_errorf("%s: %s; the supervisor writes this file, move it aside to start its state over", path, why);
    return KEEL_ERR_INPUT;
}

keel_status keel_run_state_read(const char *run_dir, keel_run_state *out) {
    memset(out, 0, sizeof *out);
    char path[4200];
    keel_run_path(path, sizeof path, run_dir, KEEL_RUN_SUPERVISOR);
    if (!keel_path_exists(path)) return KEEL_OK;
    char *text;
    keel_status st = keel_read_file(path, &text, NULL);
    if (st != KEEL_OK) return st;
    cJSON *o = cJSON_Parse(text);
    keel_free(text);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return damaged(path, "not a JSON object");
    }
    const cJSON *restarts = cJSON_GetObjectItemCaseSensitive(o, "restarts"),
                *skips = cJSON_GetObjectItemCaseSensitive(o, "skip_data_steps"),
                *nodes = cJSON_GetObjectItemCaseSensitive(o, "excluded_nodes"), *x;
    if ((restarts && !cJSON_IsNumber(restarts)) || (skips && !cJSON_IsArray(skips)) ||
        (nodes && !cJSON_IsArray(nodes)))
        st = damaged(path, "restarts must be a number, skip_data_steps and excluded_nodes lists");
    out->restarts = cJSON_IsNumber(restarts) ? restarts->valueint : 0;
    cJSON_ArrayForEach(x, skips) {
        if (!cJSON_IsNumber(x) || x->valuedouble < 0) {
            st = damaged(path, "skip_data_steps holds something other than step numbers");
            break;
        }
        keel_run_state_skip(out, (int64_t)x->valuedouble);
    }
    cJSON_ArrayForEach(x, nodes) {
        if (!cJSON_IsString(x)) continue;
        out->excluded_nodes = keel_xrealloc(out->excluded_nodes, sizeof(char *) * (size_t)(out->n_excluded + 1),
                                            "excluded nodes");
        out->excluded_nodes[out->n_excluded++] = keel_xstrdup(x->valuestring);
    }
    cJSON_Delete(o);
    if (st != KEEL_OK) keel_run_state_free(out);
    return st;
}

keel_status keel_run_state_write(const char *run_dir, const keel_run_state *s) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "restarts", s->restarts);
    cJSON *skips = cJSON_AddArrayToObject(o, "skip_data_steps");
    for (int i = 0; i < s->n_skips; i++) cJSON_AddItemToArray(skips, cJSON_CreateNumber((double)s->skip_steps[i]));
    cJSON *nodes = cJSON_AddArrayToObject(o, "excluded_nodes");
    for (int i = 0; i < s->n_excluded; i++) cJSON_AddItemToArray(nodes, cJSON_CreateString(s->excluded_nodes[i]));
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    keel_status st = keel_run_write_file(run_dir, KEEL_RUN_SUPERVISOR, text);
    free(text);
    return st;
}
