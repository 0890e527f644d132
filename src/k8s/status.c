/* k8s/status.c: `keel k8s status`'s reading of kubectl's answers — a
 * PyTorchJob or MPIJob (kubectl get -o json) and the list of its pods — and
 * the summary it prints. kubectl's JSON is input like any file: a missing
 * field, a wrong type or an over-long string is shown as unknown or cut, never
 * trusted; every text is kept to printable ASCII before it reaches a terminal
 * (fuzz_k8s_status). The shapes are the operators' (training-operator v1.9,
 * pkg/apis/kubeflow.org/v1/common_types.go; mpi-operator v0.8, pkg/apis/
 * kubeflow/v2beta1/types.go): status.conditions[] {type, status, reason,
 * message}, the last one whose status is "True" being the job's state, and
 * status.replicaStatuses {TYPE: {active, succeeded, failed}}. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "keel/k8s.h"

#define STATUS_ERR(...)                                                                                            \
    do {                                                                                                           \
        keel_errorf(__VA_ARGS__);                                                                                  \
        return KEEL_ERR_INPUT;                                                                                     \
    } while (0)

void keel_k8s_state_free(keel_k8s_state *st) {
    keel_free(st->pods);
    *st = (keel_k8s_state){0};
}

/* v cut to fit dst and kept to printable ASCII ('?' for any other byte): nothing from the cluster drives the
 * terminal or breaks a line. */
static void printable(char *dst, size_t n, const char *v) {
    size_t i = 0;
    for (; v && v[i] && i + 1 < n; i++) dst[i] = v[i] >= 0x20 && v[i] < 0x7f ? v[i] : '?';
    dst[i] = 0;
}

/* x's text as printable() keeps it; "" when x is not a string. */
static void text(char *dst, size_t n, const cJSON *x) { printable(dst, n, cJSON_IsString(x) ? x->valuestring : NULL); }

static const cJSON *at(const cJSON *obj, const char *key) { return cJSON_GetObjectItemCaseSensitive(obj, key); }

/* A count: absent is 0 (the operators omit zero counts: `omitempty`), a whole number 0..2^31-1 is itself, and
 * anything else (a string, a negative, 1e300) is -1, shown as "?". */
static int count(const cJSON *x) {
    int64_t v;
    if (!x) return 0;
    return keel_json_int(x, 0, INT32_MAX, &v) ? (int)v : -1;
}

/* An RFC 3339 time as the API writes metav1.Time ("2026-01-05T10:00:00Z"), in Unix seconds; -1 if not one. */
static int64_t rfc3339(const cJSON *x) {
    if (!cJSON_IsString(x) || !x->valuestring || strlen(x->valuestring) != 20) return -1;
    struct tm t = {0};
    char z = 0;
    if (sscanf(x->valuestring, "%4d-%2d-%2dT%2d:%2d:%2d%c", &t.tm_year, &t.tm_mon, &t.tm_mday, &t.tm_hour,
               &t.tm_min, &t.tm_sec, &z) != 7 || z != 'Z' || t.tm_year < 1970 || t.tm_mon < 1 || t.tm_mon > 12 ||
        t.tm_mday < 1 || t.tm_mday > 31 || t.tm_hour > 23 || t.tm_min > 59 || t.tm_sec > 60)
        return -1;
    t.tm_year -= 1900, t.tm_mon -= 1;
    return (int64_t)timegm(&t);
}

static void read_job(const cJSON *job, keel_k8s_state *st) {
    const cJSON *meta = at(job, "metadata"), *status = at(job, "status");
    text(st->kind, sizeof st->kind, at(job, "kind"));
    text(st->name, sizeof st->name, at(meta, "name"));
    text(st->ns, sizeof st->ns, at(meta, "namespace"));
    const cJSON *c, *conditions = at(status, "conditions"), *reps = at(status, "replicaStatuses");
    if (!cJSON_IsArray(conditions)) conditions = NULL;
    if (!cJSON_IsObject(reps)) reps = NULL;
    cJSON_ArrayForEach(c, conditions) { /* the operators append the newest: the last true one wins */
        const cJSON *s = at(c, "status");
        if (!cJSON_IsString(s) || !s->valuestring || strcmp(s->valuestring, "True")) continue;
        text(st->state, sizeof st->state, at(c, "type"));
        text(st->reason, sizeof st->reason, at(c, "reason"));
        text(st->message, sizeof st->message, at(c, "message"));
    }
    cJSON_ArrayForEach(c, reps) {
        if (st->n_replicas == KEEL_K8S_MAX_REPLICA_TYPES) { /* a job has two (Master/Launcher, Worker) */
            st->more_replicas++;
            continue;
        }
        keel_k8s_replicas *r = &st->replicas[st->n_replicas++];
        printable(r->type, sizeof r->type, c->string);
        r->active = count(at(c, "active"));
        r->succeeded = count(at(c, "succeeded"));
        r->failed = count(at(c, "failed"));
    }
}

static void read_pod(const cJSON *p, keel_k8s_pod *pod) {
    const cJSON *meta = at(p, "metadata"), *spec = at(p, "spec"), *status = at(p, "status"), *c;
    text(pod->name, sizeof pod->name, at(meta, "name"));
    text(pod->phase, sizeof pod->phase, at(status, "phase"));
    text(pod->node, sizeof pod->node, at(spec, "nodeName"));
    pod->created_s = rfc3339(at(meta, "creationTimestamp"));
    const cJSON *containers = at(spec, "containers"), *statuses = at(status, "containerStatuses");
    pod->containers = cJSON_IsArray(containers) ? cJSON_GetArraySize(containers) : 0;
    if (!cJSON_IsArray(statuses)) statuses = NULL;
    cJSON_ArrayForEach(c, statuses) {
        pod->ready += cJSON_IsTrue(at(c, "ready"));
        int r = count(at(c, "restartCount"));
        pod->restarts = pod->restarts < 0 || r < 0 || r > INT32_MAX - pod->restarts ? -1 : pod->restarts + r;
        if (!pod->waiting[0]) text(pod->waiting, sizeof pod->waiting, at(at(at(c, "state"), "waiting"), "reason"));
    }
}

/* json[0, len) as one JSON object (no NUL: kubectl's answer is text), or NULL with the error said. */
static cJSON *parse_answer(const char *what, const char *json, size_t len) {
    if (!json) json = "", len = 0;
    if (memchr(json, 0, len) || len > KEEL_K8S_ANSWER_MAX_BYTES) {
        keel_errorf("kubectl's %s: %s; not kubectl's JSON", what,
                    len > KEEL_K8S_ANSWER_MAX_BYTES ? "over 64 MiB" : "a NUL byte");
        return NULL;
    }
    cJSON *j = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsObject(j)) {
        keel_errorf("kubectl's %s is not a JSON object (%s); is KEEL_KUBECTL a kubectl?", what,
                    j ? "another JSON value" : "not valid JSON");
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

keel_status keel_k8s_state_parse(const char *job_json, size_t job_len, const char *pods_json, size_t pods_len,
                                  keel_k8s_state *st) {
    *st = (keel_k8s_state){0};
    cJSON *job = parse_answer("job", job_json, job_len);
    if (!job) return KEEL_ERR_INPUT;
    read_job(job, st);
    cJSON_Delete(job);
    cJSON *pods = parse_answer("pod list", pods_json, pods_len);
    if (!pods) return KEEL_ERR_INPUT;
    const cJSON *items = at(pods, "items"), *p;
    if (!cJSON_IsArray(items)) {
        cJSON_Delete(pods);
        STATUS_ERR("kubectl's pod list has no \"items\" list; is KEEL_KUBECTL a kubectl?");
    }
    int n = cJSON_GetArraySize(items);
    st->pods = keel_xcalloc(sizeof *st->pods * (size_t)(n < KEEL_K8S_MAX_PODS ? n : KEEL_K8S_MAX_PODS) + 1, "pods");
    cJSON_ArrayForEach(p, items) {
        if (st->n_pods == KEEL_K8S_MAX_PODS) {
            st->more_pods++;
            continue;
        }
        read_pod(p, &st->pods[st->n_pods++]);
    }
    cJSON_Delete(pods);
    return KEEL_OK;
}

/* An age as kubectl's columns show one: 45s, 12m, 5h, 3d. */
static void age(char *out, size_t n, int64_t created_s, int64_t now_s) {
    int64_t s = now_s - created_s;
    if (created_s < 0) snprintf(out, n, "?");
    else if (s < 0) snprintf(out, n, "0s");
    else if (s < 120) snprintf(out, n, "%llds", (long long)s);
    else if (s < 120 * 60) snprintf(out, n, "%lldm", (long long)(s / 60));
    else if (s < 48 * 3600) snprintf(out, n, "%lldh", (long long)(s / 3600));
    else snprintf(out, n, "%lldd", (long long)(s / 86400));
}

static void num(char *out, size_t n, int v) {
    if (v < 0) snprintf(out, n, "?");
    else snprintf(out, n, "%d", v);
}

void keel_k8s_state_print(const keel_k8s_state *st, int64_t now_s, FILE *out) {
    fprintf(out, "%s %s in namespace %s\n", st->kind[0] ? st->kind : "job", st->name[0] ? st->name : "?",
            st->ns[0] ? st->ns : "?");
    if (!st->state[0]) fprintf(out, "state:    none yet (the operator has not reported on the job)\n");
    else if (!st->reason[0] && !st->message[0]) fprintf(out, "state:    %s\n", st->state);
    else fprintf(out, "state:    %s (%s%s%s)\n", st->state, st->reason, st->reason[0] && st->message[0] ? ": " : "",
                 st->message);
    fprintf(out, "replicas:");
    if (!st->n_replicas) fprintf(out, " none reported yet");
    for (int i = 0; i < st->n_replicas; i++) {
        const keel_k8s_replicas *r = &st->replicas[i];
        char a[16], s[16], f[16];
        num(a, sizeof a, r->active), num(s, sizeof s, r->succeeded), num(f, sizeof f, r->failed);
        fprintf(out, "%s %s %s active, %s succeeded, %s failed", i ? ";" : "", r->type[0] ? r->type : "?", a, s, f);
    }
    if (st->more_replicas) fprintf(out, "; %d more types", st->more_replicas);
    fprintf(out, "\n");
    if (!st->n_pods) {
        fprintf(out, "pods:     none\n");
        return;
    }
    int wn = 4, wp = 5, wd = 4;
    for (int i = 0; i < st->n_pods; i++) {
        const keel_k8s_pod *p = &st->pods[i];
        int name = (int)strlen(p->name), phase = (int)(strlen(p->phase) + (p->waiting[0] ? strlen(p->waiting) + 3 : 0)),
            node = (int)strlen(p->node);
        wn = name > wn ? name : wn, wp = phase > wp ? phase : wp, wd = node > wd ? node : wd;
    }
    fprintf(out, "%-*s  %-*s  READY  RESTARTS  %-*s  AGE\n", wn, "POD", wp, "PHASE", wd, "NODE");
    for (int i = 0; i < st->n_pods; i++) {
        const keel_k8s_pod *p = &st->pods[i];
        char phase[sizeof p->phase + sizeof p->waiting + 4], ready[40], restarts[16], when[24];
        snprintf(phase, sizeof phase, "%s%s%s%s", p->phase[0] ? p->phase : "?", p->waiting[0] ? " (" : "", p->waiting,
                 p->waiting[0] ? ")" : "");
        snprintf(ready, sizeof ready, "%d/%d", p->ready, p->containers);
        num(restarts, sizeof restarts, p->restarts);
        age(when, sizeof when, p->created_s, now_s);
        fprintf(out, "%-*s  %-*s  %-5s  %-8s  %-*s  %s\n", wn, p->name[0] ? p->name : "?", wp, phase, ready,
                restarts, wd, p->node[0] ? p->node : "-", when);
    }
    if (st->more_pods) fprintf(out, "... and %d more pods\n", st->more_pods);
}
