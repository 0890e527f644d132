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
 *     It runs its own command line again as a child srun (the attempt number
 *     in KEEL_AUTO_RESUME_ATTEMPT, which makes the plugin in the child stand
 *     aside), waits for it, and on failure runs it again, up to N more
 *     times; then it exits with the last attempt's status. Inside an
 *     allocation each attempt is a new step of the job; a standalone srun
 *     makes a new job for each. SIGINT, SIGTERM and SIGHUP go on to the child.
 *
 * Not yet (issue 13): health checks on the failed step's nodes, draining the
 * ones that fail and excluding them from the next attempt, requeueing the job
 * when too few nodes are left. */
#include <stdint.h> /* spank.h uses the fixed-width types without including it */

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <slurm/spank.h>

SPANK_PLUGIN(keel_auto_resume, 1);

#define MAX_RELAUNCHES 100
#define ATTEMPT_ENV "KEEL_AUTO_RESUME_ATTEMPT"
#define RELAUNCHES_ENV "KEEL_AUTO_RESUME_MAX"

static int relaunches = -1; /* -1: the option was not given */
static volatile pid_t child = 0;

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
    (void)ac, (void)av;
    return spank_option_register(sp, &auto_resume) == ESPANK_SUCCESS ? 0 : -1;
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
    if (child > 0) kill(child, sig);
}

static int status_code(int status) {
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
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
    char value[16];
    snprintf(value, sizeof value, "%d", relaunches);
    setenv(RELAUNCHES_ENV, value, 1);
    int code = 1;
    for (int attempt = 1; attempt <= relaunches + 1; attempt++) {
        snprintf(value, sizeof value, "%d", attempt);
        setenv(ATTEMPT_ENV, value, 1);
        if (attempt > 1) slurm_info("keel_auto_resume: the step failed (exit %d); relaunch %d of %d", code,
                                    attempt - 1, relaunches);
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) {
            slurm_error("keel_auto_resume: fork: %s", strerror(errno));
            _exit(1);
        }
        if (pid == 0) {
            execvp(argv[0], argv);
            slurm_error("keel_auto_resume: cannot run %s again: %s", argv[0], strerror(errno));
            _exit(127);
        }
        child = pid;
        int status;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
        child = 0;
        code = status_code(status);
        if (code == 0) break;
    }
    if (code != 0 && relaunches > 0)
        slurm_info("keel_auto_resume: the step failed %d time(s); giving up with exit %d", relaunches + 1, code);
    fflush(NULL);
    _exit(code); /* the monitor never goes on to run the step itself */
}
