/* train/profile.c: train.profile_steps — where a step's time goes, call by
 * call (train/profile.h). The backend's calls are timed by keel_backend_profiled;
 * this file places the window and reports it: RUN/profile.json and a table. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>

#include "keel/backend.h"
#include "keel/run.h"
#include "train/profile.h"

void trainer_profile_init(trainer *t) {
    if (t->cfg->train.profile_steps > 0) t->be = keel_backend_profiled(t->be);
}

bool trainer_profile_begin(trainer *t, int step) {
    const keel_train_config *c = &t->cfg->train;
    if (c->profile_steps <= 0) return false;
    if (step == t->start_step) { /* the launch's first step: place the window after it */
        t->profile.first = t->start_step + (c->steps - t->start_step >= 2);
        t->profile.end = t->profile.first + c->profile_steps;
        if (t->profile.end > c->steps) t->profile.end = c->steps;
    }
    t->profile.now = step >= t->profile.first && step < t->profile.end;
    if (t->profile.now) {
        keel_backend_profile_window(true);
        if (t->world) keel_comm_get_stats(t->world, &t->profile.comm_at);
    }
    return t->profile.now;
}

void trainer_profile_end(trainer *t, double step_s) {
    keel_backend_profile_window(false);
    t->profile.done++;
    t->profile.step_s += step_s;
    if (t->world) {
        keel_comm_stats now, *at = &t->profile.comm_at, *sum = &t->profile.comm;
        keel_comm_get_stats(t->world, &now);
        sum->transfer_s += now.transfer_s - at->transfer_s;
        sum->peer_wait_s += now.peer_wait_s - at->peer_wait_s;
        sum->cpu_s += now.cpu_s - at->cpu_s;
        sum->bytes += now.bytes - at->bytes;
    }
}

void trainer_profile_report(trainer *t, bool final) {
    if (t->profile.done == 0 || t->profile.reported || !t->leader) return;
    if (!final && t->profile.done < t->profile.end - t->profile.first) return;
    t->profile.reported = true;
    keel_backend_op_time ops[KEEL_BACKEND_PROFILE_OPS];
    int n = keel_backend_profile_read(ops, KEEL_BACKEND_PROFILE_OPS);
    double in_calls = 0;
    for (int i = 0; i < n; i++) in_calls += ops[i].seconds;
    const double total = t->profile.step_s, outside = total > in_calls ? total - in_calls : 0;
    const int first = t->profile.first + 1, last = t->profile.first + t->profile.done;
    const bool waited = t->be->kind != KEEL_BACKEND_CPU; /* a CPU's calls return done: nothing to wait for */

    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "first_step", first);
    cJSON_AddNumberToObject(o, "steps", t->profile.done);
    cJSON_AddStringToObject(o, "device", t->be->name);
    cJSON_AddStringToObject(o, "mixed_precision", t->bf16 ? "bf16" : "fp32");
    cJSON_AddNumberToObject(o, "rank", t->rank);
    cJSON_AddNumberToObject(o, "world_size", t->world_size);
    cJSON_AddBoolToObject(o, "calls_waited_for", waited);
    cJSON_AddNumberToObject(o, "step_s", total);
    cJSON_AddNumberToObject(o, "in_calls_s", in_calls);
    cJSON_AddNumberToObject(o, "outside_calls_s", outside);
    cJSON *arr = cJSON_AddArrayToObject(o, "ops");
    char steps[48];
    if (last > first) snprintf(steps, sizeof steps, "steps %d-%d", first, last);
    else snprintf(steps, sizeof steps, "step %d", first);
    keel_progress_note(&t->progress, "profile of %s (rank %d, %s%s): %.3f s", steps, t->rank, t->be->name,
                       waited ? ", each call waited for" : "", total);
    keel_progress_note(&t->progress, "  %-26s %8s %10s %7s %9s", "call", "calls", "seconds", "share", "TFLOP/s");
    for (int i = 0; i < n; i++) {
        cJSON *e = cJSON_CreateObject();
        double share = total > 0 ? ops[i].seconds / total : 0;
        cJSON_AddStringToObject(e, "op", ops[i].op);
        cJSON_AddNumberToObject(e, "calls", (double)ops[i].calls);
        cJSON_AddNumberToObject(e, "seconds", ops[i].seconds);
        cJSON_AddNumberToObject(e, "share", share);
        char rate[16] = "";
        if (ops[i].flops > 0) {
            cJSON_AddNumberToObject(e, "flops", ops[i].flops);
            if (ops[i].seconds > 0) {
                cJSON_AddNumberToObject(e, "tflops_per_s", ops[i].flops / ops[i].seconds / 1e12);
                snprintf(rate, sizeof rate, "%.2f", ops[i].flops / ops[i].seconds / 1e12);
            }
        }
        cJSON_AddItemToArray(arr, e);
        keel_progress_note(&t->progress, *rate ? "  %-26s %8lld %10.4f %6.1f%% %9s" : "  %-26s %8lld %10.4f %6.1f%%%s",
                           ops[i].op, (long long)ops[i].calls, ops[i].seconds, 100 * share, rate);
    }
    keel_progress_note(&t->progress, "  %-26s %8s %10.4f %6.1f%%", "(outside the calls)", "", outside,
                       total > 0 ? 100 * outside / total : 0);
    if (t->world) { /* on its own thread, beside the calls above: cores it took from them where they are few */
        cJSON *c = cJSON_AddObjectToObject(o, "comm_thread");
        const keel_comm_stats *sum = &t->profile.comm;
        cJSON_AddNumberToObject(c, "transfer_s", sum->transfer_s);
        cJSON_AddNumberToObject(c, "peer_wait_s", sum->peer_wait_s);
        cJSON_AddNumberToObject(c, "cpu_s", sum->cpu_s);
        cJSON_AddNumberToObject(c, "bytes", (double)sum->bytes);
        keel_progress_note(&t->progress,
                           "  comm thread, beside them: %.4f s (%.1f%%) moving %.2f GB, %.4f s waiting for peers, "
                           "%.4f s (%.1f%%) on a core",
                           sum->transfer_s, total > 0 ? 100 * sum->transfer_s / total : 0, (double)sum->bytes / 1e9,
                           sum->peer_wait_s, sum->cpu_s, total > 0 ? 100 * sum->cpu_s / total : 0);
    }
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (keel_run_write_file(t->run_dir, KEEL_RUN_PROFILE, text) == KEEL_OK)
        keel_progress_note(&t->progress, "  written to %s/%s", t->run_dir, KEEL_RUN_PROFILE);
    free(text);
}
