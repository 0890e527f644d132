/* resil/policy.c: what the supervisor does next (DESIGN §6) — pure
 * functions of the failure history and what just happened, so that every
 * rule is stated once and tested from a table (tests/resil/test_policy.c). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#include "keel/resil.h"
#include "keel/run.h"

const char *keel_end_name(keel_end e) {
    static const char *const names[] = {"completed", "stopped", "crash", "hang", "diverged", "input_error",
                                        "straggler", "unhealthy"};
    return names[e];
}

void keel_policy_history_init(keel_policy_history *h) {
    *h = (keel_policy_history){.fail_step = -1, .diverged_step = -1};
}

static keel_action act(keel_action_kind kind, const char *event, int exit_code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static keel_action act(keel_action_kind kind, const char *event, int exit_code, const char *fmt, ...) {
    keel_action a = {.kind = kind, .event = event, .exit_code = exit_code};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a.reason, sizeof a.reason, fmt, ap);
    va_end(ap);
    return a;
}

static void describe_checkpoint(char *out, size_t n, int64_t ckpt, const char *none) {
    if (ckpt > 0) snprintf(out, n, "the checkpoint at step %lld", (long long)ckpt);
    else snprintf(out, n, "%s", none);
}

/* A divergence: roll back; the same step again: skip its data window once;
 * after a skip, stop. */
static keel_action diverged(keel_policy_history *h, int64_t step, int64_t ckpt) {
    char back_to[64];
    describe_checkpoint(back_to, sizeof back_to, ckpt, "the start (no checkpoint yet)");
    if (h->skipped_step > 0)
        return act(KEEL_ACT_GIVE_UP, "stop", 1, "the loss diverged again in step %lld after step %lld's data "
                   "window was skipped: lower train.lr or raise train.warmup_steps (metrics.jsonl and "
                   "events.jsonl have the losses)", (long long)step, (long long)h->skipped_step);
    keel_action a;
    if (h->diverged_step == step) {
        h->skipped_step = step;
        a = act(KEEL_ACT_RELAUNCH, "skip_data", 0, "diverged twice in step %lld: skipping its data window once "
                "and rolling back to %s", (long long)step, back_to);
        a.skip_step = step;
    } else {
        a = act(KEEL_ACT_RELAUNCH, "rollback", 0, "diverged in step %lld: rolling back to %s", (long long)step,
                back_to);
    }
    h->diverged_step = step;
    return a;
}

/* A crash, a hang or a straggler killed. A failure in a later step than every
 * failure before it in the streak is progress (the attempt got further: with
 * in-memory snapshots it lost nothing) and starts the streak again; failing in
 * the same step again, or an earlier one, is not. resilience.crash_loop
 * failures in a row without progress stop the run. */
static keel_action failed(const keel_resilience_config *rc, keel_policy_history *h, const keel_outcome *o,
                          int64_t step) {
    if (step > h->fail_step) {
        h->fail_streak = 1;
        h->fail_step = step;
    } else {
        h->fail_streak++;
    }
    if (h->fail_streak >= rc->crash_loop)
        return act(KEEL_ACT_GIVE_UP, "stop", 1, "crash loop: %d failures in a row in step %lld or before, none "
                   "further than the first (resilience.crash_loop %d); the last in step %lld: %s", h->fail_streak,
                   (long long)h->fail_step, rc->crash_loop, (long long)step, o->cause);
    return act(KEEL_ACT_RELAUNCH, NULL, 0, "%s: %s", keel_end_name(o->kind), o->cause);
}

keel_action keel_policy_stopped(int64_t done, int64_t checkpoint, bool checkpointing) {
    keel_action a = {.kind = KEEL_ACT_STOP, .event = "stopped"};
    a.exit_code = keel_run_stopped(done, checkpoint, checkpointing, a.reason, sizeof a.reason);
    return a;
}

keel_action keel_policy_decide(const keel_resilience_config *rc, const keel_policy_history *before,
                               const keel_outcome *o, keel_policy_history *after) {
    *after = *before;
    int64_t step = o->done + 1; /* the step that failed */
    if (o->kind == KEEL_END_COMPLETED)
        return act(KEEL_ACT_FINISH, "completed", 0, "after %d restart(s)", before->restarts);
    if (o->kind == KEEL_END_STOPPED || (o->stop_requested && o->kind != KEEL_END_INPUT))
        return keel_policy_stopped(o->done, o->checkpoint, o->checkpointing);
    if (o->kind == KEEL_END_INPUT) return act(KEEL_ACT_GIVE_UP, "stop", 2, "%s", o->cause);
    if (o->kind == KEEL_END_UNHEALTHY) return act(KEEL_ACT_GIVE_UP, "stop", 1, "%s", o->cause);
    keel_action a = o->kind == KEEL_END_DIVERGED ? diverged(after, step, o->checkpoint)
                                                 : failed(rc, after, o, step);
    if (a.kind != KEEL_ACT_RELAUNCH) return a;
    if (before->restarts >= rc->max_restarts)
        return act(KEEL_ACT_GIVE_UP, "stop", 1, "gave up after %d restart(s) (resilience.max_restarts); last "
                   "failure: %s", before->restarts, o->cause);
    /* back off: none after progress (the first failure of a streak, a
     * divergence's rollback: a snapshot or checkpoint holds the work, relaunch
     * at once), then backoff_s, doubling while failures make no progress, at
     * most 5 minutes */
    int streak = o->kind == KEEL_END_DIVERGED ? 1 : after->fail_streak;
    a.backoff_s = streak <= 1 ? 0 : fmin(300, rc->backoff_s * pow(2, streak - 2));
    after->restarts++;
    return a;
}

keel_node_plan keel_policy_nodes(const keel_node_situation *s) {
    keel_node_plan p = {.kind = KEEL_NODES_KEEP, .nproc = s->nproc, .active = s->active};
    if (s->failed == 0) return p;
    if (s->local) {
        p.kind = KEEL_NODES_STOP;
        snprintf(p.reason, sizeof p.reason, "this machine (%s) failed the %s health check (see events.jsonl)",
                 s->first_failed_node, s->first_failed_check);
        return p;
    }
    if (s->usable >= s->active) {
        p.kind = KEEL_NODES_SPARE;
        return p;
    }
    /* no spare left for every failed node: shrink (same ranks per node) or stop */
    int per_node = s->nproc / s->active, want = s->usable * per_node;
    if (s->min_ranks <= 0 || want < s->min_ranks || s->usable == 0) {
        p.kind = KEEL_NODES_STOP;
        snprintf(p.reason, sizeof p.reason, "%d of the allocation's %d node(s) failed health checks and %s",
                 s->nodes - s->usable, s->nodes, s->min_ranks <= 0 ? "resilience.min_ranks is 0 (no shrinking)"
                                                                   : "shrinking would go below resilience.min_ranks");
        return p;
    }
    p.kind = KEEL_NODES_SHRINK;
    p.nproc = want;
    p.active = s->usable;
    return p;
}
