/* k8s/env.c: a `keel k8s manifest` spec from a .env file — the shell
 * variables the AWS EKS guide for FSDP (aws-samples/awsome-distributed-training,
 * 3.test_cases/pytorch/FSDP/kubernetes) fills its PyTorchJob template from —
 * mapped onto the spec's keys (the table: docs/kubernetes.md) and checked by
 * spec.c exactly as a JSON spec is, so the same values render the same YAML.
 * The file is data, never run: NAME=VALUE lines, '#' comments, an optional
 * `export `, a value bare or in single or double quotes. There is no
 * expansion, substitution or escape: '$', '`' and '\' are refused wherever
 * they stand, so no line can run a command or read another variable. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k8s/spec.h"

#define MAX_LINE 4096

#define ENV_ERR(...)                                                                                               \
    do {                                                                                                           \
        keel_errorf(__VA_ARGS__);                                                                                  \
        return KEEL_ERR_INPUT;                                                                                     \
    } while (0)

typedef enum { TEXT, NUMBER, FLAG } var_type;

/* The variables keel reads: the guide's (its README's env_vars: IMAGE_URI, NUM_NODES, GPU_PER_NODE,
 * EFA_PER_NODE, FI_PROVIDER; MIN_NODES and MAX_NODES of its elastic fsdp.yaml-template; JOB_NAME and
 * CHECKPOINT_DIR of its SMP sibling's env), then keel's own for what the guide writes into its YAML by hand
 * (the claim fsx-claim, the job's name) or does not have. */
static const struct var {
    const char *name;
    const char *key; /* the spec key it gives (NULL: FI_PROVIDER, checked here) */
    var_type type;
    const char *refused; /* a variable of the guide's that keel's spec has no place for: why, and the fix */
} VARS[] = {
    {"JOB_NAME", "name", TEXT, NULL},
    {"NAMESPACE", "namespace", TEXT, NULL},
    {"KIND", "kind", TEXT, NULL},
    {"IMAGE_URI", "image", TEXT, NULL},
    {"NUM_NODES", "nodes", NUMBER, NULL},
    {"MIN_NODES", "elastic.minNodes", NUMBER, NULL},
    {"MAX_NODES", "elastic.maxNodes", NUMBER, NULL},
    {"MAX_RESTARTS", "elastic.maxRestarts", NUMBER, NULL},
    {"MASTER", "master", FLAG, NULL},
    /* and nprocPerNode unless NPROC_PER_NODE is set: the guide runs torchrun --nproc_per_node=$GPU_PER_NODE */
    {"GPU_PER_NODE", "gpusPerNode", NUMBER, NULL},
    {"NPROC_PER_NODE", "nprocPerNode", NUMBER, NULL},
    {"EFA_PER_NODE", "efaPerNode", NUMBER, NULL},
    {"FI_PROVIDER", NULL, TEXT, NULL},
    {"SHM_SIZE_GIB", "shmSizeGiB", NUMBER, NULL},
    {"CHECKPOINT_CLAIM", "checkpointClaim", TEXT, NULL},
    {"CHECKPOINT_DIR", "checkpointMountPath", TEXT, NULL},
    {"KEEL_CONFIG", "config", TEXT, NULL},
    {"RUN_ID", "runId", TEXT, NULL},
    {"ETCD_IMAGE", "etcdImage", TEXT, NULL},
    {"INSTANCE_TYPE", NULL, TEXT,
     "keel renders no nodeSelector (the pods' nvidia.com/gpu and vpc.amazonaws.com/efa limits place them on "
     "nodes that have them); remove the line"},
    {"HF_TOKEN", NULL, TEXT,
     "keel's pods read no Hugging Face Hub (the data is on the checkpoint volume), and a token does not belong "
     "in a manifest; remove the line"},
};
#define N_VARS (sizeof VARS / sizeof *VARS)
#define VAR_NAMES                                                                                                  \
    "JOB_NAME, NAMESPACE, KIND, IMAGE_URI, NUM_NODES, MIN_NODES, MAX_NODES, MAX_RESTARTS, MASTER, GPU_PER_NODE, "   \
    "NPROC_PER_NODE, EFA_PER_NODE, FI_PROVIDER, SHM_SIZE_GIB, CHECKPOINT_CLAIM, CHECKPOINT_DIR, KEEL_CONFIG, "      \
    "RUN_ID, ETCD_IMAGE"

typedef struct {
    int line;    /* where it was set; 0: absent */
    char *value; /* malloc'd */
} setting;

static int var_index(const char *name) {
    for (size_t i = 0; i < N_VARS; i++)
        if (!strcmp(VARS[i].name, name)) return (int)i;
    return -1;
}

static bool blank(char c) { return c == ' ' || c == '\t'; }
static bool name_char(char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
}
/* What a value may hold without quotes: the characters of keel's grammars, none the shell treats specially. */
static bool bare_char(char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || strchr("._-/:@+,=", c);
}

/* The value's text as written, held to keel's rules for its type. */
static keel_status check_value(const char *path, int no, const struct var *v, const char *val, size_t n,
                               char quote) {
    for (size_t i = 0; i < n; i++) {
        char c = val[i];
        if (c == '$' || c == '`' || c == '\\')
            ENV_ERR("%s:%d: %s: '%c' in the value: keel reads no shell expansion, substitution or escape (nothing in "
                    "the file is run); write the value itself", path, no, v->name, c);
        if ((unsigned char)c < 0x20 || c == 0x7f)
            ENV_ERR("%s:%d: %s: a control character in the value; write it on one line of plain text", path, no,
                    v->name);
        if (!quote && !bare_char(c))
            ENV_ERR("%s:%d: %s: '%c' in a bare value; quote the value ('...' or \"...\"), as the shell would need",
                    path, no, v->name, c);
    }
    if (v->type == NUMBER) {
        size_t sign = n && val[0] == '-', end = sign; /* val is not NUL-ended: the file's last line may end it */
        while (end < n && val[end] >= '0' && val[end] <= '9') end++;
        if (end == sign || end != n)
            ENV_ERR("%s:%d: %s: '%.*s' is not a whole number; write digits, e.g. %s=4", path, no, v->name,
                    (int)(n < 80 ? n : 80), val, v->name);
    }
    if (v->type == FLAG && !((n == 4 && !memcmp(val, "true", 4)) || (n == 5 && !memcmp(val, "false", 5))))
        ENV_ERR("%s:%d: %s: '%.*s' is not true or false; write %s=true or %s=false", path, no, v->name,
                (int)(n < 80 ? n : 80), val, v->name, v->name);
    if (!v->key && !v->refused && !(n == 3 && !memcmp(val, "efa", 3))) /* FI_PROVIDER */
        ENV_ERR("%s:%d: FI_PROVIDER: '%.*s': keel's pods use libfabric's efa provider and set FI_PROVIDER=efa "
                "themselves where they have EFA devices (EFA_PER_NODE); write FI_PROVIDER=efa or remove the line",
                path, no, (int)(n < 80 ? n : 80), val);
    return KEEL_OK;
}

/* One line (n bytes, no '\n'): a blank, a comment, or [export ]NAME=VALUE [# comment]. */
static keel_status read_line(const char *path, int no, const char *line, size_t n, setting *set) {
    if (n > MAX_LINE) ENV_ERR("%s:%d: a line of %zu bytes; a line is NAME=VALUE (at most %d bytes)", path, no, n,
                              MAX_LINE);
    if (n && line[n - 1] == '\r') n--; /* written on Windows */
    size_t i = 0;
    while (i < n && blank(line[i])) i++;
    if (i == n || line[i] == '#') return KEEL_OK;
    if (n - i > 7 && !memcmp(line + i, "export", 6) && blank(line[i + 6]))
        for (i += 6; i < n && blank(line[i]);) i++;
    size_t name_at = i;
    while (i < n && name_char(line[i])) i++;
    int name_n = (int)(i - name_at < 64 ? i - name_at : 64);
    if (i == name_at || (line[name_at] >= '0' && line[name_at] <= '9'))
        ENV_ERR("%s:%d: '%.*s' is not NAME=VALUE; write a variable, '=' and its value, e.g. NUM_NODES=4", path, no,
                (int)(n - name_at < 80 ? n - name_at : 80), line + name_at);
    if (i == n || line[i] != '=')
        ENV_ERR("%s:%d: %.*s: want '=' right after the name (NAME=VALUE, no blank around '=', as the shell reads it)",
                path, no, name_n, line + name_at);
    char name[65];
    snprintf(name, sizeof name, "%.*s", name_n, line + name_at);
    int vi = var_index(name);
    if (vi < 0) ENV_ERR("%s:%d: %s: not a variable keel reads (the variables: " VAR_NAMES "; docs/kubernetes.md)",
                        path, no, name);
    const struct var *v = &VARS[vi];
    if (v->refused) ENV_ERR("%s:%d: %s: %s", path, no, v->name, v->refused);
    if (set[vi].line) ENV_ERR("%s:%d: %s: set again (first on line %d); set each variable once", path, no, v->name,
                              set[vi].line);
    i++; /* past '=' */
    char quote = i < n && (line[i] == '\'' || line[i] == '"') ? line[i] : 0;
    size_t start = i + (quote != 0), end = start;
    while (end < n && (quote ? line[end] != quote : !blank(line[end]))) end++;
    if (quote && end == n)
        ENV_ERR("%s:%d: %s: the value's %c is not closed on its line; close it there", path, no, v->name, quote);
    keel_status st = check_value(path, no, v, line + start, end - start, quote);
    if (st != KEEL_OK) return st;
    for (i = end + (quote != 0); i < n && blank(line[i]);) i++;
    if (i < n && line[i] != '#')
        ENV_ERR("%s:%d: %s: '%.*s' after the value; one NAME=VALUE a line (a comment after blanks and '#')", path,
                no, v->name, (int)(n - i < 80 ? n - i : 80), line + i);
    set[vi].line = no;
    set[vi].value = keel_xmalloc(end - start + 1, "a .env value");
    memcpy(set[vi].value, line + start, end - start);
    set[vi].value[end - start] = 0;
    return KEEL_OK;
}

static cJSON *json_value(const struct var *v, const char *value) {
    if (v->type == NUMBER) return cJSON_CreateNumber(strtod(value, NULL)); /* digits: spec.c checks the range */
    if (v->type == FLAG) return cJSON_CreateBool(!strcmp(value, "true"));
    return cJSON_CreateString(value);
}

/* The spec the settings give, checked by spec.c with each key's line for its errors. */
static keel_status to_spec(const char *path, const setting *set, const char *default_run_id, keel_k8s_spec *s) {
    cJSON *root = cJSON_CreateObject(), *elastic = NULL;
    k8s_origin origins[N_VARS + 2];
    int n = 0, gpus = var_index("GPU_PER_NODE"), nproc = var_index("NPROC_PER_NODE");
    for (size_t i = 0; i < N_VARS; i++) {
        const struct var *v = &VARS[i];
        if (!v->key) continue;
        bool alias = (int)i == nproc && !set[i].line && set[gpus].line; /* nprocPerNode from GPU_PER_NODE */
        const setting *from = alias ? &set[gpus] : &set[i];
        origins[n++] = (k8s_origin){v->key, alias ? VARS[gpus].name : v->name, from->line};
        if (!from->line) continue;
        cJSON *parent = root;
        const char *key = v->key;
        if (!strncmp(key, "elastic.", 8)) {
            if (!elastic) {
                elastic = cJSON_AddObjectToObject(root, "elastic");
                origins[n++] = (k8s_origin){"elastic", v->name, from->line};
            }
            parent = elastic, key += 8;
        }
        cJSON_AddItemToObject(parent, key, json_value(alias ? &VARS[gpus] : v, from->value));
    }
    origins[n] = (k8s_origin){0};
    keel_status st = k8s_spec_from_json(root, path, origins, default_run_id, s);
    cJSON_Delete(root);
    int fi = var_index("FI_PROVIDER");
    if (st == KEEL_OK && set[fi].line && !s->efa_per_node) {
        keel_k8s_spec_free(s);
        ENV_ERR("%s:%d: FI_PROVIDER: efa without EFA devices; set EFA_PER_NODE (keel sets FI_PROVIDER=efa on the "
                "pods that have them), or remove the line", path, set[fi].line);
    }
    return st;
}

keel_status keel_k8s_env_parse(const char *text, size_t len, const char *path, const char *default_run_id,
                               keel_k8s_spec *s) {
    *s = (keel_k8s_spec){0};
    if (!text) text = "", len = 0; /* a fuzzer's empty input */
    keel_status st = k8s_spec_text_check(text, len, path);
    setting set[N_VARS] = {{0}};
    int no = 0;
    for (size_t at = 0; at < len && st == KEEL_OK; no++) {
        const char *nl = memchr(text + at, '\n', len - at);
        size_t n = nl ? (size_t)(nl - (text + at)) : len - at;
        st = read_line(path, no + 1, text + at, n, set);
        at += n + 1;
    }
    if (st == KEEL_OK) st = to_spec(path, set, default_run_id, s);
    for (size_t i = 0; i < N_VARS; i++) keel_free(set[i].value);
    return st;
}
