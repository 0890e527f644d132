/* cli/cmd_k8s.c: `keel k8s manifest SPEC.json [--out DIR] [--force]` — the
 * Kubeflow job (and etcd) that runs keel on Kubernetes, from a spec (keel/k8s.h). */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "keel/k8s.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: keel k8s manifest SPEC.json [--out DIR] [--force]\n"
            "  manifest    a kubeflow.org/v1 PyTorchJob (pods run `keel agent CONFIG`) and the etcd Deployment\n"
            "              and Service its rendezvous uses, or with \"kind\": \"MPIJob\" a kubeflow.org/v2beta1\n"
            "              MPIJob whose launcher runs `keel train CONFIG --nproc N`; YAML on stdout, documents\n"
            "              separated by \"---\", for `kubectl apply -f -`\n"
            "  --out DIR   write etcd.yaml and pytorchjob.yaml (or mpijob.yaml) into DIR instead, each\n"
            "              atomically, never over an existing file\n"
            "  --force     with --out: replace existing files\n"
            "the spec: docs/kubernetes.md; examples/k8s-pytorchjob.json\n");
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
        else {
            keel_errorf("keel k8s manifest: %s '%s' (see keel k8s --help)",
                        c == ':' ? "no value for" : "unknown option", argv[optind - 1]);
            return 2;
        }
    }
    if (argc - optind != 1) {
        keel_errorf("keel k8s manifest: want one spec file: keel k8s manifest SPEC.json [--out DIR] [--force]");
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

int keel_cmd_k8s(int argc, char **argv) {
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return 0;
    }
    if (argc < 2 || strcmp(argv[1], "manifest")) {
        if (argc >= 2) keel_errorf("keel k8s: unknown command '%s' (manifest)", argv[1]);
        else keel_errorf("keel k8s: want a command: keel k8s manifest SPEC.json [--out DIR]");
        return 2;
    }
    return manifest(argc - 1, argv + 1);
}
