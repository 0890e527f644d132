/* resil/launch.c: the command lines that start ranks (mpirun locally, srun in
 * a Slurm allocation) and what their messages say about a failed rank. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "keel/resil.h"

bool keel_launch_in_slurm(void) { return getenv("SLURM_JOB_ID") != NULL; }

char **keel_launch_argv(const char *keel_path, const keel_launch_spec *spec, const char *const *args) {
    char np[16], nn[16];
    snprintf(np, sizeof np, "%d", spec->nproc);
    snprintf(nn, sizeof nn, "%d", spec->nodes);
    const char *head[24];
    int n = 0;
    if (keel_launch_in_slurm()) {
        /* --kill-on-bad-exit: one dead task cancels the step (~1 s) instead of leaving the
         * others blocked in a collective. */
        const char *srun[] = {"srun", "--mpi=pmix", "--kill-on-bad-exit=1", "-n", np};
        for (size_t i = 0; i < sizeof srun / sizeof *srun; i++) head[n++] = srun[i];
        if (spec->nodes > 0) head[n++] = "-N", head[n++] = nn;
        if (spec->nodelist) head[n++] = "-w", head[n++] = spec->nodelist;
    } else {
        const char *mpirun[] = {"mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                                "-x", "KEEL_TTY", "-np", np};
        for (size_t i = 0; i < sizeof mpirun / sizeof *mpirun; i++) head[n++] = mpirun[i];
    }
    head[n++] = keel_path;
    int n_args = 0;
    while (args[n_args]) n_args++;
    char **argv = keel_xcalloc(sizeof(char *) * (size_t)(n + n_args + 1), "launch argv");
    for (int i = 0; i < n; i++) argv[i] = keel_xstrdup(head[i]);
    for (int i = 0; i < n_args; i++) argv[n + i] = keel_xstrdup(args[i]);
    return argv;
}

void keel_launch_argv_free(char **argv) {
    for (int i = 0; argv && argv[i]; i++) keel_free(argv[i]);
    keel_free(argv);
}

keel_status keel_self_path(char *out, size_t n) {
    ssize_t len = readlink("/proc/self/exe", out, n - 1);
    if (len <= 0) {
        keel_errorf("cannot read /proc/self/exe: %s", strerror(errno));
        return KEEL_ERR_IO;
    }
    out[len] = 0;
    return KEEL_OK;
}

void keel_launch_env(void) {
    /* OpenMPI on one machine: loopback only (it would also try eth0 otherwise). */
    setenv("OMPI_MCA_btl_tcp_if_include", "lo", 0);
    setenv("OMPI_MCA_oob_tcp_if_include", "lo", 0);
    /* The ranks' stdout is mpirun's pipe or pty: tell the leader what the user sees. */
    setenv("KEEL_TTY", isatty(STDOUT_FILENO) ? "1" : "0", 1);
}

/* mpirun says "process rank N with PID P on node X exited on signal S" or
 * "Process name: [[job,1],N]"; srun says "task N: Killed" / "error: ... task N". */
int keel_launch_blamed_rank(const char *line, int *sig) {
    const char *p;
    int rank;
    *sig = 0;
    if ((p = strstr(line, "process rank ")) && sscanf(p, "process rank %d", &rank) == 1) {
        const char *s = strstr(p, "on signal ");
        if (s) sscanf(s, "on signal %d", sig);
        return rank;
    }
    if ((p = strstr(line, "Process name: [[")) && (p = strstr(p, "],")) && sscanf(p, "],%d]", &rank) == 1)
        return rank;
    if ((p = strstr(line, ": task ")) && sscanf(p, ": task %d", &rank) == 1) {
        if (strstr(line, "Killed")) *sig = 9;
        return rank;
    }
    return -1;
}

int keel_run_capture(char *const *argv, char *out, size_t n) {
    int fds[2];
    out[0] = 0;
    if (pipe(fds) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(fds[1]);
    size_t len = 0;
    ssize_t got;
    while ((got = read(fds[0], out + len, n - 1 - len)) > 0) len += (size_t)got;
    out[len] = 0;
    close(fds[0]);
    int status;
    if (pid < 0) return -1;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
