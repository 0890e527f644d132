/* k8s/render.c: a spec's manifests as YAML (keel/k8s.h) — the PyTorchJob and
 * the etcd its rendezvous uses, or the MPIJob — and their files written
 * durably. Keys are this file's constants; every value is a double-quoted
 * scalar (keel_k8s_yaml_quote) or a number keel formats, so the YAML has the
 * shape this file writes whatever a spec says. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "keel/k8s.h"

#define ETCD_CLIENT_PORT 2379
#define PYTORCHJOB_PORT 23456 /* the operator's default "pytorchjob-port" */
#define SSH_DIR "/root/.ssh"  /* the MPIJob's sshAuthMountPath (the operator's default) */

void keel_k8s_yaml_quote(keel_strbuf *b, const char *v) {
    keel_strbuf_printf(b, "\"");
    for (const unsigned char *c = (const unsigned char *)v; *c; c++) {
        if (*c == '"' || *c == '\\') keel_strbuf_printf(b, "\\%c", *c);
        else if (*c < 0x20 || *c >= 0x7f) keel_strbuf_printf(b, "\\x%02x", *c); /* no accepted spec has one */
        else keel_strbuf_printf(b, "%c", *c);
    }
    keel_strbuf_printf(b, "\"");
}

/* ---- a YAML writer: one line per call, indent in spaces -------------------------- */

/* "key:" (a mapping or list follows) */
static void key(keel_strbuf *b, int indent, const char *k) { keel_strbuf_printf(b, "%*s%s:\n", indent, "", k); }

/* "key: "value"" */
static void str(keel_strbuf *b, int indent, const char *k, const char *v) {
    keel_strbuf_printf(b, "%*s%s: ", indent, "", k);
    keel_k8s_yaml_quote(b, v);
    keel_strbuf_printf(b, "\n");
}

/* "key: "<printf>"" for values keel formats (numbers as strings, names with suffixes) */
__attribute__((format(printf, 4, 5))) static void strf(keel_strbuf *b, int indent, const char *k, const char *fmt,
                                                        ...) {
    char v[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(v, sizeof v, fmt, ap);
    va_end(ap);
    KEEL_CHECK(n >= 0 && (size_t)n < sizeof v, "k8s: a formatted value of %d bytes", n);
    str(b, indent, k, v);
}

static void num(keel_strbuf *b, int indent, const char *k, int v) {
    keel_strbuf_printf(b, "%*s%s: %d\n", indent, "", k, v);
}

/* "- "value"" */
static void item(keel_strbuf *b, int indent, const char *v) {
    keel_strbuf_printf(b, "%*s- ", indent, "");
    keel_k8s_yaml_quote(b, v);
    keel_strbuf_printf(b, "\n");
}

/* "- name: "value"": a list item that is a mapping; its other keys follow at indent + 2 */
static void named_item(keel_strbuf *b, int indent, const char *name) { str(b, indent, "- name", name); }

static void env_var(keel_strbuf *b, int indent, const char *name, const char *value) {
    named_item(b, indent, name);
    str(b, indent + 2, "value", value);
}

/* ---- the parts of a pod ---------------------------------------------------------- */

static void metadata(keel_strbuf *b, const keel_k8s_spec *s, const char *name, const char *component) {
    key(b, 0, "metadata");
    str(b, 2, "name", name);
    if (s->ns[0]) str(b, 2, "namespace", s->ns);
    key(b, 2, "labels");
    str(b, 4, KEEL_K8S_LABEL_NAME, component);
    str(b, 4, KEEL_K8S_LABEL_INSTANCE, s->name);
    str(b, 4, KEEL_K8S_LABEL_MANAGED_BY, "keel");
}

static void pod_labels(keel_strbuf *b, int indent, const keel_k8s_spec *s, const char *component) {
    key(b, indent, "metadata");
    key(b, indent + 2, "labels");
    str(b, indent + 4, KEEL_K8S_LABEL_NAME, component);
    str(b, indent + 4, KEEL_K8S_LABEL_INSTANCE, s->name);
}

/* GPUs and EFA devices, as extended resources (limits; requests default to them) */
static void resources(keel_strbuf *b, int indent, const keel_k8s_spec *s) {
    if (!s->gpus_per_node && !s->efa_per_node) return;
    key(b, indent, "resources");
    key(b, indent + 2, "limits");
    if (s->gpus_per_node) strf(b, indent + 4, "nvidia.com/gpu", "%d", s->gpus_per_node);
    if (s->efa_per_node) strf(b, indent + 4, "vpc.amazonaws.com/efa", "%d", s->efa_per_node);
}

static void mounts(keel_strbuf *b, int indent, const keel_k8s_spec *s, bool shm) {
    key(b, indent, "volumeMounts");
    if (shm) {
        named_item(b, indent, "dshm");
        str(b, indent + 2, "mountPath", "/dev/shm");
    }
    named_item(b, indent, "checkpoints");
    str(b, indent + 2, "mountPath", s->checkpoint_mount);
}

/* /dev/shm memory-backed and sized for the in-memory snapshots; the shared checkpoint claim */
static void volumes(keel_strbuf *b, int indent, const keel_k8s_spec *s, bool shm) {
    key(b, indent, "volumes");
    if (shm) {
        named_item(b, indent, "dshm");
        key(b, indent + 2, "emptyDir");
        str(b, indent + 4, "medium", "Memory");
        strf(b, indent + 4, "sizeLimit", "%dGi", s->shm_gib);
    }
    named_item(b, indent, "checkpoints");
    key(b, indent + 2, "persistentVolumeClaim");
    str(b, indent + 4, "claimName", s->claim);
}

/* The PyTorchJob's pod: container "pytorch" running `keel agent CONFIG --run-dir MOUNT/runs/NAME`. */
static void pytorch_pod(keel_strbuf *b, int indent, const keel_k8s_spec *s) {
    key(b, indent, "template");
    pod_labels(b, indent + 2, s, "keel");
    key(b, indent + 2, "spec");
    int c = indent + 4;
    key(b, c, "containers");
    named_item(b, c, "pytorch");
    str(b, c + 2, "image", s->image);
    key(b, c + 2, "command");
    char run_dir[1200];
    snprintf(run_dir, sizeof run_dir, "%s/runs/%s", s->checkpoint_mount, s->name); /* every pod sees it */
    const char *argv[] = {"keel", "agent", s->config, "--run-dir", run_dir};
    for (size_t i = 0; i < sizeof argv / sizeof *argv; i++) item(b, c + 2, argv[i]);
    if (!s->elastic || s->efa_per_node) {
        key(b, c + 2, "env");
        if (!s->elastic) {
            /* elasticPolicy gives the elastic pods these; a fixed job's agents meet in the same etcd */
            env_var(b, c + 2, "PET_RDZV_BACKEND", "etcd");
            named_item(b, c + 2, "PET_RDZV_ENDPOINT");
            strf(b, c + 4, "value", "%s-etcd:%d", s->name, ETCD_CLIENT_PORT);
            env_var(b, c + 2, "PET_RDZV_ID", s->run_id);
        }
        if (s->efa_per_node) env_var(b, c + 2, "FI_PROVIDER", "efa");
    }
    key(b, c + 2, "ports");
    named_item(b, c + 2, "pytorchjob-port");
    num(b, c + 4, "containerPort", PYTORCHJOB_PORT);
    resources(b, c + 2, s);
    mounts(b, c + 2, s, true);
    volumes(b, c, s, true);
}

static void pytorch_replicas(keel_strbuf *b, const keel_k8s_spec *s, const char *type, int replicas) {
    key(b, 4, type);
    num(b, 6, "replicas", replicas);
    str(b, 6, "restartPolicy", "OnFailure");
    pytorch_pod(b, 6, s);
}

static void pytorchjob(keel_strbuf *b, const keel_k8s_spec *s) {
    keel_strbuf_printf(b, "# keel k8s manifest: the PyTorchJob; each pod runs `keel agent`, which meets the others "
                          "in etcd\n");
    str(b, 0, "apiVersion", "kubeflow.org/v1");
    str(b, 0, "kind", "PyTorchJob");
    metadata(b, s, s->name, "keel");
    key(b, 0, "spec");
    strf(b, 2, "nprocPerNode", "%d", s->nproc_per_node);
    if (s->elastic) {
        key(b, 2, "elasticPolicy");
        num(b, 4, "minReplicas", s->min_nodes);
        num(b, 4, "maxReplicas", s->max_nodes);
        str(b, 4, "rdzvBackend", "etcd");
        strf(b, 4, "rdzvHost", "%s-etcd", s->name);
        num(b, 4, "rdzvPort", ETCD_CLIENT_PORT);
        str(b, 4, "rdzvId", s->run_id);
        num(b, 4, "maxRestarts", s->max_restarts);
    }
    key(b, 2, "pytorchReplicaSpecs");
    if (s->master) pytorch_replicas(b, s, "Master", 1);
    int workers = s->master ? s->nodes - 1 : s->nodes;
    if (workers > 0) pytorch_replicas(b, s, "Worker", workers);
}

/* ---- etcd: one member, its data in the pod (a job's rendezvous state lives as long as the job) ---- */

static void etcd_deployment(keel_strbuf *b, const keel_k8s_spec *s) {
    char name[KEEL_K8S_NAME_MAX + 8], url[KEEL_K8S_NAME_MAX + 32];
    snprintf(name, sizeof name, "%s-etcd", s->name);
    snprintf(url, sizeof url, "http://%s:%d", name, ETCD_CLIENT_PORT);
    keel_strbuf_printf(b, "# keel k8s manifest: etcd for the rendezvous (v3 API on port %d; keys under "
                          "/keel/<runId>/)\n", ETCD_CLIENT_PORT);
    str(b, 0, "apiVersion", "apps/v1");
    str(b, 0, "kind", "Deployment");
    metadata(b, s, name, "etcd");
    key(b, 0, "spec");
    num(b, 2, "replicas", 1);
    key(b, 2, "selector");
    key(b, 4, "matchLabels");
    str(b, 6, KEEL_K8S_LABEL_NAME, "etcd");
    str(b, 6, KEEL_K8S_LABEL_INSTANCE, s->name);
    key(b, 2, "template");
    pod_labels(b, 4, s, "etcd");
    key(b, 4, "spec");
    key(b, 6, "containers");
    named_item(b, 6, "etcd");
    str(b, 8, "image", s->etcd_image);
    key(b, 8, "command");
    const char *argv[] = {"/usr/local/bin/etcd", "--name", name, "--data-dir", "/var/lib/etcd",
                          "--listen-client-urls", "http://0.0.0.0:2379", "--advertise-client-urls", url};
    for (size_t i = 0; i < sizeof argv / sizeof *argv; i++) item(b, 8, argv[i]);
    key(b, 8, "ports");
    named_item(b, 8, "client");
    num(b, 10, "containerPort", ETCD_CLIENT_PORT);
    key(b, 8, "readinessProbe");
    key(b, 10, "httpGet");
    str(b, 12, "path", "/health");
    num(b, 12, "port", ETCD_CLIENT_PORT);
    key(b, 8, "volumeMounts");
    named_item(b, 8, "data");
    str(b, 10, "mountPath", "/var/lib/etcd");
    key(b, 6, "volumes");
    named_item(b, 6, "data");
    keel_strbuf_printf(b, "%*semptyDir: {}\n", 8, "");
}

static void etcd_service(keel_strbuf *b, const keel_k8s_spec *s) {
    char name[KEEL_K8S_NAME_MAX + 8];
    snprintf(name, sizeof name, "%s-etcd", s->name);
    str(b, 0, "apiVersion", "v1");
    str(b, 0, "kind", "Service");
    metadata(b, s, name, "etcd");
    key(b, 0, "spec");
    key(b, 2, "selector");
    str(b, 4, KEEL_K8S_LABEL_NAME, "etcd");
    str(b, 4, KEEL_K8S_LABEL_INSTANCE, s->name);
    key(b, 2, "ports");
    named_item(b, 2, "client");
    num(b, 4, "port", ETCD_CLIENT_PORT);
    num(b, 4, "targetPort", ETCD_CLIENT_PORT);
    str(b, 4, "protocol", "TCP");
}

/* ---- the MPIJob: the launcher runs the supervisor, the workers sshd ---------------- */

static void mpi_replicas(keel_strbuf *b, const keel_k8s_spec *s, bool launcher) {
    key(b, 4, launcher ? "Launcher" : "Worker");
    num(b, 6, "replicas", launcher ? 1 : s->nodes);
    /* the launcher's supervisor resumes the run from its directory; a worker alone cannot rejoin mpirun's job */
    str(b, 6, "restartPolicy", launcher ? "OnFailure" : "Never");
    key(b, 6, "template");
    pod_labels(b, 8, s, launcher ? "keel-launcher" : "keel-worker");
    key(b, 8, "spec");
    key(b, 10, "containers");
    named_item(b, 10, launcher ? "launcher" : "worker");
    str(b, 12, "image", s->image);
    key(b, 12, "command");
    if (launcher) {
        char nproc[16], run_dir[1200];
        snprintf(nproc, sizeof nproc, "%d", s->nodes * s->nproc_per_node);
        snprintf(run_dir, sizeof run_dir, "%s/runs/%s", s->checkpoint_mount, s->name);
        const char *argv[] = {"keel", "train", s->config, "--nproc", nproc, "--run-dir", run_dir};
        for (size_t i = 0; i < sizeof argv / sizeof *argv; i++) item(b, 12, argv[i]);
    } else {
        item(b, 12, "/usr/sbin/sshd");
        item(b, 12, "-De");
        if (s->efa_per_node) {
            key(b, 12, "env");
            env_var(b, 12, "FI_PROVIDER", "efa");
        }
        resources(b, 12, s);
    }
    mounts(b, 12, s, !launcher);
    volumes(b, 10, s, !launcher);
}

static void mpijob(keel_strbuf *b, const keel_k8s_spec *s) {
    keel_strbuf_printf(b, "# keel k8s manifest: the MPIJob; the launcher runs `keel train --nproc` over the "
                          "operator's hostfile\n");
    str(b, 0, "apiVersion", "kubeflow.org/v2beta1");
    str(b, 0, "kind", "MPIJob");
    metadata(b, s, s->name, "keel");
    key(b, 0, "spec");
    num(b, 2, "slotsPerWorker", s->nproc_per_node);
    key(b, 2, "runPolicy");
    str(b, 4, "cleanPodPolicy", "Running");
    str(b, 2, "sshAuthMountPath", SSH_DIR);
    str(b, 2, "mpiImplementation", "OpenMPI");
    key(b, 2, "mpiReplicaSpecs");
    mpi_replicas(b, s, true);
    mpi_replicas(b, s, false);
}

/* ---- out ------------------------------------------------------------------------------ */

int keel_k8s_render_files(const keel_k8s_spec *s, keel_k8s_file files[KEEL_K8S_MAX_FILES]) {
    keel_strbuf b = {0};
    if (s->kind == KEEL_K8S_MPIJOB) {
        mpijob(&b, s);
        files[0] = (keel_k8s_file){"mpijob.yaml", b.s};
        return 1;
    }
    etcd_deployment(&b, s);
    keel_strbuf_printf(&b, "---\n");
    etcd_service(&b, s);
    files[0] = (keel_k8s_file){"etcd.yaml", b.s};
    b = (keel_strbuf){0};
    pytorchjob(&b, s);
    files[1] = (keel_k8s_file){"pytorchjob.yaml", b.s};
    return 2;
}

char *keel_k8s_render(const keel_k8s_spec *s) {
    keel_k8s_file files[KEEL_K8S_MAX_FILES];
    int n = keel_k8s_render_files(s, files);
    keel_strbuf b = {0};
    for (int i = 0; i < n; i++) {
        keel_strbuf_printf(&b, "%s%s", i ? "---\n" : "", files[i].yaml);
        keel_free(files[i].yaml);
    }
    return b.s;
}

keel_status keel_k8s_write(const keel_k8s_spec *s, const char *dir, bool replace) {
    keel_k8s_file files[KEEL_K8S_MAX_FILES];
    int n = keel_k8s_render_files(s, files);
    keel_status st = KEEL_OK;
    for (int i = 0; i < n && !replace && st == KEEL_OK; i++) {
        char *p = keel_path_join(dir, files[i].name);
        if (keel_path_exists(p)) {
            keel_errorf("%s exists; keel k8s manifest never overwrites unless asked (move it away, pick another "
                        "--out, or add --force)", p);
            st = KEEL_ERR_INPUT;
        }
        keel_free(p);
    }
    if (st == KEEL_OK) st = keel_mkdirs(dir);
    for (int i = 0; i < n && st == KEEL_OK; i++) {
        char *p = keel_path_join(dir, files[i].name);
        st = keel_write_file_atomic(p, files[i].yaml, strlen(files[i].yaml));
        keel_free(p);
    }
    for (int i = 0; i < n; i++) keel_free(files[i].yaml);
    return st;
}
