/* cluster/spec.c: a cluster spec (keel/cluster.h) — parsed strictly, every
 * name and path held to one grammar (a spec is data, never code), every
 * error one line naming the file, the key, the value and the fix — and the
 * Slurm files it makes, for this machine's namespaced cluster or for real
 * hosts, with every value quoted or refused. */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "keel/cluster.h"
#include "keel/resil.h"

#define MAX_NODES 250
#define MAX_SPEC_BYTES (1 << 20)
#define MAX_OBJECT_KEYS 64 /* no object of a spec has more; bounds the duplicate-key check */
#define MAX_COMPONENT 255  /* NAME_MAX */
#define SHOW 60            /* bytes of a value an error line shows */

/* Directories a node replaces with its own: a path under them is not the same on every node. */
static const char *const per_node_dirs[] = {"/tmp", "/dev/shm", "/etc/hosts", NULL};

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

/* ---- showing and quoting ------------------------------------------------------- */

keel_cluster_shown keel_cluster_show(const char *v, size_t max_bytes) {
    keel_cluster_shown out;
    size_t n = strlen(v), at = 0, i = 0;
    if (max_bytes > 320) max_bytes = 320; /* 320 bytes of \xNN and the length fit out.s */
    for (; i < n && i < max_bytes; i++) {
        unsigned char c = (unsigned char)v[i];
        const char *esc = c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r" : c == '\\' ? "\\\\" : NULL;
        if (esc) at += (size_t)snprintf(out.s + at, sizeof out.s - at, "%s", esc);
        else if (c < 0x20 || c >= 0x7f) at += (size_t)snprintf(out.s + at, sizeof out.s - at, "\\x%02x", c);
        else out.s[at++] = (char)c;
    }
    out.s[at] = 0;
    if (i < n) snprintf(out.s + at, sizeof out.s - at, "... (%zu bytes)", n);
    return out;
}

bool keel_cluster_sh_quote(keel_strbuf *b, const char *v) {
    for (const unsigned char *c = (const unsigned char *)v; *c; c++)
        if (*c < 0x20 || *c == 0x7f) return false;
    keel_strbuf_printf(b, "'");
    for (const char *c = v; *c;) {
        size_t run = strcspn(c, "'");
        keel_strbuf_printf(b, "%.*s", (int)run, c);
        c += run;
        if (*c == '\'') {
            keel_strbuf_printf(b, "'\\''"); /* close, an escaped quote, reopen */
            c++;
        }
    }
    keel_strbuf_printf(b, "'");
    return true;
}

/* ---- the grammar ---------------------------------------------------------------- */

/* [a-z][a-z0-9-]*, at most max chars: a Slurm and host name piece */
static bool good_name(const char *v, size_t max) {
    if (!v[0] || strlen(v) > max || !islower((unsigned char)v[0])) return false;
    for (const char *c = v; *c; c++)
        if (!(*c >= 'a' && *c <= 'z') && !(*c >= '0' && *c <= '9') && *c != '-') return false;
    return true;
}

/* POSIX's portable file name characters, and '/' */
static bool path_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-' || c == '/';
}

static bool under(const char *path, const char *dir) {
    size_t n = strlen(dir);
    return !strncmp(path, dir, n) && (path[n] == '/' || !path[n]);
}

/* The first byte of v that is not a path character, as "'$' at byte 12", in why. */
static bool path_chars_ok(const char *v, char *why, size_t why_n) {
    for (size_t i = 0; v[i]; i++)
        if (!path_char(v[i])) {
            char one[2] = {v[i], 0};
            snprintf(why, why_n, "has '%s' at byte %zu, and a path here is made of A-Z a-z 0-9 . _ - and / only",
                     keel_cluster_show(one, 1).s, i);
            return false;
        }
    return true;
}

/* v as a clean absolute path (malloc'd): relative to base (NULL: a relative
 * v is refused), empty and '.' components dropped, '..' refused (keel never
 * resolves it, so a path cannot leave the directory it names), at most max
 * bytes. NULL when v breaks the grammar, with why saying how. */
static char *clean_path(const char *base, const char *v, size_t max, char *why, size_t why_n) {
    size_t vn = strlen(v);
    if (!vn) return snprintf(why, why_n, "is empty"), NULL;
    if (vn > KEEL_CLUSTER_PATH_MAX)
        return snprintf(why, why_n, "is %zu bytes long, and a path here has at most %d", vn, KEEL_CLUSTER_PATH_MAX),
               NULL;
    if (!path_chars_ok(v, why, why_n)) return NULL;
    if (v[0] != '/' && !base)
        return snprintf(why, why_n, "is relative, and there is no spec directory to resolve it against"), NULL;
    if (v[0] != '/' && (strlen(base) > KEEL_CLUSTER_PATH_MAX || !path_chars_ok(base, why, why_n))) {
        snprintf(why, why_n, "is relative, and the spec's directory '%s' is not a path of A-Z a-z 0-9 . _ - and /",
                 keel_cluster_show(base, SHOW).s);
        return NULL;
    }
    keel_strbuf b = {0};
    const char *parts[2] = {v[0] == '/' ? "" : base, v};
    for (int k = 0; k < 2; k++)
        for (const char *c = parts[k]; *c;) {
            while (*c == '/') c++;
            size_t len = strcspn(c, "/");
            if (!len) break;
            if (len == 2 && c[0] == '.' && c[1] == '.') {
                snprintf(why, why_n, "has a '..' component (keel never resolves '..': a path names the directory it "
                                     "says)");
                keel_free(b.s);
                return NULL;
            }
            if (len > MAX_COMPONENT) {
                snprintf(why, why_n, "has a component of %zu bytes, more than a file name's %d", len, MAX_COMPONENT);
                keel_free(b.s);
                return NULL;
            }
            if (!(len == 1 && c[0] == '.')) keel_strbuf_printf(&b, "/%.*s", (int)len, c);
            c += len;
        }
    if (!b.s) return snprintf(why, why_n, "is the root directory"), NULL;
    if (b.n > max) {
        snprintf(why, why_n, "is %zu bytes once resolved, more than the %zu this key allows", b.n, max);
        keel_free(b.s);
        return NULL;
    }
    return b.s;
}

/* The spec as error lines show it, and the directory its relative paths are relative to. */
typedef struct {
    const char *path;
    const char *base;
} spec_origin;

#define SPEC_ERR(...)                                                                                              \
    do {                                                                                                           \
        keel_errorf(__VA_ARGS__);                                                                                  \
        return KEEL_ERR_INPUT;                                                                                     \
    } while (0)

#define PATH_FIX                                                                                                   \
    "write an absolute path (or one relative to the spec's directory) of A-Z a-z 0-9 . _ - and /, without '..'"

/* key's path value v, cleaned into *out; shared: the path must be the same
 * directory on every node (not under /tmp, /dev/shm). */
static keel_status path_value(const spec_origin *o, const char *key, const char *v, size_t max, bool shared,
                              const char *fix, char **out) {
    char why[1600];
    char *p = clean_path(o->base, v, max, why, sizeof why);
    if (!p) SPEC_ERR("%s: %s: '%s' %s; %s", o->path, key, keel_cluster_show(v, SHOW).s, why, fix ? fix : PATH_FIX);
    for (const char *const *d = per_node_dirs; shared && *d; d++)
        if (under(p, *d)) {
            keel_errorf("%s: %s: %s is under %s, which every node of the cluster has its own of; pick a directory "
                        "outside it (e.g. /var/lib/keel/...)", o->path, key, p, *d);
            keel_free(p);
            return KEEL_ERR_INPUT;
        }
    *out = p;
    return KEEL_OK;
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

/* The first key that some object in x has twice (cJSON would read the first
 * and ignore the other, so a reader of the spec and keel could disagree), or
 * the first object with more than MAX_OBJECT_KEYS keys (*too_many). */
static const char *duplicate_key(const cJSON *x, bool *too_many) {
    if (cJSON_IsObject(x) && cJSON_GetArraySize(x) > MAX_OBJECT_KEYS) {
        *too_many = true;
        return x->string ? x->string : "(the spec)";
    }
    if (cJSON_IsObject(x))
        for (const cJSON *a = x->child; a; a = a->next)
            for (const cJSON *b = a->next; b; b = b->next)
                if (!strcmp(a->string, b->string)) return a->string;
    for (const cJSON *c = x->child; c; c = c->next) {
        const char *d = duplicate_key(c, too_many);
        if (d) return d;
    }
    return NULL;
}

static bool int_in(const cJSON *x, int lo, int hi, int *out) {
    /* range first: converting a double out of int's range is undefined */
    if (!cJSON_IsNumber(x) || !(x->valuedouble >= lo && x->valuedouble <= hi) ||
        x->valuedouble != (double)(int)x->valuedouble)
        return false;
    *out = (int)x->valuedouble;
    return true;
}

/* ---- parsing ---------------------------------------------------------------------- */

static keel_status parse_lifecycle(const cJSON *lc, int i, const spec_origin *o, keel_cluster_group *out) {
    static const char *const lc_keys[] = {"SourceDir", "OnCreate", NULL};
    const char *bad = "";
    if (!cJSON_IsObject(lc) || !only_keys(lc, lc_keys, &bad))
        SPEC_ERR("%s: InstanceGroups[%d] (%s).LifeCycleConfig: want {\"SourceDir\": DIR, \"OnCreate\": SCRIPT}%s%s",
                 o->path, i, out->name, cJSON_IsObject(lc) ? "; unknown key " : "",
                 cJSON_IsObject(lc) ? keel_cluster_show(bad, SHOW).s : "");
    const cJSON *src = cJSON_GetObjectItemCaseSensitive(lc, "SourceDir");
    const cJSON *oc = cJSON_GetObjectItemCaseSensitive(lc, "OnCreate");
    if ((src && (!cJSON_IsString(src) || !src->valuestring[0])) || !cJSON_IsString(oc) || !oc->valuestring[0])
        SPEC_ERR("%s: InstanceGroups[%d] (%s).LifeCycleConfig: OnCreate (a script) is required, SourceDir (a "
                 "directory) optional, both non-empty strings", o->path, i, out->name);
    char key[128];
    snprintf(key, sizeof key, "InstanceGroups[%d] (%s).LifeCycleConfig.SourceDir", i, out->name);
    keel_status st = path_value(o, key, src ? src->valuestring : ".", KEEL_CLUSTER_PATH_MAX, false, NULL,
                                &out->source_dir);
    if (st != KEEL_OK) return st;
    /* OnCreate is relative to SourceDir (or absolute inside it) */
    spec_origin in_source = {o->path, out->source_dir};
    snprintf(key, sizeof key, "InstanceGroups[%d] (%s).LifeCycleConfig.OnCreate", i, out->name);
    if ((st = path_value(&in_source, key, oc->valuestring, KEEL_CLUSTER_PATH_MAX, false,
                         "name a script inside SourceDir, e.g. \"on_create.sh\"", &out->on_create)) != KEEL_OK)
        return st;
    if (!under(out->on_create, out->source_dir) || !strcmp(out->on_create, out->source_dir))
        SPEC_ERR("%s: %s: %s is not a file in SourceDir %s; name a script inside SourceDir", o->path, key,
                 out->on_create, out->source_dir);
    return KEEL_OK;
}

static keel_status parse_group(const cJSON *g, int i, const spec_origin *o, keel_cluster_group *out) {
    static const char *const keys[] = {"InstanceGroupName", "Role", "InstanceCount", "LifeCycleConfig", "Cpus",
                                       "MemoryMiB", "Gpus", NULL};
    const char *bad = "";
    const char *path = o->path;
    if (!cJSON_IsObject(g)) SPEC_ERR("%s: InstanceGroups[%d]: not an object", path, i);
    if (!only_keys(g, keys, &bad))
        SPEC_ERR("%s: InstanceGroups[%d]: unknown key '%s' (an instance group has InstanceGroupName, Role, "
                 "InstanceCount, LifeCycleConfig, Cpus, MemoryMiB, Gpus)", path, i, keel_cluster_show(bad, SHOW).s);
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(g, "InstanceGroupName");
    if (!cJSON_IsString(x) || !good_name(x->valuestring, 16))
        SPEC_ERR("%s: InstanceGroups[%d].InstanceGroupName: '%s' is not a name; want lower-case letters, digits and "
                 "'-' (at most 16, a letter first)",
                 path, i, cJSON_IsString(x) ? keel_cluster_show(x->valuestring, SHOW).s : "");
    memcpy(out->name, x->valuestring, strlen(x->valuestring) + 1); /* at most 16 + 1 of name[24] */
    x = cJSON_GetObjectItemCaseSensitive(g, "Role");
    const char *role = cJSON_IsString(x) ? x->valuestring : "";
    if (!strcmp(role, "controller")) out->role = KEEL_ROLE_CONTROLLER;
    else if (!strcmp(role, "login")) out->role = KEEL_ROLE_LOGIN;
    else if (!strcmp(role, "worker")) out->role = KEEL_ROLE_WORKER;
    else SPEC_ERR("%s: InstanceGroups[%d] (%s).Role: want \"controller\", \"login\" or \"worker\", not '%s'", path,
                  i, out->name, keel_cluster_show(role, SHOW).s);
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
    return lc ? parse_lifecycle(lc, i, o, out) : KEEL_OK;
}

static keel_status parse_subnet(const cJSON *x, const char *path, int nodes, keel_cluster_spec *s) {
    const char *v = cJSON_IsString(x) ? x->valuestring : "";
    char text[24]; /* "255.255.255.255/32" and its NUL; longer is refused, never cut */
    size_t n = strlen(v);
    bool chars = n > 0 && n < sizeof text && strspn(v, "0123456789./") == n;
    struct in_addr a;
    int prefix = -1;
    if (chars) {
        memcpy(text, v, n + 1);
        char *slash = strchr(text, '/');
        if (slash) {
            *slash = 0;
            char *end;
            long p = strtol(slash + 1, &end, 10);
            prefix = slash[1] == 0 || *end || p < 16 || p > 29 ? -1 : (int)p;
        }
    }
    if (prefix < 0 || inet_pton(AF_INET, text, &a) != 1)
        SPEC_ERR("%s: Subnet: '%s' is not an IPv4 subnet A.B.C.D/P with P 16..29; write one like \"10.213.0.0/24\"",
                 path, keel_cluster_show(v, SHOW).s);
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

/* [A-Za-z0-9_], 1..64: keel health's keys; its parser prints a bad one back */
static bool ident_ok(const char *k) {
    size_t n = strlen(k);
    return n >= 1 && n <= 64 && strspn(k, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") == n;
}

static const char *bad_ident_key(const cJSON *x) {
    for (const cJSON *c = x->child; c; c = c->next) {
        if (cJSON_IsObject(x) && !ident_ok(c->string)) return c->string;
        const char *d = bad_ident_key(c);
        if (d) return d;
    }
    return NULL;
}

/* HealthCheck: names and the dir held to the grammar here (the dir cleaned),
 * then the whole checked with keel health's own parser; s->health its JSON. */
static keel_status parse_health(const cJSON *x, const spec_origin *o, keel_cluster_spec *s) {
    const char *path = o->path;
    cJSON *h;
    if (x) {
        const char *bad = bad_ident_key(x);
        if (bad)
            SPEC_ERR("%s: HealthCheck: key '%s' is not a name of letters, digits and '_' (a node config has checks, "
                     "dir, gemm_floor_gflops, memory_floor_gib, gpu)", path, keel_cluster_show(bad, SHOW).s);
        h = cJSON_Duplicate(x, true);
        const cJSON *checks = cJSON_GetObjectItemCaseSensitive(h, "checks"), *c;
        const cJSON *list = cJSON_IsArray(checks) ? checks : NULL;
        int n = 0;
        cJSON_ArrayForEach(c, list) {
            bool too_many = ++n > 16, bad_name = cJSON_IsString(c) && !ident_ok(c->valuestring);
            if (too_many)
                keel_errorf("%s: HealthCheck.checks: more than 16 names; name each check once (gemm, memory, "
                            "checkpoint_dir, gpu)", path);
            else if (bad_name)
                keel_errorf("%s: HealthCheck.checks: '%s' is not a check name; want gemm, memory, checkpoint_dir or "
                            "gpu", path, keel_cluster_show(c->valuestring, SHOW).s);
            if (too_many || bad_name) {
                cJSON_Delete(h);
                return KEEL_ERR_INPUT;
            }
        }
        const cJSON *dir = cJSON_GetObjectItemCaseSensitive(h, "dir");
        if (cJSON_IsString(dir)) {
            char *clean;
            spec_origin absolute = {path, NULL}; /* keel health runs elsewhere: no relative dir */
            if (path_value(&absolute, "HealthCheck.dir", dir->valuestring, KEEL_CLUSTER_PATH_MAX, false,
                           "write the node-local directory to check as an absolute path of A-Z a-z 0-9 . _ - and /",
                           &clean) != KEEL_OK) {
                cJSON_Delete(h);
                return KEEL_ERR_INPUT;
            }
            cJSON_ReplaceItemInObjectCaseSensitive(h, "dir", cJSON_CreateString(clean));
            keel_free(clean);
        }
    } else {
        h = cJSON_CreateObject();
        cJSON_AddItemToObject(h, "checks", cJSON_CreateStringArray((const char *[]){"checkpoint_dir"}, 1));
        cJSON_AddStringToObject(h, "dir", s->shared_dir);
    }
    s->health = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    keel_strbuf origin = {0};
    keel_strbuf_printf(&origin, "%s: HealthCheck", path);
    keel_node_config nc;
    keel_status st = keel_node_config_parse(s->health, origin.s, &nc);
    keel_free(nc.dir);
    if (st == KEEL_OK && (nc.checks & (1u << KEEL_CHECK_MPI))) {
        keel_errorf("%s: checks: the mpi check needs a job's ranks; a node's health program runs the node-local "
                    "checks (gemm, memory, checkpoint_dir, gpu)", origin.s);
        st = KEEL_ERR_INPUT;
    }
    keel_free(origin.s);
    return st;
}

/* The nodes: controller, login, workers; each group's in order, named GROUP1, GROUP2, ... */
static keel_status make_nodes(const char *path, int nodes, keel_cluster_spec *s) {
    s->nodes = keel_xcalloc((size_t)nodes * sizeof *s->nodes, "cluster nodes");
    for (int role = KEEL_ROLE_CONTROLLER; role <= KEEL_ROLE_WORKER; role++)
        for (int k = 0; k < s->ngroups; k++) {
            if ((int)s->groups[k].role != role) continue;
            for (int i = 1; i <= s->groups[k].count; i++) {
                keel_cluster_node *nd = &s->nodes[s->nnodes++];
                int len = snprintf(nd->name, sizeof nd->name, "%s%d", s->groups[k].name, i);
                KEEL_CHECK(len > 0 && (size_t)len < sizeof nd->name, "node name %s%d", s->groups[k].name, i);
                nd->group = k;
                for (int m = 0; m < s->nnodes - 1; m++)
                    if (!strcmp(s->nodes[m].name, nd->name))
                        SPEC_ERR("%s: InstanceGroups: two nodes would be named %s (groups %s and %s); rename one "
                                 "group", path, nd->name, s->groups[s->nodes[m].group].name, s->groups[k].name);
            }
        }
    return KEEL_OK;
}

static keel_status parse_groups(const cJSON *groups, const spec_origin *o, keel_cluster_spec *s) {
    const char *path = o->path;
    int n = cJSON_IsArray(groups) ? cJSON_GetArraySize(groups) : 0;
    if (n == 0 || n > MAX_NODES)
        SPEC_ERR("%s: InstanceGroups: want a list of 1..%d instance groups (a controller and workers at least)", path,
                 MAX_NODES);
    s->groups = keel_xcalloc((size_t)n * sizeof *s->groups, "cluster groups");
    int counts[3] = {0, 0, 0}, nodes = 0;
    const cJSON *g;
    keel_status st;
    cJSON_ArrayForEach(g, groups) {
        keel_cluster_group *grp = &s->groups[s->ngroups];
        s->ngroups++; /* freed with the spec even when it fails here */
        if ((st = parse_group(g, s->ngroups - 1, o, grp)) != KEEL_OK) return st;
        for (int k = 0; k < s->ngroups - 1; k++)
            if (!strcmp(s->groups[k].name, grp->name))
                SPEC_ERR("%s: InstanceGroups[%d].InstanceGroupName: '%s' twice; name each group once", path,
                         s->ngroups - 1, grp->name);
        counts[grp->role] += grp->count;
        nodes += grp->count;
    }
    if (counts[KEEL_ROLE_CONTROLLER] != 1 || counts[KEEL_ROLE_WORKER] == 0 || nodes > MAX_NODES)
        SPEC_ERR("%s: InstanceGroups: %s", path,
                 counts[KEEL_ROLE_CONTROLLER] == 0 ? "no group with Role \"controller\"; a cluster needs one"
                 : counts[KEEL_ROLE_CONTROLLER] > 1 ? "more than one controller group; a cluster has one"
                 : counts[KEEL_ROLE_WORKER] == 0   ? "no worker nodes; a cluster needs at least one"
                                                   : "more than 250 nodes");
    return make_nodes(path, nodes, s);
}

/* StateDir, SharedDir, Partition, AutoResumePlugin: the grammar, defaults, and where each may lie. */
static keel_status parse_places(const cJSON *j, const spec_origin *o, keel_cluster_spec *s) {
    const char *path = o->path;
    const cJSON *x;
    static const char *const strings[] = {"StateDir", "SharedDir", "Partition", "AutoResumePlugin"};
    for (int k = 0; k < 4; k++)
        if ((x = cJSON_GetObjectItemCaseSensitive(j, strings[k])) && (!cJSON_IsString(x) || !x->valuestring[0]))
            SPEC_ERR("%s: %s: want a non-empty string", path, strings[k]);
    keel_status st;
    x = cJSON_GetObjectItemCaseSensitive(j, "StateDir");
    if (x) {
        if ((st = path_value(o, "StateDir", x->valuestring, KEEL_CLUSTER_STATE_DIR_MAX, true,
                             "StateDir holds the munge socket (StateDir/munge/munge.sock, at most 108 bytes): write "
                             "an absolute path of at most 80 bytes of A-Z a-z 0-9 . _ - and /, without '..', e.g. "
                             "/var/lib/keel/cluster/NAME", &s->state_dir)) != KEEL_OK)
            return st;
    } else {
        s->state_dir = keel_path_join("/var/lib/keel/cluster", s->name); /* 22 + 1 + at most 32 bytes */
    }
    x = cJSON_GetObjectItemCaseSensitive(j, "SharedDir");
    if (x) {
        if ((st = path_value(o, "SharedDir", x->valuestring, KEEL_CLUSTER_PATH_MAX, true, NULL, &s->shared_dir)) !=
            KEEL_OK)
            return st;
    } else {
        s->shared_dir = keel_path_join(s->state_dir, "fsx");
    }
    x = cJSON_GetObjectItemCaseSensitive(j, "Partition");
    const char *partition = x ? x->valuestring : "dev";
    if (!good_name(partition, 32))
        SPEC_ERR("%s: Partition: '%s' is not a name of lower-case letters, digits and '-' (at most 32, a letter "
                 "first)", path, keel_cluster_show(partition, SHOW).s);
    s->partition = keel_xstrdup(partition);
    /* up copies the plugin into StateDir: it may lie anywhere on this machine */
    x = cJSON_GetObjectItemCaseSensitive(j, "AutoResumePlugin");
    if (x && (st = path_value(o, "AutoResumePlugin", x->valuestring, KEEL_CLUSTER_PATH_MAX, false, NULL,
                              &s->plugin)) != KEEL_OK)
        return st;
    /* up copies each SourceDir into StateDir/lifecycle: a SourceDir holding StateDir would copy into itself */
    for (int k = 0; k < s->ngroups; k++)
        if (s->groups[k].source_dir && under(s->state_dir, s->groups[k].source_dir))
            SPEC_ERR("%s: InstanceGroups[%d] (%s).LifeCycleConfig.SourceDir: %s holds StateDir %s, which up copies "
                     "SourceDir into; keep the lifecycle scripts in a directory of their own", path, k,
                     s->groups[k].name, s->groups[k].source_dir, s->state_dir);
    return KEEL_OK;
}

static keel_status parse_spec(const cJSON *j, const spec_origin *o, keel_cluster_spec *s) {
    static const char *const keys[] = {"ClusterName", "InstanceGroups", "StateDir", "SharedDir", "Subnet",
                                       "Partition", "HealthCheck", "HealthTimeoutS", "AutoResumePlugin", NULL};
    const char *path = o->path, *bad = "";
    if (!cJSON_IsObject(j))
        SPEC_ERR("%s: not a JSON object (a cluster spec: {\"ClusterName\": ..., \"InstanceGroups\": [...]})", path);
    bool too_many = false;
    const char *dup = duplicate_key(j, &too_many);
    if (dup && too_many)
        SPEC_ERR("%s: %s: more than %d keys in one object; a spec is a short list of settings", path,
                 keel_cluster_show(dup, SHOW).s, MAX_OBJECT_KEYS);
    if (dup)
        SPEC_ERR("%s: key '%s' appears twice in one object; say each setting once", path,
                 keel_cluster_show(dup, SHOW).s);
    if (!only_keys(j, keys, &bad))
        SPEC_ERR("%s: unknown key '%s' (a cluster spec has ClusterName, InstanceGroups, StateDir, SharedDir, "
                 "Subnet, Partition, HealthCheck, HealthTimeoutS, AutoResumePlugin)",
                 path, keel_cluster_show(bad, SHOW).s);
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, "ClusterName");
    if (!cJSON_IsString(x) || !good_name(x->valuestring, 32))
        SPEC_ERR("%s: ClusterName: '%s' is not a name; want lower-case letters, digits and '-' (at most 32, a letter "
                 "first)", path, cJSON_IsString(x) ? keel_cluster_show(x->valuestring, SHOW).s : "");
    memcpy(s->name, x->valuestring, strlen(x->valuestring) + 1); /* at most 32 + 1 of name[33] */
    keel_status st;
    if ((st = parse_groups(cJSON_GetObjectItemCaseSensitive(j, "InstanceGroups"), o, s)) != KEEL_OK) return st;
    x = cJSON_GetObjectItemCaseSensitive(j, "Subnet");
    cJSON *dflt = cJSON_CreateString("10.213.0.0/24");
    st = parse_subnet(x ? x : dflt, path, s->nnodes, s);
    cJSON_Delete(dflt);
    if (st != KEEL_OK) return st;
    for (int i = 0; i < s->nnodes; i++) {
        struct in_addr a = {.s_addr = htonl(s->subnet + 2 + (uint32_t)i)}; /* .1 is the bridge */
        inet_ntop(AF_INET, &a, s->nodes[i].addr, sizeof s->nodes[i].addr);
    }
    if ((st = parse_places(j, o, s)) != KEEL_OK) return st;
    s->health_timeout_s = 120;
    if ((x = cJSON_GetObjectItemCaseSensitive(j, "HealthTimeoutS")) && !int_in(x, 1, 3600, &s->health_timeout_s))
        SPEC_ERR("%s: HealthTimeoutS: want a whole number of seconds 1..3600", path);
    return parse_health(cJSON_GetObjectItemCaseSensitive(j, "HealthCheck"), o, s);
}

keel_status keel_cluster_spec_parse(const char *text, size_t len, const char *path, const char *base_dir,
                                    keel_cluster_spec *s) {
    *s = (keel_cluster_spec){0};
    keel_cluster_shown shown = keel_cluster_show(path, 160);
    spec_origin o = {shown.s, base_dir};
    if (!text) text = "", len = 0; /* a fuzzer's empty input */
    const char *nul = memchr(text, 0, len);
    if (nul) {
        keel_errorf("%s: a NUL byte at offset %zu; a spec is JSON text", shown.s, (size_t)(nul - text));
        return KEEL_ERR_INPUT;
    }
    if (len > MAX_SPEC_BYTES) {
        keel_errorf("%s: %zu bytes; a spec is a small JSON file (at most %d bytes)", shown.s, len, MAX_SPEC_BYTES);
        return KEEL_ERR_INPUT;
    }
    if (keel_json_escaped_nul(text, len)) {
        keel_errorf("%s: a string holds \\u0000 (NUL), which would cut its value short; no name or path has one",
                    shown.s);
        return KEEL_ERR_INPUT;
    }
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, false);
    while (end && end < text + len && strchr(" \t\r\n", *end)) end++; /* text is not NUL-ended */
    if (!j || (end && end < text + len)) {
        char near[21] = {0};
        size_t rest = end && end < text + len ? (size_t)(text + len - end) : 0;
        memcpy(near, end ? end : text, rest < 20 ? rest : 20);
        keel_errorf("%s: %s (near '%s')", shown.s, j ? "text after the JSON object" : "not valid JSON",
                    keel_cluster_show(near, 20).s);
        cJSON_Delete(j);
        return KEEL_ERR_INPUT;
    }
    s->path = keel_xstrdup(path);
    keel_status st = parse_spec(j, &o, s);
    cJSON_Delete(j);
    if (st != KEEL_OK) keel_cluster_spec_free(s);
    return st;
}

/* What parsing leaves to the disk: each SourceDir a directory, each OnCreate a file. */
static keel_status check_lifecycle_files(const keel_cluster_spec *s) {
    keel_cluster_shown path = keel_cluster_show(s->path, 160);
    for (int k = 0; k < s->ngroups; k++) {
        const keel_cluster_group *g = &s->groups[k];
        if (!g->on_create) continue;
        struct stat st;
        if (stat(g->source_dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
            keel_errorf("%s: InstanceGroups[%d] (%s).LifeCycleConfig.SourceDir: %s is not a directory; name the "
                        "directory of the group's lifecycle scripts", path.s, k, g->name, g->source_dir);
            return KEEL_ERR_INPUT;
        }
        if (stat(g->on_create, &st) != 0 || !S_ISREG(st.st_mode)) {
            keel_errorf("%s: InstanceGroups[%d] (%s).LifeCycleConfig.OnCreate: %s is not a file in SourceDir; name a "
                        "script inside SourceDir", path.s, k, g->name, g->on_create);
            return KEEL_ERR_INPUT;
        }
    }
    return KEEL_OK;
}

keel_status keel_cluster_spec_load(const char *path, keel_cluster_spec *s) {
    *s = (keel_cluster_spec){0};
    char *text = NULL, *real = NULL;
    size_t len = 0;
    char why[160];
    keel_status st = keel_read_regular(path, MAX_SPEC_BYTES, &text, &len, why, sizeof why);
    if (st != KEEL_OK) {
        keel_errorf("%s: cannot read the spec: %s (a spec is a small JSON file: see docs/slurm.md)",
                    keel_cluster_show(path, 160).s, why);
        return st;
    }
    /* the scripts run elsewhere: relative paths become absolute, against the spec's real directory */
    real = realpath(path, NULL);
    char *base = real ? dirname(real) : NULL;
    st = keel_cluster_spec_parse(text, len, path, base, s);
    if (st == KEEL_OK && (st = check_lifecycle_files(s)) != KEEL_OK) keel_cluster_spec_free(s);
    free(real);
    keel_free(text);
    return st;
}

/* ---- real hosts ------------------------------------------------------------------- */

/* A NodeAddr: an IPv4 address, or a host name of [a-z0-9.-] (at most 63). */
static bool good_addr(const char *v) {
    struct in_addr a;
    size_t n = strlen(v);
    return inet_pton(AF_INET, v, &a) == 1 ||
           (n >= 1 && n <= 63 && strspn(v, "abcdefghijklmnopqrstuvwxyz0123456789.-") == n &&
            isalnum((unsigned char)v[0]));
}

/* One "NAME ADDRESS GROUP" line (comment gone) into the group's next node slot. */
static keel_status hosts_line(keel_cluster_spec *s, const char *path, int lineno, char *line, int *taken) {
    char *field[4] = {0}, *save = NULL;
    int fields = 0;
    for (char *t = strtok_r(line, " \t\r\n", &save); t && fields < 4; t = strtok_r(NULL, " \t\r\n", &save))
        field[fields++] = t;
    if (fields == 0) return KEEL_OK;
    if (fields != 3) SPEC_ERR("%s:%d: want \"NAME ADDRESS GROUP\" (three fields)", path, lineno);
    const char *name = field[0], *addr = field[1], *group = field[2];
    if (!good_name(name, sizeof s->nodes[0].name - 1))
        SPEC_ERR("%s:%d: '%s' is not a host name; want lower-case letters, digits and '-' (at most 63, a letter "
                 "first)", path, lineno, keel_cluster_show(name, SHOW).s);
    if (!good_addr(addr))
        SPEC_ERR("%s:%d: '%s' is not an address; want an IPv4 address or a host name of a-z 0-9 . - (at most 63)",
                 path, lineno, keel_cluster_show(addr, SHOW).s);
    int g = -1;
    for (int k = 0; k < s->ngroups; k++)
        if (!strcmp(s->groups[k].name, group)) g = k;
    if (g < 0)
        SPEC_ERR("%s:%d: no instance group '%s' in %s", path, lineno, keel_cluster_show(group, SHOW).s,
                 keel_cluster_show(s->path, 160).s);
    if (taken[g] == s->groups[g].count)
        SPEC_ERR("%s:%d: more hosts for group %s than its InstanceCount (%d)", path, lineno, group,
                 s->groups[g].count);
    keel_cluster_node *nd = NULL; /* the group's next node slot */
    for (int i = 0, seen = 0; i < s->nnodes && !nd; i++)
        if (s->nodes[i].group == g && seen++ == taken[g]) nd = &s->nodes[i];
    for (int i = 0; i < s->nnodes; i++)
        if (s->nodes[i].name[0] && (!strcmp(s->nodes[i].name, name) || !strcmp(s->nodes[i].addr, addr)))
            SPEC_ERR("%s:%d: host %s or address %s appears twice", path, lineno, name, addr);
    memcpy(nd->name, name, strlen(name) + 1); /* both checked to fit */
    memcpy(nd->addr, addr, strlen(addr) + 1);
    taken[g]++;
    return KEEL_OK;
}

keel_status keel_cluster_hosts_parse(keel_cluster_spec *s, const char *text, size_t len, const char *path) {
    keel_cluster_shown shown = keel_cluster_show(path, 160);
    if (memchr(text, 0, len)) {
        keel_errorf("%s: a NUL byte; a hosts file is text (lines \"NAME ADDRESS GROUP\")", shown.s);
        return KEEL_ERR_INPUT;
    }
    int *taken = keel_xcalloc((size_t)s->ngroups * sizeof *taken, "hosts");
    for (int i = 0; i < s->nnodes; i++) s->nodes[i].name[0] = s->nodes[i].addr[0] = 0; /* the file's, not ours */
    char *copy = keel_xmalloc(len + 1, "hosts");
    memcpy(copy, text, len);
    copy[len] = 0;
    keel_status st = KEEL_OK;
    int lineno = 0;
    for (char *line = copy, *next; st == KEEL_OK && line < copy + len; line = next) {
        lineno++;
        next = line + strcspn(line, "\n");
        if (*next) *next++ = 0;
        line[strcspn(line, "#")] = 0;
        st = hosts_line(s, shown.s, lineno, line, taken);
    }
    keel_free(copy);
    for (int k = 0; k < s->ngroups && st == KEEL_OK; k++)
        if (taken[k] != s->groups[k].count) {
            keel_errorf("%s: group %s has %d hosts, its InstanceCount is %d", shown.s, s->groups[k].name, taken[k],
                        s->groups[k].count);
            st = KEEL_ERR_INPUT;
        }
    keel_free(taken);
    return st;
}

keel_status keel_cluster_hosts_load(keel_cluster_spec *s, const char *path) {
    char *text = NULL, why[160];
    size_t len = 0;
    keel_status st = keel_read_regular(path, MAX_SPEC_BYTES, &text, &len, why, sizeof why);
    if (st != KEEL_OK) {
        keel_errorf("%s: cannot read the hosts file (lines \"NAME ADDRESS GROUP\"): %s", keel_cluster_show(path, 160).s,
                    why);
        return st;
    }
    st = keel_cluster_hosts_parse(s, text, len, path);
    keel_free(text);
    return st;
}

/* ---- where keel and the plugin are ---------------------------------------------------- */

char *keel_cluster_keel_path(const keel_cluster_spec *s) { return keel_path_join(s->state_dir, "bin/keel"); }
char *keel_cluster_plugin_path(const keel_cluster_spec *s) {
    return keel_path_join(s->state_dir, "lib/keel/keel_auto_resume.so");
}

keel_status keel_cluster_find_plugin(const keel_cluster_spec *s, const char *keel, char **out) {
    keel_cluster_shown path = keel_cluster_show(s->path, 160);
    *out = NULL;
    if (s->plugin) {
        if (keel_path_exists(s->plugin)) {
            *out = keel_xstrdup(s->plugin);
            return KEEL_OK;
        }
        keel_errorf("%s: AutoResumePlugin: %s does not exist (build it: make keel; or install it)", path.s, s->plugin);
        return KEEL_ERR_INPUT;
    }
    char *copy = keel_xstrdup(keel);
    const char *dir = dirname(copy);
    /* a build directory (build/keel, build/plugins/) or an install (bin/keel, lib/keel/) */
    char *p = keel_path_join(dir, "plugins/keel_auto_resume.so");
    if (!keel_path_exists(p)) {
        keel_free(p);
        p = keel_path_join(dir, "../lib/keel/keel_auto_resume.so");
    }
    keel_free(copy);
    if (keel_path_exists(p)) {
        *out = p;
        return KEEL_OK;
    }
    keel_free(p);
    keel_errorf("%s: no keel_auto_resume.so beside %s (plugins/ or ../lib/keel/): build it (make keel) or set "
                "AutoResumePlugin", path.s, keel_cluster_show(keel, 160).s);
    return KEEL_ERR_INPUT;
}

char *keel_cluster_env_text(const keel_cluster_spec *s) {
    char *conf = keel_path_join(s->state_dir, "slurm.conf"), *keel = keel_cluster_keel_path(s);
    const char *names[] = {"SLURM_CONF", "KEEL_CLUSTER_SHARED", "KEEL_CLUSTER_KEEL"};
    const char *values[] = {conf, s->shared_dir, keel};
    keel_strbuf b = {0};
    bool ok = true;
    for (int k = 0; k < 3 && ok; k++) {
        keel_strbuf_printf(&b, "export %s=", names[k]);
        if ((ok = keel_cluster_sh_quote(&b, values[k]))) keel_strbuf_printf(&b, "\n");
        else keel_errorf("%s: %s: '%s' has a control character; it cannot be an exported value",
                         keel_cluster_show(s->path, 160).s, names[k], keel_cluster_show(values[k], SHOW).s);
    }
    keel_free(conf);
    keel_free(keel);
    if (!ok) {
        keel_free(b.s);
        return NULL;
    }
    return b.s;
}

/* ---- Slurm's files ------------------------------------------------------------------------ */

/* A path that goes into Slurm's files and a shell line, cleaned into *out;
 * for real hosts (!local) not under a directory each host has its own of. */
static keel_status files_path(const char *what, const char *v, bool local, char **out) {
    char why[1600];
    *out = v[0] == '/' ? clean_path(NULL, v, KEEL_CLUSTER_PATH_MAX, why, sizeof why) : NULL;
    if (v[0] != '/') snprintf(why, sizeof why, "is relative; Slurm's files need absolute paths");
    if (!*out) {
        keel_errorf("keel cluster: %s '%s' %s; give an absolute path of A-Z a-z 0-9 . _ - and /, without '..'", what,
                    keel_cluster_show(v, SHOW).s, why);
        return KEEL_ERR_INPUT;
    }
    for (const char *const *d = per_node_dirs; !local && *d; d++)
        if (under(*out, *d)) {
            keel_errorf("keel cluster: %s %s is under %s, which every host has its own of: install keel where every "
                        "host has it at the same path (cmake --install build puts keel in /usr/local/bin and the "
                        "plugin in /usr/local/lib/keel)", what, *out, *d);
            keel_free(*out);
            *out = NULL;
            return KEEL_ERR_INPUT;
        }
    return KEEL_OK;
}

char *keel_cluster_slurm_conf(const keel_cluster_spec *s, const keel_cluster_files *f) {
    keel_strbuf b = {0};
    const keel_cluster_node *ctl = &s->nodes[0];
    /* the spec's path as typed may hold anything: shown escaped, a comment of one line */
    keel_strbuf_printf(&b, "# slurm.conf of cluster %s, written by keel cluster from %s\n", s->name,
                       keel_cluster_show(s->path, 160).s);
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

/* keel-health.sh: Slurm's Epilog takes no arguments; srun --auto-resume runs the same program.
 * Every path single-quoted (keel_cluster_sh_quote): the script runs as root after every job. */
static char *health_script(const keel_cluster_files *f) {
    char *conf = keel_path_join(f->conf_dir, "slurm.conf"), *node = keel_path_join(f->conf_dir, "keel-node.json");
    keel_strbuf b = {0};
    keel_strbuf_printf(&b, "#!/bin/sh\n# keel cluster: this node's health checks; a failing node is drained\n"
                           "[ -n \"${SLURM_CONF:-}\" ] || SLURM_CONF=");
    bool ok = keel_cluster_sh_quote(&b, conf);
    keel_strbuf_printf(&b, "\nexport SLURM_CONF\nexec ");
    ok &= keel_cluster_sh_quote(&b, f->keel);
    keel_strbuf_printf(&b, " health --epilog --node-config ");
    ok &= keel_cluster_sh_quote(&b, node);
    keel_strbuf_printf(&b, "\n");
    KEEL_CHECK(ok, "keel-health.sh: a path with a control character passed files_path");
    keel_free(conf);
    keel_free(node);
    return b.s;
}

keel_status keel_cluster_write_files(const keel_cluster_spec *s, const keel_cluster_files *given, const char *dir,
                                     bool replace) {
    enum { SLURM, PLUGSTACK, CGROUP, GRES, NODE, HEALTH, NFILES };
    static const char *const names[NFILES] = {"slurm.conf", "plugstack.conf", "cgroup.conf",
                                              "gres.conf",  "keel-node.json", "keel-health.sh"};
    /* Slurm's files cannot quote: every path in them is held to the grammar, cleaned */
    char *conf_dir = NULL, *keel = NULL, *plugin = NULL;
    keel_status st = files_path("--conf-dir", given->conf_dir, given->local, &conf_dir);
    if (st == KEEL_OK) st = files_path("--keel", given->keel, given->local, &keel);
    if (st == KEEL_OK) st = files_path("AutoResumePlugin", given->plugin, given->local, &plugin);
    if (st != KEEL_OK) {
        keel_free(conf_dir);
        keel_free(keel);
        return st;
    }
    keel_cluster_files f = {.local = given->local, .conf_dir = conf_dir, .keel = keel, .plugin = plugin};
    char *text[NFILES] = {0};
    text[SLURM] = keel_cluster_slurm_conf(s, &f);
    keel_strbuf b = {0};
    keel_strbuf_printf(&b, "required %s health=%s/keel-health.sh health_timeout=%d\n", f.plugin, f.conf_dir,
                       s->health_timeout_s);
    text[PLUGSTACK] = b.s;
    b = (keel_strbuf){0};
    keel_strbuf_printf(&b, "CgroupPlugin=autodetect\nConstrainCores=yes\nConstrainRAMSpace=yes\n%s",
                       f.local ? "# unused by this machine's cluster (proctrack/linuxproc, task/none)\n" : "");
    text[CGROUP] = b.s;
    bool gpus = false;
    for (int k = 0; k < s->ngroups; k++) gpus |= s->groups[k].gpus > 0;
    if (gpus) {
        b = (keel_strbuf){0};
        keel_strbuf_printf(&b, "AutoDetect=nvml\n");
        text[GRES] = b.s;
    }
    text[NODE] = keel_xstrdup(s->health); /* cJSON's output: JSON-escaped */
    text[HEALTH] = health_script(&f);
    for (int i = 0; i < NFILES && !replace; i++) {
        char *p = keel_path_join(dir, names[i]);
        if (text[i] && keel_path_exists(p)) {
            keel_errorf("%s exists; keel cluster slurm-conf never overwrites (move it away, or pick another --out)",
                        keel_cluster_show(p, 160).s);
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
    for (int i = 0; i < NFILES; i++) keel_free(text[i]);
    keel_free(conf_dir);
    keel_free(keel);
    keel_free(plugin);
    return st;
}
