/* cluster/local.c: a real Slurm cluster on this one machine, every node its
 * own host (keel/cluster.h). A node is a named network namespace
 * (/run/netns/keel-CLUSTER-NODE) with a veth on the cluster's bridge and its
 * address from Subnet, plus a UTS namespace (its hostname) and a mount
 * namespace in which /tmp is its own directory, /dev/shm its own tmpfs,
 * /etc/hosts the cluster's and StateDir/munge its own munged's socket. A
 * keeper process (`sleep infinity`, its pid in StateDir/nodes/NODE/keeper.pid)
 * holds the three; everything that runs on the node enters them with setns:
 * the on_create script, munged, slurmctld (controller) and slurmd (workers).
 * The host runs a munged of its own, so that its sbatch/srun/sinfo talk to
 * the cluster (keel cluster env). Taking it down kills every process whose
 * network namespace is a node's, then removes the namespaces and the bridge;
 * the veths go with their namespaces, the mounts with their keepers. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
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

/* ---- names ------------------------------------------------------------------- */

static unsigned cluster_hash(const keel_cluster_spec *s) {
    return XXH32(s->name, strlen(s->name), 0) & 0xffffff;
}
static void bridge_name(const keel_cluster_spec *s, char *out, size_t n) {
    snprintf(out, n, "kbr-%06x", cluster_hash(s));
}
static void netns_name(const keel_cluster_spec *s, int i, char *out, size_t n) {
    snprintf(out, n, "keel-%s-%s", s->name, s->nodes[i].name);
}
static char *node_path(const keel_cluster_spec *s, int i, const char *rel) {
    char p[1024];
    snprintf(p, sizeof p, "%s/nodes/%s%s%s", s->state_dir, s->nodes[i].name, rel[0] ? "/" : "", rel);
    return keel_xstrdup(p);
}
static keel_node_role role_of(const keel_cluster_spec *s, int i) { return s->groups[s->nodes[i].group].role; }

static pid_t read_pid(const char *path) {
    char *text;
    if (keel_read_file_quiet(path, 64, &text, NULL) != KEEL_OK) return 0;
    long pid = strtol(text, NULL, 10);
    keel_free(text);
    return pid > 0 ? (pid_t)pid : 0;
}
static pid_t keeper_pid(const keel_cluster_spec *s, int i) {
    char *p = node_path(s, i, "keeper.pid");
    pid_t pid = read_pid(p);
    keel_free(p);
    return pid;
}
/* The inode of node i's network namespace, 0 when it has none. */
static ino_t netns_inode(const keel_cluster_spec *s, int i) {
    char name[128], path[160];
    netns_name(s, i, name, sizeof name);
    snprintf(path, sizeof path, "/run/netns/%s", name);
    struct stat st;
    return stat(path, &st) == 0 ? st.st_ino : 0;
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

/* Run argv to its end (daemons: until they have forked off), its output in
 * out. A daemon's child may keep the pipe open: output is read only while
 * the command itself runs. */
static int run_out(const keel_cluster_spec *s, int node, char *const *argv, char *const *env, char *out, size_t n) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return -1;
    pid_t pid = spawn(s, node, argv, NULL, p[1], env);
    close(p[1]);
    if (pid < 0) {
        close(p[0]);
        return -1;
    }
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    size_t len = 0;
    double deadline = keel_now_s() + CMD_TIMEOUT_S;
    int code = -2;
    while (code == -2) {
        struct pollfd pfd = {.fd = p[0], .events = POLLIN};
        poll(&pfd, 1, 20);
        ssize_t got;
        while (len < n - 1 && (got = read(p[0], out + len, n - 1 - len)) > 0) len += (size_t)got;
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            while (len < n - 1 && (got = read(p[0], out + len, n - 1 - len)) > 0) len += (size_t)got;
            code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        } else if (keel_now_s() > deadline) {
            kill(-pid, SIGKILL);
            waitpid(pid, &status, 0);
            code = 124;
        }
    }
    out[len] = 0;
    close(p[0]);
    return code;
}

/* Run the command fmt makes (split at spaces: no argument here has one) on
 * node (-1: the host); a failure is an error naming it and what it said. */
static keel_status cmd(const keel_cluster_spec *s, int node, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static keel_status cmd(const keel_cluster_spec *s, int node, const char *fmt, ...) {
    char line[2048], out[2048], *argv[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    char copy[2048];
    snprintf(copy, sizeof copy, "%s", line);
    int argc = 0;
    for (char *t = strtok(copy, " "); t && argc < 63; t = strtok(NULL, " ")) argv[argc++] = t;
    argv[argc] = NULL;
    int rc = run_out(s, node, argv, NULL, out, sizeof out);
    if (rc == 0) return KEEL_OK;
    char *nl = strchr(out, '\n');
    if (nl) *nl = 0;
    keel_errorf("%s%s%s: %s (%s)", node >= 0 ? "on node " : "", node >= 0 ? s->nodes[node].name : "",
                node >= 0 ? ": " : "", line, rc == 124 ? "no answer in 30 s" : out[0] ? out : "failed");
    return KEEL_ERR_IO;
}

static bool in_path(const char *prog) {
    const char *path = getenv("PATH");
    char dir[4096], p[4200];
    snprintf(dir, sizeof dir, "%s", path ? path : "/usr/bin:/bin");
    strncat(dir, ":/usr/sbin:/sbin", sizeof dir - strlen(dir) - 1);
    for (char *d = strtok(dir, ":"); d; d = strtok(NULL, ":")) {
        snprintf(p, sizeof p, "%s/%s", d, prog);
        if (access(p, X_OK) == 0) return true;
    }
    return false;
}

static bool quiet; /* a failed up taking down what it made: its error is the news */

/* ---- up ------------------------------------------------------------------------- */

static keel_status need_root(const char *what) {
    if (geteuid() == 0) return KEEL_OK;
    keel_errorf("keel cluster %s: needs root (network namespaces, a bridge, mounts); run it with sudo", what);
    return KEEL_ERR_INPUT;
}

static bool bridge_exists(const keel_cluster_spec *s) {
    char br[32], p[96];
    bridge_name(s, br, sizeof br);
    snprintf(p, sizeof p, "/sys/class/net/%s", br);
    return keel_path_exists(p);
}

/* Whether any of this machine's IPv4 addresses lies in the cluster's subnet, or its subnet holds ours. */
static keel_status check_subnet(const keel_cluster_spec *s) {
    char out[16384];
    char *argv[] = {"ip", "-4", "-o", "addr", "show", NULL};
    if (run_out(s, -1, argv, NULL, out, sizeof out) != 0) {
        keel_errorf("ip -4 -o addr show failed: %s", out);
        return KEEL_ERR_IO;
    }
    for (char *at = strstr(out, "inet "); at; at = strstr(at + 5, "inet ")) {
        char addr[64], dev[64] = "?";
        int prefix;
        if (sscanf(at + 5, "%63[0-9.]/%d", addr, &prefix) != 2) continue;
        const char *line = at;
        while (line > out && line[-1] != '\n') line--;
        sscanf(line, "%*d: %63s", dev);
        struct in_addr a;
        if (inet_pton(AF_INET, addr, &a) != 1) continue;
        int p = prefix < s->prefix ? prefix : s->prefix;
        uint32_t mask = p == 0 ? 0 : ~0u << (32 - p);
        if (((ntohl(a.s_addr) ^ s->subnet) & mask) == 0) {
            keel_errorf("%s: Subnet %u.%u.%u.%u/%d overlaps %s/%d on %s: pick another private range", s->path,
                        s->subnet >> 24, s->subnet >> 16 & 255, s->subnet >> 8 & 255, s->subnet & 255, s->prefix,
                        addr, prefix, dev);
            return KEEL_ERR_INPUT;
        }
    }
    return KEEL_OK;
}

static keel_status write_text(const char *path, const char *text, mode_t mode) {
    keel_status st = keel_write_file_atomic(path, text, strlen(text));
    if (st == KEEL_OK && chmod(path, mode) != 0) {
        keel_errorf("%s: chmod: %s", path, strerror(errno));
        st = KEEL_ERR_IO;
    }
    return st;
}

/* StateDir's layout, the munge key (new for every up), /etc/hosts of the nodes and Slurm's files. */
static keel_status write_state(const keel_cluster_spec *s, const char *keel, const char *plugin) {
    keel_status st = KEEL_OK;
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
    }
    if (st != KEEL_OK) return st;
    unsigned char key[1024];
    if (getrandom(key, sizeof key, 0) != (ssize_t)sizeof key) {
        keel_errorf("getrandom: %s", strerror(errno));
        return KEEL_ERR_IO;
    }
    char *key_path = keel_path_join(s->state_dir, "munge.key");
    unlink(key_path);
    st = keel_write_file_atomic(key_path, key, sizeof key);
    if (st == KEEL_OK) chmod(key_path, 0400);
    keel_free(key_path);
    keel_strbuf hosts = {0};
    keel_strbuf_printf(&hosts, "127.0.0.1 localhost\n");
    for (int i = 0; i < s->nnodes; i++) keel_strbuf_printf(&hosts, "%s %s\n", s->nodes[i].addr, s->nodes[i].name);
    char *hosts_path = keel_path_join(s->state_dir, "hosts");
    if (st == KEEL_OK) st = write_text(hosts_path, hosts.s, 0644);
    keel_free(hosts_path);
    keel_free(hosts.s);
    keel_cluster_files f = {.local = true, .conf_dir = s->state_dir, .keel = keel, .plugin = plugin};
    if (st == KEEL_OK) st = keel_cluster_write_files(s, &f, s->state_dir, true);
    return st;
}

static keel_status make_network(const keel_cluster_spec *s) {
    char br[32];
    bridge_name(s, br, sizeof br);
    unsigned h = cluster_hash(s);
    uint32_t b = s->subnet + 1;
    keel_status st = cmd(s, -1, "ip link add %s type bridge", br);
    if (st == KEEL_OK) st = cmd(s, -1, "ip addr add %u.%u.%u.%u/%d dev %s", b >> 24, b >> 16 & 255, b >> 8 & 255,
                                b & 255, s->prefix, br);
    if (st == KEEL_OK) st = cmd(s, -1, "ip link set %s up", br);
    for (int i = 0; i < s->nnodes && st == KEEL_OK; i++) {
        char ns[128], vh[32], vp[32];
        netns_name(s, i, ns, sizeof ns);
        snprintf(vh, sizeof vh, "kv-%06x-%d", h, i);
        snprintf(vp, sizeof vp, "kp-%06x-%d", h, i);
        if ((st = cmd(s, -1, "ip netns add %s", ns)) != KEEL_OK) break;
        if ((st = cmd(s, -1, "ip link add %s type veth peer name %s", vh, vp)) != KEEL_OK) break;
        if ((st = cmd(s, -1, "ip link set %s master %s up", vh, br)) != KEEL_OK) break;
        if ((st = cmd(s, -1, "ip link set %s netns %s", vp, ns)) != KEEL_OK) break;
        if ((st = cmd(s, -1, "ip -n %s link set %s name eth0", ns, vp)) != KEEL_OK) break;
        if ((st = cmd(s, -1, "ip -n %s addr add %s/%d dev eth0", ns, s->nodes[i].addr, s->prefix)) != KEEL_OK) break;
        if ((st = cmd(s, -1, "ip -n %s link set eth0 up", ns)) != KEEL_OK) break;
        st = cmd(s, -1, "ip -n %s link set lo up", ns);
    }
    return st;
}

/* In the keeper, before it becomes `sleep infinity`: its namespaces and mounts. */
static const char *keeper_setup(const keel_cluster_spec *s, int i) {
    static char why[1400];
    char ns[128], p[1100];
    netns_name(s, i, ns, sizeof ns);
    snprintf(p, sizeof p, "/run/netns/%s", ns);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) return snprintf(why, sizeof why, "setns %s: %s", p, strerror(errno)), why;
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
    char msg[600] = "";
    ssize_t got = pid > 0 ? read(p[0], msg, sizeof msg - 1) : -1;
    close(p[0]);
    if (got > 0) msg[got] = 0;
    if (strcmp(msg, "ok") != 0) {
        keel_errorf("node %s: %s", s->nodes[i].name, msg[0] ? msg : "its keeper process did not start");
        if (pid > 0) waitpid(pid, NULL, 0);
        return KEEL_ERR_IO;
    }
    char *path = node_path(s, i, "keeper.pid"), text[32];
    snprintf(text, sizeof text, "%d\n", (int)pid);
    keel_status st = write_text(path, text, 0644);
    keel_free(path);
    return st;
}

/* A group's lifecycle scripts as its nodes see them: SourceDir copied into
 * StateDir/lifecycle/GROUP (as HyperPod copies them from S3 onto each node;
 * and a SourceDir under /tmp would be out of the nodes' sight). */
static char *lifecycle_dir(const keel_cluster_spec *s, const keel_cluster_group *g) {
    char p[1100];
    snprintf(p, sizeof p, "%s/lifecycle/%s", s->state_dir, g->name);
    return keel_xstrdup(p);
}

static keel_status copy_lifecycle(const keel_cluster_spec *s) {
    keel_status st = KEEL_OK;
    for (int k = 0; k < s->ngroups && st == KEEL_OK; k++) {
        if (!s->groups[k].on_create) continue;
        char *dst = lifecycle_dir(s, &s->groups[k]);
        st = cmd(s, -1, "rm -rf %s", dst);
        if (st == KEEL_OK) st = keel_mkdirs(dst);
        if (st == KEEL_OK) st = cmd(s, -1, "cp -a %s/. %s", s->groups[k].source_dir, dst);
        keel_free(dst);
    }
    return st;
}

/* Every node's LifeCycleConfig.OnCreate at once, each once, in the node, its output in nodes/NODE/on_create.log. */
static keel_status run_on_create(const keel_cluster_spec *s) {
    pid_t *pid = keel_xcalloc((size_t)s->nnodes * sizeof *pid, "on_create");
    char **env = keel_xcalloc((size_t)s->nnodes * 6 * sizeof *env, "on_create env");
    keel_status st = copy_lifecycle(s);
    for (int i = 0; i < s->nnodes && st == KEEL_OK; i++) {
        const keel_cluster_group *g = &s->groups[s->nodes[i].group];
        if (!g->on_create) continue;
        char **e = env + i * 6, buf[1200];
        snprintf(buf, sizeof buf, "KEEL_NODE_NAME=%s", s->nodes[i].name), e[0] = keel_xstrdup(buf);
        snprintf(buf, sizeof buf, "KEEL_NODE_ROLE=%s", keel_node_role_name(g->role)), e[1] = keel_xstrdup(buf);
        snprintf(buf, sizeof buf, "KEEL_INSTANCE_GROUP=%s", g->name), e[2] = keel_xstrdup(buf);
        snprintf(buf, sizeof buf, "KEEL_CLUSTER_NAME=%s", s->name), e[3] = keel_xstrdup(buf);
        snprintf(buf, sizeof buf, "KEEL_CLUSTER_SHARED=%s", s->shared_dir), e[4] = keel_xstrdup(buf);
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
        char *log = node_path(s, i, "on_create.log"), *text = NULL, last[300] = "";
        if (keel_read_file_quiet(log, 1 << 20, &text, NULL) == KEEL_OK) {
            size_t n = strlen(text);
            while (n && text[n - 1] == '\n') text[--n] = 0;
            const char *l = strrchr(text, '\n');
            snprintf(last, sizeof last, ": %s", l ? l + 1 : text);
            if (!text[0]) last[0] = 0;
        }
        keel_errorf("%s: LifeCycleConfig.OnCreate of group %s: %s failed on node %s (%s %d)%s (log: %s)", s->path,
                    s->groups[s->nodes[i].group].name, s->groups[s->nodes[i].group].on_create, s->nodes[i].name,
                    rc == 124 ? "no end in" : "exit", rc == 124 ? ON_CREATE_TIMEOUT_S : rc, last, log);
        keel_free(text);
        keel_free(log);
        st = KEEL_ERR_INPUT;
    }
    for (int i = 0; i < s->nnodes * 6; i++) keel_free(env[i]);
    keel_free(env);
    keel_free(pid);
    return st;
}

static keel_status start_daemons(const keel_cluster_spec *s) {
    const char *d = s->state_dir;
    char munged[2048];
    snprintf(munged, sizeof munged,
             "munged --force --socket=%s/munge/munge.sock --key-file=%s/munge.key --pid-file=%s/munge/munged.pid "
             "--seed-file=%s/munge/munged.seed --log-file=%s/munge/munged.log",
             d, d, d, d, d);
    /* the same command everywhere: each node's mount namespace gives it its own StateDir/munge */
    keel_status st = cmd(s, -1, "%s", munged);
    for (int i = 0; i < s->nnodes && st == KEEL_OK; i++) st = cmd(s, i, "%s", munged);
    if (st == KEEL_OK) st = cmd(s, 0, "slurmctld -c -f %s/slurm.conf", d);
    for (int i = 0; i < s->nnodes && st == KEEL_OK; i++)
        if (role_of(s, i) == KEEL_ROLE_WORKER) st = cmd(s, i, "slurmd -f %s/slurm.conf", d);
    return st;
}

static char *slurm_conf_env(const keel_cluster_spec *s) {
    char e[1100];
    snprintf(e, sizeof e, "SLURM_CONF=%s/slurm.conf", s->state_dir);
    return keel_xstrdup(e);
}

/* sinfo's node lines "NAME|STATE|REASON" (from the host), false when it does not answer. */
static bool sinfo(const keel_cluster_spec *s, char *out, size_t n) {
    char *env[] = {slurm_conf_env(s), NULL};
    char *argv[] = {"sinfo", "-h", "-N", "-o", "%N|%T|%E", NULL};
    int rc = run_out(s, -1, argv, env, out, n);
    keel_free(env[0]);
    return rc == 0;
}

static keel_status wait_idle(const keel_cluster_spec *s) {
    int workers = 0;
    for (int i = 0; i < s->nnodes; i++) workers += role_of(s, i) == KEEL_ROLE_WORKER;
    char out[16384] = "";
    for (double t0 = keel_now_s(); keel_now_s() - t0 < IDLE_TIMEOUT_S; keel_sleep_s(0.2)) {
        if (!sinfo(s, out, sizeof out)) continue;
        int idle = 0;
        for (const char *at = strstr(out, "|idle|"); at; at = strstr(at + 1, "|idle|")) idle++;
        if (idle == workers) return KEEL_OK;
    }
    for (char *c = out; *c; c++)
        if (*c == '\n') *c = ' ';
    keel_errorf("cluster %s: the workers did not all become idle in %d s (sinfo: %s; logs in %s)", s->name,
                IDLE_TIMEOUT_S, out[0] ? out : "no answer", s->state_dir);
    return KEEL_ERR_IO;
}

keel_status keel_cluster_up(const keel_cluster_spec *s) {
    keel_status st = need_root("up");
    if (st != KEEL_OK) return st;
    static const char *const tools[] = {"ip", "munged", "slurmctld", "slurmd", "sinfo", "sleep", "bash", NULL};
    for (const char *const *t = tools; *t; t++)
        if (!in_path(*t)) {
            keel_errorf("keel cluster up: %s not found: run scripts/install-deps.sh (iproute2, munge, slurmctld, "
                        "slurmd, slurm-client)", *t);
            return KEEL_ERR_INPUT;
        }
    char keel[4096], plugin[4096];
    if ((st = keel_self_path(keel, sizeof keel)) != KEEL_OK) return st;
    if ((st = keel_cluster_find_plugin(s, keel, plugin, sizeof plugin)) != KEEL_OK) return st;
    bool present = bridge_exists(s);
    for (int i = 0; i < s->nnodes && !present; i++) present = netns_inode(s, i) != 0;
    if (present) {
        keel_errorf("cluster %s is up already, or was not taken down: keel cluster status %s; keel cluster down %s",
                    s->name, s->path, s->path);
        return KEEL_ERR_INPUT;
    }
    if ((st = check_subnet(s)) != KEEL_OK) return st;
    if ((st = write_state(s, keel, plugin)) != KEEL_OK) return st;
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
    keel_log_info("cluster %s up in %.1f s: %d nodes on %s, shared %s; eval \"$(keel cluster env %s)\"", s->name,
                  keel_now_s() - t0, s->nnodes, s->state_dir, s->shared_dir, s->path);
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
    char *pf = keel_path_join(s->state_dir, "munge/munged.pid");
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
        char name[128];
        netns_name(s, i, name, sizeof name);
        if (cmd(s, -1, "ip netns del %s", name) != KEEL_OK) st = KEEL_ERR_IO;
        char *kp = node_path(s, i, "keeper.pid");
        unlink(kp);
        keel_free(kp);
    }
    /* the kernel takes a namespace apart after its last process: its veth goes then */
    unsigned h = cluster_hash(s);
    for (int i = 0; i < s->nnodes; i++) {
        char veth[64];
        snprintf(veth, sizeof veth, "/sys/class/net/kv-%06x-%d", h, i);
        for (double t0 = keel_now_s(); keel_path_exists(veth) && keel_now_s() - t0 < 10;) keel_sleep_s(0.05);
        if (keel_path_exists(veth)) {
            keel_errorf("cluster %s: %s is still there 10 s after its namespace was removed", s->name, veth);
            st = KEEL_ERR_IO;
        }
    }
    char br[32];
    bridge_name(s, br, sizeof br);
    bool bridge = bridge_exists(s);
    if (bridge && cmd(s, -1, "ip link del %s", br) != KEEL_OK) st = KEEL_ERR_IO;
    char *marker = keel_path_join(s->state_dir, "up");
    unlink(marker);
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

static bool pid_on_node(const keel_cluster_spec *s, const ino_t *ns, int i, const char *pidfile) {
    pid_t pid = read_pid(pidfile);
    return pid && node_of_pid(s, ns, pid) == i;
}

bool keel_cluster_status(const keel_cluster_spec *s, FILE *out) {
    ino_t *ns = keel_xcalloc((size_t)s->nnodes * sizeof *ns, "netns");
    char *marker = keel_path_join(s->state_dir, "up");
    bool up = keel_path_exists(marker) && bridge_exists(s);
    keel_free(marker);
    char slurm[65536] = "";
    bool answered = up && sinfo(s, slurm, sizeof slurm);
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
        p = node_path(s, i, "munge/munged.pid");
        bool m = pid_on_node(s, ns, i, p);
        keel_free(p);
        snprintf(daemons, sizeof daemons, "munged%s", m ? "" : "(down)");
        ok &= m;
        if (role != KEEL_ROLE_LOGIN) {
            p = role == KEEL_ROLE_CONTROLLER ? keel_path_join(s->state_dir, "slurmctld.pid")
                                             : node_path(s, i, "slurmd.pid");
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
    keel_free(ns);
    return all && answered;
}

int keel_cluster_exec(const keel_cluster_spec *s, const char *node, char *const *argv) {
    int i = 0;
    while (i < s->nnodes && strcmp(s->nodes[i].name, node)) i++;
    if (i == s->nnodes) {
        keel_errorf("%s: no node '%s' (keel cluster status %s lists them)", s->path, node, s->path);
        return 2;
    }
    if (!netns_inode(s, i)) {
        keel_errorf("node %s is not up: keel cluster up %s", node, s->path);
        return 1;
    }
    char *env[3] = {slurm_conf_env(s), NULL, NULL}, shared[1100], cwd[4096];
    snprintf(shared, sizeof shared, "KEEL_CLUSTER_SHARED=%s", s->shared_dir);
    env[1] = shared;
    pid_t pid = spawn(s, i, argv, getcwd(cwd, sizeof cwd), -1, env);
    int rc = pid < 0 ? 1 : wait_for(pid, 0);
    keel_free(env[0]);
    return rc;
}
