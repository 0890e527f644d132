/* resil/supervisor.c: `keel train --nproc N` — launch the ranks, watch them,
 * and on failure decide, act, and relaunch from the last committed
 * checkpoint (DESIGN §6).
 *
 * The supervisor is not an MPI rank: it forks the launcher (mpirun, or srun in
 * a Slurm allocation) in a process group of its own and polls every 50 ms:
 * the launcher's stderr (passed through; it names a failed rank), its exit
 * status, each rank's heartbeat file (RUN/heartbeats/rank-R) and its own
 * signals. MPI is fail-stop here, so every failure ends the whole launch;
 * recovery is a relaunch, and the workers resume from the newest checkpoint
 * that verifies. What it decided and why goes to RUN/events.jsonl. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "keel/ckpt.h"
#include "keel/obs.h"
#include "keel/resil.h"
#include "keel/train.h"

#define POLL_MS 50
#define MAX_RECOVERIES 1024

static volatile sig_atomic_t g_stop;
static void on_stop(int sig) { g_stop = sig; }

typedef enum { END_COMPLETED, END_STOPPED, END_CRASHED, END_HUNG, END_DIVERGED, END_INPUT } end_kind;

static const char *end_name(end_kind k) {
    static const char *names[] = {"completed", "stopped", "crash", "hang", "diverged", "input_error"};
    return names[k];
}

/* How one launch ended. */
typedef struct {
    end_kind kind;
    int exit_code;            /* the launcher's */
    int rank, sig;            /* the rank blamed and the signal that ended it (-1, 0: unknown) */
    int64_t done;             /* steps done when it ended (rank 0's heartbeat) */
    int64_t resumed;          /* the step this launch started from (-1: never got there) */
    double detected_unix;     /* when the supervisor saw the failure */
    char cause[768];
} attempt;

typedef struct {
    const keel_config *cfg;
    const char *run_dir;
    char self[PATH_MAX];
    int nproc;
    /* Slurm: the allocation's nodes; the first `active` usable ones run ranks */
    char **nodes;
    bool *excluded;
    int n_nodes, active;
    /* what happened */
    int restarts;
    int64_t lost_steps, first_resumed;
    double recovery[MAX_RECOVERIES];
    int n_recovery;
    double pending_failure_unix; /* a failure waiting for the next first step (0: none) */
    double slowest_gap_s;        /* longest wait between two heartbeats seen */
    /* the policy's memory */
    int64_t fail_ckpt;           /* the checkpoint the last failure went back to */
    int fail_streak;             /* failures in a row without a new checkpoint */
    int64_t diverged_step;
    int64_t *skips;
    int n_skips;
    bool skipped_here;           /* this supervisor skipped a window: the next divergence stops */
} supervisor;

static double unix_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    nanosleep(&ts, NULL);
}

/* The hang timeout in force: configured, or fitted from the heartbeats seen
 * (10x the longest gap, at least 60 s); a launch that has not finished a
 * step yet gets at least 120 s (data, checkpoint load, MPI start-up). */
static double hang_limit(const supervisor *sv, bool started) {
    double limit = sv->cfg->resilience.hang_timeout_s;
    if (limit <= 0) limit = fmax(60, 10 * sv->slowest_gap_s);
    return started ? limit : fmax(limit, 120);
}

/* ---- processes ---------------------------------------------------------------- */

/* 'R', 'S', 'T' (stopped), 'Z' (zombie)... or 0 when pid is gone. */
static char proc_state(int pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *close_paren = strrchr(buf, ')');
    return close_paren && close_paren[1] == ' ' ? close_paren[2] : 0;
}

static bool proc_alive(int pid) {
    char s = proc_state(pid);
    return s != 0 && s != 'Z' && s != 'X';
}

/* Signal rank `only` (-1: every rank): by pid on this machine; in Slurm the
 * whole step through scancel. */
static void signal_ranks(const supervisor *sv, const keel_heartbeat_info *hb, const bool *have, int sig,
                         int only) {
    for (int r = 0; r < sv->nproc; r++) {
        if (!have[r] || (only >= 0 && r != only)) continue;
        if (keel_launch_in_slurm() && strcmp(hb[r].slurm_step, "-")) {
            char cmd[256];
            snprintf(cmd, sizeof cmd, "scancel --signal=%s %s >/dev/null 2>&1", sig == SIGKILL ? "KILL" : "TERM",
                     hb[r].slurm_step);
            if (system(cmd) != 0) { /* the step may be gone already */ }
        } else if (!keel_launch_in_slurm() && hb[r].pid > 0) {
            kill(hb[r].pid, sig);
        }
    }
}

/* The nodes ranks run on: the first `active` ones not excluded, comma-separated. */
static void active_nodelist(const supervisor *sv, char *out, size_t n) {
    out[0] = 0;
    for (int i = 0, used = 0; i < sv->n_nodes && used < sv->active; i++)
        if (!sv->excluded[i])
            snprintf(out + strlen(out), n - strlen(out), "%s%s", used++ ? "," : "", sv->nodes[i]);
}

/* ---- one launch ---------------------------------------------------------------- */

/* The launcher's stderr lines: all to RUN/logs/launcher.log; to the terminal
 * until the supervisor kills the launch (what follows is the launcher's account
 * of that kill, which the supervisor's own line explains better). */
static void pass_lines(char *buf, size_t *len, attempt *a, FILE *log, bool quiet) {
    char *start = buf, *nl;
    while ((nl = memchr(start, '\n', (size_t)(buf + *len - start)))) {
        *nl = 0;
        if (!quiet) fprintf(stderr, "%s\n", start);
        if (log) fprintf(log, "%s\n", start);
        int sig, rank = keel_launch_blamed_rank(start, &sig);
        if (rank >= 0 && a->rank < 0) a->rank = rank;
        if (sig > 0 && a->sig == 0) a->sig = sig;
        start = nl + 1;
    }
    *len = (size_t)(buf + *len - start);
    memmove(buf, start, *len);
}

/* Launch the ranks and watch them until the launcher exits. */
static void run_attempt(supervisor *sv, attempt *a) {
    const char *run_dir = sv->run_dir;
    memset(a, 0, sizeof *a);
    a->rank = -1;
    a->resumed = -1;
    keel_heartbeat_clear(run_dir, sv->nproc);
    char nodelist[4096] = "";
    keel_launch_spec spec = {.nproc = sv->nproc};
    if (sv->nodes) {
        active_nodelist(sv, nodelist, sizeof nodelist);
        spec.nodelist = nodelist;
        spec.nodes = sv->active;
    }
    const char *args[] = {"worker", run_dir, NULL};
    char **argv = keel_launch_argv(sv->self, &spec, args);
    int err[2];
    KEEL_CHECK(pipe(err) == 0, "pipe: %s", strerror(errno));
    double launched = unix_now();
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0); /* the terminal's Ctrl-C reaches the supervisor only */
        dup2(err[1], STDERR_FILENO);
        close(err[0]);
        close(err[1]);
        execvp(argv[0], argv);
        fprintf(stderr, "keel: error: cannot run %s: %s; install OpenMPI (scripts/install-deps.sh)\n",
                argv[0], strerror(errno));
        _exit(127);
    }
    close(err[1]);
    KEEL_CHECK(pid > 0, "fork: %s", strerror(errno));
    setpgid(pid, pid);
    fcntl(err[0], F_SETFL, O_NONBLOCK);

    char log_path[4096];
    snprintf(log_path, sizeof log_path, "%s/logs/launcher.log", run_dir);
    FILE *log = fopen(log_path, "a");
    if (log) fprintf(log, "---- %s\n", argv[0]);
    keel_heartbeat_info *hb = keel_xcalloc(sizeof *hb * (size_t)sv->nproc, "heartbeats");
    bool *have = keel_xcalloc(sizeof(bool) * (size_t)sv->nproc, "heartbeats");
    bool *signaled = keel_xcalloc(sizeof(bool) * (size_t)sv->nproc, "heartbeats");
    char buf[8192];
    size_t len = 0;
    bool failed = false, stop_sent = false, pipe_open = true;
    double killed_at = 0;
    int status = 0;
    for (;;) {
        struct pollfd pfd = {.fd = err[0], .events = POLLIN};
        if (pipe_open && poll(&pfd, 1, POLL_MS) > 0) {
            ssize_t got = read(err[0], buf + len, sizeof buf - 1 - len);
            if (got > 0) {
                len += (size_t)got;
                if (len == sizeof buf - 1) buf[len++] = '\n'; /* an over-long line: pass it in parts */
                pass_lines(buf, &len, a, log, failed);
            } else if (got == 0) {
                pipe_open = false;
            }
        } else if (!pipe_open) {
            sleep_s(POLL_MS / 1000.0);
        }
        if (waitpid(pid, &status, WNOHANG) == pid) break;
        double now = unix_now();
        for (int r = 0; r < sv->nproc; r++) {
            keel_heartbeat_info x;
            if (!keel_heartbeat_read(run_dir, r, &x)) continue;
            if (have[r] && !strcmp(x.phase, "train") && !strcmp(hb[r].phase, "train"))
                sv->slowest_gap_s = fmax(sv->slowest_gap_s, x.unix_s - hb[r].unix_s);
            hb[r] = x;
            have[r] = true;
        }
        if (sv->pending_failure_unix > 0 && have[0] && hb[0].first_step_unix_s > 0) {
            double r = hb[0].first_step_unix_s - sv->pending_failure_unix;
            if (sv->n_recovery < MAX_RECOVERIES) sv->recovery[sv->n_recovery++] = r;
            keel_event(run_dir, "recovered", hb[0].start_step + 1, "first step after the failure done %.2f s "
                       "after it was detected (resumed from step %lld)", r, (long long)hb[0].start_step);
            sv->pending_failure_unix = 0;
        }
        if (g_stop) { /* preemption: ranks save at the next step boundary */
            if (!stop_sent)
                keel_event(run_dir, "preempt", have[0] ? hb[0].step : -1,
                           "signal %d: asking the ranks to checkpoint at the next step boundary and exit",
                           (int)g_stop);
            /* ranks catch it from their first heartbeat on; one still starting gets it later */
            for (int r = 0; r < sv->nproc; r++)
                if (have[r] && !signaled[r]) {
                    signal_ranks(sv, hb, have, SIGTERM, r);
                    signaled[r] = true;
                }
            stop_sent = true;
        }
        if (failed) {
            if (now - killed_at > 10) { /* the launcher ignores us: make sure */
                kill(-pid, SIGKILL);
                killed_at = now;
            }
            continue;
        }
        /* A rank gone without saying goodbye (killed, crashed) while no rank reported an
         * error of its own: the launcher would notice in seconds; act now. */
        bool any_exit = false;
        for (int r = 0; r < sv->nproc; r++) any_exit |= have[r] && !strcmp(hb[r].phase, "exit");
        for (int r = 0; r < sv->nproc && !keel_launch_in_slurm() && !any_exit && !failed; r++)
            if (have[r] && hb[r].pid > 0 && !proc_alive(hb[r].pid)) {
                a->kind = END_CRASHED;
                a->rank = r;
                snprintf(a->cause, sizeof a->cause, "rank %d (pid %d) died in step %lld", r, hb[r].pid,
                         (long long)hb[r].step + 1);
                failed = true;
            }
        /* A hang: a heartbeat older than the timeout (stopped process, survivors blocked in
         * a collective, or a rank that never started). */
        bool started = have[0] && hb[0].first_step_unix_s > 0;
        double limit = hang_limit(sv, started), oldest = 0;
        int stale = -1, stopped = -1;
        for (int r = 0; r < sv->nproc && !failed; r++) {
            double age = now - (have[r] ? fmax(hb[r].unix_s, launched) : launched);
            if (age > limit && age > oldest) oldest = age, stale = r;
            if (have[r] && hb[r].pid > 0 && !keel_launch_in_slurm() && proc_state(hb[r].pid) == 'T')
                stopped = r;
        }
        if (stale >= 0 && !failed) {
            a->kind = END_HUNG;
            a->rank = stopped >= 0 ? stopped : stale;
            int n = snprintf(a->cause, sizeof a->cause, "no heartbeat from rank %d for %.1f s (hang "
                             "timeout %.0f s)", stale, oldest, limit);
            if (stopped >= 0)
                snprintf(a->cause + n, sizeof a->cause - (size_t)n, "; rank %d (pid %d) is stopped "
                         "(SIGSTOP or a debugger)", stopped, hb[stopped].pid);
            failed = true;
        }
        if (failed) {
            a->detected_unix = now;
            signal_ranks(sv, hb, have, SIGKILL, -1);
            kill(-pid, SIGKILL);
            killed_at = now;
        }
    }
    /* the rest of the launcher's words */
    while (pipe_open) {
        ssize_t got = read(err[0], buf + len, sizeof buf - 1 - len);
        if (got <= 0) break;
        len += (size_t)got;
        if (len == sizeof buf - 1) buf[len++] = '\n';
        pass_lines(buf, &len, a, log, failed);
    }
    if (len) {
        buf[len++] = '\n';
        pass_lines(buf, &len, a, log, failed);
    }
    close(err[0]);
    if (log) fclose(log);
    kill(-pid, SIGKILL); /* anything the launcher left behind in its group */
    for (int r = 0; r < sv->nproc; r++) {
        keel_heartbeat_info x;
        if (keel_heartbeat_read(run_dir, r, &x)) hb[r] = x, have[r] = true;
    }
    /* Ranks outlive their launcher for a moment: never start the next launch beside them. */
    if (!keel_launch_in_slurm())
        for (int r = 0; r < sv->nproc; r++)
            for (int i = 0; have[r] && hb[r].pid > 0 && proc_alive(hb[r].pid) && i < 100; i++) {
                kill(hb[r].pid, SIGKILL);
                sleep_s(0.05);
            }
    a->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    a->done = have[0] ? hb[0].step : 0;
    a->resumed = have[0] ? hb[0].start_step : -1;
    if (!failed) {
        a->detected_unix = unix_now();
        int code = a->exit_code;
        /* the rank that reported an exit code of its own is the one to name */
        for (int r = 0; r < sv->nproc && a->rank < 0; r++)
            if (have[r] && !strcmp(hb[r].phase, "exit") && hb[r].exit_code != 0) a->rank = r;
        a->kind = code == 0                     ? END_COMPLETED
                  : code == KEEL_EXIT_RESUME    ? END_STOPPED
                  : code == KEEL_EXIT_DIVERGED ? END_DIVERGED
                  : code == 2                   ? END_INPUT
                                                : END_CRASHED;
        if (a->kind == END_CRASHED && a->rank >= 0)
            snprintf(a->cause, sizeof a->cause, "rank %d failed (%s exit %d%s%s); its log: %s/logs/rank-%d.log",
                     a->rank, argv[0], code, a->sig ? ", signal " : "", a->sig ? strsignal(a->sig) : "",
                     run_dir, a->rank);
        else if (a->kind == END_CRASHED)
            snprintf(a->cause, sizeof a->cause, "the ranks failed (%s exit %d); logs: %s/logs/", argv[0],
                     code, run_dir);
        else if (a->kind == END_DIVERGED)
            snprintf(a->cause, sizeof a->cause, "the loss diverged (NaN/Inf or above resilience.max_loss) in step %lld",
                     (long long)a->done + 1);
        else if (a->kind == END_INPUT)
            snprintf(a->cause, sizeof a->cause, "a rank rejected its input (exit 2); see %s/logs/", run_dir);
    } else if (a->sig && a->kind == END_CRASHED) {
        size_t n = strlen(a->cause);
        snprintf(a->cause + n, sizeof a->cause - n, " (%s)", strsignal(a->sig));
    }
    keel_free(hb);
    keel_free(have);
    keel_free(signaled);
    keel_launch_argv_free(argv);
}

/* ---- supervisor.json: state the workers read ------------------------------------ */

static void save_state(const supervisor *sv) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "restarts", sv->restarts);
    cJSON *skips = cJSON_AddArrayToObject(o, "skip_data_steps");
    for (int i = 0; i < sv->n_skips; i++) cJSON_AddItemToArray(skips, cJSON_CreateNumber((double)sv->skips[i]));
    cJSON *ex = cJSON_AddArrayToObject(o, "excluded_nodes");
    for (int i = 0; i < sv->n_nodes; i++)
        if (sv->excluded[i]) cJSON_AddItemToArray(ex, cJSON_CreateString(sv->nodes[i]));
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    char path[4096];
    snprintf(path, sizeof path, "%s/supervisor.json", sv->run_dir);
    keel_write_file_atomic(path, text, strlen(text));
    free(text);
}

static cJSON *read_json(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = keel_xmalloc((size_t)(n > 0 ? n : 0) + 1, "json file");
    size_t got = fread(text, 1, (size_t)(n > 0 ? n : 0), f);
    fclose(f);
    text[got] = 0;
    cJSON *o = cJSON_Parse(text);
    keel_free(text);
    return o;
}

int keel_resil_skipped_steps(const char *run_dir, int64_t **out) {
    char path[4096];
    snprintf(path, sizeof path, "%s/supervisor.json", run_dir);
    *out = NULL;
    cJSON *o = read_json(path);
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "skip_data_steps");
    int n = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : 0;
    if (n > 0) {
        *out = keel_xmalloc(sizeof(int64_t) * (size_t)n, "skipped steps");
        for (int i = 0; i < n; i++) (*out)[i] = (int64_t)cJSON_GetArrayItem(a, i)->valuedouble;
    }
    cJSON_Delete(o);
    return n;
}

/* ---- nodes ------------------------------------------------------------------------ */

/* In a Slurm allocation: its nodes, the first nodes - spares of them active. */
static keel_status init_nodes(supervisor *sv) {
    if (!keel_launch_in_slurm()) return KEEL_OK;
    FILE *p = popen("scontrol show hostnames \"$SLURM_JOB_NODELIST\" 2>/dev/null", "r");
    char line[256];
    while (p && fgets(line, sizeof line, p)) {
        line[strcspn(line, "\r\n")] = 0;
        if (!line[0]) continue;
        sv->nodes = keel_xrealloc(sv->nodes, sizeof(char *) * (size_t)(sv->n_nodes + 1), "nodes");
        sv->nodes[sv->n_nodes++] = keel_xstrdup(line);
    }
    if (p) pclose(p);
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

/* ---- health ----------------------------------------------------------------------- */

static bool has_check(const keel_config *cfg, const char *name) {
    char *names = keel_xstrdup(cfg->resilience.health_checks), *save = NULL;
    bool found = false;
    for (char *n = strtok_r(names, ",", &save); n && !found; n = strtok_r(NULL, ",", &save))
        found = !strcmp(n, name);
    keel_free(names);
    return found;
}

/* Node-local checks without mpi, comma-separated. */
static void local_checks(const keel_config *cfg, char *out, size_t n) {
    static const char *names[] = {"gemm", "memory", "checkpoint_dir", "gpu"};
    out[0] = 0;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (has_check(cfg, names[i]))
            snprintf(out + strlen(out), n - strlen(out), "%s%s", out[0] ? "," : "", names[i]);
}

/* Log each check of one node's JSON report as an event; the first failed check's name
 * (empty when all passed) goes to failed_check. */
static bool report_health(const supervisor *sv, const char *node, const char *json, char *failed_check,
                          size_t n) {
    cJSON *o = cJSON_Parse(json);
    const cJSON *checks = cJSON_GetObjectItemCaseSensitive(o, "checks"), *c;
    failed_check[0] = 0;
    if (!cJSON_IsArray(checks)) {
        keel_event(sv->run_dir, "health", -1, "node %s: no report (%.200s)", node, json);
        snprintf(failed_check, n, "report");
        cJSON_Delete(o);
        return false;
    }
    cJSON_ArrayForEach(c, checks) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(c, "name"),
                    *status = cJSON_GetObjectItemCaseSensitive(c, "status"),
                    *detail = cJSON_GetObjectItemCaseSensitive(c, "detail");
        if (!cJSON_IsString(name) || !cJSON_IsString(status)) continue;
        keel_event(sv->run_dir, "health", -1, "node %s: %s %s: %s", node, name->valuestring,
                   status->valuestring, cJSON_IsString(detail) ? detail->valuestring : "");
        if (!strcmp(status->valuestring, "fail") && !failed_check[0])
            snprintf(failed_check, n, "%s", name->valuestring);
    }
    cJSON_Delete(o);
    return failed_check[0] == 0;
}

/* Health-check every active node; exclude (local) or drain (Slurm) the ones that
 * fail, then fill the gap with a spare, or shrink if resilience.min_ranks allows.
 * false: nothing left to run on (the run stops). */
static bool check_nodes(supervisor *sv, char *why, size_t why_n) {
    const keel_config *cfg = sv->cfg;
    char checks[128], ckpt_dir[4096], config[4096], ranks[16];
    local_checks(cfg, checks, sizeof checks);
    snprintf(ckpt_dir, sizeof ckpt_dir, "%s/checkpoints", sv->run_dir);
    snprintf(config, sizeof config, "%s/config.json", sv->run_dir);
    bool any_failed = false;
    if (checks[0] && !sv->nodes) { /* this machine: check in-process */
        keel_health_options o = {.cfg = cfg, .dir = ckpt_dir, .nproc = sv->nproc, .checks = checks,
                                 .gemm_floor_gflops = cfg->resilience.gemm_floor_gflops};
        keel_health_result r[KEEL_HEALTH_MAX];
        int n = keel_health_run(&o, r);
        char node[64], failed[32];
        keel_node_name(node, sizeof node);
        char *json = keel_health_json(node, r, n);
        if (!report_health(sv, node, json, failed, sizeof failed)) {
            keel_event(sv->run_dir, "node_excluded", -1, "node %s (this machine) failed the %s check; a "
                       "local run has no other node", node, failed);
            snprintf(why, why_n, "this machine (%s) failed the %s health check (see events.jsonl)", node,
                     failed);
            any_failed = true;
        }
        free(json);
        if (any_failed) return false;
    }
    snprintf(ranks, sizeof ranks, "%d", sv->nodes ? sv->nproc / sv->active : sv->nproc);
    for (int i = 0, used = 0; checks[0] && sv->nodes && i < sv->n_nodes && used < sv->active; i++) {
        if (sv->excluded[i]) continue;
        used++;
        /* bounded: a step on a node that stopped answering would wait for good */
        char *argv[] = {"timeout", "120", "srun", "-N1", "-n1", "-w", sv->nodes[i], sv->self, "health",
                        "--json", "--checks", checks, "--dir", ckpt_dir, "--config", config, "--nproc",
                        ranks, NULL};
        char out[16384], failed[32];
        keel_run_capture(argv, out, sizeof out);
        if (report_health(sv, sv->nodes[i], out, failed, sizeof failed)) continue;
        char cmd[512];
        snprintf(cmd, sizeof cmd, "scontrol update nodename=%s state=drain reason=\"keel: %s\" 2>&1",
                 sv->nodes[i], failed);
        int rc = system(cmd);
        keel_event(sv->run_dir, "node_drained", -1, "node %s failed the %s check: %s", sv->nodes[i],
                   failed, rc == 0 ? "drained (scontrol)" : "excluded (scontrol update failed)");
        sv->excluded[i] = true;
        any_failed = true;
        used--;
    }
    if (sv->nodes) {
        int usable = 0;
        for (int i = 0; i < sv->n_nodes; i++) usable += !sv->excluded[i];
        int per_node = sv->nproc / sv->active;
        if (usable < sv->active) { /* no spare left for every failed node: shrink or stop */
            int want = usable * per_node, min = cfg->resilience.min_ranks;
            if (min <= 0 || want < min || usable == 0) {
                snprintf(why, why_n, "%d of the allocation's %d node(s) failed health checks and %s",
                         sv->n_nodes - usable, sv->n_nodes,
                         min <= 0 ? "resilience.min_ranks is 0 (no shrinking)"
                                  : "shrinking would go below resilience.min_ranks");
                return false;
            }
            /* the ranks resume resharded; config.json gets the accumulation that keeps the
             * checkpoint's global batch (or says why none does) */
            keel_config c;
            keel_config_defaults(&c);
            char path[4096];
            snprintf(path, sizeof path, "%s/config.json", sv->run_dir);
            keel_error_capture(true);
            keel_status st = keel_config_load_file(&c, path);
            if (st == KEEL_OK) st = keel_config_finalize(&c);
            if (st == KEEL_OK) st = keel_train_prepare_run_dir(&c, sv->run_dir, want);
            keel_error_capture(false);
            keel_config_free(&c);
            if (st != KEEL_OK) {
                snprintf(why, why_n, "cannot shrink to %d rank(s): %s", want, keel_last_error());
                return false;
            }
            keel_event(sv->run_dir, "shrink", -1, "%d -> %d rank(s) on %d node(s); accumulation keeps the "
                       "global batch", sv->nproc, want, usable);
            sv->nproc = want;
            sv->active = usable;
        } else if (any_failed) {
            keel_event(sv->run_dir, "spare_used", -1, "%d usable node(s) left for %d active", usable,
                       sv->active);
        }
    }
    if (has_check(cfg, "mpi")) {
        char nodelist[4096] = "";
        if (sv->nodes) active_nodelist(sv, nodelist, sizeof nodelist);
        keel_health_options o = {.cfg = cfg, .nproc = sv->nproc, .checks = "mpi",
                                 .nodelist = nodelist[0] ? nodelist : NULL, .nodes = sv->nodes ? sv->active : 0};
        keel_health_result r;
        keel_health_run(&o, &r);
        bool ok = r.status != KEEL_HEALTH_FAIL;
        keel_event(sv->run_dir, "health", -1, "ranks %d: mpi %s: %s", sv->nproc, ok ? "pass" : "fail", r.detail);
        if (!ok) {
            snprintf(why, why_n, "the MPI all-reduce check failed: %s", r.detail);
            return false;
        }
    }
    return true;
}

/* ---- the end: summary.json ----------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Productive step time: the step_s of the last metrics line of each step past
 * from_step (steps redone after a failure count once). */
static double productive_s(const char *run_dir, int64_t from_step, int64_t to_step) {
    if (to_step <= from_step) return 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int64_t n = to_step - from_step;
    double *step_s = keel_xcalloc(sizeof(double) * (size_t)n, "step times");
    char line[8192];
    while (fgets(line, sizeof line, f)) {
        cJSON *o = cJSON_Parse(line);
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "step"),
                    *t = cJSON_GetObjectItemCaseSensitive(o, "step_s");
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

static void write_summary(supervisor *sv, const char *status, const char *reason, int64_t steps,
                          double wall_s) {
    char path[4096];
    snprintf(path, sizeof path, "%s/summary.json", sv->run_dir);
    cJSON *s = read_json(path);
    if (!s) s = cJSON_CreateObject();
    if (strcmp(status, "completed")) { /* the supervisor's verdict wins over the last launch's */
        cJSON_DeleteItemFromObjectCaseSensitive(s, "status");
        cJSON_AddStringToObject(s, "status", status);
        cJSON_AddStringToObject(s, "stop_reason", reason);
        if (!cJSON_GetObjectItemCaseSensitive(s, "steps")) cJSON_AddNumberToObject(s, "steps", (double)steps);
    }
    static const char *fields[] = {"restarts", "lost_steps", "recovery_s", "goodput", "supervisor_wall_s"};
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) cJSON_DeleteItemFromObjectCaseSensitive(s, fields[i]);
    cJSON_AddNumberToObject(s, "restarts", sv->restarts);
    cJSON_AddNumberToObject(s, "lost_steps", (double)sv->lost_steps);
    cJSON *rec = cJSON_AddObjectToObject(s, "recovery_s");
    cJSON *all = cJSON_AddArrayToObject(rec, "each");
    for (int i = 0; i < sv->n_recovery; i++) cJSON_AddItemToArray(all, cJSON_CreateNumber(sv->recovery[i]));
    if (sv->n_recovery > 0) {
        double sorted[MAX_RECOVERIES];
        memcpy(sorted, sv->recovery, sizeof(double) * (size_t)sv->n_recovery);
        qsort(sorted, (size_t)sv->n_recovery, sizeof(double), cmp_double);
        cJSON_AddNumberToObject(rec, "median", sorted[sv->n_recovery / 2]);
        cJSON_AddNumberToObject(rec, "max", sorted[sv->n_recovery - 1]);
    }
    double productive = productive_s(sv->run_dir, sv->first_resumed > 0 ? sv->first_resumed : 0, steps);
    cJSON_AddNumberToObject(s, "goodput", wall_s > 0 ? productive / wall_s : 0);
    cJSON_AddNumberToObject(s, "supervisor_wall_s", wall_s);
    char *text = cJSON_Print(s);
    cJSON_Delete(s);
    size_t len = strlen(text);
    text = keel_xrealloc(text, len + 2, "summary");
    memcpy(text + len, "\n", 2);
    keel_write_file_atomic(path, text, len + 1);
    free(text);
}

/* ---- the policy ------------------------------------------------------------------------ */

static int64_t newest_checkpoint(const char *run_dir) {
    int64_t *steps;
    int n = keel_ckpt_list(run_dir, &steps);
    int64_t s = n > 0 ? steps[0] : 0;
    keel_free(steps);
    return s;
}

/* After a failed launch: what to do. Returns false (with *why) to stop. */
static bool decide(supervisor *sv, const attempt *a, char *why, size_t why_n) {
    int64_t step = a->done + 1; /* the step that failed */
    int64_t ckpt = newest_checkpoint(sv->run_dir);
    int64_t lost = a->done > ckpt ? a->done - ckpt : 0;
    sv->lost_steps += lost;
    keel_event(sv->run_dir, "failure", step, "%s: %s", end_name(a->kind), a->cause);
    keel_event(sv->run_dir, "lost_work", step, "%lld step(s) since the checkpoint at step %lld",
               (long long)lost, (long long)ckpt);
    if (a->kind == END_INPUT) {
        snprintf(why, why_n, "%s", a->cause);
        return false;
    }
    if (a->kind == END_DIVERGED) {
        char back_to[64];
        if (ckpt > 0) snprintf(back_to, sizeof back_to, "the checkpoint at step %lld", (long long)ckpt);
        else snprintf(back_to, sizeof back_to, "the start (no checkpoint yet)");
        /* roll back; the same step again: skip its data window once; after that, stop */
        if (sv->skipped_here) {
            snprintf(why, why_n, "the loss diverged again in step %lld after step %lld's data window was "
                     "skipped: lower train.lr or raise train.warmup_steps (metrics.jsonl and events.jsonl have the losses)",
                     (long long)step, (long long)sv->skips[sv->n_skips - 1]);
            return false;
        }
        if (sv->diverged_step == step) {
            sv->skips = keel_xrealloc(sv->skips, sizeof(int64_t) * (size_t)(sv->n_skips + 1), "skips");
            sv->skips[sv->n_skips++] = step;
            sv->skipped_here = true;
            save_state(sv);
            keel_event(sv->run_dir, "skip_data", step, "diverged twice in step %lld: skipping its data "
                       "window once and rolling back to %s", (long long)step, back_to);
        } else {
            keel_event(sv->run_dir, "rollback", step, "diverged in step %lld: rolling back to %s",
                       (long long)step, back_to);
        }
        sv->diverged_step = step;
    } else {
        /* failures with no new checkpoint in between make no progress: they fail the same
         * steps again (timing moves the exact step by one or two) */
        sv->fail_streak = ckpt == sv->fail_ckpt ? sv->fail_streak + 1 : 1;
        sv->fail_ckpt = ckpt;
        if (sv->fail_streak >= sv->cfg->resilience.crash_loop) {
            char since[64];
            if (ckpt > 0) snprintf(since, sizeof since, "after the checkpoint at step %lld", (long long)ckpt);
            else snprintf(since, sizeof since, "before any checkpoint");
            snprintf(why, why_n, "crash loop: %d failures in a row %s, the last in step %lld "
                     "(resilience.crash_loop %d); last cause: %s", sv->fail_streak, since, (long long)step,
                     sv->cfg->resilience.crash_loop, a->cause);
            return false;
        }
    }
    if (sv->restarts >= sv->cfg->resilience.max_restarts) {
        snprintf(why, why_n, "gave up after %d restart(s) (resilience.max_restarts); last failure: %s",
                 sv->restarts, a->cause);
        return false;
    }
    return true;
}

keel_status keel_supervise(const keel_config *cfg, const char *run_dir, int nproc, int *exit_code) {
    supervisor sv = {.cfg = cfg, .run_dir = run_dir, .nproc = nproc, .fail_ckpt = -1,
                     .diverged_step = -1, .first_resumed = -1};
    keel_status st = keel_self_path(sv.self, sizeof sv.self);
    if (st == KEEL_OK) st = init_nodes(&sv);
    if (st != KEEL_OK) {
        *exit_code = keel_status_exit_code(st);
        return st;
    }
    sv.n_skips = keel_resil_skipped_steps(run_dir, &sv.skips);
    keel_launch_env();
    struct sigaction sa = {.sa_handler = on_stop}, old[3];
    sigemptyset(&sa.sa_mask);
    const int sigs[3] = {SIGTERM, SIGUSR1, SIGINT};
    for (int i = 0; i < 3; i++) sigaction(sigs[i], &sa, &old[i]);
    g_stop = 0;
    double start = unix_now();
    const char *status = "failed";
    char why[1024] = "";
    int64_t steps = 0;
    *exit_code = 1;
    keel_event(run_dir, "supervisor_start", -1, "%d rank(s)%s%s; max_restarts %d, hang timeout %s, "
               "health checks [%s]", nproc, sv.nodes ? " on Slurm nodes, spares " : "",
               sv.nodes ? (cfg->resilience.spares ? "yes" : "none") : "",
               cfg->resilience.max_restarts,
               cfg->resilience.hang_timeout_s > 0 ? "fixed" : "fitted from step times",
               cfg->resilience.health_checks);
    for (;;) {
        char where[4096] = "";
        if (sv.nodes) {
            snprintf(where, sizeof where, " on ");
            active_nodelist(&sv, where + 4, sizeof where - 4);
        }
        keel_event(run_dir, "launch", -1, "attempt %d: %d rank(s)%s", sv.restarts + 1, sv.nproc, where);
        attempt a;
        run_attempt(&sv, &a);
        if (a.resumed >= 0 && sv.first_resumed < 0) sv.first_resumed = a.resumed;
        if (a.done > steps) steps = a.done;
        if (a.kind == END_COMPLETED) {
            status = "completed";
            *exit_code = 0;
            keel_event(run_dir, "completed", a.done, "after %d restart(s)", sv.restarts);
            break;
        }
        if (a.kind == END_STOPPED || (g_stop && a.kind != END_INPUT)) {
            status = "stopped";
            snprintf(why, sizeof why, "stopped on a signal; state saved at step %lld: run the same keel "
                     "train command again to resume", (long long)newest_checkpoint(run_dir));
            *exit_code = KEEL_EXIT_RESUME;
            keel_event(run_dir, "stopped", a.done, "%s", why);
            break;
        }
        if (!decide(&sv, &a, why, sizeof why)) {
            if (a.kind == END_INPUT) *exit_code = 2;
            keel_event(run_dir, "stop", a.done + 1, "%s", why);
            break;
        }
        if (sv.pending_failure_unix == 0) sv.pending_failure_unix = a.detected_unix;
        keel_log_warn("%s: %s; restarting from the checkpoint at step %lld", end_name(a.kind), a.cause,
                      (long long)newest_checkpoint(run_dir));
        if (!check_nodes(&sv, why, sizeof why)) {
            keel_event(run_dir, "stop", a.done + 1, "%s", why);
            break;
        }
        /* back off: the relaunch comes no sooner than the backoff after the failure
         * (the health checks above count toward it), doubling while failures make
         * no progress */
        int streak = a.kind == END_DIVERGED ? 1 : sv.fail_streak;
        double wait = fmin(300, cfg->resilience.backoff_s * pow(2, streak - 1));
        while (unix_now() - a.detected_unix < wait && !g_stop) sleep_s(0.05);
        if (g_stop) {
            status = "stopped";
            snprintf(why, sizeof why, "stopped on a signal while restarting; state saved at step %lld: run "
                     "the same keel train command again to resume", (long long)newest_checkpoint(run_dir));
            *exit_code = KEEL_EXIT_RESUME;
            keel_event(run_dir, "stopped", -1, "%s", why);
            break;
        }
        sv.restarts++;
        save_state(&sv);
        keel_event(run_dir, "restart", -1, "restart %d, %.1f s after the failure (backoff %.1f s)", sv.restarts,
                   unix_now() - a.detected_unix, wait);
    }
    for (int i = 0; i < 3; i++) sigaction(sigs[i], &old[i], NULL);
    double wall = unix_now() - start;
    write_summary(&sv, status, why, steps, wall);
    if (*exit_code != 0 && *exit_code != KEEL_EXIT_RESUME) keel_errorf("%s", why);
    else if (*exit_code == KEEL_EXIT_RESUME) keel_log_info("%s", why);
    for (int i = 0; i < sv.n_nodes; i++) keel_free(sv.nodes[i]);
    keel_free(sv.nodes);
    keel_free(sv.excluded);
    keel_free(sv.skips);
    return *exit_code == 0 ? KEEL_OK : *exit_code == 2 ? KEEL_ERR_INPUT : KEEL_ERR_IO;
}
