/* resil/launch.c: process plumbing — the command lines that start ranks
 * (mpirun locally, srun in a Slurm allocation), what their messages say about
 * a failed rank, a child whose stderr we read line by line, and commands run
 * from argv vectors with a time limit (never through a shell). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "keel/ckpt.h"
#include "keel/resil.h"

bool keel_launch_in_slurm(void) { return getenv("SLURM_JOB_ID") != NULL; }

bool keel_launch_is_local(void) {
    const char *l = getenv("KEEL_LAUNCHER");
    return l && !strcmp(l, "local");
}

char **keel_launch_argv(const char *keel_path, const keel_launch_spec *spec, const char *const *args) {
    char np[16], nn[16];
    snprintf(np, sizeof np, "%d", spec->nproc);
    snprintf(nn, sizeof nn, "%d", spec->nodes);
    const char *head[24];
    int n = 0;
    if (keel_launch_is_local()) {
        const char *local[] = {keel_path, "launch", "-n", np, "--"};
        for (size_t i = 0; i < sizeof local / sizeof *local; i++) head[n++] = local[i];
    } else if (keel_launch_in_slurm()) {
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

/* mpirun given a default hostfile spans the hosts it lists: the Kubeflow MPIJob operator sets
 * OMPI_MCA_orte_default_hostfile=/etc/mpi/hostfile in the launcher pod (PRRTE's name in OpenMPI 5). */
static bool hostfile_given(void) {
    return getenv("OMPI_MCA_orte_default_hostfile") || getenv("PRTE_MCA_prte_default_hostfile");
}

bool keel_launch_ranks_here(void) { return keel_launch_is_local() || (!keel_launch_in_slurm() && !hostfile_given()); }

void keel_launch_env(void) {
    /* One machine: OpenMPI over loopback only (it would also try eth0
     * otherwise), and shared memory through ob1 (probing for UCX costs every
     * MPI_Init 0.2 s, a fifth of a recovery). A Slurm allocation or a hostfile
     * spans hosts: OpenMPI picks their interfaces and transport. A setting of
     * the user's stays. */
    if (keel_launch_ranks_here()) {
        setenv("OMPI_MCA_btl_tcp_if_include", "lo", 0);
        setenv("OMPI_MCA_oob_tcp_if_include", "lo", 0);
        setenv("OMPI_MCA_pml", "ob1", 0);
    }
    /* The ranks' stdout is mpirun's pipe or pty: tell the leader what the user sees. */
    setenv("KEEL_TTY", isatty(STDOUT_FILENO) ? "1" : "0", 1);
}

/* The backing directories of supervisors that are gone (killed -9 with their
 * job): this user's /dev/shm/keel-mpi-<pid> whose process is not alive. */
static void remove_orphaned_shm(void) {
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    struct dirent *e;
    int pid;
    while ((e = readdir(d))) {
        char path[300];
        struct stat st;
        snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
        if (sscanf(e->d_name, "keel-mpi-%d", &pid) == 1 && pid > 0 && !keel_pid_alive(pid) &&
            stat(path, &st) == 0 && st.st_uid == getuid())
            keel_ckpt_remove_tree(path);
    }
    closedir(d);
}

void keel_launch_shm_begin(char *dir, size_t n) {
    dir[0] = 0;
    /* over a hostfile the other hosts have no such directory */
    if (!keel_launch_ranks_here() || getenv("OMPI_MCA_btl_vader_backing_directory")) return;
    remove_orphaned_shm();
    snprintf(dir, n, "/dev/shm/keel-mpi-%d", (int)getpid());
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        keel_log_warn("%s: cannot create (%s): OpenMPI keeps its shared memory in /dev/shm", dir, strerror(errno));
        dir[0] = 0;
        return;
    }
    setenv("OMPI_MCA_btl_vader_backing_directory", dir, 1);
}

void keel_launch_shm_clear(const char *dir, bool last) {
    if (!dir[0]) return;
    keel_ckpt_remove_tree(dir); /* flat: OpenMPI's segment files */
    if (!last) mkdir(dir, 0700);
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

static int exit_code_of(int status) {
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* fork + exec argv with stream `fd` (stdout or stderr) into a new pipe whose
 * read end comes back in *read_fd; in a process group of its own. */
static pid_t spawn(char *const *argv, int fd, int *read_fd) {
    int p[2];
    if (pipe(p) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        dup2(p[1], fd);
        close(p[0]);
        close(p[1]);
        execvp(argv[0], argv);
        dprintf(STDERR_FILENO, "keel: error: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(p[1]);
    if (pid < 0) {
        close(p[0]);
        return -1;
    }
    setpgid(pid, pid); /* also here: no race with the child's own call */
    *read_fd = p[0];
    return pid;
}

int keel_run_capture(char *const *argv, double timeout_s, char *out, size_t n) {
    int fd;
    out[0] = 0;
    pid_t pid = spawn(argv, STDOUT_FILENO, &fd);
    if (pid < 0) return -1;
    size_t len = 0;
    double deadline = timeout_s > 0 ? keel_now_s() + timeout_s : 0;
    bool timed_out = false;
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int wait_ms = deadline > 0 ? (int)((deadline - keel_now_s()) * 1000) + 1 : -1;
        if (deadline > 0 && wait_ms <= 0) {
            timed_out = true;
            break;
        }
        int ready = poll(&pfd, 1, wait_ms);
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0) continue; /* the deadline check above ends it */
        char drop[4096];
        char *dst = len < n - 1 ? out + len : drop;
        size_t room = len < n - 1 ? n - 1 - len : sizeof drop;
        ssize_t got = read(fd, dst, room);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        if (dst != drop) len += (size_t)got;
    }
    out[len] = 0;
    close(fd);
    if (timed_out) kill(-pid, SIGKILL);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -1;
    return timed_out ? 124 : exit_code_of(status);
}

/* ---- a child with its stderr read line by line ----------------------------------- */

struct keel_proc {
    pid_t pid;
    int fd;             /* stderr's read end, -1 once closed */
    bool reaped;
    int exit_code;
    char buf[8192];     /* a partial line */
    size_t len;
};

keel_status keel_proc_start(char *const *argv, keel_proc **out) {
    keel_proc *p = keel_xcalloc(sizeof *p, "process");
    p->pid = spawn(argv, STDERR_FILENO, &p->fd);
    if (p->pid < 0) {
        keel_errorf("cannot start %s: %s", argv[0], strerror(errno));
        keel_free(p);
        return KEEL_ERR_IO;
    }
    fcntl(p->fd, F_SETFL, O_NONBLOCK);
    *out = p;
    return KEEL_OK;
}

/* Hand every complete line in the buffer to fn; keep the rest. */
static void pass_lines(keel_proc *p, keel_line_fn fn, void *ctx) {
    char *start = p->buf, *nl;
    while ((nl = memchr(start, '\n', (size_t)(p->buf + p->len - start)))) {
        *nl = 0;
        fn(ctx, start);
        start = nl + 1;
    }
    p->len = (size_t)(p->buf + p->len - start);
    memmove(p->buf, start, p->len);
}

void keel_proc_read_lines(keel_proc *p, int timeout_ms, keel_line_fn fn, void *ctx) {
    if (p->fd < 0) {
        keel_sleep_s(timeout_ms / 1000.0);
        return;
    }
    struct pollfd pfd = {.fd = p->fd, .events = POLLIN};
    if (poll(&pfd, 1, timeout_ms) <= 0) return;
    for (;;) {
        ssize_t got = read(p->fd, p->buf + p->len, sizeof p->buf - 1 - p->len);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return; /* EAGAIN: all read for now */
        if (got == 0) {      /* closed: the last line may lack its newline */
            close(p->fd);
            p->fd = -1;
            if (p->len) p->buf[p->len++] = '\n';
        }
        p->len += (size_t)(got > 0 ? got : 0);
        if (p->len == sizeof p->buf - 1) p->buf[p->len++] = '\n'; /* an over-long line: pass it in parts */
        pass_lines(p, fn, ctx);
        if (p->fd < 0) return;
    }
}

bool keel_proc_exited(keel_proc *p, int *exit_code) {
    int status;
    if (!p->reaped && waitpid(p->pid, &status, WNOHANG) == p->pid) {
        p->reaped = true;
        p->exit_code = exit_code_of(status);
    }
    if (p->reaped && exit_code) *exit_code = p->exit_code;
    return p->reaped;
}

void keel_proc_kill(keel_proc *p, int sig) { kill(-p->pid, sig); }

int keel_proc_finish(keel_proc *p, keel_line_fn fn, void *ctx) {
    /* what is there now: ranks that outlive their launcher may hold the pipe open */
    keel_proc_read_lines(p, 0, fn, ctx);
    if (p->fd >= 0) close(p->fd);
    if (p->len) {
        p->buf[p->len++] = '\n';
        pass_lines(p, fn, ctx);
    }
    kill(-p->pid, SIGKILL); /* anything the process left behind in its group */
    int status;
    if (!p->reaped) {
        while (waitpid(p->pid, &status, 0) < 0 && errno == EINTR) {}
        p->exit_code = exit_code_of(status);
    }
    int code = p->exit_code;
    keel_free(p);
    return code;
}

