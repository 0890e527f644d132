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

/* fork + exec argv (never a shell). Each stream asked for (pipe_out: stdout,
 * pipe_err: stderr) goes into a new pipe whose read end comes back in fds[0]
 * or fds[1] (-1 where the stream stays ours). own_group: the child leads a
 * process group of its own, so that killing the group ends all it started (and
 * a terminal's Ctrl-C reaches only us). An exec failure is the child's exit
 * code 127 with a line on its stderr, and its errno in *exec_errno (told over
 * a close-on-exec pipe: nothing to read there means the exec worked). */
static pid_t spawn(char *const *argv, bool pipe_out, bool pipe_err, bool own_group, int fds[2], int *exec_errno) {
    int po[2] = {-1, -1}, pe[2] = {-1, -1}, pexec[2] = {-1, -1};
    fds[0] = fds[1] = -1;
    *exec_errno = 0;
    pid_t pid = -1;
    if ((pipe_out && pipe(po) != 0) || (pipe_err && pipe(pe) != 0) || pipe2(pexec, O_CLOEXEC) != 0) goto done;
    pid = fork();
    if (pid == 0) {
        if (own_group) setpgid(0, 0);
        if (pipe_out) dup2(po[1], STDOUT_FILENO);
        if (pipe_err) dup2(pe[1], STDERR_FILENO);
        for (int i = 0; i < 2; i++) {
            if (po[i] >= 0) close(po[i]);
            if (pe[i] >= 0) close(pe[i]);
        }
        execvp(argv[0], argv);
        int e = errno;
        (void)!write(pexec[1], &e, sizeof e);
        dprintf(STDERR_FILENO, "keel: error: cannot run %s: %s\n", argv[0], strerror(e));
        _exit(127);
    }
    if (pid > 0) {
        if (own_group) setpgid(pid, pid); /* also here: no race with the child's own call */
        close(pexec[1]);
        pexec[1] = -1;
        int e;
        ssize_t got;
        while ((got = read(pexec[0], &e, sizeof e)) < 0 && errno == EINTR) {}
        if (got == (ssize_t)sizeof e) *exec_errno = e;
        fds[0] = po[0], fds[1] = pe[0];
        po[0] = pe[0] = -1;
    }
done:
    for (int i = 0; i < 2; i++) {
        if (po[i] >= 0) close(po[i]);
        if (pe[i] >= 0) close(pe[i]);
        if (pexec[i] >= 0) close(pexec[i]);
    }
    return pid;
}

/* A stream being kept: up to max bytes, the rest read and dropped. */
typedef struct {
    int fd;
    char *buf;
    size_t len, cap, max;
    bool cut;
} kept;

/* Read what fd has; false once it closed (or failed). */
static bool keep_more(kept *k) {
    char chunk[16384];
    ssize_t got = read(k->fd, chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) return true;
    if (got <= 0) return false;
    size_t take = (size_t)got <= k->max - k->len ? (size_t)got : k->max - k->len;
    if (take < (size_t)got) k->cut = true;
    if (k->len + take + 1 > k->cap) {
        k->cap = k->len + take + 1 > 2 * k->cap ? k->len + take + 1 : 2 * k->cap;
        k->buf = keel_xrealloc(k->buf, k->cap, "a command's output");
    }
    memcpy(k->buf + k->len, chunk, take);
    k->len += take;
    return true;
}

int keel_run_collect(char *const *argv, double timeout_s, unsigned keep, size_t max_bytes, keel_run_output *o) {
    *o = (keel_run_output){0};
    int fds[2];
    pid_t pid = spawn(argv, keep & KEEL_RUN_STDOUT, keep & KEEL_RUN_STDERR, timeout_s > 0, fds, &o->exec_errno);
    kept k[2] = {{.fd = fds[0], .max = max_bytes}, {.fd = fds[1], .max = max_bytes}};
    double deadline = timeout_s > 0 ? keel_now_s() + timeout_s : 0;
    bool timed_out = false;
    while (pid > 0 && (k[0].fd >= 0 || k[1].fd >= 0)) {
        struct pollfd pfd[2];
        nfds_t n = 0;
        for (int i = 0; i < 2; i++)
            if (k[i].fd >= 0) pfd[n++] = (struct pollfd){.fd = k[i].fd, .events = POLLIN};
        int wait_ms = deadline > 0 ? (int)((deadline - keel_now_s()) * 1000) + 1 : -1;
        if (deadline > 0 && wait_ms <= 0) {
            timed_out = true;
            break;
        }
        if (poll(pfd, n, wait_ms) <= 0) continue; /* EINTR, or the deadline check above ends it */
        for (nfds_t j = 0; j < n; j++) {
            kept *s = pfd[j].fd == k[0].fd ? &k[0] : &k[1];
            if (pfd[j].revents && !keep_more(s)) {
                close(s->fd);
                s->fd = -1;
            }
        }
    }
    char **dst[2] = {&o->out, &o->err};
    for (int i = 0; i < 2; i++) {
        if (k[i].fd >= 0) close(k[i].fd);
        *dst[i] = k[i].buf ? k[i].buf : keel_xcalloc(1, "a command's output");
        (*dst[i])[k[i].len] = 0;
    }
    o->out_cut = k[0].cut, o->err_cut = k[1].cut;
    if (pid < 0) return -1;
    if (timed_out) kill(-pid, SIGKILL);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -1;
    return timed_out ? 124 : exit_code_of(status);
}

void keel_run_output_free(keel_run_output *o) {
    keel_free(o->out);
    keel_free(o->err);
    *o = (keel_run_output){0};
}

int keel_run_capture(char *const *argv, double timeout_s, char *out, size_t n) {
    keel_run_output o;
    int code = keel_run_collect(argv, timeout_s, KEEL_RUN_STDOUT, n - 1, &o);
    memcpy(out, o.out, strlen(o.out) + 1); /* at most n - 1 bytes and the NUL */
    keel_run_output_free(&o);
    return code;
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
    int fds[2], exec_errno;
    p->pid = spawn(argv, false, true, true, fds, &exec_errno);
    p->fd = fds[1];
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

