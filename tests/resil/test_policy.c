/* The supervisor's policy, table-driven: each scenario is a sequence of
 * launch outcomes fed to keel_policy_decide with the history carried from
 * one to the next (as the supervisor does when it relaunches), and the
 * action expected after each — crash, hang, divergence (rollback -> skip ->
 * stop), preemption, crash loop, max restarts, bad input — and the node plan
 * after health checks (keep, spare, shrink, stop). */
#include <stdio.h>
#include <string.h>

#include "keel/resil.h"

#include "../testlib.h"

typedef struct {
    keel_end kind;
    int64_t done, checkpoint;
    bool stop_requested;
    /* expected */
    keel_action_kind act;
    const char *event;      /* NULL: none */
    int exit_code;
    int64_t skip_step;
    double backoff_s;
    const char *reason;     /* a substring of the reason */
} step;

typedef struct {
    const char *name;
    int max_restarts, crash_loop;
    step steps[8];
    int n;
} scenario;

#define RELAUNCH(kind_, done_, ckpt_, backoff_) \
    {kind_, done_, ckpt_, false, KEEL_ACT_RELAUNCH, NULL, 0, 0, backoff_, ""}

static const scenario SCENARIOS[] = {
    {"completes", 10, 3, {{KEEL_END_COMPLETED, 50, 50, false, KEEL_ACT_FINISH, "completed", 0, 0, 0, "after 0 restart"}}, 1},
    {"a crash relaunches, the next one too, then it completes", 10, 3,
     {RELAUNCH(KEEL_END_CRASHED, 12, 10, 0), RELAUNCH(KEEL_END_CRASHED, 25, 20, 0),
      {KEEL_END_COMPLETED, 50, 50, false, KEEL_ACT_FINISH, "completed", 0, 0, 0, "after 2 restart"}}, 3},
    {"a hang is a failure like a crash", 10, 3, {RELAUNCH(KEEL_END_HUNG, 7, 5, 0)}, 1},
    {"the first failure relaunches at once, the same step again backs off, then a crash loop stops", 10, 3,
     {RELAUNCH(KEEL_END_CRASHED, 12, 10, 0), RELAUNCH(KEEL_END_HUNG, 12, 10, 1),
      {KEEL_END_CRASHED, 12, 10, false, KEEL_ACT_GIVE_UP, "stop", 1, 0, 0,
       "crash loop: 3 failures in a row in step 13 or before, none further than the first"}}, 3},
    {"failing earlier than before is no progress either", 10, 2,
     {RELAUNCH(KEEL_END_CRASHED, 12, 10, 0),
      {KEEL_END_CRASHED, 11, 10, false, KEEL_ACT_GIVE_UP, "stop", 1, 0, 0, "the last in step 12"}}, 2},
    {"a crash loop before any checkpoint", 10, 2,
     {RELAUNCH(KEEL_END_CRASHED, 3, 0, 0),
      {KEEL_END_CRASHED, 3, 0, false, KEEL_ACT_GIVE_UP, "stop", 1, 0, 0, "2 failures in a row in step 4"}}, 2},
    {"failing further each time is progress, with no checkpoint in between (kills at 12, 27, 41)", 10, 3,
     {RELAUNCH(KEEL_END_CRASHED, 11, 0, 0), RELAUNCH(KEEL_END_CRASHED, 26, 0, 0), RELAUNCH(KEEL_END_CRASHED, 40, 0, 0),
      {KEEL_END_COMPLETED, 60, 50, false, KEEL_ACT_FINISH, "completed", 0, 0, 0, "after 3 restart"}}, 4},
    {"progress starts the streak again: the same step twice after it stops only at crash_loop", 10, 3,
     {RELAUNCH(KEEL_END_CRASHED, 5, 0, 0), RELAUNCH(KEEL_END_CRASHED, 5, 0, 1), RELAUNCH(KEEL_END_CRASHED, 9, 0, 0),
      RELAUNCH(KEEL_END_CRASHED, 9, 0, 1),
      {KEEL_END_CRASHED, 8, 0, false, KEEL_ACT_GIVE_UP, "stop", 1, 0, 0, "3 failures in a row in step 10 or before"}}, 5},
    {"divergence: rollback, then skip the step's window, then stop", 10, 3,
     {{KEEL_END_DIVERGED, 6, 5, false, KEEL_ACT_RELAUNCH, "rollback", 0, 0, 0, "diverged in step 7: rolling back to the checkpoint at step 5"},
      {KEEL_END_DIVERGED, 6, 5, false, KEEL_ACT_RELAUNCH, "skip_data", 0, 7, 0, "diverged twice in step 7"},
      {KEEL_END_DIVERGED, 6, 5, false, KEEL_ACT_GIVE_UP, "stop", 1, 0, 0, "diverged again in step 7 after step 7's data window was skipped"}}, 3},
    {"divergence at different steps rolls back each time", 10, 3,
     {{KEEL_END_DIVERGED, 1, 0, false, KEEL_ACT_RELAUNCH, "rollback", 0, 0, 0, "rolling back to the start"},
      {KEEL_END_DIVERGED, 8, 5, false, KEEL_ACT_RELAUNCH, "rollback", 0, 0, 0, "diverged in step 9"}}, 2},
    {"preemption saves and asks to be resumed", 10, 3,
     {{KEEL_END_STOPPED, 30, 30, true, KEEL_ACT_STOP, "stopped", KEEL_EXIT_RESUME, 0, 0, "state saved at step 30"}}, 1},
    {"a stop request wins over the crash it caused", 10, 3,
     {{KEEL_END_CRASHED, 30, 25, true, KEEL_ACT_STOP, "stopped", KEEL_EXIT_RESUME, 0, 0, "run the same keel train command again"}}, 1},
    {"a stop without a checkpoint is not resumable: exit 1, and it says so", 10, 3,
     {{KEEL_END_CRASHED, 3, 0, true, KEEL_ACT_STOP, "stopped", 1, 0, 0,
       "stopped on a signal after step 3; nothing was saved to resume from (checkpointing is off"}}, 1},
    {"a stop after a failed save resumes from the older checkpoint", 10, 3,
     {{KEEL_END_STOPPED, 30, 20, true, KEEL_ACT_STOP, "stopped", KEEL_EXIT_RESUME, 0, 0,
       "the newest checkpoint is at step 20 (the save at the stop did not commit)"}}, 1},
    {"bad input stops at once with exit 2, even when asked to stop", 10, 3,
     {{KEEL_END_INPUT, 0, 0, true, KEEL_ACT_GIVE_UP, "stop", 2, 0, 0, "rejected"}}, 1},
    {"the relaunched ranks' mpi check failed: stop, not relaunch", 10, 3,
     {{KEEL_END_UNHEALTHY, 12, 10, false, KEEL_ACT_GIVE_UP, "stop", 1, 0, 0, "rejected"}}, 1},
    {"max_restarts gives up", 1, 5,
     {RELAUNCH(KEEL_END_CRASHED, 12, 10, 0),
      {KEEL_END_CRASHED, 22, 20, false, KEEL_ACT_GIVE_UP, "stop", 1, 0, 0, "gave up after 1 restart(s) (resilience.max_restarts)"}}, 2},
    {"max_restarts 0 gives up on the first failure", 0, 5,
     {{KEEL_END_HUNG, 2, 0, false, KEEL_ACT_GIVE_UP, "stop", 1, 0, 0, "gave up after 0 restart(s)"}}, 1},
};

static void run_scenario(const scenario *sc) {
    keel_resilience_config rc = {.max_restarts = sc->max_restarts, .crash_loop = sc->crash_loop, .backoff_s = 1};
    keel_policy_history h;
    keel_policy_history_init(&h);
    for (int i = 0; i < sc->n; i++) {
        const step *s = &sc->steps[i];
        char cause[64];
        snprintf(cause, sizeof cause, "%s rejected or failed", keel_end_name(s->kind));
        keel_outcome o = {.kind = s->kind, .done = s->done, .checkpoint = s->checkpoint,
                          .stop_requested = s->stop_requested, .cause = cause};
        keel_policy_history next;
        keel_action a = keel_policy_decide(&rc, &h, &o, &next);
        bool event_ok = s->event ? a.event && !strcmp(a.event, s->event) : a.event == NULL;
        EXPECT(a.kind == s->act && event_ok && a.exit_code == s->exit_code && a.skip_step == s->skip_step &&
                   (a.kind != KEEL_ACT_RELAUNCH || a.backoff_s == s->backoff_s) && strstr(a.reason, s->reason),
               "%s, launch %d (%s after %lld steps): action %d event %s exit %d skip %lld backoff %g: %s", sc->name,
               i + 1, keel_end_name(s->kind), (long long)s->done, a.kind, a.event ? a.event : "-", a.exit_code,
               (long long)a.skip_step, a.backoff_s, a.reason);
        EXPECT(next.restarts == h.restarts + (a.kind == KEEL_ACT_RELAUNCH),
               "%s, launch %d: only a relaunch counts a restart (%d -> %d)", sc->name, i + 1, h.restarts, next.restarts);
        h = next; /* the supervisor keeps the history of the actions it carried out */
    }
}

typedef struct {
    const char *name;
    keel_node_situation s;
    keel_node_action kind;
    int nproc, active;
    const char *reason;
} node_case;

static const node_case NODE_CASES[] = {
    {"no node failed", {.nodes = 3, .active = 2, .usable = 3, .failed = 0, .nproc = 4, .min_ranks = 0}, KEEL_NODES_KEEP, 4, 2, ""},
    {"a spare takes the failed node's place", {.nodes = 3, .active = 2, .usable = 2, .failed = 1, .nproc = 4}, KEEL_NODES_SPARE, 4, 2, ""},
    {"no spare: shrink keeps ranks per node", {.nodes = 2, .active = 2, .usable = 1, .failed = 1, .nproc = 4, .min_ranks = 2},
     KEEL_NODES_SHRINK, 2, 1, ""},
    {"no spare, min_ranks 0: stop", {.nodes = 2, .active = 2, .usable = 1, .failed = 1, .nproc = 2},
     KEEL_NODES_STOP, 2, 2, "1 of the allocation's 2 node(s) failed health checks and resilience.min_ranks is 0"},
    {"no spare, shrinking below min_ranks: stop", {.nodes = 4, .active = 4, .usable = 2, .failed = 2, .nproc = 8, .min_ranks = 6},
     KEEL_NODES_STOP, 8, 4, "shrinking would go below resilience.min_ranks"},
    {"every node failed: stop", {.nodes = 2, .active = 2, .usable = 0, .failed = 2, .nproc = 2, .min_ranks = 1},
     KEEL_NODES_STOP, 2, 2, "2 of the allocation's 2 node(s)"},
    {"this machine failed: a local run stops", {.local = true, .nodes = 1, .active = 1, .usable = 1, .failed = 1, .nproc = 2,
                                                .first_failed_node = "box", .first_failed_check = "gemm"},
     KEEL_NODES_STOP, 2, 1, "this machine (box) failed the gemm health check"},
};

/* A stop's last line and exit code, from what was saved (keel_policy_stopped). */
typedef struct {
    int64_t done, checkpoint;
    bool checkpointing;
    int exit_code;
    const char *reason; /* the whole line */
} stop_case;

static const stop_case STOPS[] = {
    {40, 40, true, KEEL_EXIT_RESUME,
     "stopped on a signal after step 40; state saved at step 40: run the same keel train command again to resume"},
    {40, 30, true, KEEL_EXIT_RESUME,
     "stopped on a signal after step 40; the newest checkpoint is at step 30 (the save at the stop did not commit): "
     "run the same keel train command again to resume from there"},
    {40, 0, true, 1, "stopped on a signal after step 40; nothing was saved to resume from (no checkpoint was committed)"},
    {40, 0, false, 1, "stopped on a signal after step 40; nothing was saved to resume from (checkpointing is off: set "
                      "checkpoint.every_steps to make a stop resumable)"},
};

int main(void) {
    for (size_t i = 0; i < sizeof SCENARIOS / sizeof *SCENARIOS; i++) run_scenario(&SCENARIOS[i]);
    for (size_t i = 0; i < sizeof STOPS / sizeof *STOPS; i++) {
        const stop_case *c = &STOPS[i];
        keel_action a = keel_policy_stopped(c->done, c->checkpoint, c->checkpointing);
        EXPECT(a.kind == KEEL_ACT_STOP && a.exit_code == c->exit_code && !strcmp(a.reason, c->reason),
               "stop after %lld, checkpoint %lld: action %d exit %d: %s", (long long)c->done,
               (long long)c->checkpoint, a.kind, a.exit_code, a.reason);
    }
    for (size_t i = 0; i < sizeof NODE_CASES / sizeof *NODE_CASES; i++) {
        const node_case *c = &NODE_CASES[i];
        keel_node_plan p = keel_policy_nodes(&c->s);
        EXPECT(p.kind == c->kind && p.nproc == c->nproc && p.active == c->active && strstr(p.reason, c->reason),
               "nodes: %s: plan %d, %d rank(s) on %d node(s) %s", c->name, p.kind, p.nproc, p.active, p.reason);
    }
    return test_summary("test_policy");
}
