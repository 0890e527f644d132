/* k8s/spec.c: a `keel k8s manifest` spec (keel/k8s.h) — parsed strictly
 * (known keys only, each once, each of its type and range), every value
 * held to the grammar of the Kubernetes field it becomes, every error one
 * line naming the file, the key, the value and the fix. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k8s/spec.h"
#include "keel/k8s.h"

#define MAX_NODES 1000
#define MAX_NPROC 64
#define MAX_IMAGE 512
#define MAX_PATH 1024
#define SHOW "%.80s" /* a value as an error line shows it (keel_errorf escapes control bytes) */

#define SPEC_ERR(...)                                                                                              \
    do {                                                                                                           \
        keel_errorf(__VA_ARGS__);                                                                                  \
        return KEEL_ERR_INPUT;                                                                                     \
    } while (0)

void keel_k8s_spec_free(keel_k8s_spec *s) {
    keel_free(s->path);
    keel_free(s->image);
    keel_free(s->checkpoint_mount);
    keel_free(s->config);
    keel_free(s->etcd_image);
    *s = (keel_k8s_spec){0};
}

/* ---- the grammars ------------------------------------------------------------- */

static bool lower_alnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

/* A DNS-1123 label: [a-z0-9]([-a-z0-9]*[a-z0-9])?, at most max; letter_first makes it DNS-1035. */
static bool dns_label(const char *v, size_t n, size_t max, bool letter_first) {
    if (n == 0 || n > max || !lower_alnum(v[0]) || !lower_alnum(v[n - 1])) return false;
    if (letter_first && !(v[0] >= 'a' && v[0] <= 'z')) return false;
    for (size_t i = 0; i < n; i++)
        if (!lower_alnum(v[i]) && v[i] != '-') return false;
    return true;
}

/* A DNS-1123 subdomain (a PersistentVolumeClaim's name): labels joined by '.', at most 253. */
static bool dns_subdomain(const char *v) {
    size_t n = strlen(v);
    if (n == 0 || n > KEEL_K8S_CLAIM_MAX) return false;
    for (const char *c = v;;) {
        size_t len = strcspn(c, ".");
        if (!dns_label(c, len, 63, false)) return false;
        if (!c[len]) return true;
        c += len + 1;
    }
}

bool keel_k8s_dns1123_label(const char *v) { return dns_label(v, strlen(v), KEEL_K8S_NAME_MAX, false); }
bool keel_k8s_dns1035_label(const char *v) { return dns_label(v, strlen(v), KEEL_K8S_NAME_MAX, true); }
bool keel_k8s_dns1123_subdomain(const char *v) { return dns_subdomain(v); }

/* An image reference's characters ([registry/]repo[:tag][@digest]): no blank, quote or control. */
static bool image_ok(const char *v) {
    size_t n = strlen(v);
    return n > 0 && n <= MAX_IMAGE &&
           strspn(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-/:@+") == n &&
           v[0] != '-' && v[0] != ':' && v[0] != '@' && v[0] != '/';
}

/* An absolute path of A-Z a-z 0-9 . _ - and '/', no '.' or '..' component, not "/". */
static bool path_ok(const char *v) {
    size_t n = strlen(v);
    if (n < 2 || n > MAX_PATH || v[0] != '/' ||
        strspn(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-/") != n)
        return false;
    for (const char *c = v; *c;) {
        while (*c == '/') c++;
        size_t len = strcspn(c, "/");
        if ((len == 1 && c[0] == '.') || (len == 2 && c[0] == '.' && c[1] == '.')) return false;
        c += len;
    }
    return true;
}

static bool under(const char *path, const char *dir) {
    size_t n = strlen(dir);
    return !strncmp(path, dir, n) && (path[n] == '/' || !path[n]);
}

/* ---- reading keys --------------------------------------------------------------- */

typedef struct {
    const char *path;          /* the spec, as error lines name it */
    const cJSON *obj;          /* the object being read */
    const char *at;            /* its key path: "" or "elastic." */
    const k8s_origin *origins; /* where keys came from (a .env file's lines), or NULL */
} reader;

typedef struct {
    char s[1200];
} label;

/* How an error line names key: "PATH: KEY", or for a key a .env file's
 * variable gives, "PATH:LINE: VARIABLE (KEY)" (no line when it is absent). */
static label where(const reader *r, const char *key) {
    label l;
    char full[64];
    snprintf(full, sizeof full, "%s%s", r->at, key);
    for (const k8s_origin *o = r->origins; o && o->key; o++) {
        if (strcmp(o->key, full)) continue;
        if (o->line) snprintf(l.s, sizeof l.s, "%.1000s:%d: %s (%s)", r->path, o->line, o->var, full);
        else snprintf(l.s, sizeof l.s, "%.1000s: %s (%s)", r->path, o->var, full);
        return l;
    }
    snprintf(l.s, sizeof l.s, "%.1000s: %s", r->path, full);
    return l;
}

static const char *type_name(const cJSON *x) {
    return cJSON_IsString(x) ? "a string" : cJSON_IsNumber(x) ? "a number" : cJSON_IsBool(x) ? "true/false"
           : cJSON_IsObject(x) ? "an object" : cJSON_IsArray(x) ? "a list" : "null";
}

/* key's whole number in [lo, hi], or dflt when absent; required: absence is an error. */
static keel_status int_key(const reader *r, const char *key, int64_t lo, int64_t hi, int dflt, bool required,
                           const char *fix, int *out) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(r->obj, key);
    if (!x) {
        if (required) SPEC_ERR("%s: missing; %s", where(r, key).s, fix);
        *out = dflt;
        return KEEL_OK;
    }
    int64_t v;
    if (!cJSON_IsNumber(x))
        SPEC_ERR("%s: want a whole number %lld..%lld, not %s", where(r, key).s, (long long)lo, (long long)hi,
                 type_name(x));
    if (!keel_json_int(x, lo, hi, &v))
        SPEC_ERR("%s: %g is not a whole number %lld..%lld; %s", where(r, key).s, x->valuedouble, (long long)lo,
                 (long long)hi, fix);
    *out = (int)v;
    return KEEL_OK;
}

/* key's string (NULL when absent and not required). */
static keel_status str_key(const reader *r, const char *key, bool required, const char *fix, const char **out) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(r->obj, key);
    *out = NULL;
    if (!x) {
        if (required) SPEC_ERR("%s: missing; %s", where(r, key).s, fix);
        return KEEL_OK;
    }
    if (!cJSON_IsString(x)) SPEC_ERR("%s: want a string, not %s; %s", where(r, key).s, type_name(x), fix);
    *out = x->valuestring;
    return KEEL_OK;
}

/* Only these keys, each once; the error names the first other (a misspelling) or the repeat. */
static keel_status known_keys(const reader *r, const char *const *keys, const char *list) {
    for (const cJSON *x = r->obj->child; x; x = x->next) {
        bool known = false;
        for (const char *const *k = keys; *k && !known; k++) known = !strcmp(x->string, *k);
        if (!known) SPEC_ERR("%s: %s" SHOW ": unknown key (a spec%s has %s; see docs/kubernetes.md)", r->path, r->at,
                             x->string, r->at[0] ? "'s elastic" : "", list);
        for (const cJSON *y = x->next; y; y = y->next)
            if (!strcmp(x->string, y->string))
                SPEC_ERR("%s: %s%s: appears twice; say each setting once", r->path, r->at, x->string);
    }
    return KEEL_OK;
}

/* ---- the spec's parts ----------------------------------------------------------- */

static keel_status parse_names(const reader *r, keel_k8s_spec *s) {
    const char *v;
    keel_status st;
    const char *fix = "want a DNS-1035 label: lower-case letters, digits and '-', a letter first, at most 63";
    if ((st = str_key(r, "name", true, fix, &v)) != KEEL_OK) return st;
    if (!dns_label(v, strlen(v), KEEL_K8S_NAME_MAX, true))
        SPEC_ERR("%s: '" SHOW "' is not a DNS-1035 label; %s (e.g. \"llama-fsdp\")", where(r, "name").s, v,
                 "write lower-case letters, digits and '-', a letter first and a letter or digit last");
    memcpy(s->name, v, strlen(v) + 1);
    if ((st = str_key(r, "namespace", false, "want a DNS-1123 label, e.g. \"training\"", &v)) != KEEL_OK) return st;
    if (v && !dns_label(v, strlen(v), KEEL_K8S_NAME_MAX, false))
        SPEC_ERR("%s: '" SHOW "' is not a DNS-1123 label; write lower-case letters, digits and '-' (at most 63, a "
                 "letter or digit at each end)", where(r, "namespace").s, v);
    if (v) memcpy(s->ns, v, strlen(v) + 1);
    const char *kind;
    if ((st = str_key(r, "kind", false, "want \"PyTorchJob\" or \"MPIJob\"", &kind)) != KEEL_OK) return st;
    if (!kind || !strcmp(kind, "PyTorchJob")) s->kind = KEEL_K8S_PYTORCHJOB;
    else if (!strcmp(kind, "MPIJob")) s->kind = KEEL_K8S_MPIJOB;
    else SPEC_ERR("%s: '" SHOW "' is not a kind keel renders; want \"PyTorchJob\" or \"MPIJob\"", where(r, "kind").s,
                  kind);
    if ((st = str_key(r, "image", true, "name keel's container image, e.g. \"registry.example.com/keel:1.0\"",
                      &v)) != KEEL_OK)
        return st;
    if (!image_ok(v))
        SPEC_ERR("%s: '" SHOW "' is not an image reference; write [registry/]repository[:tag][@digest] of letters, "
                 "digits and . _ - / : @ +", where(r, "image").s, v);
    s->image = keel_xstrdup(v);
    return KEEL_OK;
}

static keel_status parse_elastic(const reader *top, keel_k8s_spec *s) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(top->obj, "elastic");
    if (!e) return KEEL_OK;
    if (!cJSON_IsObject(e))
        SPEC_ERR("%s: want an object {\"minNodes\": N, \"maxNodes\": M, \"maxRestarts\": R}, not %s",
                 where(top, "elastic").s, type_name(e));
    if (s->kind == KEEL_K8S_MPIJOB)
        SPEC_ERR("%s: an MPIJob has a fixed number of workers; remove elastic, or use \"kind\": \"PyTorchJob\" for "
                 "an elastic job", where(top, "elastic").s);
    static const char *const keys[] = {"minNodes", "maxNodes", "maxRestarts", NULL};
    reader r = {top->path, e, "elastic.", top->origins};
    keel_status st;
    if ((st = known_keys(&r, keys, "minNodes, maxNodes, maxRestarts")) != KEEL_OK) return st;
    const char *fix = "the number of pods the job may run on";
    if ((st = int_key(&r, "minNodes", 1, MAX_NODES, 0, true, fix, &s->min_nodes)) != KEEL_OK ||
        (st = int_key(&r, "maxNodes", 1, MAX_NODES, 0, true, fix, &s->max_nodes)) != KEEL_OK ||
        (st = int_key(&r, "maxRestarts", 0, 1000, 3, false, "how often the job may re-form", &s->max_restarts)) !=
            KEEL_OK)
        return st;
    if (s->min_nodes > s->max_nodes)
        SPEC_ERR("%s: %d is more than elastic.maxNodes %d; make minNodes <= maxNodes", where(&r, "minNodes").s,
                 s->min_nodes, s->max_nodes);
    s->elastic = true;
    return KEEL_OK;
}

static keel_status parse_shape(const reader *r, keel_k8s_spec *s) {
    keel_status st;
    if ((st = parse_elastic(r, s)) != KEEL_OK) return st;
    int dflt_nodes = s->elastic ? s->max_nodes : 0;
    if ((st = int_key(r, "nodes", 1, MAX_NODES, dflt_nodes, !s->elastic, "say how many pods run ranks", &s->nodes)) !=
        KEEL_OK)
        return st;
    if (s->elastic && (s->nodes < s->min_nodes || s->nodes > s->max_nodes))
        SPEC_ERR("%s: %d is outside elastic.minNodes..maxNodes (%d..%d); start with a count in that range",
                 where(r, "nodes").s, s->nodes, s->min_nodes, s->max_nodes);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(r->obj, "master");
    if (m && !cJSON_IsBool(m)) SPEC_ERR("%s: want true or false, not %s", where(r, "master").s, type_name(m));
    if (m && s->kind == KEEL_K8S_MPIJOB)
        SPEC_ERR("%s: an MPIJob has a Launcher, not a Master; remove master", where(r, "master").s);
    if (m && cJSON_IsTrue(m) && s->elastic)
        SPEC_ERR("%s: true with elastic: an elastic PyTorchJob has Workers only (the operator's webhook refuses a "
                 "Master beside elasticPolicy's rendezvous); remove master", where(r, "master").s);
    s->master = s->kind == KEEL_K8S_PYTORCHJOB && !s->elastic && (!m || cJSON_IsTrue(m));
    if ((st = int_key(r, "nprocPerNode", 1, MAX_NPROC, 1, false, "ranks per pod", &s->nproc_per_node)) != KEEL_OK ||
        (st = int_key(r, "gpusPerNode", 0, MAX_NPROC, 0, false, "GPUs per pod, one per rank", &s->gpus_per_node)) !=
            KEEL_OK ||
        (st = int_key(r, "efaPerNode", 0, 32, 0, false, "EFA devices per pod", &s->efa_per_node)) != KEEL_OK ||
        (st = int_key(r, "shmSizeGiB", 1, 4096, 16, false, "GiB of /dev/shm for in-memory snapshots",
                      &s->shm_gib)) != KEEL_OK)
        return st;
    if (s->gpus_per_node && s->gpus_per_node != s->nproc_per_node)
        SPEC_ERR("%s: %d GPUs for nprocPerNode %d ranks; keel runs one rank per GPU: make them equal (or "
                 "gpusPerNode 0 for CPU ranks)", where(r, "gpusPerNode").s, s->gpus_per_node, s->nproc_per_node);
    return KEEL_OK;
}

/* keel's path keys: absolute, in the grammar; key names it for the error. */
static keel_status path_key(const reader *r, const char *key, const char *dflt, const char *fix, char **out) {
    const char *v;
    keel_status st = str_key(r, key, false, fix, &v);
    if (st != KEEL_OK) return st;
    if (!v) v = dflt;
    if (!path_ok(v))
        SPEC_ERR("%s: '" SHOW "' is not an absolute path of A-Z a-z 0-9 . _ - and / (no '.' or '..'); %s",
                 where(r, key).s, v, fix);
    *out = keel_xstrdup(v);
    return KEEL_OK;
}

static keel_status parse_storage(const reader *r, keel_k8s_spec *s) {
    const char *v;
    keel_status st;
    const char *fix = "name the PersistentVolumeClaim (ReadWriteMany) every pod mounts for checkpoints";
    if ((st = str_key(r, "checkpointClaim", true, fix, &v)) != KEEL_OK) return st;
    if (!dns_subdomain(v))
        SPEC_ERR("%s: '" SHOW "' is not a DNS-1123 subdomain (a claim's name); write lower-case letters, digits, "
                 "'-' and '.', e.g. \"keel-checkpoints\"", where(r, "checkpointClaim").s, v);
    memcpy(s->claim, v, strlen(v) + 1);
    if ((st = path_key(r, "checkpointMountPath", "/checkpoints", "e.g. \"/checkpoints\"", &s->checkpoint_mount)) !=
        KEEL_OK)
        return st;
    if (under(s->checkpoint_mount, "/dev/shm") || !strcmp(s->checkpoint_mount, "/dev"))
        SPEC_ERR("%s: %s is where the pod's memory-backed /dev/shm is; mount checkpoints elsewhere, e.g. "
                 "\"/checkpoints\"", where(r, "checkpointMountPath").s, s->checkpoint_mount);
    return path_key(r, "config", "/etc/keel/config.json",
                    "the keel config inside the container (in the image or on the checkpoint volume)", &s->config);
}

static keel_status parse_rendezvous(const reader *r, const char *default_run_id, keel_k8s_spec *s) {
    const char *run_id, *etcd;
    keel_status st;
    if ((st = str_key(r, "runId", false, "a DNS-1123 label unique to this job", &run_id)) != KEEL_OK ||
        (st = str_key(r, "etcdImage", false, "e.g. \"quay.io/coreos/etcd:v3.5.21\"", &etcd)) != KEEL_OK)
        return st;
    if (s->kind == KEEL_K8S_MPIJOB && (run_id || etcd))
        SPEC_ERR("%s: an MPIJob's ranks meet through mpirun, not etcd; remove it",
                 where(r, run_id ? "runId" : "etcdImage").s);
    if (s->kind == KEEL_K8S_MPIJOB) return KEEL_OK;
    if (run_id && !dns_label(run_id, strlen(run_id), KEEL_K8S_NAME_MAX, false))
        SPEC_ERR("%s: '" SHOW "' is not a DNS-1123 label; write lower-case letters, digits and '-' (at most 63), "
                 "unique to this job", where(r, "runId").s, run_id);
    char dflt[KEEL_K8S_NAME_MAX + 1];
    if (!run_id) {
        /* "<name>-<suffix>", the name cut so that it fits a label */
        const char *suffix = default_run_id ? default_run_id : "run";
        size_t keep = strlen(suffix) + 1 >= sizeof dflt - 1 ? 0 : sizeof dflt - 2 - strlen(suffix);
        snprintf(dflt, sizeof dflt, "%.*s-%s", (int)(strlen(s->name) < keep ? strlen(s->name) : keep), s->name,
                 suffix);
        size_t n = strlen(dflt);
        while (n && dflt[n - 1] == '-') dflt[--n] = 0; /* a cut name may end in '-' */
        if (!dns_label(dflt, n, KEEL_K8S_NAME_MAX, false))
            SPEC_ERR("%s: the default '" SHOW "' is not a DNS-1123 label; set runId", where(r, "runId").s, dflt);
        run_id = dflt;
    }
    memcpy(s->run_id, run_id, strlen(run_id) + 1);
    etcd = etcd ? etcd : "quay.io/coreos/etcd:v3.5.21";
    if (!image_ok(etcd))
        SPEC_ERR("%s: '" SHOW "' is not an image reference; write [registry/]repository[:tag][@digest]",
                 where(r, "etcdImage").s, etcd);
    s->etcd_image = keel_xstrdup(etcd);
    return KEEL_OK;
}

/* Every pod's hostname is "<name>-worker-<i>" (the operators' Services name pods so): it must be a label. */
static keel_status check_pod_names(const reader *r, const keel_k8s_spec *s) {
    int last = s->elastic ? s->max_nodes - 1 : s->master ? s->nodes - 2 : s->nodes - 1;
    if (last < 0) last = 0;
    char host[160];
    snprintf(host, sizeof host, "%s-worker-%d", s->name, last);
    if (strlen(host) > KEEL_K8S_NAME_MAX)
        SPEC_ERR("%s: '%s' is too long: its pod %s has %zu characters, more than a DNS label's 63; shorten the name",
                 where(r, "name").s, s->name, host, strlen(host));
    return KEEL_OK;
}

static keel_status parse_spec(const cJSON *j, const char *path, const k8s_origin *origins, const char *default_run_id,
                              keel_k8s_spec *s) {
    static const char *const keys[] = {"name",       "namespace",   "kind",       "image",           "nodes",
                                       "master",     "elastic",     "nprocPerNode", "gpusPerNode",   "efaPerNode",
                                       "shmSizeGiB", "checkpointClaim", "checkpointMountPath", "config", "runId",
                                       "etcdImage",  NULL};
    if (!cJSON_IsObject(j))
        SPEC_ERR("%s: not a JSON object (a spec: {\"name\": ..., \"image\": ..., \"nodes\": ..., ...}; see "
                 "docs/kubernetes.md)", path);
    reader r = {path, j, "", origins};
    keel_status st;
    if ((st = known_keys(&r, keys,
                         "name, namespace, kind, image, nodes, master, elastic, nprocPerNode, gpusPerNode, efaPerNode, "
                         "shmSizeGiB, checkpointClaim, checkpointMountPath, config, runId, etcdImage")) != KEEL_OK ||
        (st = parse_names(&r, s)) != KEEL_OK || (st = parse_shape(&r, s)) != KEEL_OK ||
        (st = parse_storage(&r, s)) != KEEL_OK || (st = parse_rendezvous(&r, default_run_id, s)) != KEEL_OK)
        return st;
    return check_pod_names(&r, s);
}

keel_status k8s_spec_text_check(const char *text, size_t len, const char *path) {
    const char *nul = memchr(text, 0, len);
    if (nul) SPEC_ERR("%s: a NUL byte at offset %zu; a spec is text", path, (size_t)(nul - text));
    if (len > K8S_SPEC_MAX_BYTES)
        SPEC_ERR("%s: %zu bytes; a spec is a small text file (at most %d bytes)", path, len, K8S_SPEC_MAX_BYTES);
    return KEEL_OK;
}

keel_status k8s_spec_from_json(const cJSON *j, const char *path, const k8s_origin *origins,
                               const char *default_run_id, keel_k8s_spec *s) {
    *s = (keel_k8s_spec){0};
    s->path = keel_xstrdup(path);
    keel_status st = parse_spec(j, path, origins, default_run_id, s);
    if (st != KEEL_OK) keel_k8s_spec_free(s);
    return st;
}

keel_status keel_k8s_spec_parse(const char *text, size_t len, const char *path, const char *default_run_id,
                                keel_k8s_spec *s) {
    *s = (keel_k8s_spec){0};
    if (!text) text = "", len = 0; /* a fuzzer's empty input */
    keel_status st = k8s_spec_text_check(text, len, path);
    if (st != KEEL_OK) return st;
    if (keel_json_escaped_nul(text, len))
        SPEC_ERR("%s: a string holds \\u0000 (NUL), which would cut its value short; no spec value has one", path);
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, false);
    while (end && end < text + len && strchr(" \t\r\n", *end)) end++; /* text is not NUL-ended */
    if (!j || (end && end < text + len)) {
        size_t at = end && end >= text && end <= text + len ? (size_t)(end - text) : 0;
        keel_errorf("%s: %s at byte %zu; a spec is one JSON object (see docs/kubernetes.md)", path,
                    j ? "text after the JSON object" : "not valid JSON", at);
        cJSON_Delete(j);
        return KEEL_ERR_INPUT;
    }
    st = k8s_spec_from_json(j, path, NULL, default_run_id, s);
    cJSON_Delete(j);
    return st;
}
