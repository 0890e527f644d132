/* cli/cmd_cluster.c: `keel cluster up|down|status|env|exec|slurm-conf SPEC.json`
 * — a Slurm cluster from a HyperPod-shaped spec (keel/cluster.h). */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "keel/cluster.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: keel cluster up|down|status|env SPEC.json\n"
            "       keel cluster exec SPEC.json NODE -- COMMAND [ARG...]\n"
            "       keel cluster slurm-conf SPEC.json --hosts FILE [--out DIR] [--conf-dir DIR] [--keel PATH]\n"
            "  up          bring the spec's cluster up on this machine (root): every node its own host (network,\n"
            "              UTS and mount namespaces on a bridge), LifeCycleConfig.OnCreate once per node, munge,\n"
            "              slurmctld on the controller, slurmd on each worker, srun --auto-resume and the health\n"
            "              epilog installed; waits until every worker is idle\n"
            "  down        stop every process of the cluster's nodes and remove its namespaces and bridge\n"
            "              (StateDir's logs and SharedDir's data stay)\n"
            "  status      nodes, roles, addresses, daemons, Slurm states and drain reasons (exit 1: not all up)\n"
            "  env         export lines for this shell's sbatch/srun/sinfo (SLURM_CONF, KEEL_CLUSTER_SHARED, and\n"
            "              KEEL_CLUSTER_KEEL: the cluster's copy of keel, which every node sees):\n"
            "              eval \"$(keel cluster env SPEC)\"\n"
            "  exec        run a command on a node (like ssh to it), SLURM_CONF set\n"
            "  slurm-conf  for real hosts: slurm.conf, plugstack.conf, cgroup.conf, gres.conf (GPUs),\n"
            "              keel-node.json, keel-health.sh into --out (default .), never overwriting;\n"
            "              --hosts has lines \"NAME ADDRESS GROUP\"; the files name --conf-dir (default\n"
            "              /etc/slurm) and --keel (default /usr/local/bin/keel), paths every host has (not\n"
            "              under /tmp or /dev/shm)\n"
            "the spec: docs/slurm.md; examples/cluster-local.json\n");
}

static int slurm_conf(keel_cluster_spec *s, int argc, char **argv) {
    const char *hosts = NULL, *out = ".", *conf_dir = "/etc/slurm", *keel = "/usr/local/bin/keel";
    for (int i = 0; i < argc; i++) {
        const char **dst = !strcmp(argv[i], "--hosts")      ? &hosts
                           : !strcmp(argv[i], "--out")      ? &out
                           : !strcmp(argv[i], "--conf-dir") ? &conf_dir
                           : !strcmp(argv[i], "--keel")     ? &keel
                                                            : NULL;
        if (!dst || i + 1 == argc) {
            keel_errorf("keel cluster slurm-conf: %s '%s' (see keel cluster --help)",
                        dst ? "no value for" : "unknown option", keel_cluster_show(argv[i], 60).s);
            return 2;
        }
        *dst = argv[++i];
    }
    if (!hosts) {
        keel_errorf("keel cluster slurm-conf: --hosts FILE is required (lines \"NAME ADDRESS GROUP\")");
        return 2;
    }
    keel_status st = keel_cluster_hosts_load(s, hosts);
    if (st != KEEL_OK) return keel_status_exit_code(st);
    const char *plugin = s->plugin ? s->plugin : "/usr/local/lib/keel/keel_auto_resume.so";
    keel_cluster_files f = {.local = false, .conf_dir = conf_dir, .keel = keel, .plugin = plugin};
    st = keel_cluster_write_files(s, &f, out, false);
    if (st == KEEL_OK)
        printf("wrote %s/{slurm.conf,plugstack.conf,cgroup.conf,keel-node.json,keel-health.sh}\n",
               keel_cluster_show(out, 160).s);
    return keel_status_exit_code(st);
}

int keel_cmd_cluster(int argc, char **argv) {
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return 0;
    }
    static const char *const verbs[] = {"up", "down", "status", "env", "exec", "slurm-conf", NULL};
    bool known = false;
    for (const char *const *v = verbs; *v && argc >= 2; v++) known |= !strcmp(argv[1], *v);
    if (argc < 3 || !known) {
        if (argc >= 2 && !known)
            keel_errorf("keel cluster: unknown command '%s' (up, down, status, env, exec, slurm-conf)",
                        keel_cluster_show(argv[1], 60).s);
        else keel_errorf("keel cluster: want a command and a spec: keel cluster up|down|status|env SPEC.json");
        return 2;
    }
    const char *verb = argv[1];
    bool exec = !strcmp(verb, "exec"), conf = !strcmp(verb, "slurm-conf");
    if (!exec && !conf && argc != 3) {
        keel_errorf("keel cluster %s: takes one spec file, got '%s' after it", verb, keel_cluster_show(argv[3], 60).s);
        return 2;
    }
    if (exec && (argc < 6 || strcmp(argv[4], "--"))) {
        keel_errorf("keel cluster exec: want SPEC.json NODE -- COMMAND [ARG...]");
        return 2;
    }
    keel_cluster_spec s;
    keel_status st = keel_cluster_spec_load(argv[2], &s);
    if (st != KEEL_OK) return keel_status_exit_code(st);
    int rc;
    if (!strcmp(verb, "up")) rc = keel_status_exit_code(keel_cluster_up(&s));
    else if (!strcmp(verb, "down")) rc = keel_status_exit_code(keel_cluster_down(&s));
    else if (!strcmp(verb, "status")) rc = keel_cluster_status(&s, stdout) ? 0 : 1;
    else if (!strcmp(verb, "env")) {
        char *text = keel_cluster_env_text(&s); /* single-quoted: safe to eval */
        if (text) fputs(text, stdout);
        rc = text ? 0 : 2;
        keel_free(text);
    } else if (exec) rc = keel_cluster_exec(&s, argv[3], argv + 5);
    else rc = slurm_conf(&s, argc - 3, argv + 3);
    keel_cluster_spec_free(&s);
    return rc;
}
