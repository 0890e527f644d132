/* cluster/local.c: a real Slurm cluster on this one machine, every node its
 * own host (keel/cluster.h). A node is a named network namespace
 * (/run/netns/keel-CLUSTER-NODE) with a veth on the cluster's bridge and its
 * address from Subnet, plus a UTS namespace (its hostname) and a mount
 * namespace in which /tmp is its own directory, /dev/shm its own tmpfs,
 * /etc/hosts the cluster's and StateDir/munge its own munged's socket. A
 * keeper process (`sleep infinity`, its pid in StateDir/nodes/NODE/keeper.pid)
 * holds the three; everything that runs on the node enters them with setns:
 * the on_create script, munged, slurmctld (controller) and slurmd (workers).
 * keel and the auto-resume plugin are copied into StateDir (bin/, lib/keel/),
 * which every node sees, so a keel built anywhere (a clone in /tmp, whose
 * /tmp no node shares) runs on the nodes. The host runs a munged of its own,
 * so that its sbatch/srun/sinfo talk to the cluster (keel cluster env).
 * Taking it down kills every process whose network namespace is a node's,
 * then removes the namespaces and the bridge; the veths go with their
 * namespaces, the mounts with their keepers. Nothing is removed outside
 * StateDir (remove_in_state checks each path). */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "keel/cluster.h"
#include "keel/resil.h"

#define CMD_TIMEOUT_S 30
#define IDLE_TIMEOUT_S 60
#define ON_CREATE_TIMEOUT_S 600
#define OUTPUT_MAX_BYTES (4 << 20) /* what a command may print that we keep */
#define LOG_TAIL_BYTES 65536       /* of a daemon's log, read for its last error */

/* ---- names ------------------------------------------------------------------- */

/* A new string (keel_free) from fmt: no buffer to cut a path short. */
static char *xprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xprintf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    KEEL_CHECK(n >= 0, "vsnprintf(%s) failed", fmt);
    char *p = keel_xmalloc((size_t)n + 1, "string");
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return p;
}

static unsigned cluster_hash(const keel_cluster_spec *s) {
    return XXH32(s->name, strlen(s->name), 0) & 0xffffff;
}
/* Interface names: at most 15 bytes (IFNAMSIZ), fixed width by construction. */
typedef struct {
    char s[16];
} ifname;
static ifname bridge_name(const keel_cluster_spec *s) {
    ifname n;
    snprintf(n.s, sizeof n.s, "kbr-%06x", cluster_hash(s));
    return n;
}
static ifname veth_name(const keel_cluster_spec *s, const char *side, int i) {
    ifname n;
    int len = snprintf(n.s, sizeof n.s, "%s-%06x-%d", side, cluster_hash(s), i);
    KEEL_CHECK(len > 0 && (size_t)len < sizeof n.s, "veth name of node %d", i);
    return n;
}
static char *netns_name(const keel_cluster_spec *s, int i) {
    return xprintf("keel-%s-%s", s->name, s->nodes[i].name);
}
static char *node_path(const keel_cluster_spec *s, int i, const char *rel) {
    return xprintf("%s/nodes/%s%s%s", s->state_dir, s->nodes[i].name, rel[0] ? "/" : "", rel);
}
static keel_node_role role_of(const keel_cluster_spec *s, int i) { return s->groups[s->nodes[i].group].role; }

static pid_t read_pid(const char *path) {
    char *text;
    if (keel_read_file_quiet(path, 64, &text, NULL) != KEEL_OK) return 0;
    long pid = strtol(text, NULL, 10);
    keel_free(text);
    return pid > 0 && pid < (1L << 22) ? (pid_t)pid : 0;
}
static pid_t keeper_pid(const keel_cluster_spec *s, int i) {
    char *p = node_path(s, i, "keeper.pid");
    pid_t pid = read_pid(p);
    keel_free(p);
    return pid;
}
/* The inode of node i's network namespace, 0 when it has none. */
static ino_t netns_inode(const keel_cluster_spec *s, int i) {
    char *name = netns_name(s, i), *path = xprintf("/run/netns/%s", name);
    struct stat st;
    ino_t ino = stat(path, &st) == 0 ? st.st_ino : 0;
    keel_free(name);
    keel_free(path);
    return ino;
}
/* Node i whose network namespace pid is in, or -1. */
static int node_of_pid(const keel_cluster_spec *s, const ino_t *ns, pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/ns/net", (int)pid);
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    for (int i = 0; i < s->nnodes; i++)
        if (ns[i] && st.st_ino == ns[i]) return i;
    return -1;
}

/* ---- removing: only below StateDir ------------------------------------------------ */

static int remove_entry(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)ftw;
    return (flag == FTW_DP ? rmdir(p) : unlink(p)) == 0 || errno == ENOENT ? 0 : -1;
}

/* Remove path — a file, or a directory and everything in it, never following
 * a symlink nor crossing into another file system — when it lies strictly
 * below the cluster's StateDir with no symlink on the way there. Every
 * removal of up and down goes through here; a path that is not there is
 * fine. The paths are keel's own (StateDir + a name it made): one elsewhere
 * is a bug. */
static keel_status remove_in_state(const keel_cluster_spec *s, const char *path) {
    size_t n = strlen(s->state_dir);
    bool below = !strncmp(path, s->state_dir, n) && path[n] == '/' && path[n + 1];
    for (const char *c = path + n; below && *c; c = strchr(c + 1, '/') ? strchr(c + 1, '/') : "") {
        size_t len = strcspn(c + 1, "/");
        below = len > 0 && !(len == 1 && c[1] == '.') && !(len == 2 && c[1] == '.' && c[2] == '.');
    }
    KEEL_CHECK(below, "refusing to remove %s: not below the cluster's StateDir %s", path, s->state_dir);
    for (const char *c = strchr(path + n + 1, '/'); c; c = strchr(c + 1, '/')) {
        char *prefix = xprintf("%.*s", (int)(c - path), path);
        struct stat st;
        bool link = lstat(prefix, &st) == 0 && S_ISLNK(st.st_mode);
        if (link) keel_errorf("cluster %s: %s is a symlink; keel removes nothing through one (%s stays)", s->name,
                              prefix, path);
        keel_free(prefix);
        if (link) return KEEL_ERR_INPUT;
    }
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT || errno == ENOTDIR) return KEEL_OK;
        keel_errorf("cannot remove %s: %s", path, strerror(errno));
        return KEEL_ERR_IO;
    }
    int rc = S_ISDIR(st.st_mode) ? nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) : unlink(path);
    if (rc != 0 && errno != ENOENT) {
        keel_errorf("cannot remove %s: %s", path, strerror(errno));
        return KEEL_ERR_IO;
    }
    return KEEL_OK;
}

/* ---- running things on the host or on a node ---------------------------------- */

/* Start argv on the host (node < 0) or in node's namespaces, in its own
 * process group; stdout and stderr to out_fd (-1: ours), env "K=V" added. */
static pid_t spawn(const keel_cluster_spec *s, int node, char *const *argv, const char *cwd, int out_fd,
                   char *const *env) {
    pid_t keeper = node >= 0 ? keeper_pid(s, node) : 0;
    if (node >= 0 && !keeper) {
        keel_errorf("node %s: no keeper process (is the cluster up?)", s->nodes[node].name);
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        keel_errorf("fork: %s", strerror(errno));
        return -1;
    }
    if (pid > 0) return pid;
    if (out_fd >= 0) { /* not `keel cluster exec`'s: that one stays in the terminal's foreground */
        setpgid(0, 0);
        dup2(out_fd, STDOUT_FILENO);
        dup2(out_fd, STDERR_FILENO);
        int null = open("/dev/null", O_RDONLY);
        if (null >= 0) dup2(null, STDIN_FILENO);
    }
    if (keeper) {
        static const char *const kinds[] = {"net", "uts", "mnt"}; /* mnt last: /proc is the host's until then */
        for (int k = 0; k < 3; k++) {
            char p[64];
            snprintf(p, sizeof p, "/proc/%d/ns/%s", (int)keeper, kinds[k]);
            int fd = open(p, O_RDONLY | O_CLOEXEC);
            if (fd < 0 || setns(fd, 0) != 0) {
                fprintf(stderr, "cannot enter node %s (%s): %s\n", s->nodes[node].name, p, strerror(errno));
                _exit(126);
            }
            close(fd);
        }
    }
    if (!cwd || chdir(cwd) != 0) (void)!chdir("/");
    for (char *const *e = env; e && *e; e++) putenv(*e);
    signal(SIGPIPE, SIG_DFL);
    execvp(argv[0], argv);
    fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

/* Wait for pid up to timeout_s (0: no limit), killing its group after. Its exit code, 128+signal, 124. */
static int wait_for(pid_t pid, double timeout_s) {
    double deadline = keel_now_s() + timeout_s;
    for (;;) {
        int status;
        pid_t r = waitpid(pid, &status, timeout_s > 0 ? WNOHANG : 0);
        if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (r < 0 && errno != EINTR) return -1;
        if (timeout_s > 0 && keel_now_s() > deadline) {
            kill(-pid, SIGKILL);
            waitpid(pid, &status, 0);
            return 124;
        }
        if (r == 0) keel_sleep_s(0.02);
    }
}

/* Append what fd has now to *out (up to OUTPUT_MAX_BYTES; the rest is read and dropped). */
static void drain(int fd, keel_strbuf *out) {
    char chunk[4096];
    ssize_t got;
    while ((got = read(fd, chunk, sizeof chunk)) > 0)
        if (out->n + (size_t)got <= OUTPUT_MAX_BYTES) keel_strbuf_printf(out, "%.*s", (int)got, chunk);
}

/* Run argv to its end (daemons: until they have forked off); *out its
 * output (malloc'd, never NULL). A daemon's child may keep the pipe open:
 * output is read only while the command itself runs. */
static int run_out(const keel_cluster_spec *s, int node, char *const *argv, char *const *env, char **out) {
    keel_strbuf b = {0};
    keel_strbuf_printf(&b, "%s", "");
    *out = b.s;
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return -1;
    pid_t pid = spawn(s, node, argv, NULL, p[1], env);
    close(p[1]);
    if (pid < 0) {
        close(p[0]);
        return -1;
    }
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    double deadline = keel_now_s() + CMD_TIMEOUT_S;
    int code = -2;
    while (code == -2) {
        struct pollfd pfd = {.fd = p[0], .events = POLLIN};
        poll(&pfd, 1, 20);
        drain(p[0], &b);
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            drain(p[0], &b);
            code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        } else if (keel_now_s() > deadline) {
            kill(-pid, SIGKILL);
            waitpid(pid, &status, 0);
            code = 124;
        }
    }
    close(p[0]);
    *out = b.s;
    return code;
}

static bool error_line(const char *line) { return strcasestr(line, "error") || strcasestr(line, "fatal"); }

/* What a daemon's log says went wrong, for one error line (malloc'd): its
 * last line that says error or fatal, led by the first of the errors just
 * before it when there are several in a row (slurmd's last is "slurmd
 * initialization failed"; the cause is where the run began), timestamps
 * dropped, control characters escaped. */
static char *log_last_error(const char *log) {
    int fd = open(log, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return keel_xstrdup("(no log written)");
    off_t size = lseek(fd, 0, SEEK_END), from = size > LOG_TAIL_BYTES ? size - LOG_TAIL_BYTES : 0;
    char *text = keel_xmalloc(LOG_TAIL_BYTES + 1, "log tail");
    ssize_t got = size > 0 ? pread(fd, text, (size_t)(size - from), from) : 0;
    close(fd);
    size_t n = got > 0 ? (size_t)got : 0;
    for (size_t k = 0; k < n; k++)
        if (!text[k]) text[k] = ' ';
    text[n] = 0;
    const char *last = NULL, *run_first = NULL, *run_last = NULL; /* the last run of error lines */
    bool in_run = false;
    for (char *line = text; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        if (*line == '[' && strstr(line, "] ")) line = strstr(line, "] ") + 2; /* slurm's [timestamp] */
        if (*line) {
            last = line;
            if (error_line(line)) {
                if (!in_run) run_first = line;
                run_last = line;
            }
            in_run = error_line(line);
        }
        line = nl ? nl + 1 : NULL;
    }
    char *said;
    if (!run_last) said = keel_xstrdup(keel_cluster_show(last ? last : "(empty)", 320).s);
    else if (run_first == run_last) said = keel_xstrdup(keel_cluster_show(run_last, 320).s);
    else {
        keel_cluster_shown first = keel_cluster_show(run_first, 320);
        said = xprintf("%s ... %s", first.s, keel_cluster_show(run_last, 160).s);
    }
    keel_free(text);
    return said;
}

/* Run argv on node (-1: the host) to its end; a failure is one error line
 * naming the node, the command, its exit code and the first line it said,
 * and for a daemon (log: its log file as the host sees it) the log and its
 * last error line. */
static keel_status run_cmd(const keel_cluster_spec *s, int node, char *const *argv, const char *log) {
    char *out;
    int rc = run_out(s, node, argv, NULL, &out);
    if (rc == 0) {
        keel_free(out);
        return KEEL_OK;
    }
    keel_strbuf line = {0};
    for (int k = 0; argv[k]; k++) keel_strbuf_printf(&line, "%s%s", k ? " " : "", argv[k]);
    out[strcspn(out, "\n")] = 0;
    char code[32];
    snprintf(code, sizeof code, rc == 124 ? "no answer in %d s" : rc < 0 ? "not started" : "exit %d",
             rc == 124 ? CMD_TIMEOUT_S : rc);
    keel_cluster_shown said = keel_cluster_show(out, 160);
    char *where = node >= 0 ? xprintf("on node %s: ", s->nodes[node].name) : keel_xstrdup("");
    if (log) {
        char *log_said = log_last_error(log);
        keel_errorf("%s%s failed (%s%s%s); its log %s says: %s", where, line.s, code, out[0] ? ": " : "", said.s,
                    log, log_said);
        keel_free(log_said);
    } else
        keel_errorf("%s%s failed (%s%s%s)", where, line.s, code, out[0] ? ": " : "", said.s);
    keel_free(where);
    keel_free(line.s);
    keel_free(out);
    return KEEL_ERR_IO;
}

/* run_cmd of the arguments after log, up to a NULL. */
static keel_status cmdv(const keel_cluster_spec *s, int node, const char *log, ...) __attribute__((sentinel));
static keel_status cmdv(const keel_cluster_spec *s, int node, const char *log, ...) {
    char *argv[24];
    int argc = 0;
    va_list ap;
    va_start(ap, log);
    for (char *a; (a = va_arg(ap, char *));) {
        KEEL_CHECK(argc < 23, "more than 23 arguments to %s", argv[0]);
        argv[argc++] = a;
    }
    va_end(ap);
    argv[argc] = NULL;
    return run_cmd(s, node, argv, log);
}

static bool in_path(const char *prog) {
    const char *path = getenv("PATH");
    char *dirs = xprintf("%s:/usr/sbin:/sbin", path ? path : "/usr/bin:/bin"), *save = NULL;
    bool found = false;
    for (char *d = strtok_r(dirs, ":", &save); d && !found; d = strtok_r(NULL, ":", &save)) {
        char *p = xprintf("%s/%s", d, prog);
        found = access(p, X_OK) == 0;
        keel_free(p);
    }
    keel_free(dirs);
    return found;
}

static bool quiet; /* a failed up taking down what it made: its error is the news */

/* ---- up: checks before anything starts ------------------------------------------ */

static keel_status need_root(const char *what) {
    if (geteuid() == 0) return KEEL_OK;
    keel_errorf("keel cluster %s: needs root (network namespaces, a bridge, mounts); run it with sudo", what);
    return KEEL_ERR_INPUT;
}

static bool bridge_exists(const keel_cluster_spec *s) {
    char *p = xprintf("/sys/class/net/%s", bridge_name(s).s);
    bool there = keel_path_exists(p);
    keel_free(p);
    return there;
}

/* Whether any of this machine's IPv4 addresses lies in the cluster's subnet, or its subnet holds ours. */
static keel_status check_subnet(const keel_cluster_spec *s) {
    char *out;
    char *argv[] = {"ip", "-4", "-o", "addr", "show", NULL};
    if (run_out(s, -1, argv, NULL, &out) != 0) {
        keel_errorf("ip -4 -o addr show failed: %s", keel_cluster_show(out, 160).s);
        keel_free(out);
        return KEEL_ERR_IO;
    }
    keel_status st = KEEL_OK;
    for (char *at = strstr(out, "inet "); at && st == KEEL_OK; at = strstr(at + 5, "inet ")) {
        char addr[64], dev[64] = "?";
        int prefix;
        if (sscanf(at + 5, "%63[0-9.]/%d", addr, &prefix) != 2 || prefix < 0 || prefix > 32) continue;
        const char *line = at;
        while (line > out && line[-1] != '\n') line--;
        sscanf(line, "%*d: %63s", dev);
        struct in_addr a;
        if (inet_pton(AF_INET, addr, &a) != 1) continue;
        int p = prefix < s->prefix ? prefix : s->prefix;
        uint32_t mask = p == 0 ? 0 : ~0u << (32 - p);
        if (((ntohl(a.s_addr) ^ s->subnet) & mask) == 0) {
            keel_errorf("%s: Subnet %u.%u.%u.%u/%d overlaps %s/%d on %s: pick another private range",
                        keel_cluster_show(s->path, 160).s, s->subnet >> 24, s->subnet >> 16 & 255,
                        s->subnet >> 8 & 255, s->subnet & 255, s->prefix, addr, prefix, dev);
            st = KEEL_ERR_INPUT;
        }
    }
    keel_free(out);
    return st;
}

/* path under /tmp or /dev/shm (as they are, or as their symlinks resolve):
 * directories every node has its own of. The one it is under, or NULL. */
static const char *per_node_dir(const char *path) {
    static const char *const dirs[] = {"/tmp", "/dev/shm", NULL};
    const char *hit = NULL;
    for (const char *const *d = dirs; *d && !hit; d++) {
        char *real = realpath(*d, NULL);
        size_t n = strlen(*d), rn = real ? strlen(real) : 0;
        if ((!strncmp(path, *d, n) && (path[n] == '/' || !path[n])) ||
            (real && !strncmp(path, real, rn) && (path[rn] == '/' || !path[rn])))
            hit = *d;
        free(real);
    }
    return hit;
}

/* StateDir and SharedDir as the disk has them: the spec held their text to
 * the grammar; a symlink on the way may still lead under /tmp. */
static keel_status check_seen_by_nodes(const keel_cluster_spec *s, const char *key, const char *path) {
    char *p = keel_xstrdup(path), *real = NULL;
    while (!(real = realpath(p, NULL)) && strcmp(p, "/")) { /* its longest part that exists */
        char *slash = strrchr(p, '/');
        slash[slash == p] = 0;
    }
    const char *dir = real ? per_node_dir(real) : NULL;
    if (dir)
        keel_errorf("%s: %s: %s leads to %s, under %s, which every node of the cluster has its own of; pick a "
                    "directory outside it (e.g. /var/lib/keel/...)", keel_cluster_show(s->path, 160).s, key, path,
                    real, dir);
    free(real);
    keel_free(p);
    return dir ? KEEL_ERR_INPUT : KEEL_OK;
}

/* StateDir is keel's to write and remove in: new, empty, or this cluster's
 * (its .keel-cluster names it; a StateDir of an older keel: its slurm.conf
 * says it). Never a directory of something else's that happens to be named. */
static keel_status check_state_dir(const keel_cluster_spec *s) {
    DIR *d = opendir(s->state_dir);
    if (!d && errno == ENOENT) return KEEL_OK;
    if (!d) {
        keel_errorf("%s: StateDir: %s: %s", keel_cluster_show(s->path, 160).s, s->state_dir, strerror(errno));
        return KEEL_ERR_INPUT;
    }
    bool empty = true;
    for (struct dirent *e; empty && (e = readdir(d));) empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    closedir(d);
    if (empty) return KEEL_OK;
    char *marker = keel_path_join(s->state_dir, ".keel-cluster"), *conf = keel_path_join(s->state_dir, "slurm.conf");
    char *text = NULL, *want = xprintf("%s\n", s->name);
    char *old = xprintf("# slurm.conf of cluster %s, written by keel cluster", s->name);
    bool ours = false, other = false;
    if (keel_read_file_quiet(marker, 4096, &text, NULL) == KEEL_OK) {
        ours = !strcmp(text, want);
        other = !ours;
    } else if (keel_read_file_quiet(conf, 1 << 20, &text, NULL) == KEEL_OK) {
        ours = !strncmp(text, old, strlen(old));
    }
    if (!ours)
        keel_errorf("%s: StateDir: %s %s; keel cluster writes and removes files there: pick a new directory",
                    keel_cluster_show(s->path, 160).s, s->state_dir,
                    other ? "belongs to another cluster (its .keel-cluster names it)"
                          : "is not empty and is not a keel cluster's (no .keel-cluster)");
    keel_free(text);
    keel_free(want);
    keel_free(old);
    keel_free(marker);
    keel_free(conf);
    return ours ? KEEL_OK : KEEL_ERR_INPUT;
}

/* keel and the plugin as the nodes will run them. keel's own file is copied
 * into StateDir, so what else it loads must be where every node sees it (not
 * under /tmp or /dev/shm: a library found through LD_LIBRARY_PATH or an
 * rpath there); the plugin must be a shared object. */
static keel_status check_programs(const keel_cluster_spec *s, const char *keel, const char *plugin) {
    char *maps = NULL;
    keel_status st = KEEL_OK;
    if (keel_read_file_quiet("/proc/self/maps", 0, &maps, NULL) == KEEL_OK) {
        char *save = NULL;
        for (char *line = strtok_r(maps, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
            char perms[8] = "";
            int at = 0;
            if (sscanf(line, "%*s %7s %*s %*s %*s %n", perms, &at) < 1 || !strchr(perms, 'x') || line[at] != '/')
                continue;
            const char *file = line + at;
            const char *dir = per_node_dir(file);
            if (!dir || !strncmp(file, keel, strlen(keel))) continue;
            keel_errorf("keel cluster up: keel loads %s, under %s, which the cluster's nodes do not see (each has its "
                        "own): build or install keel's libraries elsewhere (or unset LD_LIBRARY_PATH/LD_PRELOAD "
                        "that point there)", keel_cluster_show(file, 160).s, dir);
            st = KEEL_ERR_INPUT;
            break;
        }
        keel_free(maps);
    }
    if (st != KEEL_OK) return st;
    unsigned char magic[4] = {0};
    int fd = open(plugin, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    bool elf = fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && read(fd, magic, 4) == 4 &&
               !memcmp(magic, "\x7f" "ELF", 4);
    if (fd >= 0) close(fd);
    if (!elf) {
        keel_errorf("%s: the auto-resume plugin %s is not a shared object (ELF) keel can read: build it (make keel) "
                    "or fix AutoResumePlugin", keel_cluster_show(s->path, 160).s, keel_cluster_show(plugin, 160).s);
        return KEEL_ERR_INPUT;
    }
    return KEEL_OK;
}

/* ---- up: StateDir ------------------------------------------------------------------ */

static keel_status write_text(const char *path, const char *text, mode_t mode) {
    keel_status st = keel_write_file_atomic(path, text, strlen(text));
    if (st == KEEL_OK && chmod(path, mode) != 0) {
        keel_errorf("%s: chmod: %s", path, strerror(errno));
        st = KEEL_ERR_IO;
    }
    return st;
}

/* src copied to dst with mode, atomically (a daemon still running an older copy keeps its file). */
static keel_status copy_program(const char *src, const char *dst, mode_t mode) {
    char *data = NULL, *dir = keel_xstrdup(dst);
    size_t len = 0;
    keel_status st = keel_read_file_quiet(src, 0, &data, &len);
    if (st != KEEL_OK) keel_errorf("cannot read %s to copy it into the cluster: %s", src, strerror(errno));
    if (st == KEEL_OK) st = keel_mkdirs(dirname(dir));
    if (st == KEEL_OK) st = keel_write_file_atomic(dst, data, len);
    if (st == KEEL_OK && chmod(dst, mode) != 0) {
        keel_errorf("%s: chmod: %s", dst, strerror(errno));
        st = KEEL_ERR_IO;
    }
    keel_free(data);
    keel_free(dir);
    return st;
}

/* StateDir's layout and owner mark, keel and the plugin copied in, the
 * munge key (new for every up), /etc/hosts of the nodes and Slurm's files. */
static keel_status write_state(const keel_cluster_spec *s, const char *keel, const char *plugin) {
    keel_status st = keel_mkdirs(s->state_dir);
    char *mark = keel_path_join(s->state_dir, ".keel-cluster"), *name = xprintf("%s\n", s->name);
    if (st == KEEL_OK) st = write_text(mark, name, 0644);
    keel_free(mark);
    keel_free(name);
    const char *dirs[] = {"munge", "slurmctld"};
    for (int k = 0; k < 2 && st == KEEL_OK; k++) {
        char *d = keel_path_join(s->state_dir, dirs[k]);
        st = keel_mkdirs(d);
        keel_free(d);
    }
    if (st == KEEL_OK) st = keel_mkdirs(s->shared_dir);
    for (int i = 0; i < s->nnodes && st == KEEL_OK; i++) {
        const char *sub[] = {"tmp", "munge", "spool"};
        for (int k = 0; k < 3 && st == KEEL_OK; k++) {
            char *d = node_path(s, i, sub[k]);
            st = keel_mkdirs(d);
            if (st == KEEL_OK && k == 0) chmod(d, 01777);
            keel_free(d);
        }
        /* an earlier up's pid files would speak for daemons not yet started */
        const char *stale[] = {"slurmd.pid", "munge/munged.pid"};
        for (int k = 0; k < 2 && st == KEEL_OK; k++) {
            char *p = node_path(s, i, stale[k]);
            st = remove_in_state(s, p);
            keel_free(p);
        }
    }
    char *ctl_pid = keel_path_join(s->state_dir, "slurmctld.pid");
    if (st == KEEL_OK) st = remove_in_state(s, ctl_pid);
    keel_free(ctl_pid);
    if (st != KEEL_OK) return st;
    unsigned char key[1024];
    if (getrandom(key, sizeof key, 0) != (ssize_t)sizeof key) {
        keel_errorf("getrandom: %s", strerror(errno));
        return KEEL_ERR_IO;
    }
    char *key_path = keel_path_join(s->state_dir, "munge.key");
    st = remove_in_state(s, key_path);
    if (st == KEEL_OK) st = keel_write_file_atomic(key_path, key, sizeof key);
    if (st == KEEL_OK) chmod(key_path, 0400);
    keel_free(key_path);
    keel_strbuf hosts = {0};
    keel_strbuf_printf(&hosts, "127.0.0.1 localhost\n");
    for (int i = 0; i < s->nnodes; i++) keel_strbuf_printf(&hosts, "%s %s\n", s->nodes[i].addr, s->nodes[i].name);
    char *hosts_path = keel_path_join(s->state_dir, "hosts");
    if (st == KEEL_OK) st = write_text(hosts_path, hosts.s, 0644);
    keel_free(hosts_path);
    keel_free(hosts.s);
    /* keel and the plugin where every node sees them, whatever directory they were built in */
    char *keel_copy = keel_cluster_keel_path(s), *plugin_copy = keel_cluster_plugin_path(s);
    if (st == KEEL_OK) st = copy_program(keel, keel_copy, 0755);
    if (st == KEEL_OK) st = copy_program(plugin, plugin_copy, 0755);
    keel_cluster_files f = {.local = true, .conf_dir = s->state_dir, .keel = keel_copy, .plugin = plugin_copy};
    if (st == KEEL_OK) st = keel_cluster_write_files(s, &f, s->state_dir, true);
    keel_free(keel_copy);
    keel_free(plugin_copy);
    return st;
}

/* ---- up: network, keepers, lifecycle, daemons ------------------------------------------ */

static keel_status make_network(const keel_cluster_spec *s) {
    ifname br = bridge_name(s);
    uint32_t b = s->subnet + 1;
    char *bridge_addr = xprintf("%u.%u.%u.%u/%d", b >> 24, b >> 16 & 255, b >> 8 & 255, b & 255, s->prefix);
    keel_status st = cmdv(s, -1, NULL, "ip", "link", "add", br.s, "type", "bridge", NULL);
    if (st == KEEL_OK) st = cmdv(s, -1, NULL, "ip", "addr", "add", bridge_addr, "dev", br.s, NULL);
    if (st == KEEL_OK) st = cmdv(s, -1, NULL, "ip", "link", "set", br.s, "up", NULL);
    keel_free(bridge_addr);
    for (int i = 0; i < s->nnodes && st == KEEL_OK; i++) {
        char *ns = netns_name(s, i), *addr = xprintf("%s/%d", s->nodes[i].addr, s->prefix);
        ifname vh = veth_name(s, "kv", i), vp = veth_name(s, "kp", i);
        st = cmdv(s, -1, NULL, "ip", "netns", "add", ns, NULL);
        if (st == KEEL_OK)
            st = cmdv(s, -1, NULL, "ip", "link", "add", vh.s, "type", "veth", "peer", "name", vp.s, NULL);
        if (st == KEEL_OK) st = cmdv(s, -1, NULL, "ip", "link", "set", vh.s, "master", br.s, "up", NULL);
        if (st == KEEL_OK) st = cmdv(s, -1, NULL, "ip", "link", "set", vp.s, "netns", ns, NULL);
        if (st == KEEL_OK) st = cmdv(s, -1, NULL, "ip", "-n", ns, "link", "set", vp.s, "name", "eth0", NULL);
        if (st == KEEL_OK) st = cmdv(s, -1, NULL, "ip", "-n", ns, "addr", "add", addr, "dev", "eth0", NULL);
        if (st == KEEL_OK) st = cmdv(s, -1, NULL, "ip", "-n", ns, "link", "set", "eth0", "up", NULL);
        if (st == KEEL_OK) st = cmdv(s, -1, NULL, "ip", "-n", ns, "link", "set", "lo", "up", NULL);
        keel_free(ns);
        keel_free(addr);
    }
    return st;
}

/* In the keeper, before it becomes `sleep infinity`: its namespaces and mounts. */
static const char *keeper_setup(const keel_cluster_spec *s, int i) {
    static char why[1400];
    char *ns = netns_name(s, i), *p = xprintf("/run/netns/%s", ns);
    keel_free(ns);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    bool entered = fd >= 0 && setns(fd, CLONE_NEWNET) == 0;
    if (!entered) snprintf(why, sizeof why, "setns %s: %s", p, strerror(errno));
    keel_free(p);
    if (!entered) return why;
    close(fd);
    if (unshare(CLONE_NEWNS | CLONE_NEWUTS) != 0) return snprintf(why, sizeof why, "unshare: %s", strerror(errno)), why;
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
        return snprintf(why, sizeof why, "mount --make-rprivate /: %s", strerror(errno)), why;
    const char *name = s->nodes[i].name;
    if (sethostname(name, strlen(name)) != 0) return snprintf(why, sizeof why, "sethostname: %s", strerror(errno)), why;
    char *tmp = node_path(s, i, "tmp"), *munge = node_path(s, i, "munge");
    char *hosts = keel_path_join(s->state_dir, "hosts"), *munge_at = keel_path_join(s->state_dir, "munge");
    const char *what = NULL;
    if (mount(tmp, "/tmp", NULL, MS_BIND, NULL) != 0) what = "/tmp";
    else if (mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777") != 0) what = "/dev/shm";
    else if (mount(hosts, "/etc/hosts", NULL, MS_BIND, NULL) != 0) what = "/etc/hosts";
    else if (mount(munge, munge_at, NULL, MS_BIND, NULL) != 0) what = munge_at;
    if (what) snprintf(why, sizeof why, "mount on %s: %s", what, strerror(errno));
    keel_free(tmp);
    keel_free(munge);
    keel_free(hosts);
    keel_free(munge_at);
    return what ? why : NULL;
}

static keel_status start_keeper(const keel_cluster_spec *s, int i) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return KEEL_ERR_IO;
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        setsid();
        const char *why = keeper_setup(s, i);
        const char *msg = why ? why : "ok";
        (void)!write(p[1], msg, strlen(msg));
        if (why) _exit(1);
        int null = open("/dev/null", O_RDWR);
        for (int fd = 0; fd < 3; fd++) dup2(null, fd);
        execlp("sleep", "sleep", "infinity", (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    char msg[1500] = "";
    ssize_t got = pid > 0 ? read(p[0], msg, sizeof msg - 1) : -1;
    close(p[0]);
    if (got > 0) msg[got] = 0;
    if (strcmp(msg, "ok") != 0) {
        keel_errorf("node %s: %s", s->nodes[i].name, msg[0] ? msg : "its keeper process did not start");
        if (pid > 0) waitpid(pid, NULL, 0);
        return KEEL_ERR_IO;
    }
    char *path = node_path(s, i, "keeper.pid"), *text = xprintf("%d\n", (int)pid);
    keel_status st = write_text(path, text, 0644);
    keel_free(path);
    keel_free(text);
    return st;
}

/* A group's lifecycle scripts as its nodes see them: SourceDir copied into
 * StateDir/lifecycle/GROUP (as HyperPod copies them from S3 onto each node;
 * and a SourceDir under /tmp would be out of the nodes' sight). */
static char *lifecycle_dir(const keel_cluster_spec *s, const keel_cluster_group *g) {
    return xprintf("%s/lifecycle/%s", s->state_dir, g->name);
}

static keel_status copy_lifecycle(const keel_cluster_spec *s) {
    keel_status st = KEEL_OK;
    for (int k = 0; k < s->ngroups && st == KEEL_OK; k++) {
        if (!s->groups[k].on_create) continue;
        char *dst = lifecycle_dir(s, &s->groups[k]), *src = xprintf("%s/.", s->groups[k].source_dir);
        st = remove_in_state(s, dst);
        if (st == KEEL_OK) st = keel_mkdirs(dst);
        if (st == KEEL_OK) st = cmdv(s, -1, NULL, "cp", "-a", "--", src, dst, NULL);
        keel_free(dst);
        keel_free(src);
    }
    return st;
}

/* Every node's LifeCycleConfig.OnCreate at once, each once, in the node, its output in nodes/NODE/on_create.log. */
static keel_status run_on_create(const keel_cluster_spec *s) {
    enum { NENV = 6 };
    pid_t *pid = keel_xcalloc((size_t)s->nnodes * sizeof *pid, "on_create");
    char **env = keel_xcalloc((size_t)s->nnodes * NENV * sizeof *env, "on_create env");
    keel_status st = copy_lifecycle(s);
    for (int i = 0; i < s->nnodes && st == KEEL_OK; i++) {
        const keel_cluster_group *g = &s->groups[s->nodes[i].group];
        if (!g->on_create) continue;
        char **e = env + i * NENV;
        e[0] = xprintf("KEEL_NODE_NAME=%s", s->nodes[i].name);
        e[1] = xprintf("KEEL_NODE_ROLE=%s", keel_node_role_name(g->role));
        e[2] = xprintf("KEEL_INSTANCE_GROUP=%s", g->name);
        e[3] = xprintf("KEEL_CLUSTER_NAME=%s", s->name);
        e[4] = xprintf("KEEL_CLUSTER_SHARED=%s", s->shared_dir);
        char *log = node_path(s, i, "on_create.log");
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        keel_free(log);
        if (fd < 0) {
            st = KEEL_ERR_IO;
            break;
        }
        char *dir = lifecycle_dir(s, g);
        char *script = keel_path_join(dir, g->on_create + strlen(g->source_dir) + 1);
        char *argv[] = {"bash", script, NULL};
        pid[i] = spawn(s, i, argv, dir, fd, e);
        close(fd);
        keel_free(script);
        keel_free(dir);
        if (pid[i] < 0) st = KEEL_ERR_IO;
    }
    double t0 = keel_now_s();
    for (int i = 0; i < s->nnodes; i++) {
        if (pid[i] <= 0) continue;
        double left = ON_CREATE_TIMEOUT_S - (keel_now_s() - t0);
        int rc = wait_for(pid[i], left > 0.1 ? left : 0.1);
        if (rc == 0 || st != KEEL_OK) continue;
        char *log = node_path(s, i, "on_create.log"), *text = NULL;
        const char *last = "";
        if (keel_read_file_quiet(log, 1 << 20, &text, NULL) == KEEL_OK) {
            size_t n = strlen(text);
            while (n && text[n - 1] == '\n') text[--n] = 0;
            const char *l = strrchr(text, '\n');
            last = l ? l + 1 : text;
        }
        keel_errorf("%s: LifeCycleConfig.OnCreate of group %s: %s failed on node %s (%s %d)%s%s (log: %s)",
                    keel_cluster_show(s->path, 160).s, s->groups[s->nodes[i].group].name,
                    s->groups[s->nodes[i].group].on_create, s->nodes[i].name, rc == 124 ? "no end in" : "exit",
                    rc == 124 ? ON_CREATE_TIMEOUT_S : rc, last[0] ? ": " : "", keel_cluster_show(last, 160).s, log);
        keel_free(text);
        keel_free(log);
        st = KEEL_ERR_INPUT;
    }
    for (int i = 0; i < s->nnodes * NENV; i++) keel_free(env[i]);
    keel_free(env);
    keel_free(pid);
    return st;
}

/* A daemon's pid file and log as the host sees them (munged on a node: its
 * StateDir/munge is the host's StateDir/nodes/NODE/munge). */
typedef enum { MUNGED, SLURMCTLD, SLURMD } daemon_kind;
static const char *const daemon_names[] = {"munged", "slurmctld", "slurmd"};
static char *daemon_file(const keel_cluster_spec *s, int node, daemon_kind d, bool log) {
    if (d == MUNGED)
        return node < 0 ? xprintf("%s/munge/munged.%s", s->state_dir, log ? "log" : "pid")
                        : node_path(s, node, log ? "munge/munged.log" : "munge/munged.pid");
    if (d == SLURMCTLD) return xprintf("%s/slurmctld.%s", s->state_dir, log ? "log" : "pid");
    return node_path(s, node, log ? "slurmd.log" : "slurmd.pid");
}

static keel_status start_daemon(const keel_cluster_spec *s, int node, daemon_kind d) {
    const char *dir = s->state_dir;
    char *log = daemon_file(s, node, d, true), *conf = keel_path_join(dir, "slurm.conf");
    keel_status st;
    if (d == MUNGED) {
        /* the same command everywhere: each node's mount namespace gives it its own StateDir/munge */
        char *sock = xprintf("--socket=%s/munge/munge.sock", dir), *key = xprintf("--key-file=%s/munge.key", dir);
        char *pid = xprintf("--pid-file=%s/munge/munged.pid", dir);
        char *seed = xprintf("--seed-file=%s/munge/munged.seed", dir);
        char *log_at = xprintf("--log-file=%s/munge/munged.log", dir);
        st = cmdv(s, node, log, "munged", "--force", sock, key, pid, seed, log_at, NULL);
        keel_free(sock), keel_free(key), keel_free(pid), keel_free(seed), keel_free(log_at);
    } else if (d == SLURMCTLD) {
        st = cmdv(s, node, log, "slurmctld", "-c", "-f", conf, NULL);
    } else {
        st = cmdv(s, node, log, "slurmd", "-f", conf, NULL);
    }
    keel_free(log);
    keel_free(conf);
    return st;
}

static keel_status start_daemons(const keel_cluster_spec *s) {
    keel_status st = start_daemon(s, -1, MUNGED);
    for (int i = 0; i < s->nnodes && st == KEEL_OK; i++) st = start_daemon(s, i, MUNGED);
    if (st == KEEL_OK) st = start_daemon(s, 0, SLURMCTLD);
    for (int i = 0; i < s->nnodes && st == KEEL_OK; i++)
        if (role_of(s, i) == KEEL_ROLE_WORKER) st = start_daemon(s, i, SLURMD);
    return st;
}

static bool pid_on_node(const keel_cluster_spec *s, const ino_t *ns, int i, const char *pidfile) {
    pid_t pid = read_pid(pidfile);
    return pid && node_of_pid(s, ns, pid) == i;
}

/* The first of the nodes' daemons that is not running: its pid file names no
 * process on its node (or, when must_exist, there is none yet). An error line
 * naming it, its log and the log's last error; false when all run. */
static bool daemon_down(const keel_cluster_spec *s, bool must_exist) {
    ino_t *ns = keel_xcalloc((size_t)s->nnodes * sizeof *ns, "netns");
    for (int i = 0; i < s->nnodes; i++) ns[i] = netns_inode(s, i);
    bool down = false;
    for (int i = 0; i < s->nnodes && !down; i++) {
        daemon_kind kinds[2] = {MUNGED, role_of(s, i) == KEEL_ROLE_CONTROLLER ? SLURMCTLD : SLURMD};
        int n = role_of(s, i) == KEEL_ROLE_LOGIN ? 1 : 2;
        for (int k = 0; k < n && !down; k++) {
            char *pid = daemon_file(s, i, kinds[k], false);
            down = (must_exist || keel_path_exists(pid)) && !pid_on_node(s, ns, i, pid);
            if (down) {
                char *log = daemon_file(s, i, kinds[k], true), *said = log_last_error(log);
                keel_errorf("cluster %s: %s on node %s is not running (%s); its log %s says: %s", s->name,
                            daemon_names[kinds[k]], s->nodes[i].name,
                            keel_path_exists(pid) ? "it started, then ended" : "it wrote no pid file", log, said);
                keel_free(said);
                keel_free(log);
            }
            keel_free(pid);
        }
    }
    keel_free(ns);
    return down;
}

static char *slurm_conf_env(const keel_cluster_spec *s) { return xprintf("SLURM_CONF=%s/slurm.conf", s->state_dir); }

/* sinfo's node lines "NAME|STATE|REASON" (from the host, *out malloc'd), false when it does not answer. */
static bool sinfo(const keel_cluster_spec *s, char **out) {
    char *env[] = {slurm_conf_env(s), NULL};
    char *argv[] = {"sinfo", "-h", "-N", "-o", "%N|%T|%E", NULL};
    int rc = run_out(s, -1, argv, env, out);
    keel_free(env[0]);
    return rc == 0;
}

static keel_status wait_idle(const keel_cluster_spec *s) {
    int workers = 0;
    for (int i = 0; i < s->nnodes; i++) workers += role_of(s, i) == KEEL_ROLE_WORKER;
    char *out = keel_xstrdup("");
    for (double t0 = keel_now_s(); keel_now_s() - t0 < IDLE_TIMEOUT_S; keel_sleep_s(0.2)) {
        if (daemon_down(s, false)) { /* one ended after it started: its log says why */
            keel_free(out);
            return KEEL_ERR_IO;
        }
        keel_free(out);
        if (!sinfo(s, &out)) continue;
        int idle = 0;
        for (const char *at = strstr(out, "|idle|"); at; at = strstr(at + 1, "|idle|")) idle++;
        if (idle == workers) {
            keel_free(out);
            return KEEL_OK;
        }
    }
    if (!daemon_down(s, true)) {
        for (char *c = out; *c; c++)
            if (*c == '\n') *c = ' ';
        keel_errorf("cluster %s: the workers did not all become idle in %d s (sinfo: %s; logs in %s)", s->name,
                    IDLE_TIMEOUT_S, out[0] ? keel_cluster_show(out, 160).s : "no answer", s->state_dir);
    }
    keel_free(out);
    return KEEL_ERR_IO;
}

keel_status keel_cluster_up(const keel_cluster_spec *s) {
    keel_status st = need_root("up");
    if (st != KEEL_OK) return st;
    static const char *const tools[] = {"ip", "munged", "slurmctld", "slurmd", "sinfo", "sleep", "bash", "cp", NULL};
    for (const char *const *t = tools; *t; t++)
        if (!in_path(*t)) {
            keel_errorf("keel cluster up: %s not found: run scripts/install-deps.sh (iproute2, munge, slurmctld, "
                        "slurmd, slurm-client)", *t);
            return KEEL_ERR_INPUT;
        }
    char *keel = realpath("/proc/self/exe", NULL), *plugin = NULL;
    if (!keel) {
        keel_errorf("cannot read /proc/self/exe: %s", strerror(errno));
        return KEEL_ERR_IO;
    }
    /* refused before anything starts: what the nodes could not reach, a cluster up already, a taken
     * subnet or StateDir */
    st = keel_cluster_find_plugin(s, keel, &plugin);
    if (st == KEEL_OK) st = check_programs(s, keel, plugin);
    if (st == KEEL_OK) st = check_seen_by_nodes(s, "StateDir", s->state_dir);
    if (st == KEEL_OK) st = check_seen_by_nodes(s, "SharedDir", s->shared_dir);
    bool present = st == KEEL_OK && bridge_exists(s);
    for (int i = 0; i < s->nnodes && !present && st == KEEL_OK; i++) present = netns_inode(s, i) != 0;
    if (present) {
        keel_cluster_shown path = keel_cluster_show(s->path, 160);
        keel_errorf("cluster %s is up already, or was not taken down: keel cluster status %s; keel cluster down %s",
                    s->name, path.s, path.s);
        st = KEEL_ERR_INPUT;
    }
    if (st == KEEL_OK) st = check_subnet(s);
    if (st == KEEL_OK) st = check_state_dir(s);
    if (st == KEEL_OK) st = write_state(s, keel, plugin);
    free(keel);
    keel_free(plugin);
    if (st != KEEL_OK) return st;
    double t0 = keel_now_s();
    st = make_network(s);
    for (int i = 0; i < s->nnodes && st == KEEL_OK; i++) st = start_keeper(s, i);
    if (st == KEEL_OK) st = run_on_create(s);
    if (st == KEEL_OK) st = start_daemons(s);
    if (st == KEEL_OK) st = wait_idle(s);
    if (st != KEEL_OK) {
        keel_error_capture(true); /* the first error is the one to tell */
        quiet = true;
        keel_cluster_down(s);
        quiet = false;
        keel_error_capture(false);
        return st;
    }
    char *marker = keel_path_join(s->state_dir, "up");
    st = write_text(marker, s->path, 0644);
    keel_free(marker);
    keel_strbuf hint = {0};
    if (!keel_cluster_sh_quote(&hint, s->path)) keel_strbuf_printf(&hint, "SPEC");
    keel_log_info("cluster %s up in %.1f s: %d nodes on %s, shared %s; eval \"$(keel cluster env %s)\"", s->name,
                  keel_now_s() - t0, s->nnodes, s->state_dir, s->shared_dir, hint.s);
    keel_free(hint.s);
    return st;
}
/* ---- down ----------------------------------------------------------------------- */

/* Signal every process in the nodes' network namespaces; how many there were. */
static int signal_nodes(const keel_cluster_spec *s, const ino_t *ns, int sig) {
    DIR *d = opendir("/proc");
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 1 || pid == getpid()) continue;
        if (node_of_pid(s, ns, (pid_t)pid) < 0) continue;
        kill((pid_t)pid, sig);
        n++;
    }
    closedir(d);
    while (waitpid(-1, NULL, WNOHANG) > 0) {} /* a failed up's own keepers */
    return n;
}

/* The host's munged, by its pid file, when the process is still it. */
static void stop_host_munged(const keel_cluster_spec *s) {
    char *pf = daemon_file(s, -1, MUNGED, false);
    pid_t pid = read_pid(pf);
    keel_free(pf);
    if (!pid) return;
    char path[64], *cmdline = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
    if (keel_read_file_quiet(path, 1 << 16, &cmdline, &len) == KEEL_OK) {
        for (size_t k = 0; k + 1 < len; k++)
            if (!cmdline[k]) cmdline[k] = ' ';
        if (strstr(cmdline, "munged") && strstr(cmdline, s->state_dir)) {
            kill(pid, SIGTERM);
            for (int k = 0; k < 100 && kill(pid, 0) == 0; k++) keel_sleep_s(0.05);
            kill(pid, SIGKILL);
        }
    }
    keel_free(cmdline);
}

keel_status keel_cluster_down(const keel_cluster_spec *s) {
    keel_status st = need_root("down");
    if (st != KEEL_OK) return st;
    ino_t *ns = keel_xcalloc((size_t)s->nnodes * sizeof *ns, "netns");
    int with_ns = 0;
    for (int i = 0; i < s->nnodes; i++) with_ns += (ns[i] = netns_inode(s, i)) != 0;
    /* TERM first (slurmctld saves its state, slurmd its jobs' ends), then KILL */
    int procs = signal_nodes(s, ns, SIGTERM), left = procs;
    for (double t0 = keel_now_s(); left && keel_now_s() - t0 < 5; keel_sleep_s(0.05)) left = signal_nodes(s, ns, 0);
    for (double t0 = keel_now_s(); left && keel_now_s() - t0 < 5; keel_sleep_s(0.05))
        left = signal_nodes(s, ns, SIGKILL);
    stop_host_munged(s);
    for (int i = 0; i < s->nnodes; i++) {
        if (!ns[i]) continue;
        char *name = netns_name(s, i), *kp = node_path(s, i, "keeper.pid");
        if (cmdv(s, -1, NULL, "ip", "netns", "del", name, NULL) != KEEL_OK) st = KEEL_ERR_IO;
        if (remove_in_state(s, kp) != KEEL_OK) st = KEEL_ERR_IO;
        keel_free(name);
        keel_free(kp);
    }
    /* the kernel takes a namespace apart after its last process: its veth goes then */
    for (int i = 0; i < s->nnodes; i++) {
        char veth[64];
        snprintf(veth, sizeof veth, "/sys/class/net/%s", veth_name(s, "kv", i).s);
        for (double t0 = keel_now_s(); keel_path_exists(veth) && keel_now_s() - t0 < 10;) keel_sleep_s(0.05);
        if (keel_path_exists(veth)) {
            keel_errorf("cluster %s: %s is still there 10 s after its namespace was removed", s->name, veth);
            st = KEEL_ERR_IO;
        }
    }
    bool bridge = bridge_exists(s);
    if (bridge && cmdv(s, -1, NULL, "ip", "link", "del", bridge_name(s).s, NULL) != KEEL_OK) st = KEEL_ERR_IO;
    char *marker = keel_path_join(s->state_dir, "up");
    if (remove_in_state(s, marker) != KEEL_OK) st = KEEL_ERR_IO;
    keel_free(marker);
    keel_free(ns);
    if (left) {
        keel_errorf("cluster %s: %d processes in its nodes would not die", s->name, left);
        st = KEEL_ERR_IO;
    }
    if (st == KEEL_OK && !quiet)
        keel_log_info("cluster %s down: %d processes stopped, %d namespaces%s removed (logs stay in %s, data in %s)",
                      s->name, procs, with_ns, bridge ? " and the bridge" : "", s->state_dir, s->shared_dir);
    return st;
}

/* ---- status and exec -------------------------------------------------------------- */

bool keel_cluster_status(const keel_cluster_spec *s, FILE *out) {
    ino_t *ns = keel_xcalloc((size_t)s->nnodes * sizeof *ns, "netns");
    char *marker = keel_path_join(s->state_dir, "up");
    bool up = keel_path_exists(marker) && bridge_exists(s);
    keel_free(marker);
    char *slurm = keel_xstrdup("");
    bool answered = false;
    if (up) {
        keel_free(slurm);
        answered = sinfo(s, &slurm);
    }
    fprintf(out, "cluster %s: %s; state %s, shared %s\n", s->name, up ? "up" : "down", s->state_dir, s->shared_dir);
    fprintf(out, "%-16s %-10s %-15s %-6s %-24s %-10s %s\n", "NODE", "ROLE", "ADDRESS", "HOST", "DAEMONS", "SLURM",
            "REASON");
    bool all = up;
    for (int i = 0; i < s->nnodes; i++) {
        ns[i] = netns_inode(s, i);
        keel_node_role role = role_of(s, i);
        bool host = ns[i] && keeper_pid(s, i) && node_of_pid(s, ns, keeper_pid(s, i)) == i;
        char daemons[64] = "", *p;
        bool ok = host;
        p = daemon_file(s, i, MUNGED, false);
        bool m = pid_on_node(s, ns, i, p);
        keel_free(p);
        snprintf(daemons, sizeof daemons, "munged%s", m ? "" : "(down)");
        ok &= m;
        if (role != KEEL_ROLE_LOGIN) {
            p = daemon_file(s, i, role == KEEL_ROLE_CONTROLLER ? SLURMCTLD : SLURMD, false);
            bool d = pid_on_node(s, ns, i, p);
            keel_free(p);
            size_t at = strlen(daemons);
            snprintf(daemons + at, sizeof daemons - at, ",%s%s", role == KEEL_ROLE_CONTROLLER ? "slurmctld" : "slurmd",
                     d ? "" : "(down)");
            ok &= d;
        }
        all &= ok;
        char state[64] = "-", reason[256] = "";
        if (role == KEEL_ROLE_WORKER && answered) {
            char key[80];
            snprintf(key, sizeof key, "%s|", s->nodes[i].name);
            for (char *line = slurm; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
                if (!strncmp(line, key, strlen(key))) {
                    sscanf(line + strlen(key), "%63[^|]|%255[^\n]", state, reason);
                    break;
                }
        }
        if (!strcmp(reason, "none")) reason[0] = 0;
        fprintf(out, "%-16s %-10s %-15s %-6s %-24s %-10s %s\n", s->nodes[i].name, keel_node_role_name(role),
                s->nodes[i].addr, host ? "up" : "down", host ? daemons : "-", state, reason);
    }
    if (up && !answered) fprintf(out, "slurmctld does not answer (log: %s/slurmctld.log)\n", s->state_dir);
    keel_free(slurm);
    keel_free(ns);
    return all && answered;
}

int keel_cluster_exec(const keel_cluster_spec *s, const char *node, char *const *argv) {
    int i = 0;
    while (i < s->nnodes && strcmp(s->nodes[i].name, node)) i++;
    if (i == s->nnodes) {
        keel_cluster_shown path = keel_cluster_show(s->path, 160);
        keel_errorf("%s: no node '%s' (keel cluster status %s lists them)", path.s, keel_cluster_show(node, 64).s,
                    path.s);
        return 2;
    }
    if (!netns_inode(s, i)) {
        keel_errorf("node %s is not up: keel cluster up %s", node, keel_cluster_show(s->path, 160).s);
        return 1;
    }
    char *keel = keel_cluster_keel_path(s), *cwd = getcwd(NULL, 0);
    char *env[4] = {slurm_conf_env(s), xprintf("KEEL_CLUSTER_SHARED=%s", s->shared_dir),
                    xprintf("KEEL_CLUSTER_KEEL=%s", keel), NULL};
    pid_t pid = spawn(s, i, argv, cwd, -1, env);
    int rc = pid < 0 ? 1 : wait_for(pid, 0);
    for (int k = 0; k < 3; k++) keel_free(env[k]);
    keel_free(keel);
    free(cwd);
    return rc;
}
