/* cli/cmd_k8s.c: `keel k8s manifest SPEC.json|SPEC.env [--out DIR] [--force]`
 * — the Kubeflow job (and etcd) that runs keel on Kubernetes, from a spec —
 * and `keel k8s status|logs|delete NAME` — that job on a cluster, through
 * kubectl (keel/k8s.h). */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "keel/k8s.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: keel k8s manifest SPEC.json|SPEC.env [--out DIR] [--force]\n"
            "       keel k8s status NAME [--namespace NS] [--kind PyTorchJob|MPIJob]\n"
            "       keel k8s logs NAME [--namespace NS] [--kind K] [--pod POD | --node I|master] [--follow]\n"
            "                     [--tail N]\n"
            "       keel k8s delete NAME [--namespace NS] [--kind K] [--keep-etcd]\n"
            "  manifest     a kubeflow.org/v1 PyTorchJob (pods run `keel agent CONFIG`) and the etcd Deployment\n"
            "               and Service its rendezvous uses, or with \"kind\": \"MPIJob\" a kubeflow.org/v2beta1\n"
            "               MPIJob whose launcher runs `keel train CONFIG --nproc N`; YAML on stdout, documents\n"
            "               separated by \"---\", for `kubectl apply -f -`. A SPEC ending in .env holds the AWS EKS\n"
            "               guide's shell variables (IMAGE_URI, NUM_NODES, GPU_PER_NODE, ...), never run\n"
            "  --out DIR    write etcd.yaml and pytorchjob.yaml (or mpijob.yaml) into DIR instead, each\n"
            "               atomically, never over an existing file\n"
            "  --force      with --out: replace existing files\n"
            "  status       the job's state (its last true condition, reason and message), its replicas per type,\n"
            "               and a line per pod (phase, ready, restarts, node, age); exit 0, or 1 when it failed\n"
            "  logs         the logs of every pod of a PyTorchJob (container pytorch, each line prefixed with its\n"
            "               pod), of an MPIJob's launcher, or of one pod: --pod POD, --node I (NAME-worker-I),\n"
            "               --node master (NAME-master-0); --follow streams them, --tail N keeps the last N lines\n"
            "               of each (without it, kubectl keeps 10 a pod when it shows several)\n"
            "  delete       the job, and a PyTorchJob's NAME-etcd Deployment and Service where they carry keel's\n"
            "               labels (never anything keel did not render); --keep-etcd keeps them\n"
            "  --namespace NS (-n NS)  the job's namespace (default: kubectl's current one)\n"
            "  --kind K     PyTorchJob (default) or MPIJob, as the spec's \"kind\"\n"
            "kubectl: $KEEL_KUBECTL, or kubectl on PATH, run from an argv (never a shell); exit 2 on bad input, a job\n"
            "that is not there, or no kubectl\n"
            "the spec: docs/kubernetes.md; examples/k8s-pytorchjob.json\n");
}

static int bad_option(const char *cmd, int c, char **argv) {
    keel_errorf("keel k8s %s: %s '%s' (see keel k8s --help)", cmd, c == ':' ? "no value for" : "unknown option",
                argv[optind - 1]);
    return 2;
}

static int manifest(int argc, char **argv) {
    static const struct option options[] = {
        {"out", required_argument, NULL, 'o'}, {"force", no_argument, NULL, 'f'}, {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    const char *out = NULL;
    bool force = false;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":", options, NULL)) != -1) {
        if (c == 'o') out = optarg;
        else if (c == 'f') force = true;
        else if (c == 'h') return usage(stdout), 0;
        else return bad_option("manifest", c, argv);
    }
    if (argc - optind != 1) {
        keel_errorf("keel k8s manifest: want one spec file: keel k8s manifest SPEC.json|SPEC.env [--out DIR] "
                    "[--force]");
        return 2;
    }
    if (force && !out) {
        keel_errorf("keel k8s manifest: --force replaces files of --out DIR; without --out nothing is written");
        return 2;
    }
    keel_k8s_spec s;
    keel_status st = keel_k8s_spec_load(argv[optind], &s);
    if (st != KEEL_OK) return keel_status_exit_code(st);
    if (out) {
        st = keel_k8s_write(&s, out, force);
        if (st == KEEL_OK)
            fprintf(stderr, "wrote %s/%s\n", out, s.kind == KEEL_K8S_MPIJOB ? "mpijob.yaml" : "{etcd,pytorchjob}.yaml");
    } else {
        char *yaml = keel_k8s_render(&s);
        fputs(yaml, stdout);
        keel_free(yaml);
    }
    keel_k8s_spec_free(&s);
    return keel_status_exit_code(st);
}

/* ---- status, logs, delete: NAME and the options they share ------------------------------- */

typedef struct {
    keel_k8s_job job;
    keel_k8s_logs_opts logs;
    bool keep_etcd;
} job_args;

/* Parse `keel k8s CMD NAME [options]` with the options CMD takes (own: "follow", "tail", ...);
 * 0 ok, else the exit code (2, one error line said why; or 0 after --help, with *help). */
static int parse_job(const char *cmd, int argc, char **argv, const struct option *options, job_args *a, bool *help) {
    *a = (job_args){.logs = {.node = -1, .tail = -1}};
    *help = false;
    optind = 1;
    opterr = 0;
    int c;
    long long v;
    while ((c = getopt_long(argc, argv, ":n:", options, NULL)) != -1) {
        if (c == 'n') a->job.ns = optarg;
        else if (c == 'k' && !strcmp(optarg, "PyTorchJob")) a->job.kind = KEEL_K8S_PYTORCHJOB;
        else if (c == 'k' && !strcmp(optarg, "MPIJob")) a->job.kind = KEEL_K8S_MPIJOB;
        else if (c == 'k') {
            keel_errorf("keel k8s %s: --kind '%.80s': want PyTorchJob or MPIJob (the spec's \"kind\")", cmd, optarg);
            return 2;
        } else if (c == 'p') a->logs.pod = optarg;
        else if (c == 'N' && !strcmp(optarg, "master")) a->logs.node = KEEL_K8S_MASTER;
        else if (c == 'N') {
            if (!cli_parse_int("--node", optarg, 0, 999, &v)) return 2;
            a->logs.node = (int)v;
        } else if (c == 'f') a->logs.follow = true;
        else if (c == 't') {
            if (!cli_parse_int("--tail", optarg, 0, 1000000000, &v)) return 2;
            a->logs.tail = (int)v;
        } else if (c == 'e') a->keep_etcd = true;
        else if (c == 'h') return *help = true, usage(stdout), 0;
        else return bad_option(cmd, c, argv);
    }
    if (argc - optind != 1) {
        keel_errorf("keel k8s %s: want the job's name: keel k8s %s NAME [--namespace NS] (see keel k8s --help)", cmd,
                    cmd);
        return 2;
    }
    if (a->logs.pod && a->logs.node != -1) {
        keel_errorf("keel k8s %s: --pod and --node both name a pod; give one", cmd);
        return 2;
    }
    a->job.name = argv[optind];
    return 0;
}

#define JOB_OPTIONS                                                                                                \
    {"namespace", required_argument, NULL, 'n'}, {"kind", required_argument, NULL, 'k'},                        \
        {"help", no_argument, NULL, 'h'}

static int status(int argc, char **argv) {
    static const struct option options[] = {JOB_OPTIONS, {NULL, 0, NULL, 0}};
    job_args a;
    bool help, failed = false;
    int rc = parse_job("status", argc, argv, options, &a, &help);
    if (rc || help) return rc;
    keel_status st = keel_k8s_status(&a.job, stdout, &failed);
    return st != KEEL_OK ? keel_status_exit_code(st) : failed ? 1 : 0;
}

static int logs(int argc, char **argv) {
    static const struct option options[] = {JOB_OPTIONS,
                                            {"pod", required_argument, NULL, 'p'},
                                            {"node", required_argument, NULL, 'N'},
                                            {"follow", no_argument, NULL, 'f'},
                                            {"tail", required_argument, NULL, 't'},
                                            {NULL, 0, NULL, 0}};
    job_args a;
    bool help;
    int rc = parse_job("logs", argc, argv, options, &a, &help);
    if (rc || help) return rc;
    return keel_status_exit_code(keel_k8s_logs(&a.job, &a.logs));
}

static int delete(int argc, char **argv) {
    static const struct option options[] = {JOB_OPTIONS, {"keep-etcd", no_argument, NULL, 'e'}, {NULL, 0, NULL, 0}};
    job_args a;
    bool help;
    int rc = parse_job("delete", argc, argv, options, &a, &help);
    if (rc || help) return rc;
    return keel_status_exit_code(keel_k8s_delete(&a.job, a.keep_etcd, stdout));
}

int keel_cmd_k8s(int argc, char **argv) {
    static const struct {
        const char *name;
        int (*run)(int argc, char **argv);
    } commands[] = {{"manifest", manifest}, {"status", status}, {"logs", logs}, {"delete", delete}};
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; argc >= 2 && i < sizeof commands / sizeof *commands; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    if (argc >= 2) keel_errorf("keel k8s: unknown command '%s' (manifest, status, logs, delete)", argv[1]);
    else keel_errorf("keel k8s: want a command: keel k8s manifest|status|logs|delete ... (see keel k8s --help)");
    return 2;
}
