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

/* A spec is data, never code: every name and path in it matches a strict
 * grammar (docs/slurm.md, "What a spec may say") before anything uses it.
 * Names: [a-z][a-z0-9-]*, bounded. Paths: absolute once resolved, made of
 * A-Z a-z 0-9 . _ - and '/', no '..' component ('//' and '.' are dropped),
 * not '/', at most KEEL_CLUSTER_PATH_MAX bytes (StateDir: KEEL_CLUSTER_STATE_DIR_MAX).
 * So every value can go into a shell line, slurm.conf or a C string as it is. */
#define KEEL_CLUSTER_PATH_MAX 1024
#define KEEL_CLUSTER_STATE_DIR_MAX 80 /* StateDir/munge/munge.sock fits a Unix socket's 108 bytes */

/* Parse and check a spec file (every error is one line naming the file, the
 * key, the value and the fix: KEEL_ERR_INPUT). Relative paths are relative to
 * the spec's directory. Besides the text's checks it looks at the disk:
 * lifecycle scripts must exist. *s is the caller's to free (on success). */
keel_status keel_cluster_spec_load(const char *path, keel_cluster_spec *s);
/* The fuzz entry: parse len bytes of spec text (no NUL needed; a NUL byte in
 * them is refused) without touching any file: path only names the spec in
 * messages, base_dir (absolute; NULL: none, a relative path is refused) is
 * what relative paths are relative to. Lifecycle scripts are not looked for
 * (keel_cluster_spec_load does). On error *s is freed and zeroed. */
keel_status keel_cluster_spec_parse(const char *text, size_t len, const char *path, const char *base_dir,
                                    keel_cluster_spec *s);
void keel_cluster_spec_free(keel_cluster_spec *s);
/* Real hosts (`slurm-conf --hosts FILE`): each line "NAME ADDRESS GROUP",
 * '#' comments; every group gets exactly its InstanceCount hosts. NAME is a
 * name ([a-z][a-z0-9-]*, at most 63), ADDRESS an IPv4 address or a host name
 * of [a-z0-9.-]. Replaces the nodes' names and addresses. */
keel_status keel_cluster_hosts_load(keel_cluster_spec *s, const char *path);
/* The same on len bytes of a hosts file's text (the fuzz entry; path names it in messages). */
keel_status keel_cluster_hosts_parse(keel_cluster_spec *s, const char *text, size_t len, const char *path);

/* Where the files a cluster's Slurm reads live, and the programs they name. */
typedef struct {
    bool local;            /* this machine's namespaced cluster: munge socket, spools, logs in state_dir */
    const char *conf_dir;  /* slurm.conf, plugstack.conf, keel-health.sh, keel-node.json */
    const char *keel;      /* the keel binary the health program runs */
    const char *plugin;    /* keel_auto_resume.so */
} keel_cluster_files;

/* slurm.conf's text (malloc'd); f's paths clean (keel_cluster_write_files checks them). */
char *keel_cluster_slurm_conf(const keel_cluster_spec *s, const keel_cluster_files *f);
/* Write slurm.conf, plugstack.conf, cgroup.conf, gres.conf (with GPUs),
 * keel-node.json and keel-health.sh into dir (they name f->conf_dir, where
 * they will be); refuses (before writing any) when one exists and !replace,
 * and when a path of f breaks the grammar (Slurm's files cannot quote) or,
 * for real hosts (!f->local), lies under /tmp or /dev/shm, which every host
 * has its own of. keel-health.sh single-quotes every path. */
keel_status keel_cluster_write_files(const keel_cluster_spec *s, const keel_cluster_files *f, const char *dir,
                                     bool replace);
/* The auto-resume plugin: the spec's, or the one built or installed beside
 * keel (*out malloc'd, keel_free). */
keel_status keel_cluster_find_plugin(const keel_cluster_spec *s, const char *keel, char **out);
/* Where `up` puts its copies of keel and the plugin: StateDir/bin/keel and
 * StateDir/lib/keel/keel_auto_resume.so (malloc'd): every node sees
 * StateDir, whatever directory keel was built in. */
char *keel_cluster_keel_path(const keel_cluster_spec *s);
char *keel_cluster_plugin_path(const keel_cluster_spec *s);
/* `keel cluster env`'s text: export lines of SLURM_CONF, KEEL_CLUSTER_SHARED
 * and KEEL_CLUSTER_KEEL, each value single-quoted (safe to eval); malloc'd,
 * NULL with an error when a value cannot be quoted. */
char *keel_cluster_env_text(const keel_cluster_spec *s);

/* Append v to b single-quoted for sh/bash ('it'\''s'), the one shell quoting
 * of the cluster module; false (b untouched) when v holds a control
 * character, which no line-oriented file or eval'd line should carry. */
bool keel_cluster_sh_quote(keel_strbuf *b, const char *v);
/* A value as an error line may show it: control characters, '\\' and
 * bytes >= 0x7f escaped (\n, \x1b), cut after max_bytes (at most 320) with
 * its length said. Use .s within the same expression (a temporary). */
typedef struct {
    char s[1320];
} keel_cluster_shown;
keel_cluster_shown keel_cluster_show(const char *v, size_t max_bytes);
const char *keel_node_role_name(keel_node_role r);

/* ---- this machine's namespaced cluster (local.c); root only ------------------- */

/* Refused before anything starts (KEEL_ERR_INPUT, one line naming the path):
 * a plugin that is missing or not a shared object, a library keel loads from
 * /tmp or /dev/shm, a StateDir or SharedDir that leads there through a
 * symlink, a StateDir that is not empty and not this cluster's (its
 * .keel-cluster), a cluster up already, a subnet of this machine's. A daemon
 * that does not start is one line with its log and what the log says. */
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
