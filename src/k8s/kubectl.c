/* k8s/kubectl.c: `keel k8s status|logs|delete` — a job on a cluster through
 * kubectl. The job's name and namespace are held to Kubernetes' grammars
 * before anything runs (none can start with '-', so none can pass for an
 * option), and kubectl runs from an argv through resil's keel_run_collect,
 * never a shell (no value can become a command). kubectl's stderr is kept for
 * the one error line keel prints when it fails. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "keel/k8s.h"
#include "keel/resil.h"

#define KUBECTL_TIMEOUT_S 120 /* a get or a delete; logs stream as long as they last */
/* Both operators label a job's pods with its name (training-operator v1.9 GenLabels, mpi-operator v0.8
 * defaultLabels); the mpi-operator adds the role, "launcher" or "worker". */
#define JOB_NAME_LABEL "training.kubeflow.org/job-name"
#define JOB_ROLE_LABEL "training.kubeflow.org/job-role"

#define K8S_ERR(st, ...)                                                                                           \
    do {                                                                                                           \
        keel_errorf(__VA_ARGS__);                                                                                  \
        return st;                                                                                                 \
    } while (0)

/* The version keel renders of each kind: pinned, so that a cluster serving another version of the same group
 * (the training-operator's own MPIJob v1) never answers for keel's job. */
static const char *resource(keel_k8s_kind k) {
    return k == KEEL_K8S_MPIJOB ? "mpijobs.v2beta1.kubeflow.org" : "pytorchjobs.v1.kubeflow.org";
}
static const char *kind_name(keel_k8s_kind k) { return k == KEEL_K8S_MPIJOB ? "MPIJob" : "PyTorchJob"; }

/* "namespace training" or "kubectl's current namespace", for messages */
static const char *where_ns(const keel_k8s_job *job, char *buf, size_t n) {
    if (!job->ns) return "kubectl's current namespace";
    snprintf(buf, n, "namespace %s", job->ns);
    return buf;
}

static keel_status job_check(const keel_k8s_job *job, const char *cmd) {
    if (!job->name || !keel_k8s_dns1035_label(job->name))
        K8S_ERR(KEEL_ERR_INPUT, "keel k8s %s: '%.80s' is not a job's name: a DNS-1035 label (lower-case letters, "
                "digits and '-', a letter first, at most 63), as in the spec's \"name\"", cmd,
                job->name ? job->name : "");
    if (job->ns && !keel_k8s_dns1123_label(job->ns))
        K8S_ERR(KEEL_ERR_INPUT, "keel k8s %s: --namespace '%.80s' is not a namespace's name: a DNS-1123 label "
                "(lower-case letters, digits and '-', at most 63)", cmd, job->ns);
    return KEEL_OK;
}

/* ---- a kubectl command line ------------------------------------------------------- */

typedef struct {
    char *argv[32];
    int n;
} cmd;

static void add(cmd *c, const char *arg) {
    KEEL_CHECK(c->n < 31, "k8s: more than 31 arguments to kubectl");
    c->argv[c->n++] = (char *)arg;
    c->argv[c->n] = NULL;
}

/* "kubectl VERB", kubectl being $KEEL_KUBECTL when set */
static cmd kubectl(const char *verb) {
    const char *bin = getenv("KEEL_KUBECTL");
    cmd c = {.n = 0};
    add(&c, bin && bin[0] ? bin : "kubectl");
    add(&c, verb);
    return c;
}

static void namespace(cmd *c, const keel_k8s_job *job) {
    if (!job->ns) return;
    add(c, "--namespace");
    add(c, job->ns);
}

/* kubectl's message: the first line of its stderr that is not one of client-go's log lines ("E0105
 * 10:00:00.123456 ... memcache.go:265] ...": a refused connection logs several before the message) or a
 * server's "Warning:". */
static void message(const char *err, char *out, size_t n) {
    const char *pick = NULL; /* the first line, unless a better one comes */
    for (const char *line = err; *line;) {
        size_t len = strcspn(line, "\n");
        bool klog = len > 6 && strchr("IWEF", line[0]) && strspn(line + 1, "0123456789") == 4 && line[5] == ' ';
        if (len && !pick) pick = line;
        if (len && !klog && strncmp(line, "Warning:", 8)) {
            pick = line;
            break;
        }
        line += len + (line[len] == '\n');
    }
    if (pick) snprintf(out, n, "%.*s", (int)strcspn(pick, "\n"), pick);
    else snprintf(out, n, "no message on its stderr");
}

/* Run c, keeping its stdout when keep_out (else it streams to ours) and its stderr. The exit code is in
 * *code; a kubectl that cannot run, or did not end in time, is an error line here. */
static keel_status run(const cmd *c, const char *what, bool keep_out, double timeout_s, keel_run_output *o,
                       int *code) {
    *code = keel_run_collect(c->argv, timeout_s, KEEL_RUN_STDERR | (keep_out ? KEEL_RUN_STDOUT : 0),
                             KEEL_K8S_ANSWER_MAX_BYTES, o);
    if (o->exec_errno)
        K8S_ERR(KEEL_ERR_INPUT, "keel k8s %s: cannot run %s: %s; install kubectl (Debian: apt-get install "
                "kubernetes-client) or name it in KEEL_KUBECTL", what, c->argv[0], strerror(o->exec_errno));
    if (*code < 0) K8S_ERR(KEEL_ERR_IO, "keel k8s %s: cannot start %s", what, c->argv[0]);
    if (*code == 124) K8S_ERR(KEEL_ERR_IO, "keel k8s %s: kubectl %s did not end in %.0f s", what, c->argv[1],
                              timeout_s);
    if (o->out_cut) K8S_ERR(KEEL_ERR_IO, "keel k8s %s: kubectl's answer is over %u MiB", what,
                            KEEL_K8S_ANSWER_MAX_BYTES >> 20);
    return KEEL_OK;
}

/* kubectl failed: its message in keel's line. NotFound (the object, or the namespace) is bad input, naming
 * what was looked for; anything else (no cluster, forbidden) is an I/O error. */
static keel_status failed(const keel_run_output *o, int code, const char *what, const char *missing) {
    char msg[600];
    message(o->err, msg, sizeof msg);
    if (strstr(msg, "(NotFound)")) K8S_ERR(KEEL_ERR_INPUT, "keel k8s %s: no %s (kubectl: %s)", what, missing, msg);
    K8S_ERR(KEEL_ERR_IO, "keel k8s %s: kubectl failed (exit %d): %s", what, code, msg);
}

/* ---- status ---------------------------------------------------------------------- */

keel_status keel_k8s_status(const keel_k8s_job *job, FILE *out, bool *is_failed) {
    *is_failed = false;
    keel_status st = job_check(job, "status");
    if (st != KEEL_OK) return st;
    char ns[96], missing[200], selector[128];
    snprintf(missing, sizeof missing, "%s %s in %s", kind_name(job->kind), job->name, where_ns(job, ns, sizeof ns));
    cmd get = kubectl("get");
    add(&get, resource(job->kind));
    add(&get, job->name);
    add(&get, "-o");
    add(&get, "json");
    namespace(&get, job);
    keel_run_output o[2] = {{0}, {0}};
    int code;
    if ((st = run(&get, "status", true, KUBECTL_TIMEOUT_S, &o[0], &code)) == KEEL_OK && code != 0)
        st = failed(&o[0], code, "status", missing);
    snprintf(selector, sizeof selector, JOB_NAME_LABEL "=%s", job->name);
    cmd pods = kubectl("get");
    add(&pods, "pods");
    add(&pods, "-l");
    add(&pods, selector);
    add(&pods, "-o");
    add(&pods, "json");
    namespace(&pods, job);
    if (st == KEEL_OK && (st = run(&pods, "status", true, KUBECTL_TIMEOUT_S, &o[1], &code)) == KEEL_OK && code != 0)
        st = failed(&o[1], code, "status", missing);
    if (st == KEEL_OK) {
        keel_k8s_state s;
        st = keel_k8s_state_parse(o[0].out, strlen(o[0].out), o[1].out, strlen(o[1].out), &s);
        if (st == KEEL_OK) {
            keel_k8s_state_print(&s, (int64_t)time(NULL), out);
            *is_failed = !strcmp(s.state, "Failed");
        }
        keel_k8s_state_free(&s);
    }
    keel_run_output_free(&o[0]);
    keel_run_output_free(&o[1]);
    return st;
}

/* ---- logs ------------------------------------------------------------------------ */

/* How many pods the selector finds (kubectl get pods -l ... -o name): a selector that finds none is no
 * error to kubectl logs (1.32 says so on stderr, 1.20 says nothing), so keel asks first. */
static keel_status count_pods(const keel_k8s_job *job, const char *selector, const char *missing, int *n) {
    cmd c = kubectl("get");
    add(&c, "pods");
    add(&c, "-l");
    add(&c, selector);
    add(&c, "-o");
    add(&c, "name");
    namespace(&c, job);
    keel_run_output o;
    int code;
    keel_status st = run(&c, "logs", true, KUBECTL_TIMEOUT_S, &o, &code);
    if (st == KEEL_OK && code != 0) st = failed(&o, code, "logs", missing);
    *n = 0;
    for (const char *p = o.out; st == KEEL_OK && (p = strstr(p, "pod/")); p += 4) (*n)++;
    keel_run_output_free(&o);
    return st;
}

keel_status keel_k8s_logs(const keel_k8s_job *job, const keel_k8s_logs_opts *opt) {
    keel_status st = job_check(job, "logs");
    if (st != KEEL_OK) return st;
    char pod[300] = "", selector[200], tail[16], ns[96], missing[400];
    size_t stem = strlen(job->name);
    if (opt->pod && (!keel_k8s_dns1123_subdomain(opt->pod) || strncmp(opt->pod, job->name, stem) ||
                     opt->pod[stem] != '-'))
        K8S_ERR(KEEL_ERR_INPUT, "keel k8s logs: --pod '%.80s' is not a pod of %s: its pods are named %s-... "
                "(keel k8s status %s lists them)", opt->pod, job->name, job->name, job->name);
    if (opt->node == KEEL_K8S_MASTER && job->kind == KEEL_K8S_MPIJOB)
        K8S_ERR(KEEL_ERR_INPUT, "keel k8s logs: --node master: an MPIJob has a launcher, not a master (its log is "
                "the default)");
    if (opt->pod) snprintf(pod, sizeof pod, "%s", opt->pod);
    else if (opt->node == KEEL_K8S_MASTER) snprintf(pod, sizeof pod, "%s-master-0", job->name);
    else if (opt->node >= 0) snprintf(pod, sizeof pod, "%s-worker-%d", job->name, opt->node);
    /* a PyTorchJob's pods: all of them; an MPIJob's: the launcher, where mpirun's ranks write */
    snprintf(selector, sizeof selector, JOB_NAME_LABEL "=%s%s", job->name,
             job->kind == KEEL_K8S_MPIJOB ? "," JOB_ROLE_LABEL "=launcher" : "");
    if (pod[0]) snprintf(missing, sizeof missing, "pod %s in %s", pod, where_ns(job, ns, sizeof ns));
    else snprintf(missing, sizeof missing, "%s of %s %s in %s", job->kind == KEEL_K8S_MPIJOB ? "launcher" : "pods",
                  kind_name(job->kind), job->name, where_ns(job, ns, sizeof ns));
    int pods = 1;
    if (!pod[0] && (st = count_pods(job, selector, missing, &pods)) != KEEL_OK) return st;
    if (!pods) K8S_ERR(KEEL_ERR_INPUT, "keel k8s logs: no %s (keel k8s status %s shows the job)", missing, job->name);
    cmd c = kubectl("logs");
    if (pod[0]) add(&c, pod);
    else {
        add(&c, "-l");
        add(&c, selector);
        add(&c, "--prefix");
    }
    if (job->kind == KEEL_K8S_PYTORCHJOB) { /* the operator's container name, which render.c gives */
        add(&c, "-c");
        add(&c, "pytorch");
    }
    char followed[16];
    snprintf(followed, sizeof followed, "%d", pods > 5 ? pods : 5);
    if (opt->follow) add(&c, "--follow");
    if (opt->follow && !pod[0]) { /* kubectl follows at most 5 pods unless told */
        add(&c, "--max-log-requests");
        add(&c, followed);
    }
    if (opt->tail >= 0) {
        snprintf(tail, sizeof tail, "%d", opt->tail);
        add(&c, "--tail");
        add(&c, tail);
    }
    namespace(&c, job);
    keel_run_output o;
    int code;
    fflush(stdout); /* kubectl writes to the same stdout */
    if ((st = run(&c, "logs", false, 0, &o, &code)) == KEEL_OK && code != 0) st = failed(&o, code, "logs", missing);
    keel_run_output_free(&o);
    return st;
}

/* ---- delete ---------------------------------------------------------------------- */

/* kubectl delete's lines for what it deleted ('pytorchjob.kubeflow.org "llama" deleted', kubectl 1.33 adds
 * ' from training namespace') on out, kept printable; how many. Its other lines ("No resources found") are
 * not news: keel says what was not found its own way. */
static int say_deleted(const char *lines, FILE *out) {
    int n = 0;
    for (const char *line = lines; *line;) {
        size_t len = strcspn(line, "\n");
        const char *deleted = strstr(line, "\" deleted");
        if (deleted && deleted < line + len) {
            for (size_t i = 0; i < len; i++) fputc(line[i] >= 0x20 && line[i] < 0x7f ? line[i] : '?', out);
            fputc('\n', out);
            n++;
        }
        line += len + (line[len] == '\n');
    }
    return n;
}

/* Run `kubectl delete ...` (not-found ignored) and say what it deleted; *n how many. */
static keel_status delete_some(const cmd *c, const char *missing, FILE *out, int *n) {
    keel_run_output o;
    int code;
    keel_status st = run(c, "delete", true, KUBECTL_TIMEOUT_S, &o, &code);
    if (st == KEEL_OK && code != 0) st = failed(&o, code, "delete", missing);
    *n = st == KEEL_OK ? say_deleted(o.out, out) : 0;
    keel_run_output_free(&o);
    return st;
}

keel_status keel_k8s_delete(const keel_k8s_job *job, bool keep_etcd, FILE *out) {
    keel_status st = job_check(job, "delete");
    if (st != KEEL_OK) return st;
    if (keep_etcd && job->kind == KEEL_K8S_MPIJOB)
        K8S_ERR(KEEL_ERR_INPUT, "keel k8s delete: --keep-etcd: an MPIJob has no etcd (its ranks meet through "
                "mpirun); leave the option out");
    char ns[96], missing[200], selector[300], field[100];
    const char *in = where_ns(job, ns, sizeof ns);
    snprintf(missing, sizeof missing, "%s %s in %s", kind_name(job->kind), job->name, in);
    cmd c = kubectl("delete");
    add(&c, resource(job->kind));
    add(&c, job->name);
    add(&c, "--ignore-not-found");
    namespace(&c, job);
    int jobs = 0, etcd = 0;
    if ((st = delete_some(&c, missing, out, &jobs)) != KEEL_OK) return st;
    if (!jobs) fprintf(out, "no %s\n", missing);
    if (job->kind == KEEL_K8S_PYTORCHJOB && keep_etcd) fprintf(out, "kept %s-etcd (--keep-etcd)\n", job->name);
    if (job->kind == KEEL_K8S_PYTORCHJOB && !keep_etcd) {
        /* only what `keel k8s manifest` rendered for this job: the name, and keel's three labels on it (a
         * same-named object someone else made is left alone); kubectl lists with both selectors and deletes
         * what the list holds */
        snprintf(selector, sizeof selector, KEEL_K8S_LABEL_MANAGED_BY "=keel," KEEL_K8S_LABEL_INSTANCE "=%s,"
                 KEEL_K8S_LABEL_NAME "=etcd", job->name);
        snprintf(field, sizeof field, "metadata.name=%s-etcd", job->name);
        cmd e = kubectl("delete");
        add(&e, "deployments.v1.apps,services");
        add(&e, "-l");
        add(&e, selector);
        add(&e, "--field-selector");
        add(&e, field);
        add(&e, "--ignore-not-found");
        namespace(&e, job);
        if ((st = delete_some(&e, missing, out, &etcd)) != KEEL_OK) return st;
        if (!etcd)
            fprintf(out, "no etcd Deployment or Service %s-etcd labelled " KEEL_K8S_LABEL_MANAGED_BY "=keel in %s\n",
                    job->name, in);
    }
    if (!jobs && !etcd)
        K8S_ERR(KEEL_ERR_INPUT, "keel k8s delete: no %s%s; nothing deleted", missing,
                job->kind == KEEL_K8S_PYTORCHJOB && !keep_etcd ? ", nor an etcd of keel's for it" : "");
    return KEEL_OK;
}
