/* k8s: `keel k8s manifest` — the Kubernetes objects that run keel under the
 * Kubeflow operators, rendered from a small JSON spec (docs/kubernetes.md):
 * a kubeflow.org/v1 PyTorchJob (one Master and Workers, or elastic Workers
 * only) with the etcd Deployment and Service its rendezvous uses, or a
 * kubeflow.org/v2beta1 MPIJob whose launcher runs `keel train --nproc N` over
 * the operator's hostfile. A spec is data, never code: every value is held to
 * a grammar when parsed and double-quoted when written, so no spec value can
 * add a key or a document to the YAML.
 *
 *     keel_k8s_spec s;
 *     if (keel_k8s_spec_load("examples/k8s-pytorchjob.json", &s) != KEEL_OK) return 2;
 *     char *yaml = keel_k8s_render(&s);    // every document, "---" between them
 *     fputs(yaml, stdout);
 *     keel_free(yaml);
 *     keel_k8s_spec_free(&s);
 */
#ifndef KEEL_K8S_H
#define KEEL_K8S_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "keel/core.h"

typedef enum { KEEL_K8S_PYTORCHJOB, KEEL_K8S_MPIJOB } keel_k8s_kind;

#define KEEL_K8S_NAME_MAX 63  /* a DNS label */
#define KEEL_K8S_CLAIM_MAX 253 /* a DNS subdomain */

typedef struct {
    char *path;                           /* the spec file, for errors */
    keel_k8s_kind kind;                   /* kind: "PyTorchJob" (default) or "MPIJob" */
    char name[KEEL_K8S_NAME_MAX + 1];     /* name: the job's, a DNS-1035 label */
    char ns[KEEL_K8S_NAME_MAX + 1];       /* namespace: a DNS-1123 label; "" = kubectl's current one */
    char *image;                          /* image: keel's container image */
    int nodes;                            /* nodes: pods that run ranks (Master included) */
    bool master;                          /* master: a Master pod (PyTorchJob, not elastic) */
    bool elastic;                         /* elastic: {...} given (PyTorchJob: Workers only) */
    int min_nodes, max_nodes;             /* elastic.minNodes, elastic.maxNodes */
    int max_restarts;                     /* elastic.maxRestarts */
    int nproc_per_node;                   /* nprocPerNode: ranks per pod */
    int gpus_per_node;                    /* gpusPerNode: nvidia.com/gpu per pod (0 or nprocPerNode) */
    int efa_per_node;                     /* efaPerNode: vpc.amazonaws.com/efa per pod */
    int shm_gib;                          /* shmSizeGiB: /dev/shm, memory-backed */
    char claim[KEEL_K8S_CLAIM_MAX + 1];   /* checkpointClaim: the shared volume's PVC */
    char *checkpoint_mount;               /* checkpointMountPath: where pods see it */
    char *config;                         /* config: keel's config path inside the container */
    char run_id[KEEL_K8S_NAME_MAX + 1];   /* runId: the rendezvous' job-unique id (PyTorchJob) */
    char *etcd_image;                     /* etcdImage (PyTorchJob) */
} keel_k8s_spec;

/* Read and check a spec file — JSON, or with a name ending in ".env" the AWS
 * guide's shell variables (keel_k8s_env_parse): every error is one line
 * naming the file, the key, the value and the fix (KEEL_ERR_INPUT). A spec
 * without runId gets "<name>-<UTC time of rendering>" so that two jobs of one
 * name never share a rendezvous. *s is the caller's to free (on success). */
keel_status keel_k8s_spec_load(const char *path, keel_k8s_spec *s);
/* The same on len bytes of spec text (no NUL needed; a NUL byte is refused);
 * path only names the spec in messages; default_run_id is what a spec
 * without runId gets (NULL: "<name>-run"). On error *s is freed and zeroed. */
keel_status keel_k8s_spec_parse(const char *text, size_t len, const char *path, const char *default_run_id,
                                keel_k8s_spec *s);
void keel_k8s_spec_free(keel_k8s_spec *s);
/* The same from a .env file's text (keel_k8s_spec_load reads a file whose
 * name ends in ".env" so): the AWS EKS guide's shell variables (IMAGE_URI,
 * NUM_NODES, GPU_PER_NODE, ...; docs/kubernetes.md has the table), NAME=VALUE
 * lines, '#' comments, an optional `export `, a value bare or quoted, never
 * expanded ('$', '`' and '\' are refused). Every error is one line naming
 * the file, the line, the variable and the fix. */
keel_status keel_k8s_env_parse(const char *text, size_t len, const char *path, const char *default_run_id,
                               keel_k8s_spec *s);

/* The Kubernetes name grammars (every spec name is held to one): a DNS-1123
 * label ([a-z0-9]([-a-z0-9]*[a-z0-9])?, at most 63), a DNS-1035 label (the
 * same with a letter first: a job's name), a DNS-1123 subdomain (such labels
 * joined by '.', at most 253: a pod's or a claim's name). None can start with
 * '-', so none can be read as an option. */
bool keel_k8s_dns1123_label(const char *v);
bool keel_k8s_dns1035_label(const char *v);
bool keel_k8s_dns1123_subdomain(const char *v);

/* The manifests: one file's worth each (its name, e.g. "pytorchjob.yaml",
 * and its YAML, one or more documents). */
#define KEEL_K8S_MAX_FILES 2
typedef struct {
    const char *name;
    char *yaml; /* malloc'd */
} keel_k8s_file;
/* Fill files[] in apply order (etcd first); returns how many. Free each yaml with keel_free. */
int keel_k8s_render_files(const keel_k8s_spec *s, keel_k8s_file files[KEEL_K8S_MAX_FILES]);
/* Every document in one text, "---" lines between them (malloc'd). */
char *keel_k8s_render(const keel_k8s_spec *s);
/* Write the files into dir (made if missing), each atomically; refuses
 * before writing any when one exists and !replace. */
keel_status keel_k8s_write(const keel_k8s_spec *s, const char *dir, bool replace);

/* Append v to b as a YAML double-quoted scalar: '"' and '\\' escaped, every
 * byte below 0x20 and 0x7f as \xNN, so the value stays one scalar on one line. */
void keel_k8s_yaml_quote(keel_strbuf *b, const char *v);

/* ---- keel k8s status: a job on a cluster as kubectl tells it ------------------------ */

/* kubectl's JSON for a job of 1000 pods is a few MB; more is not kubectl's answer. */
#define KEEL_K8S_ANSWER_MAX_BYTES (64u << 20)

/* What `keel k8s status` shows, read from kubectl's JSON (status.c): every
 * text cut to its field and kept to printable ASCII. */
#define KEEL_K8S_MAX_REPLICA_TYPES 4 /* a job has two: Master or Launcher, and Worker */
#define KEEL_K8S_MAX_PODS 4096       /* shown; more are counted (a spec has at most 1000 nodes) */
typedef struct {
    char type[32];                 /* "Master", "Worker", "Launcher" */
    int active, succeeded, failed; /* -1: not a count */
} keel_k8s_replicas;
typedef struct {
    char name[254], phase[32], node[254]; /* node "": not scheduled */
    char waiting[64];                     /* a container's waiting reason ("ContainerCreating"), or "" */
    int ready, containers;                /* containers ready, of the pod's */
    int restarts;                         /* over its containers; -1: not a count */
    int64_t created_s;                    /* Unix seconds; -1: unknown */
} keel_k8s_pod;
typedef struct {
    char kind[32], name[254], ns[64];
    char state[32];    /* the type of the last condition whose status is "True" ("Running", "Failed"); "": none */
    char reason[128], message[512];
    keel_k8s_replicas replicas[KEEL_K8S_MAX_REPLICA_TYPES];
    int n_replicas, more_replicas;
    keel_k8s_pod *pods; /* malloc'd */
    int n_pods, more_pods;
} keel_k8s_state;
/* Read kubectl's answers: the job (`kubectl get KIND NAME -o json`) and its
 * pods (`kubectl get pods -l ... -o json`), job_len and pods_len bytes (no NUL
 * needed). Fields missing or of the wrong type are shown as unknown; a text
 * that is not one JSON object is an error line. *st is the caller's to free
 * with keel_k8s_state_free (also after an error). */
keel_status keel_k8s_state_parse(const char *job_json, size_t job_len, const char *pods_json, size_t pods_len,
                                  keel_k8s_state *st);
void keel_k8s_state_free(keel_k8s_state *st);
/* The summary: the job and its namespace, its state with reason and message,
 * replicas per type, then one line per pod (name, phase, ready, restarts,
 * node, age at now_s). */
void keel_k8s_state_print(const keel_k8s_state *st, int64_t now_s, FILE *out);

/* ---- keel k8s status|logs|delete: a job on a cluster, through kubectl ---------------- */

/* A job as the commands name it: its kind, name (a DNS-1035 label) and
 * namespace (a DNS-1123 label; NULL: kubectl's current namespace). */
typedef struct {
    keel_k8s_kind kind;
    const char *name;
    const char *ns;
} keel_k8s_job;

/* The labels keel puts on every object it renders (render.c): `keel k8s
 * delete` deletes an etcd Deployment or Service only where all three say it
 * is keel's for this job. */
#define KEEL_K8S_LABEL_NAME "app.kubernetes.io/name"             /* "keel", "etcd" */
#define KEEL_K8S_LABEL_INSTANCE "app.kubernetes.io/instance"     /* the job's name */
#define KEEL_K8S_LABEL_MANAGED_BY "app.kubernetes.io/managed-by" /* "keel" */

/* The commands (kubectl.c). Each checks the job's name and namespace first
 * (nothing runs on a bad one: exit 2), then runs kubectl — $KEEL_KUBECTL, or
 * kubectl on PATH — from an argv, never a shell. kubectl missing, or failing,
 * is one error line (its own first line); a job that is not there is
 * KEEL_ERR_INPUT naming it and its namespace. */
/* Print the job's summary to out; *failed: its state is Failed. */
keel_status keel_k8s_status(const keel_k8s_job *job, FILE *out, bool *failed);
typedef struct {
    const char *pod; /* one pod by name ("NAME-..."), or NULL */
    int node;        /* one pod by index: NAME-worker-I; KEEL_K8S_MASTER: NAME-master-0; -1: none */
    bool follow;
    int tail; /* lines per pod; -1: kubectl's default */
} keel_k8s_logs_opts;
#define KEEL_K8S_MASTER (-2)
/* Stream the logs to stdout: every pod of a PyTorchJob (container "pytorch",
 * lines prefixed with the pod), the launcher of an MPIJob, or one pod. */
keel_status keel_k8s_logs(const keel_k8s_job *job, const keel_k8s_logs_opts *o);
/* Delete the job and, for a PyTorchJob unless keep_etcd, the NAME-etcd
 * Deployment and Service that carry keel's labels (nothing else); each thing
 * deleted, or not found, is a line on out. */
keel_status keel_k8s_delete(const keel_k8s_job *job, bool keep_etcd, FILE *out);

#endif
