/* plugins/slurm/keel_auto_resume.c: `srun --auto-resume[=N]` (and sbatch's
 * option of the same name), a SPANK plugin: a step that fails is run again,
 * up to N times (default 1), for any command.
 *
 * Where each part runs (the contexts are SPANK's):
 *   - the option is registered in every context and validated where it is
 *     typed — srun (local) and sbatch/salloc (allocator) — so a bad value is
 *     refused at submission. In slurmstepd (remote) the callback never fails:
 *     an error there would fail the job on its nodes, long after submission.
 *   - the relaunch is srun's: in slurm_spank_init_post_opt, before srun asks
 *     for an allocation or a step, the srun the user typed becomes a monitor.
 *     It runs its own command line again as a child srun, with
 *     --kill-on-bad-exit=1 in front (a task that fails ends the step at once:
 *     no peer waits on it; an option the user typed still wins) (the attempt number
 *     in KEEL_AUTO_RESUME_ATTEMPT, which makes the plugin in the child stand
 *     aside), waits for it, and on failure runs it again, up to N more
 *     times; then it exits with the last attempt's status. Inside an
 *     allocation each attempt is a new step of the job; a standalone srun
 *     makes a new job for each. SIGINT, SIGTERM and SIGHUP go on to the child,
 *     and end the relaunches (a stop asked for is not a failure).
 *   - the child srun, as it launches its tasks (slurm_spank_local_user_init),
 *     writes its step's node list and node count to a file the monitor named
 *     (KEEL_AUTO_RESUME_NODES_FILE), from `scontrol show step`.
 *   - after a failure, with `health=PROGRAM` among the plugin's arguments in
 *     plugstack.conf, the monitor runs PROGRAM on each of the step's nodes
 *     (`srun -N1 -n1 -w NODE PROGRAM`; `keel health --epilog` drains a node
 *     that fails its checks with its reason), then excludes every node of the
 *     step now drained from the attempts that follow (srun --exclude). Inside
 *     an allocation with fewer nodes left than the step needs, the job is
 *     requeued (scontrol requeue) instead.
 * Every srun and scontrol the monitor runs is killed after a time limit. */
#include <stdint.h> /* spank.h uses the fixed-width types without including it */

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <slurm/spank.h>

SPANK_PLUGIN(keel_auto_resume, 1);

#define MAX_RELAUNCHES 100
#define ATTEMPT_ENV "KEEL_AUTO_RESUME_ATTEMPT"
#define RELAUNCHES_ENV "KEEL_AUTO_RESUME_MAX"
#define NODES_FILE_ENV "KEEL_AUTO_RESUME_NODES_FILE"
#define SCONTROL_TIMEOUT_S 30
#define MAX_NODES 1024

static int relaunches = -1; /* -1: the option was not given */
static volatile pid_t child = 0;
static volatile sig_atomic_t stopping = 0; /* SIGINT, SIGTERM or SIGHUP came: no more attempts */
/* plugstack.conf arguments */
static char health[1024];       /* health=PROGRAM: run on each node of a failed step */
static int health_timeout = 300; /* health_timeout=S: per node */

/* N: a whole number from 0 to MAX_RELAUNCHES; none (a bare --auto-resume): 1. */
static int parse(const char *arg) {
    if (!arg) return 1;
    char *end;
    errno = 0;
    long n = strtol(arg, &end, 10);
    if (errno || *end || end == arg || n < 0 || n > MAX_RELAUNCHES || arg[0] == '+' || arg[0] == ' ') return -1;
    return (int)n;
}

static int option(int val, const char *optarg, int remote) {
    (void)val;
    int n = parse(optarg);
    if (n < 0) {
        if (remote) return 0; /* refused at submission already; never fail a job on its nodes */
        slurm_error("--auto-resume=%s: expected how many times to relaunch a failed step, a whole number "
                    "from 0 to %d (--auto-resume alone: 1)", optarg, MAX_RELAUNCHES);
        return -1;
    }
    relaunches = n;
    return 0;
}

static struct spank_option auto_resume = {
    "auto-resume", "N",
    "relaunch the step when it fails, up to N times (default 1; keel_auto_resume plugin)", 2, 0, option,
};

int slurm_spank_init(spank_t sp, int ac, char **av) {
    for (int i = 0; i < ac; i++) {
        char *end = NULL;
        if (!strncmp(av[i], "health=", 7) && av[i][7]) {
            snprintf(health, sizeof health, "%s", av[i] + 7);
        } else if (!strncmp(av[i], "health_timeout=", 15) &&
                   (health_timeout = (int)strtol(av[i] + 15, &end, 10)) > 0 && !*end) {
        } else if (spank_context() == S_CTX_LOCAL || spank_context() == S_CTX_ALLOCATOR) {
            /* plugstack.conf is the administrator's: say it where it is read, never fail a job's nodes */
            slurm_error("keel_auto_resume: plugstack.conf argument '%s': expected health=PROGRAM or "
                        "health_timeout=SECONDS", av[i]);
            return -1;
        }
    }
    return spank_option_register(sp, &auto_resume) == ESPANK_SUCCESS ? 0 : -1;
}

/* Run argv (no shell) with its stdout in out (NUL-ended, may be NULL), its
 * stderr passed through; killed after timeout_s. Its exit status, 128+signal,
 * 124 when it timed out, -1 when it did not start. */
static int run(char *const *argv, int timeout_s, char *out, size_t n) {
    int p[2];
    if (pipe(p) != 0) return -1;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(p[1], STDOUT_FILENO);
        close(p[0]);
        close(p[1]);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(p[1]);
    size_t got = 0;
    char sink[4096];
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    bool timed_out = false;
    for (;;) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double left = timeout_s - (double)(now.tv_sec - t0.tv_sec) - (now.tv_nsec - t0.tv_nsec) / 1e9;
        if (left <= 0) {
            timed_out = true;
            kill(pid, SIGKILL);
            break;
        }
        struct pollfd pf = {.fd = p[0], .events = POLLIN};
        int r = poll(&pf, 1, (int)(left * 1000) + 1);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) continue;
        char *dst = out && got + 1 < n ? out + got : sink;
        size_t room = out && got + 1 < n ? n - 1 - got : sizeof sink;
        ssize_t k = read(p[0], dst, room);
        if (k <= 0) break;
        if (dst != sink) got += (size_t)k;
    }
    close(p[0]);
    if (out && n) out[got] = 0;
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (timed_out) return 124;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The child srun, as it launches its tasks: its step's node list and count,
 * for the monitor (from `scontrol show step`, the one place that has them). */
int slurm_spank_local_user_init(spank_t sp, int ac, char **av) {
    (void)ac, (void)av;
    const char *path = getenv(NODES_FILE_ENV);
    uint32_t job, step;
    if (!path || spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS)
        return 0;
    char id[64], out[8192], list[4096] = "";
    snprintf(id, sizeof id, "%u.%u", job, step);
    char *argv[] = {"scontrol", "-o", "show", "step", id, NULL};
    int nodes = 0;
    const char *at;
    if (run(argv, SCONTROL_TIMEOUT_S, out, sizeof out) == 0 && (at = strstr(out, " NodeList=")))
        sscanf(at + 10, "%4095s", list);
    if ((at = strstr(out, " Nodes="))) nodes = atoi(at + 7);
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "%s\n%d\n", list, nodes);
        fclose(f);
    }
    return 0; /* the step runs whatever happens here */
}

/* This srun's own command line (argv[0] first), from /proc; NULL on failure. */
static char **own_argv(void) {
    FILE *f = fopen("/proc/self/cmdline", "r");
    if (!f) return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    if (n == 0 || n == sizeof buf - 1) return NULL;
    buf[n] = 0;
    int count = 0;
    for (size_t i = 0; i < n; i++) count += buf[i] == 0;
    char **argv = calloc((size_t)count + 1, sizeof *argv);
    if (!argv) return NULL;
    for (size_t i = 0, k = 0; i < n && (int)k < count; i += strlen(buf + i) + 1) argv[k++] = buf + i;
    return argv;
}

static void forward(int sig) {
    stopping = 1;
    if (child > 0) kill(child, sig);
}

static int status_code(int status) {
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static bool is_drained(const char *node) {
    char name[256], out[8192], state[128] = "";
    snprintf(name, sizeof name, "%s", node);
    char *argv[] = {"scontrol", "-o", "show", "node", name, NULL};
    if (run(argv, SCONTROL_TIMEOUT_S, out, sizeof out) != 0) return false;
    const char *at = strstr(out, " State=");
    if (at) sscanf(at + 7, "%127s", state);
    return strstr(state, "DRAIN") != NULL;
}

static bool listed(const char *list, const char *node) {
    size_t n = strlen(node);
    for (const char *p = list; (p = strstr(p, node)); p += n)
        if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == 0)) return true;
    return false;
}

/* After a failed attempt: run the health program on each node of its step
 * (nodes file: node list, node count), then add every one of them now
 * drained to `excluded` (comma-separated). *step_nodes: the step's size. */
static void check_nodes(const char *nodes_file, char *excluded, size_t n, int *step_nodes) {
    char list[4096] = "", names[65536];
    FILE *f = fopen(nodes_file, "r");
    if (!f || fscanf(f, "%4095s %d", list, step_nodes) != 2 || !list[0]) {
        if (f) fclose(f);
        slurm_info("keel_auto_resume: the failed step's nodes are not known (it never launched?): no health checks");
        return;
    }
    fclose(f);
    char *expand[] = {"scontrol", "show", "hostnames", list, NULL};
    if (run(expand, SCONTROL_TIMEOUT_S, names, sizeof names) != 0) {
        slurm_error("keel_auto_resume: scontrol show hostnames %s failed: no health checks", list);
        return;
    }
    unsetenv(NODES_FILE_ENV); /* the health sruns' steps are not the one to report */
    char *node[MAX_NODES];
    pid_t check[MAX_NODES];
    int count = 0;
    for (char *save = NULL, *x = strtok_r(names, "\n", &save); x && count < MAX_NODES; x = strtok_r(NULL, "\n", &save))
        if (!listed(excluded, x)) node[count++] = x;
    /* the checks of all the nodes at once, each its own srun, all within health_timeout */
    for (int i = 0; i < count; i++) {
        check[i] = -1;
        if (!health[0] || is_drained(node[i])) continue;
        char where[300], limit[32];
        snprintf(where, sizeof where, "--nodelist=%s", node[i]);
        snprintf(limit, sizeof limit, "--time=%d", (health_timeout + 59) / 60);
        char *argv[] = {"srun", "-N1", "-n1", where, limit, "--job-name=keel-health", health, NULL};
        if ((check[i] = fork()) == 0) {
            execvp(argv[0], argv);
            _exit(127);
        }
    }
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int left = count; left > 0;) {
        left = 0;
        clock_gettime(CLOCK_MONOTONIC, &now);
        bool late = now.tv_sec - t0.tv_sec > health_timeout;
        for (int i = 0; i < count; i++) {
            int status, rc;
            if (check[i] <= 0) continue;
            if (late) {
                kill(check[i], SIGKILL);
                waitpid(check[i], &status, 0);
                rc = 124;
            } else if (waitpid(check[i], &status, WNOHANG) == check[i]) {
                rc = status_code(status);
            } else {
                left++;
                continue;
            }
            if (rc != 0) slurm_info("keel_auto_resume: health check on %s: exit %d", node[i], rc);
            check[i] = 0;
        }
        if (left) usleep(20000);
    }
    for (int i = 0; i < count; i++)
        if (is_drained(node[i])) {
            size_t at = strlen(excluded);
            snprintf(excluded + at, n - at, "%s%s", at ? "," : "", node[i]);
            slurm_info("keel_auto_resume: node %s is drained: the next attempts exclude it", node[i]);
        }
}

/* Inside an allocation with fewer usable nodes than the step needs: requeue
 * the job (a batch job comes back on other nodes) and say so. true: requeued. */
static bool requeue_if_short(const char *excluded, int step_nodes) {
    const char *job = getenv("SLURM_JOB_ID"), *total = getenv("SLURM_JOB_NUM_NODES");
    if (!job || !total || step_nodes <= 0 || !excluded[0]) return false;
    int out = 1;
    for (const char *p = excluded; *p; p++) out += *p == ',';
    if (atoi(total) - out >= step_nodes) return false;
    char id[64];
    snprintf(id, sizeof id, "%s", job);
    char *argv[] = {"scontrol", "requeue", id, NULL};
    int rc = run(argv, SCONTROL_TIMEOUT_S, NULL, 0);
    slurm_error("keel_auto_resume: %d of the job's %s node(s) drained, the step needs %d: %s", out, total,
                step_nodes, rc == 0 ? "job requeued" : "requeue failed (not a batch job?), giving up");
    return true;
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av) {
    (void)sp, (void)ac, (void)av;
    if (spank_context() != S_CTX_LOCAL || relaunches < 0 || getenv(ATTEMPT_ENV)) return 0;
    char **argv = own_argv();
    if (!argv) {
        slurm_error("keel_auto_resume: cannot read this srun's command line from /proc/self/cmdline; "
                    "running the step once");
        return 0;
    }
    struct sigaction sa = {.sa_handler = forward};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    /* srun has these blocked by now: the monitor takes them; each attempt starts with srun's mask */
    sigset_t stops, srun_mask;
    sigemptyset(&stops);
    sigaddset(&stops, SIGINT);
    sigaddset(&stops, SIGTERM);
    sigaddset(&stops, SIGHUP);
    sigprocmask(SIG_UNBLOCK, &stops, &srun_mask);
    char value[16], nodes_file[64], excluded[8192] = "", exclude_arg[8300];
    snprintf(value, sizeof value, "%d", relaunches);
    setenv(RELAUNCHES_ENV, value, 1);
    snprintf(nodes_file, sizeof nodes_file, "/tmp/keel-auto-resume-%d.nodes", (int)getpid());
    int argc = 0;
    while (argv[argc]) argc++;
    /* argv with --kill-on-bad-exit=1 (and --exclude) after argv[0]: a task that fails ends the attempt's
     * step at once, so no peer waits on it (options the user typed come later and win) */
    char **again = calloc((size_t)argc + 3, sizeof *again);
    if (!again) _exit(1);
    int code = 1, step_nodes = 0;
    for (int attempt = 1; attempt <= relaunches + 1; attempt++) {
        snprintf(value, sizeof value, "%d", attempt);
        setenv(ATTEMPT_ENV, value, 1);
        if (attempt > 1) {
            slurm_info("keel_auto_resume: the step failed (exit %d); relaunch %d of %d", code, attempt - 1,
                       relaunches);
            check_nodes(nodes_file, excluded, sizeof excluded, &step_nodes);
            if (requeue_if_short(excluded, step_nodes)) break;
        }
        int k = 0;
        again[k++] = argv[0];
        again[k++] = "--kill-on-bad-exit=1";
        if (excluded[0]) {
            snprintf(exclude_arg, sizeof exclude_arg, "--exclude=%s", excluded);
            again[k++] = exclude_arg;
        }
        for (int i = 1; i <= argc; i++) again[k++] = argv[i];
        char **use = again;
        setenv(NODES_FILE_ENV, nodes_file, 1);
        unlink(nodes_file);
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) {
            slurm_error("keel_auto_resume: fork: %s", strerror(errno));
            _exit(1);
        }
        if (pid == 0) {
            sigprocmask(SIG_SETMASK, &srun_mask, NULL);
            execvp(use[0], use);
            slurm_error("keel_auto_resume: cannot run %s again: %s", argv[0], strerror(errno));
            _exit(127);
        }
        child = pid;
        int status;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
        child = 0;
        code = status_code(status);
        if (code == 0) break;
        if (stopping) { /* Ctrl-C, scancel: the user's stop, not a failure to repair */
            slurm_info("keel_auto_resume: stopped by a signal; no relaunch");
            break;
        }
    }
    if (code != 0 && relaunches > 0)
        slurm_info("keel_auto_resume: the step failed %d time(s); giving up with exit %d", relaunches + 1, code);
    unlink(nodes_file);
    fflush(NULL);
    _exit(code); /* the monitor never goes on to run the step itself */
}
