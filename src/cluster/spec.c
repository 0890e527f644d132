/* cluster/spec.c: a cluster spec (keel/cluster.h) — parsed strictly, every
 * error one line naming the file and key — and the Slurm files it makes, for
 * this machine's namespaced cluster or for real hosts. */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <ctype.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "keel/cluster.h"
#include "keel/resil.h"

#define MAX_NODES 250

const char *keel_node_role_name(keel_node_role r) {
    static const char *names[] = {"controller", "login", "worker"};
    return names[r];
}

void keel_cluster_spec_free(keel_cluster_spec *s) {
    for (int i = 0; i < s->ngroups; i++) {
        keel_free(s->groups[i].on_create);
        keel_free(s->groups[i].source_dir);
    }
    keel_free(s->groups);
    keel_free(s->nodes);
    keel_free(s->path);
    keel_free(s->state_dir);
    keel_free(s->shared_dir);
    keel_free(s->partition);
    keel_free(s->plugin);
    keel_free(s->health);
    *s = (keel_cluster_spec){0};
}

/* [a-z][a-z0-9-]*, at most max chars: a Slurm and host name piece */
static bool good_name(const char *v, size_t max) {
    if (!v[0] || strlen(v) > max || !islower((unsigned char)v[0])) return false;
    for (const char *c = v; *c; c++)
        if (!islower((unsigned char)*c) && !isdigit((unsigned char)*c) && *c != '-') return false;
    return true;
}

/* An absolute path: p itself, or p relative to base. */
static char *resolve(const char *base, const char *p) {
    return p[0] == '/' ? keel_xstrdup(p) : keel_path_join(base, p);
}

static bool under(const char *path, const char *dir) {
    size_t n = strlen(dir);
    return !strncmp(path, dir, n) && (path[n] == '/' || !path[n]);
}

/* Only these keys; *bad = the first other. */
static bool only_keys(const cJSON *o, const char *const *keys, const char **bad) {
    const cJSON *x;
    cJSON_ArrayForEach(x, o) {
        bool known = false;
        for (const char *const *k = keys; *k && !known; k++) known = !strcmp(x->string, *k);
        if (!known) {
            *bad = x->string;
            return false;
        }
    }
    return true;
}

static bool int_in(const cJSON *x, int lo, int hi, int *out) {
    if (!cJSON_IsNumber(x) || x->valuedouble != (double)(int)x->valuedouble || x->valueint < lo || x->valueint > hi)
        return false;
    *out = x->valueint;
    return true;
}

#define SPEC_ERR(...)                                                                                              \
    do {                                                                                                           \
        keel_errorf(__VA_ARGS__);                                                                                  \
        return KEEL_ERR_INPUT;                                                                                     \
    } while (0)

static keel_status parse_group(const cJSON *g, int i, const char *path, const char *base, keel_cluster_group *out) {
    static const char *const keys[] = {"InstanceGroupName", "Role", "InstanceCount", "LifeCycleConfig", "Cpus",
                                       "MemoryMiB", "Gpus", NULL};
    const char *bad = "";
    if (!cJSON_IsObject(g)) SPEC_ERR("%s: InstanceGroups[%d]: not an object", path, i);
    if (!only_keys(g, keys, &bad))
        SPEC_ERR("%s: InstanceGroups[%d]: unknown key '%s' (an instance group has InstanceGroupName, Role, "
                 "InstanceCount, LifeCycleConfig, Cpus, MemoryMiB, Gpus)", path, i, bad);
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(g, "InstanceGroupName");
    if (!cJSON_IsString(x) || !good_name(x->valuestring, 16))
        SPEC_ERR("%s: InstanceGroups[%d].InstanceGroupName: want a name of lower-case letters, digits and '-' "
                 "(at most 16, a letter first)", path, i);
    snprintf(out->name, sizeof out->name, "%s", x->valuestring);
    x = cJSON_GetObjectItemCaseSensitive(g, "Role");
    const char *role = cJSON_IsString(x) ? x->valuestring : "";
    if (!strcmp(role, "controller")) out->role = KEEL_ROLE_CONTROLLER;
    else if (!strcmp(role, "login")) out->role = KEEL_ROLE_LOGIN;
    else if (!strcmp(role, "worker")) out->role = KEEL_ROLE_WORKER;
    else SPEC_ERR("%s: InstanceGroups[%d] (%s).Role: want \"controller\", \"login\" or \"worker\"", path, i, out->name);
    if (!int_in(cJSON_GetObjectItemCaseSensitive(g, "InstanceCount"), 0, MAX_NODES, &out->count))
        SPEC_ERR("%s: InstanceGroups[%d] (%s).InstanceCount: want a whole number 1..%d", path, i, out->name,
                 MAX_NODES);
    if (out->count == 0)
        SPEC_ERR("%s: InstanceGroups[%d] (%s).InstanceCount: 0 nodes; a group needs at least one (remove the "
                 "group instead)", path, i, out->name);
    if (out->role == KEEL_ROLE_CONTROLLER && out->count != 1)
        SPEC_ERR("%s: InstanceGroups[%d] (%s).InstanceCount: %d controllers; a cluster has exactly one", path, i,
                 out->name, out->count);
    out->cpus = 4;
    out->memory_mib = 2000;
    out->gpus = 0;
    static const char *const hw[] = {"Cpus", "MemoryMiB", "Gpus"};
    int *dst[] = {&out->cpus, &out->memory_mib, &out->gpus};
    const int lo[] = {1, 1, 0}, hi[] = {4096, 1 << 30, 64};
    for (int k = 0; k < 3; k++) {
        if (!(x = cJSON_GetObjectItemCaseSensitive(g, hw[k]))) continue;
        if (out->role != KEEL_ROLE_WORKER)
            SPEC_ERR("%s: InstanceGroups[%d] (%s).%s: only worker groups run jobs; remove it", path, i, out->name,
                     hw[k]);
        if (!int_in(x, lo[k], hi[k], dst[k]))
            SPEC_ERR("%s: InstanceGroups[%d] (%s).%s: want a whole number %d..%d", path, i, out->name, hw[k], lo[k],
                     hi[k]);
    }
    const cJSON *lc = cJSON_GetObjectItemCaseSensitive(g, "LifeCycleConfig");
    if (!lc) return KEEL_OK;
    static const char *const lc_keys[] = {"SourceDir", "OnCreate", NULL};
    if (!cJSON_IsObject(lc) || !only_keys(lc, lc_keys, &bad))
        SPEC_ERR("%s: InstanceGroups[%d] (%s).LifeCycleConfig: want {\"SourceDir\": DIR, \"OnCreate\": SCRIPT}%s%s",
                 path, i, out->name, cJSON_IsObject(lc) ? "; unknown key " : "", cJSON_IsObject(lc) ? bad : "");
    const cJSON *src = cJSON_GetObjectItemCaseSensitive(lc, "SourceDir");
    const cJSON *oc = cJSON_GetObjectItemCaseSensitive(lc, "OnCreate");
    if ((src && (!cJSON_IsString(src) || !src->valuestring[0])) || !cJSON_IsString(oc) || !oc->valuestring[0])
        SPEC_ERR("%s: InstanceGroups[%d] (%s).LifeCycleConfig: OnCreate (a script) is required, SourceDir (a "
                 "directory) optional, both non-empty strings", path, i, out->name);
    out->source_dir = resolve(base, src ? src->valuestring : ".");
    out->on_create = resolve(out->source_dir, oc->valuestring);
    struct stat st;
    if (stat(out->source_dir, &st) != 0 || !S_ISDIR(st.st_mode) || strpbrk(out->source_dir, " \t\n"))
        SPEC_ERR("%s: InstanceGroups[%d] (%s).LifeCycleConfig.SourceDir: %s is not a directory (or has a space)",
                 path, i, out->name, out->source_dir);
    if (!under(out->on_create, out->source_dir) || stat(out->on_create, &st) != 0 || !S_ISREG(st.st_mode))
        SPEC_ERR("%s: InstanceGroups[%d] (%s).LifeCycleConfig.OnCreate: %s is not a file in SourceDir", path, i,
                 out->name, out->on_create);
    return KEEL_OK;
}

static keel_status parse_subnet(const cJSON *x, const char *path, int nodes, keel_cluster_spec *s) {
    char text[64], *slash;
    const char *v = cJSON_IsString(x) ? x->valuestring : "";
    snprintf(text, sizeof text, "%s", v);
    struct in_addr a;
    int prefix = -1;
    if ((slash = strchr(text, '/'))) {
        *slash = 0;
        char *end;
        long p = strtol(slash + 1, &end, 10);
        prefix = *end || p < 16 || p > 29 ? -1 : (int)p;
    }
    if (prefix < 0 || inet_pton(AF_INET, text, &a) != 1)
        SPEC_ERR("%s: Subnet: '%s' is not an IPv4 subnet A.B.C.D/P with P 16..29 (e.g. \"10.213.0.0/24\")", path, v);
    uint32_t ip = ntohl(a.s_addr), mask = ~0u << (32 - prefix);
    bool private = (ip >> 24) == 10 || (ip >> 20) == (172u << 4 | 1) || (ip >> 16) == (192u << 8 | 168);
    if (!private)
        SPEC_ERR("%s: Subnet: %s is not a private range (10/8, 172.16/12, 192.168/16); the cluster's hosts "
                 "must not shadow real ones", path, v);
    if (ip & ~mask) SPEC_ERR("%s: Subnet: %s has host bits set; its network address is wanted", path, v);
    if ((1u << (32 - prefix)) < (uint32_t)nodes + 3)
        SPEC_ERR("%s: Subnet: %s has room for %u hosts, the spec has %d nodes and the bridge", path, v,
                 (1u << (32 - prefix)) - 3, nodes);
    s->subnet = ip;
    s->prefix = prefix;
    return KEEL_OK;
}

/* Dirs a node replaces with its own (a path under them is not the same on every node). */
static keel_status check_dir(const char *path, const char *key, const char *dir) {
    if (dir[0] != '/') SPEC_ERR("%s: %s: '%s' is not an absolute path", path, key, dir);
    if (strpbrk(dir, " \t\n,:")) SPEC_ERR("%s: %s: '%s' has a space, ',' or ':' (Slurm's files cannot quote them)", path, key, dir);
    static const char *const per_node[] = {"/tmp", "/dev/shm", "/etc/hosts", NULL};
    for (const char *const *p = per_node; *p; p++)
        if (under(dir, *p))
            SPEC_ERR("%s: %s: %s is under %s, which every node of the cluster has its own of; pick a directory "
                     "outside it (e.g. /var/lib/keel/...)", path, key, dir, *p);
    return KEEL_OK;
}

static keel_status parse_spec(const cJSON *j, const char *path, keel_cluster_spec *s) {
    static const char *const keys[] = {"ClusterName", "InstanceGroups", "StateDir", "SharedDir", "Subnet",
                                       "Partition", "HealthCheck", "HealthTimeoutS", "AutoResumePlugin", NULL};
    const char *bad = "";
    if (!cJSON_IsObject(j))
        SPEC_ERR("%s: not a JSON object (a cluster spec: {\"ClusterName\": ..., \"InstanceGroups\": [...]})", path);
    if (!only_keys(j, keys, &bad))
        SPEC_ERR("%s: unknown key '%s' (a cluster spec has ClusterName, InstanceGroups, StateDir, SharedDir, "
                 "Subnet, Partition, HealthCheck, HealthTimeoutS, AutoResumePlugin)", path, bad);
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, "ClusterName");
    if (!cJSON_IsString(x) || !good_name(x->valuestring, 32))
        SPEC_ERR("%s: ClusterName: want a name of lower-case letters, digits and '-' (at most 32, a letter first)",
                 path);
    snprintf(s->name, sizeof s->name, "%s", x->valuestring);
    char *dir_copy = keel_xstrdup(path);
    char *base = realpath(dirname(dir_copy), NULL); /* the scripts run elsewhere: absolute paths */
    keel_free(dir_copy);
    if (!base) base = keel_xstrdup("/");
    keel_status st = KEEL_OK;
    const cJSON *groups = cJSON_GetObjectItemCaseSensitive(j, "InstanceGroups");
    int n = cJSON_GetArraySize(groups);
    if (!cJSON_IsArray(groups) || n == 0) {
        keel_errorf("%s: InstanceGroups: want a list of instance groups (a controller and workers at least)", path);
        st = KEEL_ERR_INPUT;
        goto out;
    }
    s->groups = keel_xcalloc((size_t)n * sizeof *s->groups, "cluster groups");
    int counts[3] = {0, 0, 0}, nodes = 0;
    const cJSON *g;
    cJSON_ArrayForEach(g, groups) {
        keel_cluster_group *grp = &s->groups[s->ngroups];
        s->ngroups++; /* freed with the spec even when it fails here */
        if ((st = parse_group(g, s->ngroups - 1, path, base, grp)) != KEEL_OK) goto out;
        for (int k = 0; k < s->ngroups - 1; k++)
            if (!strcmp(s->groups[k].name, grp->name)) {
                keel_errorf("%s: InstanceGroups[%d].InstanceGroupName: '%s' twice", path, s->ngroups - 1, grp->name);
                st = KEEL_ERR_INPUT;
                goto out;
            }
        counts[grp->role] += grp->count;
        nodes += grp->count;
    }
    if (counts[KEEL_ROLE_CONTROLLER] != 1 || counts[KEEL_ROLE_WORKER] == 0 || nodes > MAX_NODES) {
        keel_errorf("%s: InstanceGroups: %s", path,
                    counts[KEEL_ROLE_CONTROLLER] == 0 ? "no group with Role \"controller\"; a cluster needs one"
                    : counts[KEEL_ROLE_CONTROLLER] > 1 ? "more than one controller group; a cluster has one"
                    : counts[KEEL_ROLE_WORKER] == 0   ? "no worker nodes; a cluster needs at least one"
                                                      : "more than 250 nodes");
        st = KEEL_ERR_INPUT;
        goto out;
    }
    /* nodes: controller, login, workers; each group's in order */
    s->nodes = keel_xcalloc((size_t)nodes * sizeof *s->nodes, "cluster nodes");
    for (int role = KEEL_ROLE_CONTROLLER; role <= KEEL_ROLE_WORKER; role++)
        for (int k = 0; k < s->ngroups; k++) {
            if ((int)s->groups[k].role != role) continue;
            for (int i = 1; i <= s->groups[k].count; i++) {
                keel_cluster_node *nd = &s->nodes[s->nnodes++];
                snprintf(nd->name, sizeof nd->name, "%s%d", s->groups[k].name, i);
                nd->group = k;
                for (int m = 0; m < s->nnodes - 1; m++)
                    if (!strcmp(s->nodes[m].name, nd->name)) {
                        keel_errorf("%s: InstanceGroups: two nodes would be named %s (groups %s and %s); rename "
                                    "one group", path, nd->name, s->groups[s->nodes[m].group].name,
                                    s->groups[k].name);
                        st = KEEL_ERR_INPUT;
                        goto out;
                    }
            }
        }
    x = cJSON_GetObjectItemCaseSensitive(j, "Subnet");
    cJSON *dflt = cJSON_CreateString("10.213.0.0/24");
    st = parse_subnet(x ? x : dflt, path, nodes, s);
    cJSON_Delete(dflt);
    if (st != KEEL_OK) goto out;
    for (int i = 0; i < s->nnodes; i++) {
        struct in_addr a = {.s_addr = htonl(s->subnet + 2 + (uint32_t)i)}; /* .1 is the bridge */
        inet_ntop(AF_INET, &a, s->nodes[i].addr, sizeof s->nodes[i].addr);
    }
    const char *strings[] = {"StateDir", "SharedDir", "Partition", "AutoResumePlugin"};
    char **dst[] = {&s->state_dir, &s->shared_dir, &s->partition, &s->plugin};
    for (int k = 0; k < 4; k++) {
        if (!(x = cJSON_GetObjectItemCaseSensitive(j, strings[k]))) continue;
        if (!cJSON_IsString(x) || !x->valuestring[0]) {
            keel_errorf("%s: %s: want a non-empty string", path, strings[k]);
            st = KEEL_ERR_INPUT;
            goto out;
        }
        *dst[k] = k == 2 ? keel_xstrdup(x->valuestring) : resolve(base, x->valuestring);
    }
    if (!s->state_dir) {
        char d[128];
        snprintf(d, sizeof d, "/var/lib/keel/cluster/%s", s->name);
        s->state_dir = keel_xstrdup(d);
    }
    if (!s->shared_dir) s->shared_dir = keel_path_join(s->state_dir, "fsx");
    if (!s->partition) s->partition = keel_xstrdup("dev");
    if (!good_name(s->partition, 32)) {
        keel_errorf("%s: Partition: '%s' is not a name of lower-case letters, digits and '-'", path, s->partition);
        st = KEEL_ERR_INPUT;
        goto out;
    }
    if ((st = check_dir(path, "StateDir", s->state_dir)) != KEEL_OK ||
        (st = check_dir(path, "SharedDir", s->shared_dir)) != KEEL_OK)
        goto out;
    s->health_timeout_s = 120;
    if ((x = cJSON_GetObjectItemCaseSensitive(j, "HealthTimeoutS")) && !int_in(x, 1, 3600, &s->health_timeout_s)) {
        keel_errorf("%s: HealthTimeoutS: want a whole number of seconds 1..3600", path);
        st = KEEL_ERR_INPUT;
        goto out;
    }
    /* the health program's node config: checked here with keel health's own parser */
    x = cJSON_GetObjectItemCaseSensitive(j, "HealthCheck");
    if (x) {
        s->health = cJSON_PrintUnformatted(x);
    } else {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddItemToObject(d, "checks", cJSON_CreateStringArray((const char *[]){"checkpoint_dir"}, 1));
        cJSON_AddStringToObject(d, "dir", s->shared_dir);
        s->health = cJSON_PrintUnformatted(d);
        cJSON_Delete(d);
    }
    char origin[600];
    snprintf(origin, sizeof origin, "%s: HealthCheck", path);
    keel_node_config nc;
    st = keel_node_config_parse(s->health, origin, &nc);
    keel_free(nc.dir);
    if (st == KEEL_OK && (nc.checks & (1u << KEEL_CHECK_MPI))) {
        keel_errorf("%s: checks: the mpi check needs a job's ranks; a node's health program runs the node-local "
                    "checks (gemm, memory, checkpoint_dir, gpu)", origin);
        st = KEEL_ERR_INPUT;
    }
out:
    keel_free(base);
    return st;
}

keel_status keel_cluster_spec_parse(const char *json, const char *path, keel_cluster_spec *s) {
    *s = (keel_cluster_spec){0};
    s->path = keel_xstrdup(path);
    cJSON *j = cJSON_Parse(json);
    if (!j) {
        keel_errorf("%s: not valid JSON (near '%.20s')", path, cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() : "");
        keel_cluster_spec_free(s);
        return KEEL_ERR_INPUT;
    }
    keel_status st = parse_spec(j, path, s);
    cJSON_Delete(j);
    if (st != KEEL_OK) keel_cluster_spec_free(s);
    return st;
}

keel_status keel_cluster_spec_load(const char *path, keel_cluster_spec *s) {
    *s = (keel_cluster_spec){0};
    char *text;
    keel_status st = keel_read_file(path, &text, NULL);
    if (st != KEEL_OK) return st;
    st = keel_cluster_spec_parse(text, path, s);
    keel_free(text);
    return st;
}

keel_status keel_cluster_hosts_load(keel_cluster_spec *s, const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) {
        keel_errorf("%s: cannot open the hosts file (lines \"NAME ADDRESS GROUP\")", path);
        return KEEL_ERR_IO;
    }
    int *taken = keel_xcalloc((size_t)s->ngroups * sizeof *taken, "hosts");
    for (int i = 0; i < s->nnodes; i++) s->nodes[i].name[0] = s->nodes[i].addr[0] = 0; /* the file's, not ours */
    char line[512];
    int lineno = 0;
    keel_status st = KEEL_OK;
    while (st == KEEL_OK && fgets(line, sizeof line, f)) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char name[128], addr[128], group[128], extra[8];
        int fields = sscanf(line, "%127s %127s %127s %7s", name, addr, group, extra);
        if (fields <= 0) continue;
        st = KEEL_ERR_INPUT;
        if (fields != 3) {
            keel_errorf("%s:%d: want \"NAME ADDRESS GROUP\" (three fields)", path, lineno);
            break;
        }
        if (!good_name(name, 63) || strlen(addr) >= sizeof s->nodes[0].addr) {
            keel_errorf("%s:%d: '%s' is not a host name of lower-case letters, digits and '-' (or its address "
                        "is too long)", path, lineno, name);
            break;
        }
        int g = -1;
        for (int k = 0; k < s->ngroups; k++)
            if (!strcmp(s->groups[k].name, group)) g = k;
        if (g < 0) {
            keel_errorf("%s:%d: no instance group '%s' in %s", path, lineno, group, s->path);
            break;
        }
        if (taken[g] == s->groups[g].count) {
            keel_errorf("%s:%d: more hosts for group %s than its InstanceCount (%d)", path, lineno, group,
                        s->groups[g].count);
            break;
        }
        /* the group's next node slot */
        keel_cluster_node *nd = NULL;
        for (int i = 0, seen = 0; i < s->nnodes && !nd; i++)
            if (s->nodes[i].group == g && seen++ == taken[g]) nd = &s->nodes[i];
        bool dup = false;
        for (int i = 0; i < s->nnodes && !dup; i++)
            dup = s->nodes[i].name[0] && (!strcmp(s->nodes[i].name, name) || !strcmp(s->nodes[i].addr, addr));
        if (dup) {
            keel_errorf("%s:%d: host %s or address %s appears twice", path, lineno, name, addr);
            break;
        }
        snprintf(nd->name, sizeof nd->name, "%.63s", name);
        snprintf(nd->addr, sizeof nd->addr, "%.63s", addr);
        taken[g]++;
        st = KEEL_OK;
    }
    fclose(f);
    for (int k = 0; k < s->ngroups && st == KEEL_OK; k++)
        if (taken[k] != s->groups[k].count) {
            keel_errorf("%s: group %s has %d hosts, its InstanceCount is %d", path, s->groups[k].name, taken[k],
                        s->groups[k].count);
            st = KEEL_ERR_INPUT;
        }
    keel_free(taken);
    return st;
}

keel_status keel_cluster_find_plugin(const keel_cluster_spec *s, const char *keel, char *out, size_t n) {
    if (s->plugin) {
        snprintf(out, n, "%s", s->plugin);
        if (keel_path_exists(out)) return KEEL_OK;
        keel_errorf("%s: AutoResumePlugin: %s does not exist (build it: make keel; or install it)", s->path, out);
        return KEEL_ERR_INPUT;
    }
    char *copy = keel_xstrdup(keel);
    const char *dir = dirname(copy);
    /* a build directory (build/keel, build/plugins/) or an install (bin/keel, lib/keel/) */
    snprintf(out, n, "%s/plugins/keel_auto_resume.so", dir);
    if (!keel_path_exists(out)) snprintf(out, n, "%s/../lib/keel/keel_auto_resume.so", dir);
    keel_free(copy);
    if (keel_path_exists(out)) return KEEL_OK;
    keel_errorf("%s: no keel_auto_resume.so beside %s (plugins/ or ../lib/keel/): build it (make keel) or set "
                "AutoResumePlugin", s->path, keel);
    return KEEL_ERR_INPUT;
}

char *keel_cluster_slurm_conf(const keel_cluster_spec *s, const keel_cluster_files *f) {
    keel_strbuf b = {0};
    const keel_cluster_node *ctl = &s->nodes[0];
    keel_strbuf_printf(&b, "# slurm.conf of cluster %s, written by keel cluster from %s\n", s->name, s->path);
    keel_strbuf_printf(&b, "ClusterName=%s\nSlurmctldHost=%s(%s)\n", s->name, ctl->name, ctl->addr);
    keel_strbuf_printf(&b, "AuthType=auth/munge\nCredType=cred/munge\n");
    if (f->local) {
        /* every node's own munged answers at the same path (its mount namespace); cred_expire=10
         * shortens the hold on a requeued job from 121 s to 11 s */
        const char *d = s->state_dir;
        keel_strbuf_printf(&b, "AuthInfo=socket=%s/munge/munge.sock,cred_expire=10\n", d);
        keel_strbuf_printf(&b,
                           "SlurmUser=root\nSlurmdUser=root\nStateSaveLocation=%s/slurmctld\n"
                           "SlurmdSpoolDir=%s/nodes/%%n/spool\nSlurmctldPidFile=%s/slurmctld.pid\n"
                           "SlurmdPidFile=%s/nodes/%%n/slurmd.pid\nSlurmctldLogFile=%s/slurmctld.log\n"
                           "SlurmdLogFile=%s/nodes/%%n/slurmd.log\n",
                           d, d, d, d, d, d);
        /* the nodes share this machine's CPUs and have no cgroup hierarchy of their own */
        keel_strbuf_printf(&b, "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
                               "SlurmdParameters=config_overrides\nSelectType=select/cons_tres\n"
                               "SelectTypeParameters=CR_Core\nSlurmdTimeout=10\n");
    } else {
        keel_strbuf_printf(&b, "SlurmUser=slurm\nStateSaveLocation=/var/spool/slurmctld\n"
                               "SlurmdSpoolDir=/var/spool/slurmd\nSlurmctldPidFile=/run/slurmctld.pid\n"
                               "SlurmdPidFile=/run/slurmd.pid\nSlurmctldLogFile=/var/log/slurm/slurmctld.log\n"
                               "SlurmdLogFile=/var/log/slurm/slurmd.log\n"
                               "ProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup,task/affinity\n"
                               "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core_Memory\n");
    }
    keel_strbuf_printf(&b, "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
                           "JobCompType=jobcomp/none\nReturnToService=2\nMpiDefault=none\n");
    /* a node that fails its checks after a job is drained with "keel: <check>" */
    keel_strbuf_printf(&b, "Epilog=%s/keel-health.sh\nPlugStackConfig=%s/plugstack.conf\n", f->conf_dir,
                       f->conf_dir);
    bool gpus = false;
    for (int k = 0; k < s->ngroups; k++) gpus |= s->groups[k].gpus > 0;
    if (gpus) keel_strbuf_printf(&b, "GresTypes=gpu\n");
    for (int i = 0; i < s->nnodes; i++) {
        const keel_cluster_node *nd = &s->nodes[i];
        const keel_cluster_group *g = &s->groups[nd->group];
        if (g->role != KEEL_ROLE_WORKER) continue;
        keel_strbuf_printf(&b, "NodeName=%s NodeAddr=%s NodeHostname=%s CPUs=%d RealMemory=%d", nd->name, nd->addr,
                           nd->name, g->cpus, g->memory_mib);
        if (g->gpus) keel_strbuf_printf(&b, " Gres=gpu:%d", g->gpus);
        keel_strbuf_printf(&b, "\n");
    }
    keel_strbuf_printf(&b, "PartitionName=%s Nodes=", s->partition);
    for (int i = 0, first = 1; i < s->nnodes; i++)
        if (s->groups[s->nodes[i].group].role == KEEL_ROLE_WORKER) {
            keel_strbuf_printf(&b, "%s%s", first ? "" : ",", s->nodes[i].name);
            first = 0;
        }
    keel_strbuf_printf(&b, " Default=YES MaxTime=INFINITE State=UP\n");
    return b.s;
}

keel_status keel_cluster_write_files(const keel_cluster_spec *s, const keel_cluster_files *f, const char *dir,
                                     bool replace) {
    enum { SLURM, PLUGSTACK, CGROUP, GRES, NODE, HEALTH, NFILES };
    static const char *const names[NFILES] = {"slurm.conf", "plugstack.conf", "cgroup.conf",
                                              "gres.conf",  "keel-node.json", "keel-health.sh"};
    char *text[NFILES] = {0};
    text[SLURM] = keel_cluster_slurm_conf(s, f);
    keel_strbuf b = {0};
    keel_strbuf_printf(&b, "required %s health=%s/keel-health.sh health_timeout=%d\n", f->plugin, f->conf_dir,
                       s->health_timeout_s);
    text[PLUGSTACK] = b.s;
    b = (keel_strbuf){0};
    keel_strbuf_printf(&b, "CgroupPlugin=autodetect\nConstrainCores=yes\nConstrainRAMSpace=yes\n%s",
                       f->local ? "# unused by this machine's cluster (proctrack/linuxproc, task/none)\n" : "");
    text[CGROUP] = b.s;
    bool gpus = false;
    for (int k = 0; k < s->ngroups; k++) gpus |= s->groups[k].gpus > 0;
    if (gpus) {
        b = (keel_strbuf){0};
        keel_strbuf_printf(&b, "AutoDetect=nvml\n");
        text[GRES] = b.s;
    }
    text[NODE] = keel_xstrdup(s->health);
    b = (keel_strbuf){0};
    /* Slurm's Epilog takes no arguments; srun --auto-resume runs the same program */
    keel_strbuf_printf(&b, "#!/bin/sh\n# keel cluster: this node's health checks; a failing node is drained\n"
                           "export SLURM_CONF=\"${SLURM_CONF:-%s/slurm.conf}\"\n"
                           "exec \"%s\" health --epilog --node-config \"%s/keel-node.json\"\n",
                       f->conf_dir, f->keel, f->conf_dir);
    text[HEALTH] = b.s;
    keel_status st = KEEL_OK;
    for (int i = 0; i < NFILES && !replace; i++) {
        char *p = keel_path_join(dir, names[i]);
        if (text[i] && keel_path_exists(p)) {
            keel_errorf("%s exists; keel cluster slurm-conf never overwrites (move it away, or pick another --out)", p);
            st = KEEL_ERR_INPUT;
        }
        keel_free(p);
        if (st != KEEL_OK) break;
    }
    if (st == KEEL_OK) st = keel_mkdirs(dir);
    for (int i = 0; i < NFILES && st == KEEL_OK; i++) {
        if (!text[i]) continue;
        char *p = keel_path_join(dir, names[i]);
        st = keel_write_file_atomic(p, text[i], strlen(text[i]));
        if (st == KEEL_OK && chmod(p, i == HEALTH ? 0755 : 0644) != 0) {
            keel_errorf("%s: chmod failed", p);
            st = KEEL_ERR_IO;
        }
        keel_free(p);
    }
    for (int i = 0; i < NFILES; i++) free(text[i]);
    return st;
}
