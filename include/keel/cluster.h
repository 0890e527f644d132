/* cluster: `keel cluster` — a Slurm cluster described by a spec shaped like
 * SageMaker HyperPod's create-cluster input (instance groups with counts and
 * lifecycle scripts), either brought up on this one machine with every node
 * its own host (network, UTS and mount namespaces on a bridge: spec.c writes
 * the files, local.c runs it), or written out as slurm.conf and friends for
 * real hosts (docs/slurm.md).
 *
 *     keel_cluster_spec s;
 *     keel_cluster_spec_load("examples/cluster-local.json", &s);
 *     keel_cluster_up(&s);        // bridge, namespaces, on_create, munge, slurmctld, slurmd
 *     keel_cluster_down(&s);      // nothing left: no process, namespace, bridge or mount
 */
#ifndef KEEL_CLUSTER_H
#define KEEL_CLUSTER_H

#include <stdio.h>

#include "keel/core.h"

typedef enum { KEEL_ROLE_CONTROLLER, KEEL_ROLE_LOGIN, KEEL_ROLE_WORKER } keel_node_role;

typedef struct {
    char name[24];       /* InstanceGroupName */
    keel_node_role role; /* Role */
    int count;           /* InstanceCount */
    int cpus, gpus;      /* Cpus, Gpus: what Slurm is told a worker has */
    int memory_mib;      /* MemoryMiB */
    char *on_create;     /* LifeCycleConfig.OnCreate, absolute; NULL = none */
    char *source_dir;    /* LifeCycleConfig.SourceDir, absolute: the script's working directory */
} keel_cluster_group;

typedef struct {
    char name[64];  /* group name + index (worker3), or the hosts file's */
    char addr[64];  /* local: in Subnet; real hosts: the hosts file's */
    int group;      /* index into groups */
} keel_cluster_node;

typedef struct {
    char name[33];           /* ClusterName */
    char *path;              /* the spec file, for errors */
    char *state_dir;         /* StateDir: configs, logs, spools, the munge key */
    char *shared_dir;        /* SharedDir: the same path on every node (HyperPod's /fsx) */
    char *partition;         /* Partition */
    char *plugin;            /* AutoResumePlugin; NULL = found next to keel */
    char *health;            /* HealthCheck: a node config (keel health --node-config), as JSON text */
    int health_timeout_s;    /* HealthTimeoutS: srun --auto-resume's per-node health check limit */
    uint32_t subnet;         /* Subnet's network address (host order) */
    int prefix;              /* Subnet's prefix length */
    keel_cluster_group *groups;
    int ngroups;
    keel_cluster_node *nodes; /* controller first, then login, then workers, each in group order */
    int nnodes;
} keel_cluster_spec;

/* Parse and check a spec (every error names the file and key: one line,
 * KEEL_ERR_INPUT). Relative paths are relative to the spec's directory. */
keel_status keel_cluster_spec_load(const char *path, keel_cluster_spec *s);
keel_status keel_cluster_spec_parse(const char *json, const char *path, keel_cluster_spec *s);
void keel_cluster_spec_free(keel_cluster_spec *s);
/* Real hosts (`slurm-conf --hosts FILE`): each line "NAME ADDRESS GROUP",
 * '#' comments; every group gets exactly its InstanceCount hosts. Replaces
 * the nodes' names and addresses. */
keel_status keel_cluster_hosts_load(keel_cluster_spec *s, const char *path);

/* Where the files a cluster's Slurm reads live, and the programs they name. */
typedef struct {
    bool local;            /* this machine's namespaced cluster: munge socket, spools, logs in state_dir */
    const char *conf_dir;  /* slurm.conf, plugstack.conf, keel-health.sh, keel-node.json */
    const char *keel;      /* the keel binary the health program runs */
    const char *plugin;    /* keel_auto_resume.so */
} keel_cluster_files;

/* slurm.conf's text (malloc'd). */
char *keel_cluster_slurm_conf(const keel_cluster_spec *s, const keel_cluster_files *f);
/* Write slurm.conf, plugstack.conf, cgroup.conf, gres.conf (with GPUs),
 * keel-node.json and keel-health.sh into dir (they name f->conf_dir, where
 * they will be); refuses (before writing any) when one exists and !replace. */
keel_status keel_cluster_write_files(const keel_cluster_spec *s, const keel_cluster_files *f, const char *dir,
                                     bool replace);
/* The auto-resume plugin: the spec's, or the one built or installed beside keel. */
keel_status keel_cluster_find_plugin(const keel_cluster_spec *s, const char *keel, char *out, size_t n);
const char *keel_node_role_name(keel_node_role r);

/* ---- this machine's namespaced cluster (local.c); root only ------------------- */

keel_status keel_cluster_up(const keel_cluster_spec *s);
/* Stops every process in the nodes' namespaces and removes the namespaces,
 * veths and the bridge; StateDir's logs and SharedDir stay. Fine on a
 * cluster partly up or already down. */
keel_status keel_cluster_down(const keel_cluster_spec *s);
/* Nodes, their processes and Slurm states/drain reasons; false when not up. */
bool keel_cluster_status(const keel_cluster_spec *s, FILE *out);
/* Run argv on node (its namespaces, SLURM_CONF set), stdio inherited: its exit code. */
int keel_cluster_exec(const keel_cluster_spec *s, const char *node, char *const *argv);

#endif
