/* resil/launch.c: start the ranks of a run through mpirun or srun and report how they ended. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "keel/resil.h"

char **keel_launch_argv(const char *keel_path, const char *run_dir, int nproc) {
    char np[16];
    snprintf(np, sizeof np, "%d", nproc);
    const char *mpirun[] = {"mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                            "-x", "KEEL_TTY", "-np", np, keel_path, "worker", run_dir, NULL};
    const char *srun[] = {"srun", "--mpi=pmix", "--kill-on-bad-exit=1", "-n", np, keel_path,
                          "worker", run_dir, NULL};
    const char **src = getenv("SLURM_JOB_ID") ? srun : mpirun;
    int n = 0;
    while (src[n]) n++;
    char **argv = keel_xcalloc(sizeof(char *) * (size_t)(n + 1), "launch argv");
    for (int i = 0; i < n; i++) argv[i] = keel_xstrdup(src[i]);
    return argv;
}

void keel_launch_argv_free(char **argv) {
    for (int i = 0; argv && argv[i]; i++) keel_free(argv[i]);
    keel_free(argv);
}

/* The rank a launcher's message names, or -1: mpirun says "process rank N"
 * or "Process name: [[job,1],N]"; srun says "task N". */
static int rank_named_in(const char *line) {
    const char *p;
    int rank;
    if ((p = strstr(line, "process rank ")) && sscanf(p, "process rank %d", &rank) == 1) return rank;
    if ((p = strstr(line, "Process name: [[")) && (p = strstr(p, "],")) && sscanf(p, "],%d]", &rank) == 1)
        return rank;
    if ((p = strstr(line, ": task ")) && sscanf(p, ": task %d", &rank) == 1) return rank;
    return -1;
}

keel_status keel_launch_ranks(const char *run_dir, int nproc, int *exit_code) {
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    KEEL_CHECK(len > 0, "cannot read /proc/self/exe: %s", strerror(errno));
    self[len] = 0;
    /* OpenMPI on one machine: loopback only (it would also try eth0 otherwise). */
    setenv("OMPI_MCA_btl_tcp_if_include", "lo", 0);
    setenv("OMPI_MCA_oob_tcp_if_include", "lo", 0);
    /* The ranks' stdout is mpirun's pipe or pty: tell the leader what the user sees. */
    setenv("KEEL_TTY", isatty(STDOUT_FILENO) ? "1" : "0", 1);
    char **argv = keel_launch_argv(self, run_dir, nproc);
    int err[2];
    KEEL_CHECK(pipe(err) == 0, "pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid == 0) {
        dup2(err[1], STDERR_FILENO);
        close(err[0]);
        close(err[1]);
        execvp(argv[0], argv);
        fprintf(stderr, "keel: error: cannot run %s: %s; install OpenMPI (scripts/install-deps.sh)\n",
                argv[0], strerror(errno));
        _exit(127);
    }
    close(err[1]);
    keel_status st = KEEL_OK;
    if (pid < 0) {
        keel_errorf("cannot start %s: %s", argv[0], strerror(errno));
        close(err[0]);
        keel_launch_argv_free(argv);
        return KEEL_ERR_IO;
    }
    /* Pass the launcher's messages through, remembering the first rank they blame. */
    FILE *f = fdopen(err[0], "r");
    char line[4096];
    int blamed = -1;
    while (fgets(line, sizeof line, f)) {
        fputs(line, stderr);
        if (blamed < 0) blamed = rank_named_in(line);
    }
    fclose(f);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (*exit_code != 0) {
        if (blamed >= 0)
            keel_errorf("rank %d of %d failed (%s exit %d); its log: %s/logs/rank-%d.log", blamed,
                        nproc, argv[0], *exit_code, run_dir, blamed);
        else
            keel_errorf("the ranks failed (%s exit %d); logs: %s/logs/", argv[0], *exit_code, run_dir);
        st = KEEL_ERR_IO;
    }
    keel_launch_argv_free(argv);
    return st;
}
