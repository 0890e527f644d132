/* resil/spawn.c: keel's own launcher of ranks on one machine (`keel launch
 * -n N -- PROGRAM ARGS...`, what `keel train --launcher local` puts where
 * mpirun stood): N children of its process group, each told its place by
 * KEEL_TRANSPORT=gloo, KEEL_RANK, KEEL_WORLD_SIZE and a file store of this
 * launch's own (comm/gloo.c). Like mpirun it stays until every rank is gone,
 * names a rank that failed in mpirun's words ("process rank N ... exited on
 * signal S", which keel_launch_blamed_rank reads), ends the others a grace
 * period later, and exits with the first failure's code. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "keel/ckpt.h"
#include "keel/resil.h"

/* After the first rank failed, the others have this long to end on their own
 * (under Gloo they see the lost peer within milliseconds) before SIGKILL. */
#define GRACE_S 3.0

/* A stop signal sent to the process group reaches every rank itself: the
 * launcher stays to reap them (a handler that does nothing, not SIG_IGN,
 * which the ranks would inherit across exec). */
static void stay(int sig) { (void)sig; }

static pid_t start_rank(char *const *argv, int rank, int n, const char *store, const char *prefix) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    char v[32];
    setenv("KEEL_TRANSPORT", "gloo", 1);
    snprintf(v, sizeof v, "%d", rank);
    setenv("KEEL_RANK", v, 1);
    snprintf(v, sizeof v, "%d", n);
    setenv("KEEL_WORLD_SIZE", v, 1);
    setenv("KEEL_STORE", store, 1);
    setenv("KEEL_STORE_PREFIX", prefix, 1);
    setenv("KEEL_HOST", "127.0.0.1", 0); /* one machine: loopback, whatever the host name resolves to */
    execvp(argv[0], argv);
    dprintf(STDERR_FILENO, "keel: error: launch: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

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

    pid_t *pids = keel_xcalloc(sizeof(pid_t) * (size_t)n, "rank pids");
    int alive = 0, first = -1;
    for (int r = 0; r < n; r++) {
        pids[r] = start_rank(argv, r, n, store, prefix);
        if (pids[r] < 0) {
            keel_errorf("launch: cannot fork rank %d: %s", r, strerror(errno));
            first = r, *exit_code = 1;
            break;
        }
        alive++;
    }
    double failed_at = first >= 0 ? keel_now_s() : 0;
    bool killed = false;
    while (alive > 0) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid < 0 && errno != EINTR) break;
        if (pid <= 0) {
            if (first >= 0 && !killed && keel_now_s() - failed_at > GRACE_S) {
                for (int r = 0; r < n; r++)
                    if (pids[r] > 0) kill(pids[r], SIGKILL);
                killed = true;
            }
            keel_sleep_s(0.02);
            continue;
        }
        int r = 0;
        while (r < n && pids[r] != pid) r++;
        if (r == n) continue; /* not a rank of ours */
        pids[r] = 0;
        alive--;
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (code == 0 || first >= 0) continue;
        first = r, *exit_code = code, failed_at = keel_now_s();
        if (WIFSIGNALED(status))
            fprintf(stderr, "keel: launch: process rank %d with PID %d exited on signal %d (%s)\n", r, (int)pid,
                    WTERMSIG(status), strsignal(WTERMSIG(status)));
        else if (code != KEEL_EXIT_RESUME)
            fprintf(stderr, "keel: launch: process rank %d with PID %d exited with code %d\n", r, (int)pid, code);
    }
    if (first < 0) *exit_code = 0;
    keel_free(pids);
    keel_ckpt_remove_tree(dir);
    return KEEL_OK;
}
