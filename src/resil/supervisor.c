/* resil/supervisor.c: `keel train --nproc N` — launch the ranks, watch them,
 * and on failure ask the policy (policy.c) what to do: relaunch (from the
 * newest in-memory snapshot or checkpoint) after health checks, or stop with
 * a report.
 *
 * The supervisor is not an MPI rank: it starts the launcher (mpirun, or srun
 * in a Slurm allocation) in a process group of its own and polls every
 * 50 ms: the launcher's stderr (passed through; it names a failed rank), its
 * exit status, each rank's heartbeat (RUN/heartbeats/rank-R) and its own
 * signals. MPI is fail-stop here, so every failure ends the whole launch;
 * recovery is a relaunch, and the workers resume from the newest in-memory
 * snapshot or checkpoint that verifies (train/resume.c). What it decided and why goes to RUN/events.jsonl. */
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/ckpt.h"
#include "keel/monitor.h"
#include "keel/resil.h"
#include "keel/run.h"

#define POLL_MS 50
#define MAX_RECOVERIES 1024
#define SLURM_CMD_TIMEOUT_S 30 /* scontrol, scancel: a slurmctld that stops answering must not stop us */
#define NODE_HEALTH_TIMEOUT_S 120

static volatile sig_atomic_t g_stop;
static void on_stop(int sig) { g_stop = sig; }

/* Where a recovery's time went: failure -> detected -> health checks ->
 * backoff -> ranks launched and their state loaded -> first step done. */
typedef struct {
    double detect_s, health_s, backoff_s, launch_s, restore_s, first_step_s;
    char source[16];             /* where the state came from: memory, disk, none */
} recovery_split;

typedef struct {
    const keel_config *cfg;
    const char *run_dir;
    char self[PATH_MAX];
    int nproc;
    /* Slurm: the allocation's nodes; the first `active` usable ones run ranks */
    char **nodes;
    bool *excluded;
    int n_nodes, active;
    keel_policy_history history;
    keel_run_state state;        /* RUN/supervisor.json */
    /* what happened */
    int64_t lost_steps, first_resumed;
    int64_t lost_done, lost_step; /* a failure waiting for the relaunch's restored step: steps done, failed step (-1: none) */
    double recovery[MAX_RECOVERIES];
    int n_recovery;
    double pending_failure_unix; /* a failure waiting for the next first step: when it began (0: none) */
    double pending_detect_s, pending_health_s, pending_backoff_s; /* its recovery so far */
    recovery_split split[MAX_RECOVERIES];
    double slowest_gap_s;        /* longest time between two progress marks of a training rank seen */
    char straggler_node[64];     /* resilience.straggler_action drain: the node to take out (empty: none) */
    char mpi_shm[64];            /* OpenMPI's shared-memory files of the local ranks ("": not ours to clean) */
    bool probe_mpi;              /* the next launch's ranks run the mpi check first (KEEL_MPI_PROBE) */
} supervisor;

/* One launch, watched until its launcher exits. */
typedef struct {
    supervisor *sv;
    keel_proc *proc;
    const char *launcher;        /* argv[0], for messages */
    FILE *log;                   /* RUN/logs/launcher.log */
    keel_watch w;                /* the ranks' heartbeats and the hang rules (keel/run.h) */
    bool *signaled;              /* (nproc) the stop signal was forwarded */
    double killed_unix;
    bool failed;                 /* the supervisor saw a crash or hang and killed the launch */
    bool stopping;               /* the supervisor asked the ranks to stop (a signal came) */
    /* how it ended */
    keel_end kind;
    int exit_code, rank, sig;    /* the launcher's exit code; the rank blamed and its signal (-1, 0) */
    int64_t done, resumed;       /* steps done (rank 0's beat); the step it resumed from (-1: never) */
    double detected_unix, onset_unix; /* when the supervisor saw the failure; when it began (last sign of life) */
    char cause[768];
    char node[64];               /* the blamed rank's node, from its heartbeat ("" when unknown) */
    keel_straggler_watch stragglers;
    double *compute_s;           /* (nproc) scratch: the ranks' compute seconds of one step */
} launch;

/* Whether the run saves checkpoints (and so saves one when it stops). */
static bool checkpointing(const keel_config *cfg) {
    return cfg->checkpoint.every_steps > 0 || cfg->checkpoint.every_seconds > 0;
}

static int64_t newest_checkpoint(const char *run_dir) {
    int64_t *steps;
    int n = keel_ckpt_list(run_dir, &steps);
    int64_t s = n > 0 ? steps[0] : 0;
    keel_free(steps);
    return s;
}

void keel_outcome_run_state(keel_outcome *o, const keel_config *cfg, const char *run_dir) {
    o->checkpoint = newest_checkpoint(run_dir);
    o->checkpointing = checkpointing(cfg);
}

/* The nodes ranks run on: the first `active` ones not excluded, comma-separated. */
static void active_nodelist(const supervisor *sv, char *out, size_t n) {
    out[0] = 0;
    for (int i = 0, used = 0; i < sv->n_nodes && used < sv->active; i++)
        if (!sv->excluded[i])
            snprintf(out + strlen(out), n - strlen(out), "%s%s", used++ ? "," : "", sv->nodes[i]);
}

/* ---- watching one launch ---------------------------------------------------------- */

/* Signal rank `only` (-1: every rank): by pid on this machine; in Slurm the
 * rank's whole step through scancel. */
static void signal_ranks(const launch *l, int sig, int only) {
    for (int r = 0; r < l->sv->nproc; r++) {
        if (!l->w.have[r] || (only >= 0 && r != only)) continue;
        if (keel_launch_in_slurm() && strcmp(l->w.hb[r].slurm_step, "-")) {
            char *argv[] = {"scancel", sig == SIGKILL ? "--signal=KILL" : "--signal=TERM", l->w.hb[r].slurm_step, NULL};
            char out[256];
            keel_run_capture(argv, SLURM_CMD_TIMEOUT_S, out, sizeof out); /* the step may be gone already */
        } else if (keel_launch_ranks_here() && l->w.hb[r].pid > 0) {
            kill(l->w.hb[r].pid, sig);
        }
    }
}

/* A launcher stderr line: to RUN/logs/launcher.log, and to the terminal until
 * the supervisor kills the launch or asks its ranks to stop (what follows is
 * the launcher's account of that kill or stop — mpirun's banner for ranks
 * that exited non-zero — which the supervisor's own line explains better). */
static void on_launcher_line(void *ctx, const char *line) {
    launch *l = ctx;
    if (!l->failed && !l->stopping) fprintf(stderr, "%s\n", line);
    if (l->log) fprintf(l->log, "%s\n", line);
    int sig, rank = keel_launch_blamed_rank(line, &sig);
    if (rank >= 0 && l->rank < 0) l->rank = rank;
    if (sig > 0 && l->sig == 0) l->sig = sig;
}

/* The steps a failure lost: those done after the state the run goes on from
 * (`from`: the relaunch's restored step, or the newest checkpoint when the
 * run stops). */
static void record_lost(supervisor *sv, int64_t from, const char *source) {
    if (sv->lost_done < 0) return;
    int64_t lost = sv->lost_done > from ? sv->lost_done - from : 0;
    sv->lost_steps += lost;
    keel_event_with(sv->run_dir, "lost_work", sv->lost_step, &(keel_event_fields){.steps = lost},
                    "%lld step(s) done after the state at step %lld (%s)", (long long)lost, (long long)from, source);
    sv->lost_done = -1;
}

/* The first step after a failure: the recovery is complete. */
static void note_recovery(launch *l) {
    supervisor *sv = l->sv;
    const keel_heartbeat_info *h = &l->w.hb[0];
    if (sv->pending_failure_unix == 0 || !l->w.have[0] || h->first_step_unix_s == 0) return;
    double r = h->first_step_unix_s - sv->pending_failure_unix;
    recovery_split x = {.detect_s = sv->pending_detect_s, .health_s = sv->pending_health_s,
                        .backoff_s = sv->pending_backoff_s, .restore_s = h->restore_s,
                        .launch_s = fmax(0, h->ready_unix_s - l->w.launched_unix - h->restore_s),
                        .first_step_s = fmax(0, h->first_step_unix_s - h->ready_unix_s)};
    snprintf(x.source, sizeof x.source, "%s", h->restore_source);
    record_lost(sv, h->start_step, x.source);
    if (sv->n_recovery < MAX_RECOVERIES) sv->split[sv->n_recovery] = x, sv->recovery[sv->n_recovery++] = r;
    keel_event_with(sv->run_dir, "recovered", h->start_step + 1,
                    &(keel_event_fields){.has_seconds = true, .seconds = r}, "first step after the failure done %.2f s "
                    "after it began: detect %.2f, health %.2f, backoff %.2f, launch %.2f, restore %.2f from %s (step "
                    "%lld), first step %.2f", r, x.detect_s, x.health_s, x.backoff_s, x.launch_s, x.restore_s,
                    x.source, (long long)h->start_step, x.first_step_s);
    sv->pending_failure_unix = 0;
}

/* Preemption: ask every rank to checkpoint at the next step boundary. Ranks
 * catch the signal from their first heartbeat on; one still starting gets it later. */
static void forward_stop(launch *l) {
    l->stopping = true;
    bool first = true, remote = !keel_launch_in_slurm() && !keel_launch_ranks_here();
    for (int r = 0; r < l->sv->nproc; r++) first &= !l->signaled[r];
    if (first)
        keel_event_with(l->sv->run_dir, "preempt", l->w.have[0] ? l->w.hb[0].step : -1,
                        &(keel_event_fields){.cause = "preempted"}, "signal %d: asking the ranks to "
                        "checkpoint at the next step boundary and exit%s", (int)g_stop,
                        remote ? " (through mpirun: the ranks run on the hostfile's hosts)" : "");
    if (remote) {
        /* over a hostfile the ranks are on other hosts: mpirun forwards SIGUSR1
         * (a stop, as SIGTERM), once every rank can catch it */
        bool all = true;
        for (int r = 0; r < l->sv->nproc; r++) all &= l->w.have[r];
        if (all && !l->signaled[0]) keel_proc_kill(l->proc, SIGUSR1);
        for (int r = 0; r < l->sv->nproc && all; r++) l->signaled[r] = true;
        return;
    }
    for (int r = 0; r < l->sv->nproc; r++)
        if (l->w.have[r] && !l->signaled[r]) {
            signal_ranks(l, SIGTERM, r);
            l->signaled[r] = true;
        }
}

/* onset: the failure's last sign of life (a beat, a progress mark), 0: now. */
static void fail_launch(launch *l, keel_end kind, int rank, double now, double onset) {
    l->onset_unix = onset > 0 && onset <= now ? onset : now;
    l->kind = kind;
    l->rank = rank;
    l->failed = true;
    l->detected_unix = now;
    signal_ranks(l, SIGKILL, -1);
    keel_proc_kill(l->proc, SIGKILL);
    l->killed_unix = now;
}

/* A rank gone without saying goodbye (killed, crashed) while no rank reported
 * an error of its own: the launcher would notice in seconds; act now. */
static bool detect_crash(launch *l, double now) {
    keel_watch_finding f;
    if (!keel_watch_dead(&l->w, keel_launch_ranks_here(), NULL, &f)) return false;
    snprintf(l->cause, sizeof l->cause, "%s", f.cause);
    fail_launch(l, KEEL_END_CRASHED, f.rank, now, f.onset_unix);
    return true;
}

/* A hang, and whose it is (keel_watch_hung). */
static bool detect_hang(launch *l, double now) {
    keel_watch_finding f;
    if (!keel_watch_hung(&l->w, now, keel_launch_ranks_here(), NULL, &f)) return false;
    snprintf(l->cause, sizeof l->cause, "%s", f.cause);
    fail_launch(l, KEEL_END_HUNG, f.rank, now, f.onset_unix);
    return true;
}

/* Ranks outlive their launcher for a moment: never start the next launch beside them. */
static void reap_leftover_ranks(launch *l) {
    keel_watch_read(&l->w, l->sv->run_dir);
    if (!keel_launch_ranks_here()) return;
    for (int r = 0; r < l->sv->nproc; r++)
        for (int i = 0; l->w.have[r] && l->w.hb[r].pid > 0 && keel_pid_alive(l->w.hb[r].pid) && i < 100; i++) {
            kill(l->w.hb[r].pid, SIGKILL);
            keel_sleep_s(0.05);
        }
}

/* A launch the supervisor did not kill: its exit code says how it went. */
static void classify_exit(launch *l) {
    const char *run_dir = l->sv->run_dir;
    int code = l->exit_code;
    l->detected_unix = keel_unix_s();
    /* the rank that reported an exit code of its own is the one to name (not one that lost a peer) */
    for (int r = 0; r < l->sv->nproc && l->rank < 0; r++)
        if (l->w.have[r] && !strcmp(l->w.hb[r].phase, "exit") && l->w.hb[r].exit_code != 0 &&
            l->w.hb[r].exit_code != KEEL_EXIT_PEER_LOST)
            l->rank = r;
    l->onset_unix = l->detected_unix; /* the blamed rank's last beat, when there is one */
    if (l->rank >= 0 && l->w.have[l->rank]) l->onset_unix = fmin(l->w.hb[l->rank].unix_s, l->detected_unix);
    l->kind = code == 0                    ? KEEL_END_COMPLETED
              : code == KEEL_EXIT_RESUME   ? KEEL_END_STOPPED
              : code == KEEL_EXIT_DIVERGED ? KEEL_END_DIVERGED
              : code == KEEL_EXIT_UNHEALTHY ? KEEL_END_UNHEALTHY
              : code == 2                  ? KEEL_END_INPUT
                                           : KEEL_END_CRASHED;
    if (l->kind == KEEL_END_CRASHED && l->rank >= 0)
        snprintf(l->cause, sizeof l->cause, "rank %d failed (%s exit %d%s%s); its log: %s/logs/rank-%d.log",
                 l->rank, l->launcher, code, l->sig ? ", signal " : "", l->sig ? strsignal(l->sig) : "", run_dir,
                 l->rank);
    else if (l->kind == KEEL_END_CRASHED)
        snprintf(l->cause, sizeof l->cause, "the ranks failed (%s exit %d); logs: %s/logs/", l->launcher, code,
                 run_dir);
    else if (l->kind == KEEL_END_DIVERGED)
        snprintf(l->cause, sizeof l->cause, "the loss diverged (NaN/Inf or above resilience.max_loss) in step %lld",
                 (long long)l->done + 1);
    else if (l->kind == KEEL_END_INPUT)
        snprintf(l->cause, sizeof l->cause, "a rank rejected its input (exit 2); see %s/logs/", run_dir);
    else if (l->kind == KEEL_END_UNHEALTHY)
        snprintf(l->cause, sizeof l->cause, "the MPI all-reduce check failed on the relaunched ranks (the mpi "
                 "health event in %s/events.jsonl)", run_dir);
}

int keel_straggler_report(keel_straggler_watch *s, const keel_watch *w, const char *run_dir, const char *then,
                          double *compute_s, double *ratio) {
    int n = s->nproc;
    for (int r = 0; r < n; r++)
        if (!w->have[r] || strcmp(w->hb[r].phase, "train") || w->hb[r].step != w->hb[0].step ||
            w->hb[r].step <= w->hb[r].start_step)
            return -1;
    for (int r = 0; r < n; r++) compute_s[r] = w->hb[r].compute_s;
    double median;
    int r = keel_straggler_observe(s, w->hb[0].step, compute_s, ratio, &median);
    if (r < 0) return -1;
    keel_event_with(run_dir, "straggler", w->hb[r].step,
                    &(keel_event_fields){.cause = "straggler", .has_rank = true, .rank = r, .node = w->hb[r].node,
                                         .has_seconds = true, .seconds = compute_s[r]},
                    "rank %d on %s: %.3f s of compute a step, %.2fx the other ranks' median %.3f s, %d steps in a "
                    "row (resilience.straggler_factor %g)%s", r, w->hb[r].node, compute_s[r], *ratio, median,
                    s->steps, s->factor, then);
    keel_log_warn("straggler: rank %d on %s is %.2fx slower than the others", r, w->hb[r].node, *ratio);
    return r;
}

/* A straggler is an event (and, with straggler_action drain, a failed launch
 * whose node the relaunch leaves out). */
static void detect_straggler(launch *l, double now) {
    supervisor *sv = l->sv;
    const keel_resilience_config *rc = &sv->cfg->resilience;
    bool drain = rc->straggler_action == KEEL_STRAGGLER_DRAIN;
    double ratio;
    int r = keel_straggler_report(&l->stragglers, &l->w, sv->run_dir,
                                  drain ? "; straggler_action drain: relaunching without its node" : "", l->compute_s,
                                  &ratio);
    if (r < 0 || !drain) return;
    snprintf(sv->straggler_node, sizeof sv->straggler_node, "%s", l->w.hb[r].node);
    snprintf(l->cause, sizeof l->cause, "rank %d on %s computed %.2fx slower than the others for %d steps", r,
             l->w.hb[r].node, ratio, rc->straggler_steps);
    fail_launch(l, KEEL_END_STRAGGLER, r, now, 0);
}

/* One poll: what the ranks did, and whether the launch has failed. */
static void watch_step(launch *l) {
    double now = keel_unix_s();
    keel_watch_read(&l->w, l->sv->run_dir);
    note_recovery(l);
    if (!l->failed) detect_straggler(l, now);
    if (g_stop) forward_stop(l);
    if (!l->failed) {
        if (!detect_crash(l, now)) detect_hang(l, now);
    } else if (now - l->killed_unix > 10) { /* the launcher ignores us: make sure */
        keel_proc_kill(l->proc, SIGKILL);
        l->killed_unix = now;
    }
}

/* Launch the ranks and watch them until the launcher exits; l says how it ended. */
static keel_status run_launch(supervisor *sv, launch *l) {
    int n = sv->nproc;
    *l = (launch){.sv = sv, .rank = -1, .resumed = -1};
    keel_watch_init(&l->w, &sv->cfg->resilience, n, keel_unix_s(), sv->slowest_gap_s);
    keel_heartbeat_clear(sv->run_dir, n);
    char nodelist[4096] = "";
    keel_launch_spec spec = {.nproc = n};
    if (sv->nodes) {
        active_nodelist(sv, nodelist, sizeof nodelist);
        spec.nodelist = nodelist;
        spec.nodes = sv->active;
    }
    const char *args[] = {"worker", sv->run_dir, NULL};
    char **argv = keel_launch_argv(sv->self, &spec, args);
    if (sv->probe_mpi) setenv(KEEL_MPI_PROBE_ENV, "1", 1);
    keel_status st = keel_proc_start(argv, &l->proc);
    unsetenv(KEEL_MPI_PROBE_ENV);
    sv->probe_mpi = false;
    if (st != KEEL_OK) {
        keel_watch_free(&l->w);
        keel_launch_argv_free(argv);
        return st;
    }
    l->launcher = argv[0];
    char path[4200];
    keel_run_path(path, sizeof path, sv->run_dir, KEEL_RUN_LOGS "/launcher.log");
    if ((l->log = fopen(path, "a"))) fprintf(l->log, "---- %s\n", argv[0]);
    l->signaled = keel_xcalloc(sizeof(bool) * (size_t)n, "heartbeats");
    l->compute_s = keel_xcalloc(sizeof(double) * (size_t)n, "compute times");
    keel_straggler_init(&l->stragglers, n, sv->cfg->resilience.straggler_factor, sv->cfg->resilience.straggler_steps);
    while (!keel_proc_exited(l->proc, NULL)) {
        keel_proc_read_lines(l->proc, POLL_MS, on_launcher_line, l);
        watch_step(l);
    }
    l->exit_code = keel_proc_finish(l->proc, on_launcher_line, l);
    if (l->log) fclose(l->log);
    reap_leftover_ranks(l);
    keel_launch_shm_clear(sv->mpi_shm, false); /* ranks killed by a failure leave theirs */
    l->done = l->w.have[0] ? l->w.hb[0].step : 0;
    l->resumed = l->w.have[0] ? l->w.hb[0].start_step : -1;
    if (!l->failed) classify_exit(l);
    else if (l->sig && l->kind == KEEL_END_CRASHED)
        snprintf(l->cause + strlen(l->cause), sizeof l->cause - strlen(l->cause), " (%s)", strsignal(l->sig));
    if (l->rank >= 0 && l->rank < n && l->w.have[l->rank]) snprintf(l->node, sizeof l->node, "%s", l->w.hb[l->rank].node);
    sv->slowest_gap_s = l->w.slowest_gap_s;
    keel_watch_free(&l->w);
    keel_free(l->signaled);
    keel_free(l->compute_s);
    keel_straggler_free(&l->stragglers);
    keel_launch_argv_free(argv);
    l->launcher = NULL;
    return KEEL_OK;
}

/* ---- nodes ------------------------------------------------------------------------ */

static void save_state(supervisor *sv) {
    sv->state.restarts = sv->history.restarts;
    for (int i = 0; i < sv->state.n_excluded; i++) keel_free(sv->state.excluded_nodes[i]);
    sv->state.n_excluded = 0;
    for (int i = 0; i < sv->n_nodes; i++)
        if (sv->excluded[i]) {
            sv->state.excluded_nodes = keel_xrealloc(sv->state.excluded_nodes,
                                                     sizeof(char *) * (size_t)(sv->state.n_excluded + 1), "nodes");
            sv->state.excluded_nodes[sv->state.n_excluded++] = keel_xstrdup(sv->nodes[i]);
        }
    if (keel_run_state_write(sv->run_dir, &sv->state) != KEEL_OK)
        keel_log_warn("%s/%s not written: a relaunch may repeat a skipped data window", sv->run_dir,
                      KEEL_RUN_SUPERVISOR);
}

/* In a Slurm allocation: its nodes, the first nodes - spares of them active. */
static keel_status init_nodes(supervisor *sv) {
    if (!keel_launch_in_slurm()) return KEEL_OK;
    const char *list = getenv("SLURM_JOB_NODELIST");
    char *argv[] = {"scontrol", "show", "hostnames", (char *)(list ? list : ""), NULL};
    char out[65536];
    int rc = list ? keel_run_capture(argv, SLURM_CMD_TIMEOUT_S, out, sizeof out) : -1;
    char *save = NULL;
    for (char *line = rc == 0 ? strtok_r(out, "\r\n", &save) : NULL; line; line = strtok_r(NULL, "\r\n", &save)) {
        sv->nodes = keel_xrealloc(sv->nodes, sizeof(char *) * (size_t)(sv->n_nodes + 1), "nodes");
        sv->nodes[sv->n_nodes++] = keel_xstrdup(line);
    }
    if (sv->n_nodes == 0) { /* not knowable: let srun place the ranks as it likes */
        keel_log_warn("SLURM_JOB_NODELIST unreadable (scontrol): node health and replacement are off");
        return KEEL_OK;
    }
    sv->excluded = keel_xcalloc(sizeof(bool) * (size_t)sv->n_nodes, "nodes");
    int spares = sv->cfg->resilience.spares;
    if (spares >= sv->n_nodes) {
        keel_errorf("resilience.spares %d leaves none of the allocation's %d node(s) to train on; "
                    "lower it or allocate more nodes", spares, sv->n_nodes);
        return KEEL_ERR_INPUT;
    }
    sv->active = sv->n_nodes - spares;
    if (sv->nproc % sv->active != 0) {
        keel_errorf("--nproc %d does not spread evenly over %d active node(s) (%d allocated, "
                    "resilience.spares %d); pick a multiple", sv->nproc, sv->active, sv->n_nodes, spares);
        return KEEL_ERR_INPUT;
    }
    return KEEL_OK;
}

/* Log each check of one node's JSON report as an event; the first failed
 * check's name (empty when all passed) goes to failed_check. */
static bool report_health(const char *run_dir, const char *node, const char *json, char *failed_check, size_t n) {
    cJSON *o = cJSON_Parse(json);
    const cJSON *checks = cJSON_GetObjectItemCaseSensitive(o, "checks"), *c;
    failed_check[0] = 0;
    if (!cJSON_IsArray(checks)) {
        keel_event(run_dir, "health", -1, "node %s: no report (%.200s)", node, json);
        snprintf(failed_check, n, "report");
        cJSON_Delete(o);
        return false;
    }
    cJSON_ArrayForEach(c, checks) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(c, "name"),
                    *status = cJSON_GetObjectItemCaseSensitive(c, "status"),
                    *detail = cJSON_GetObjectItemCaseSensitive(c, "detail");
        if (!cJSON_IsString(name) || !cJSON_IsString(status)) continue;
        keel_event(run_dir, "health", -1, "node %s: %s %s: %s", node, name->valuestring, status->valuestring,
                   cJSON_IsString(detail) ? detail->valuestring : "");
        if (!strcmp(status->valuestring, "fail") && !failed_check[0])
            snprintf(failed_check, n, "%s", name->valuestring);
    }
    cJSON_Delete(o);
    return failed_check[0] == 0;
}

bool keel_health_here(const keel_config *cfg, const char *run_dir, const char *node, int nproc, char *failed,
                      size_t n) {
    unsigned checks = cfg->resilience.health_checks & ~(1u << KEEL_CHECK_MPI);
    failed[0] = 0;
    if (!checks) return true;
    char ckpt_dir[4200], here[64];
    keel_run_path(ckpt_dir, sizeof ckpt_dir, run_dir, "checkpoints");
    if (!node) keel_node_name(here, sizeof here), node = here;
    keel_health_options o = {.cfg = cfg, .dir = ckpt_dir, .nproc = nproc, .checks = checks,
                             .gemm_floor_gflops = cfg->resilience.gemm_floor_gflops};
    keel_health_result r[KEEL_CHECK_COUNT];
    int count = keel_health_run(&o, r);
    char *json = keel_health_json(node, r, count);
    bool ok = report_health(run_dir, node, json, failed, n);
    free(json);
    if (!ok)
        keel_event_with(run_dir, "node_excluded", -1, &(keel_event_fields){.cause = "health", .node = node},
                        "node %s failed the %s check", node, failed);
    return ok;
}

/* Node i's checks through `srun -w NODE keel health`, bounded in time (a
 * node that stopped answering would wait for good); a failing node is
 * drained with its reason and excluded. */
/* Take node i out of the job: drained in Slurm with reason "keel: <check>"
 * (excluded from our launches if scontrol fails). cause: the failure's, or
 * NULL when an event already counted it. */
static void drain_node(supervisor *sv, int i, const char *check, const char *cause) {
    char reason[96];
    snprintf(reason, sizeof reason, "reason=keel: %s", check);
    char state_arg[] = "state=drain", nodename[300];
    snprintf(nodename, sizeof nodename, "nodename=%s", sv->nodes[i]);
    char *drain[] = {"scontrol", "update", nodename, state_arg, reason, NULL};
    char drain_out[1024];
    int rc = keel_run_capture(drain, SLURM_CMD_TIMEOUT_S, drain_out, sizeof drain_out);
    keel_event_with(sv->run_dir, "node_drained", -1, &(keel_event_fields){.cause = cause, .node = sv->nodes[i]},
                    "node %s failed the %s check: %s", sv->nodes[i], check,
                    rc == 0 ? "drained (scontrol)" : "excluded (scontrol update failed)");
    sv->excluded[i] = true;
}

static bool check_slurm_node(supervisor *sv, int i, unsigned checks, char *failed, size_t n) {
    char names[128], ckpt_dir[4200], config[4200], ranks[16];
    keel_health_checks_format(checks, names, sizeof names);
    keel_run_path(ckpt_dir, sizeof ckpt_dir, sv->run_dir, "checkpoints");
    keel_run_path(config, sizeof config, sv->run_dir, KEEL_RUN_CONFIG);
    snprintf(ranks, sizeof ranks, "%d", sv->nproc / sv->active);
    char *argv[] = {"srun", "-N1", "-n1", "-w", sv->nodes[i], sv->self, "health", "--json", "--checks", names,
                    "--dir", ckpt_dir, "--config", config, "--nproc", ranks, NULL};
    char out[16384];
    keel_run_capture(argv, NODE_HEALTH_TIMEOUT_S, out, sizeof out);
    if (report_health(sv->run_dir, sv->nodes[i], out, failed, n)) return true;
    drain_node(sv, i, failed, "health");
    return false;
}

/* The shrunk world's config: the ranks resume resharded, and config.json
 * gets the accumulation that keeps the checkpoint's global batch. */
static bool shrink_config(supervisor *sv, int nproc, char *why, size_t why_n) {
    keel_config c;
    keel_error_capture(true);
    keel_status st = keel_run_load_config(sv->run_dir, &c);
    if (st == KEEL_OK) st = keel_run_prepare(&c, sv->run_dir, nproc);
    keel_error_capture(false);
    keel_config_free(&c);
    if (st != KEEL_OK) snprintf(why, why_n, "cannot shrink to %d rank(s): %s", nproc, keel_last_error());
    return st == KEEL_OK;
}

/* Health-check every active node; exclude (local) or drain (Slurm) the ones
 * that fail, then fill the gap with a spare, or shrink if resilience.min_ranks
 * allows. false: nothing left to run on (the run stops, *why says so). */
static bool check_nodes(supervisor *sv, char *why, size_t why_n) {
    unsigned checks = sv->cfg->resilience.health_checks & ~(1u << KEEL_CHECK_MPI);
    char node[64] = "", failed[32] = "", first_node[64] = "", first_check[32] = "";
    keel_node_situation s = {.local = !sv->nodes, .nodes = sv->nodes ? sv->n_nodes : 1,
                             .active = sv->nodes ? sv->active : 1, .nproc = sv->nproc,
                             .min_ranks = sv->cfg->resilience.min_ranks, .first_failed_node = first_node,
                             .first_failed_check = first_check};
    if (sv->straggler_node[0]) { /* straggler_action drain: its node is out, as if it failed a check */
        s.failed++;
        snprintf(first_node, sizeof first_node, "%s", sv->straggler_node);
        snprintf(first_check, sizeof first_check, "straggler");
        for (int i = 0; sv->nodes && i < sv->n_nodes; i++)
            if (!sv->excluded[i] && !strcmp(sv->nodes[i], sv->straggler_node)) drain_node(sv, i, "straggler", NULL);
        sv->straggler_node[0] = 0;
    }
    if (!s.failed && !sv->nodes && !keel_health_here(sv->cfg, sv->run_dir, NULL, sv->nproc, failed, sizeof failed)) {
        s.failed = 1;
        keel_node_name(node, sizeof node);
        snprintf(first_node, sizeof first_node, "%s", node);
        snprintf(first_check, sizeof first_check, "%s", failed);
    }
    for (int i = 0, used = 0; checks && sv->nodes && i < sv->n_nodes && used < sv->active; i++) {
        if (sv->excluded[i]) continue;
        used++;
        if (!check_slurm_node(sv, i, checks, failed, sizeof failed)) s.failed++;
    }
    for (int i = 0; i < sv->n_nodes; i++) s.usable += !sv->excluded[i];
    keel_node_plan plan = keel_policy_nodes(&s);
    switch (plan.kind) {
    case KEEL_NODES_STOP: snprintf(why, why_n, "%s", plan.reason); return false;
    case KEEL_NODES_SHRINK:
        if (!shrink_config(sv, plan.nproc, why, why_n)) return false;
        keel_event(sv->run_dir, "shrink", -1, "%d -> %d rank(s) on %d node(s); accumulation keeps the global "
                   "batch", sv->nproc, plan.nproc, plan.active);
        sv->nproc = plan.nproc;
        sv->active = plan.active;
        break;
    case KEEL_NODES_SPARE:
        keel_event(sv->run_dir, "spare_used", -1, "%d usable node(s) left for %d active", s.usable, sv->active);
        break;
    case KEEL_NODES_KEEP: break;
    }
    /* the mpi check: the relaunched ranks' first collective (a probe job of its own would cost a launch) */
    sv->probe_mpi = sv->cfg->resilience.health_checks & (1u << KEEL_CHECK_MPI);
    return true;
}

/* ---- the end: summary.json ----------------------------------------------------------- */

/* Productive step time: the step_s of the last metrics line of each step past
 * from_step (steps redone after a failure count once). */
static double productive_s(const char *run_dir, int64_t from_step, int64_t to_step) {
    if (to_step <= from_step) return 0;
    char path[4200];
    keel_run_path(path, sizeof path, run_dir, KEEL_RUN_METRICS);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int64_t n = to_step - from_step;
    double *step_s = keel_xcalloc(sizeof(double) * (size_t)n, "step times");
    char line[8192];
    while (fgets(line, sizeof line, f)) {
        cJSON *o = cJSON_Parse(line);
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "step"), *t = cJSON_GetObjectItemCaseSensitive(o, "step_s");
        if (cJSON_IsNumber(s) && cJSON_IsNumber(t) && s->valuedouble > from_step && s->valuedouble <= to_step)
            step_s[(int64_t)s->valuedouble - from_step - 1] = t->valuedouble;
        cJSON_Delete(o);
    }
    fclose(f);
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += step_s[i];
    keel_free(step_s);
    return sum;
}

/* summary.json as the last launch's leader left it (or a new one), with the
 * supervisor's verdict and its counts. */
static void write_summary(supervisor *sv, const char *status, const char *reason, int64_t steps, double wall_s) {
    char path[4200], *text = NULL;
    keel_run_path(path, sizeof path, sv->run_dir, KEEL_RUN_SUMMARY);
    cJSON *s = NULL;
    keel_error_capture(true);
    if (keel_path_exists(path) && keel_read_file(path, &text, NULL) == KEEL_OK) s = cJSON_Parse(text);
    keel_error_capture(false);
    keel_free(text);
    if (!cJSON_IsObject(s)) cJSON_Delete(s), s = cJSON_CreateObject();
    if (strcmp(status, "completed")) { /* the supervisor's verdict wins over the last launch's */
        cJSON_DeleteItemFromObjectCaseSensitive(s, "status");
        cJSON_AddStringToObject(s, "status", status);
        cJSON_AddStringToObject(s, "stop_reason", reason);
        if (!cJSON_GetObjectItemCaseSensitive(s, "steps")) cJSON_AddNumberToObject(s, "steps", (double)steps);
    }
    static const char *fields[] = {"restarts", "lost_steps", "recovery_s", "goodput", "supervisor_wall_s"};
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) cJSON_DeleteItemFromObjectCaseSensitive(s, fields[i]);
    cJSON_AddNumberToObject(s, "restarts", sv->history.restarts);
    cJSON_AddNumberToObject(s, "lost_steps", (double)sv->lost_steps);
    cJSON *rec = cJSON_AddObjectToObject(s, "recovery_s");
    cJSON *all = cJSON_AddArrayToObject(rec, "each");
    for (int i = 0; i < sv->n_recovery; i++) cJSON_AddItemToArray(all, cJSON_CreateNumber(sv->recovery[i]));
    if (sv->n_recovery > 0) {
        double sorted[MAX_RECOVERIES];
        memcpy(sorted, sv->recovery, sizeof(double) * (size_t)sv->n_recovery);
        cJSON_AddNumberToObject(rec, "median", keel_median(sorted, sv->n_recovery));
        cJSON_AddNumberToObject(rec, "max", sorted[sv->n_recovery - 1]);
    }
    cJSON *parts = cJSON_AddArrayToObject(rec, "split"); /* where each recovery's time went */
    for (int i = 0; i < sv->n_recovery; i++) {
        const recovery_split *x = &sv->split[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "detect", x->detect_s);
        cJSON_AddNumberToObject(o, "health", x->health_s);
        cJSON_AddNumberToObject(o, "backoff", x->backoff_s);
        cJSON_AddNumberToObject(o, "launch", x->launch_s);
        cJSON_AddNumberToObject(o, "restore", x->restore_s);
        cJSON_AddNumberToObject(o, "first_step", x->first_step_s);
        cJSON_AddStringToObject(o, "source", x->source);
        cJSON_AddItemToArray(parts, o);
    }
    double productive = productive_s(sv->run_dir, sv->first_resumed > 0 ? sv->first_resumed : 0, steps);
    cJSON_AddNumberToObject(s, "goodput", wall_s > 0 ? productive / wall_s : 0);
    cJSON_AddNumberToObject(s, "supervisor_wall_s", wall_s);
    char *json = cJSON_Print(s);
    cJSON_Delete(s);
    keel_run_write_file(sv->run_dir, KEEL_RUN_SUMMARY, json);
    free(json);
}

/* ---- the loop ------------------------------------------------------------------------ */

/* A failed launch, for events and the summary; what it lost is known when
 * the relaunch has restored its state (a snapshot may hold more than the
 * newest checkpoint), or now when the run stops. */
static void record_failure(supervisor *sv, const launch *l, int64_t ckpt, bool relaunch) {
    int64_t step = l->done + 1;
    /* a straggler was counted by its own event */
    keel_event_fields f = {.cause = l->kind == KEEL_END_STRAGGLER ? NULL : keel_end_name(l->kind),
                           .has_rank = l->rank >= 0, .rank = l->rank,
                           .node = l->node[0] ? l->node : NULL};
    keel_event_with(sv->run_dir, "failure", step, &f, "%s: %s", keel_end_name(l->kind), l->cause);
    if (sv->lost_done < 0 || l->done > sv->lost_done) sv->lost_done = l->done, sv->lost_step = step;
    if (!relaunch) record_lost(sv, ckpt, "the newest checkpoint");
}

/* Carry out a relaunch decision: skip a data window, health checks, back off.
 * false (*a becomes the reason to stop): the run cannot go on. */
static bool prepare_relaunch(supervisor *sv, const launch *l, keel_action *a, const keel_policy_history *next) {
    if (a->event) keel_event(sv->run_dir, a->event, l->done + 1, "%s", a->reason);
    if (a->skip_step > 0) {
        keel_run_state_skip(&sv->state, a->skip_step);
        save_state(sv);
    }
    if (sv->pending_failure_unix == 0) { /* a failure during a recovery adds to that recovery */
        sv->pending_failure_unix = l->onset_unix;
        sv->pending_detect_s = l->detected_unix - l->onset_unix;
        sv->pending_health_s = sv->pending_backoff_s = 0;
    }
    /* a divergence rolls back to a checkpoint: the snapshots hold the steps that led to it */
    if (l->kind == KEEL_END_DIVERGED) keel_snap_remove_run(sv->run_dir);
    bool snapshots = sv->cfg->resilience.snapshot_every_steps > 0 && l->kind != KEEL_END_DIVERGED;
    keel_log_warn("%s: %s; restarting from %sthe checkpoint at step %lld", keel_end_name(l->kind), l->cause,
                  snapshots ? "the newest in-memory snapshot, or " : "", (long long)newest_checkpoint(sv->run_dir));
    char why[1024];
    double health0 = keel_unix_s();
    bool nodes_ok = check_nodes(sv, why, sizeof why);
    sv->pending_health_s += keel_unix_s() - health0;
    if (!nodes_ok) {
        *a = (keel_action){.kind = KEEL_ACT_GIVE_UP, .event = "stop", .exit_code = 1};
        snprintf(a->reason, sizeof a->reason, "%s", why);
        return false;
    }
    /* the relaunch comes no sooner than the backoff after the failure (the health checks count toward it) */
    double backoff0 = keel_unix_s();
    while (keel_unix_s() - l->detected_unix < a->backoff_s && !g_stop) keel_sleep_s(0.05);
    sv->pending_backoff_s += keel_unix_s() - backoff0;
    if (g_stop) { /* while restarting: what the last launch left */
        *a = keel_policy_stopped(l->done, newest_checkpoint(sv->run_dir), checkpointing(sv->cfg));
        keel_event(sv->run_dir, "stopped", -1, "%s", a->reason);
        a->event = NULL;
        return false;
    }
    sv->history = *next;
    save_state(sv);
    double since = keel_unix_s() - l->detected_unix;
    keel_event_with(sv->run_dir, "restart", -1, &(keel_event_fields){.has_seconds = true, .seconds = since},
                    "restart %d, %.1f s after the failure (backoff %.1f s)", sv->history.restarts, since, a->backoff_s);
    return true;
}

/* Launch, watch, decide, until the policy says stop; the final action. */
static keel_action supervise_loop(supervisor *sv, int64_t *steps) {
    for (;;) {
        char where[4096] = "";
        if (sv->nodes) {
            snprintf(where, sizeof where, " on ");
            active_nodelist(sv, where + 4, sizeof where - 4);
        }
        keel_event(sv->run_dir, "launch", -1, "attempt %d: %d rank(s)%s", sv->history.restarts + 1, sv->nproc, where);
        launch l;
        if (run_launch(sv, &l) != KEEL_OK)
            return (keel_action){.kind = KEEL_ACT_GIVE_UP, .event = "stop", .exit_code = 1,
                                 .reason = "cannot start the launcher"};
        if (l.resumed >= 0 && sv->first_resumed < 0) sv->first_resumed = l.resumed;
        if (l.done > *steps) *steps = l.done;
        int64_t ckpt = newest_checkpoint(sv->run_dir);
        keel_outcome o = {.kind = l.kind, .done = l.done, .checkpoint = ckpt, .stop_requested = g_stop != 0,
                          .checkpointing = checkpointing(sv->cfg), .cause = l.cause};
        keel_policy_history next;
        keel_action a = keel_policy_decide(&sv->cfg->resilience, &sv->history, &o, &next);
        if (a.kind == KEEL_ACT_RELAUNCH || a.kind == KEEL_ACT_GIVE_UP)
            record_failure(sv, &l, ckpt, a.kind == KEEL_ACT_RELAUNCH);
        if (a.kind != KEEL_ACT_RELAUNCH || !prepare_relaunch(sv, &l, &a, &next)) {
            if (a.event) keel_event(sv->run_dir, a.event, a.kind == KEEL_ACT_GIVE_UP ? l.done + 1 : l.done, "%s", a.reason);
            return a;
        }
    }
}

keel_status keel_supervise(const keel_config *cfg, const char *run_dir, int nproc, int *exit_code) {
    supervisor sv = {.cfg = cfg, .run_dir = run_dir, .nproc = nproc, .first_resumed = -1, .lost_done = -1};
    keel_policy_history_init(&sv.history);
    keel_status st = keel_self_path(sv.self, sizeof sv.self);
    if (st == KEEL_OK) st = keel_run_state_read(run_dir, &sv.state);
    if (st == KEEL_OK) st = init_nodes(&sv);
    if (st != KEEL_OK) {
        *exit_code = keel_status_exit_code(st);
        keel_run_state_free(&sv.state);
        return st;
    }
    keel_launch_env();
    keel_launch_shm_begin(sv.mpi_shm, sizeof sv.mpi_shm);
    struct sigaction sa = {.sa_handler = on_stop}, old[3];
    sigemptyset(&sa.sa_mask);
    const int sigs[3] = {SIGTERM, SIGUSR1, SIGINT};
    for (int i = 0; i < 3; i++) sigaction(sigs[i], &sa, &old[i]);
    g_stop = 0;
    double start = keel_unix_s();
    char checks[128];
    keel_health_checks_format(cfg->resilience.health_checks, checks, sizeof checks);
    const keel_resilience_config *rc = &cfg->resilience;
    char hang[96];
    if (rc->hang_timeout_s > 0) snprintf(hang, sizeof hang, "%g s", rc->hang_timeout_s);
    else snprintf(hang, sizeof hang, "%g x the median step, at least %g s, once steady", rc->hang_factor,
                  rc->hang_floor_s);
    keel_event(run_dir, "supervisor_start", -1, "%d rank(s)%s%s; max_restarts %d, hang timeout %s, health checks "
               "[%s]", nproc, sv.nodes ? " on Slurm nodes, spares " : "", sv.nodes ? (rc->spares ? "yes" : "none") : "",
               rc->max_restarts, hang, checks);
    /* in-memory snapshots of runs whose directory is gone (or is another run now) */
    int stale = keel_snap_remove_stale();
    if (stale > 0) keel_log_info("removed %d stale in-memory snapshot segment(s) from /dev/shm", stale);
    int64_t steps = 0;
    keel_action a = supervise_loop(&sv, &steps);
    record_lost(&sv, newest_checkpoint(run_dir), "the newest checkpoint");
    /* the run is over (a later keel train resumes from its checkpoints): its snapshots go */
    keel_snap_remove_run(run_dir);
    for (int i = 0; i < 3; i++) sigaction(sigs[i], &old[i], NULL);
    static const char *status[] = {"completed", "stopped", "failed", "failed"};
    write_summary(&sv, status[a.kind], a.reason, steps, keel_unix_s() - start);
    *exit_code = a.exit_code;
    if (a.kind == KEEL_ACT_GIVE_UP) keel_errorf("%s", a.reason);
    else if (a.kind == KEEL_ACT_STOP) keel_log_info("%s", a.reason);
    for (int i = 0; i < sv.n_nodes; i++) keel_free(sv.nodes[i]);
    keel_free(sv.nodes);
    keel_free(sv.excluded);
    keel_run_state_free(&sv.state);
    keel_launch_shm_clear(sv.mpi_shm, true);
    return *exit_code == 0 ? KEEL_OK : *exit_code == 2 ? KEEL_ERR_INPUT : KEEL_ERR_IO;
}
