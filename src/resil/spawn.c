/* resil/spawn.c: keel's own starter of ranks on this machine — no mpirun.
 * Each rank is a child told its place by KEEL_TRANSPORT=gloo, KEEL_RANK,
 * KEEL_WORLD_SIZE, KEEL_STORE and KEEL_STORE_PREFIX (comm/gloo.c). `keel
 * launch -n N -- PROGRAM ARGS...` (what `keel train --launcher local` puts
 * where mpirun stood) starts all N with a file store of its own; keel agent
 * starts its node's share of a larger world with etcd as the store. Like
 * mpirun it names a rank that failed in mpirun's words ("process rank N ...
 * exited on signal S", which keel_launch_blamed_rank reads), gives the others
 * a grace period to end on their own, then ends them. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "keel/ckpt.h"
#include "keel/resil.h"

/* After the first rank failed, the others have this long to end on their own
 * (under Gloo they see the lost peer within milliseconds) before SIGKILL. */
#define GRACE_S 3.0

struct keel_ranks {
    int n, first_rank;
    pid_t *pids;      /* 0: reaped */
    int alive;
    int failed;       /* the first failed rank here (-1: none) */
    int exit_code;    /* its exit code (0: every rank so far succeeded) */
    double failed_at; /* keel_now_s() of the first failure */
    bool killed;
};

static pid_t start_rank(const keel_ranks_spec *spec, int rank) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    char v[32];
    setenv("KEEL_TRANSPORT", "gloo", 1);
    snprintf(v, sizeof v, "%d", rank);
    setenv("KEEL_RANK", v, 1);
    snprintf(v, sizeof v, "%d", spec->world_size);
    setenv("KEEL_WORLD_SIZE", v, 1);
    setenv("KEEL_STORE", spec->store, 1);
    setenv("KEEL_STORE_PREFIX", spec->prefix, 1);
    if (spec->host) setenv("KEEL_HOST", spec->host, 1);
    execvp(spec->argv[0], spec->argv);
    dprintf(STDERR_FILENO, "keel: error: launch: cannot run %s: %s\n", spec->argv[0], strerror(errno));
    _exit(127);
}

keel_status keel_ranks_start(const keel_ranks_spec *spec, keel_ranks **out) {
    keel_ranks *r = keel_xcalloc(sizeof *r, "ranks");
    *r = (keel_ranks){.n = spec->n, .first_rank = spec->first_rank, .failed = -1};
    r->pids = keel_xcalloc(sizeof(pid_t) * (size_t)spec->n, "rank pids");
    for (int i = 0; i < spec->n; i++) {
        if ((r->pids[i] = start_rank(spec, spec->first_rank + i)) < 0) {
            keel_errorf("launch: cannot fork rank %d: %s", spec->first_rank + i, strerror(errno));
            r->pids[i] = 0;
            keel_ranks_free(r);
            return KEEL_ERR_IO;
        }
        r->alive++;
    }
    *out = r;
    return KEEL_OK;
}

bool keel_ranks_poll(keel_ranks *r, int *exit_code) {
    for (int i = 0; i < r->n; i++) { /* each of ours by pid: a child of someone else's stays theirs */
        int status;
        pid_t pid = r->pids[i] > 0 ? waitpid(r->pids[i], &status, WNOHANG) : 0;
        if (pid <= 0) continue;
        r->pids[i] = 0;
        r->alive--;
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        /* a rank that lost a peer (78) is named only when no other failure comes: the peer is the one */
        bool lost_peer = code == KEEL_EXIT_PEER_LOST;
        if (code == 0 || (r->failed >= 0 && (lost_peer || r->exit_code != KEEL_EXIT_PEER_LOST))) continue;
        if (r->failed < 0) r->failed_at = keel_now_s();
        r->failed = r->first_rank + i, r->exit_code = code;
        if (lost_peer) continue;
        if (WIFSIGNALED(status))
            fprintf(stderr, "keel: launch: process rank %d with PID %d exited on signal %d (%s)\n", r->failed,
                    (int)pid, WTERMSIG(status), strsignal(WTERMSIG(status)));
        else if (code != KEEL_EXIT_RESUME)
            fprintf(stderr, "keel: launch: process rank %d with PID %d exited with code %d\n", r->failed, (int)pid,
                    code);
    }
    if (r->failed >= 0 && r->alive > 0 && !r->killed && keel_now_s() - r->failed_at > GRACE_S) {
        keel_ranks_signal(r, SIGKILL);
        r->killed = true;
    }
    *exit_code = r->exit_code;
    return r->alive == 0;
}

int keel_ranks_failed(const keel_ranks *r) { return r->failed; }

void keel_ranks_signal(keel_ranks *r, int sig) {
    for (int i = 0; i < r->n; i++)
        if (r->pids[i] > 0) kill(r->pids[i], sig);
}

void keel_ranks_free(keel_ranks *r) {
    if (!r) return;
    keel_ranks_signal(r, SIGKILL);
    for (int i = 0; i < r->n; i++)
        if (r->pids[i] > 0) waitpid(r->pids[i], NULL, 0);
    keel_free(r->pids);
    keel_free(r);
}

/* ---- keel launch ------------------------------------------------------------------ */

/* A stop signal sent to the process group reaches every rank itself: the
 * launcher stays to reap them (a handler that does nothing, not SIG_IGN,
 * which the ranks would inherit across exec). */
static void stay(int sig) { (void)sig; }

keel_status keel_launch_local(int n, char *const *argv, int *exit_code) {
    *exit_code = 1;
    char dir[4096];
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/keel-launch-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        keel_errorf("launch: cannot create a store directory in %s: %s (set TMPDIR to a writable directory)",
                    tmp && *tmp ? tmp : "/tmp", strerror(errno));
        return KEEL_ERR_IO;
    }
    char store[4200], prefix[64];
    snprintf(store, sizeof store, "file:%s", dir);
    snprintf(prefix, sizeof prefix, "launch-%d", (int)getpid());
    int sigs[] = {SIGTERM, SIGINT, SIGUSR1, SIGUSR2, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) signal(sigs[i], stay);
    /* one machine: loopback, whatever the host name resolves to */
    keel_ranks_spec spec = {.n = n, .first_rank = 0, .world_size = n, .store = store, .prefix = prefix,
                            .host = "127.0.0.1", .argv = argv};
    keel_ranks *ranks;
    keel_status st = keel_ranks_start(&spec, &ranks);
    if (st == KEEL_OK) {
        while (!keel_ranks_poll(ranks, exit_code)) keel_sleep_s(0.02);
        keel_ranks_free(ranks);
    }
    keel_ckpt_remove_tree(dir);
    return st;
}
