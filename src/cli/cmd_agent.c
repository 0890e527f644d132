/* cli/cmd_agent.c: `keel agent CONFIG --run-dir RUN [...]` — one per pod or
 * host; the job's agents meet in etcd and start their nodes' ranks (resil/agent.c).
 * Every setting comes from a flag or from the variable a Kubeflow PyTorchJob
 * gives its pods (PET_*); a flag and its variable that disagree are an error. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "keel/monitor.h"
#include "keel/resil.h"
#include "keel/run.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: keel agent CONFIG.json --run-dir RUN [--set key=value ...] [--nnodes N|MIN:MAX]\n"
            "                  [--nproc-per-node N] [--rdzv-endpoint HOST:PORT] [--rdzv-id ID] [--max-restarts N]\n"
            "                  [--node NAME] [--host ADDR] [--last-call S] [--rdzv-timeout S]\n"
            "       keel agent --reset --rdzv-endpoint HOST:PORT --rdzv-id ID\n"
            "  one agent per node: the agents meet in etcd, each starts its node's ranks (keel worker RUN),\n"
            "  and after a failure, a lost node or a new one they start the next round on the nodes there.\n"
            "  Each flag may come instead from the variable a PyTorchJob sets (docs/kubernetes.md):\n"
            "  --nnodes PET_NNODES, --nproc-per-node PET_NPROC_PER_NODE, --rdzv-endpoint PET_RDZV_ENDPOINT,\n"
            "  --rdzv-id PET_RDZV_ID (default: from the run directory), --max-restarts PET_MAX_RESTARTS\n"
            "  (default: resilience.max_restarts). --node: this node's name (default: the host name);\n"
            "  --host: the address its ranks listen on (default: the host name's); --last-call: with the\n"
            "  minimum of nodes there, wait this long for more (default 10 s); --rdzv-timeout: retry an etcd\n"
            "  that does not answer this long (default 60 s). --reset deletes the run id's keys from etcd.\n"
            "exit status: 0 done, 2 bad input, 75 stopped on a signal (run it again to go on), 1 any other\n");
}

/* The value of a setting: the flag's, else the variable's; both and different: an error. */
static bool setting(const char *flag, const char *flag_value, const char *var, const char **out) {
    const char *env = getenv(var);
    if (env && !*env) env = NULL;
    if (flag_value && env && strcmp(flag_value, env)) {
        keel_errorf("%s %s contradicts %s=%s: give the value once (the flag, or the variable the operator sets)",
                    flag, flag_value, var, env);
        return false;
    }
    *out = flag_value ? flag_value : env;
    return true;
}

static bool name_ok(const char *s, size_t max) {
    size_t n = strlen(s);
    return n > 0 && n < max && strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == n;
}

/* "N" or "MIN:MAX", 1 <= MIN <= MAX. */
static bool parse_nnodes(const char *from, const char *text, keel_agent_options *o) {
    long long lo, hi;
    const char *colon = strchr(text, ':');
    char first[32];
    snprintf(first, sizeof first, "%.*s", colon ? (int)(colon - text) : (int)strlen(text), text);
    keel_error_capture(true);
    bool ok = cli_parse_int(from, first, 1, 4096, &lo) && cli_parse_int(from, colon ? colon + 1 : first, 1, 4096, &hi);
    keel_error_capture(false);
    if (!ok || lo > hi) {
        keel_errorf("%s \"%s\": give N nodes or MIN:MAX with 1 <= MIN <= MAX (e.g. 2 or 2:4)%s", from, text,
                    ok ? ": MIN is above MAX" : "");
        return false;
    }
    o->min_nodes = (int)lo, o->max_nodes = (int)hi;
    return true;
}

int keel_cmd_agent(int argc, char **argv) {
    static const struct option options[] = {
        {"set", required_argument, NULL, 's'},          {"run-dir", required_argument, NULL, 'r'},
        {"nnodes", required_argument, NULL, 'n'},       {"nproc-per-node", required_argument, NULL, 'p'},
        {"rdzv-endpoint", required_argument, NULL, 'e'}, {"rdzv-id", required_argument, NULL, 'i'},
        {"max-restarts", required_argument, NULL, 'm'}, {"node", required_argument, NULL, 'N'},
        {"host", required_argument, NULL, 'H'},         {"last-call", required_argument, NULL, 'l'},
        {"rdzv-timeout", required_argument, NULL, 't'}, {"reset", no_argument, NULL, 'R'},
        {"help", no_argument, NULL, 'h'},               {0, 0, 0, 0},
    };
    char *sets[CLI_MAX_SETS];
    int n_sets = 0, c;
    const char *run_dir = NULL, *f_nnodes = NULL, *f_nproc = NULL, *f_endpoint = NULL, *f_id = NULL,
               *f_restarts = NULL, *node = NULL, *host = NULL;
    double last_call = 10, rdzv_timeout = 60;
    bool reset = false;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 's':
            if (!cli_add_set(sets, &n_sets, optarg)) return 2;
            break;
        case 'r': run_dir = optarg; break;
        case 'n': f_nnodes = optarg; break;
        case 'p': f_nproc = optarg; break;
        case 'e': f_endpoint = optarg; break;
        case 'i': f_id = optarg; break;
        case 'm': f_restarts = optarg; break;
        case 'N': node = optarg; break;
        case 'H': host = optarg; break;
        case 'l':
            if (!cli_parse_double("--last-call", optarg, 0, 3600, &last_call)) return 2;
            break;
        case 't':
            if (!cli_parse_double("--rdzv-timeout", optarg, 1, 86400, &rdzv_timeout)) return 2;
            break;
        case 'R': reset = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    keel_agent_options o = {.max_restarts = -1, .last_call_s = last_call, .rdzv_timeout_s = rdzv_timeout};
    const char *nnodes, *nproc, *endpoint, *id, *restarts, *backend;
    if (!setting("--nnodes", f_nnodes, "PET_NNODES", &nnodes) ||
        !setting("--nproc-per-node", f_nproc, "PET_NPROC_PER_NODE", &nproc) ||
        !setting("--rdzv-endpoint", f_endpoint, "PET_RDZV_ENDPOINT", &endpoint) ||
        !setting("--rdzv-id", f_id, "PET_RDZV_ID", &id) ||
        !setting("--max-restarts", f_restarts, "PET_MAX_RESTARTS", &restarts) ||
        !setting("PET_RDZV_BACKEND", NULL, "PET_RDZV_BACKEND", &backend))
        return 2;
    if (backend && strcmp(backend, "etcd") && strcmp(backend, "etcd-v2")) {
        keel_errorf("PET_RDZV_BACKEND=%s: keel agent meets in etcd; set the PyTorchJob's elasticPolicy.rdzvBackend "
                    "to etcd (keel k8s manifest does)", backend);
        return 2;
    }
    if (!endpoint) {
        keel_errorf("keel agent: no etcd to meet in: give --rdzv-endpoint HOST:PORT or PET_RDZV_ENDPOINT");
        return 2;
    }
    snprintf(o.endpoint, sizeof o.endpoint, "%s", endpoint);
    if (id && !name_ok(id, sizeof o.run_id)) {
        keel_errorf("run id \"%s\" (--rdzv-id, PET_RDZV_ID): use letters, digits, '.', '_' and '-', at most %zu",
                    id, sizeof o.run_id - 1);
        return 2;
    }
    if (reset) {
        if (!id) {
            keel_errorf("keel agent --reset: name the run id to clear (--rdzv-id ID or PET_RDZV_ID); nothing else "
                        "in etcd is touched");
            return 2;
        }
        snprintf(o.run_id, sizeof o.run_id, "%s", id);
        return keel_status_exit_code(keel_agent_reset(&o));
    }
    if (optind != argc - 1 || !run_dir) {
        keel_errorf("keel agent takes one CONFIG.json and --run-dir RUN (a directory every node sees); see keel "
                    "agent --help");
        return 2;
    }
    if (!nnodes) {
        keel_errorf("keel agent: how many nodes? give --nnodes N or MIN:MAX, or PET_NNODES");
        return 2;
    }
    if (!parse_nnodes(f_nnodes ? "--nnodes" : "PET_NNODES", nnodes, &o)) return 2;
    long long v = 1;
    if (nproc && !cli_parse_int(f_nproc ? "--nproc-per-node" : "PET_NPROC_PER_NODE", nproc, 1, 1024, &v)) return 2;
    o.nproc = (int)v;
    if (restarts && !cli_parse_int(f_restarts ? "--max-restarts" : "PET_MAX_RESTARTS", restarts, 0, 1000000, &v))
        return 2;
    if (restarts) o.max_restarts = v;
    /* a Master's operator sets the world size: it must be what the agents will make */
    const char *world = getenv("WORLD_SIZE");
    if (world && *world && o.min_nodes == o.max_nodes && atoll(world) != (long long)o.min_nodes * o.nproc) {
        keel_errorf("WORLD_SIZE=%s contradicts %d node(s) x %d rank(s) per node: set PET_NNODES and "
                    "PET_NPROC_PER_NODE to the job's shape", world, o.min_nodes, o.nproc);
        return 2;
    }
    char hostname[128] = "";
    gethostname(hostname, sizeof hostname - 1);
    if (!node) node = hostname;
    if (!name_ok(node, sizeof o.node)) {
        keel_errorf("node name \"%s\" (--node, or the host name): use letters, digits, '.', '_' and '-'", node);
        return 2;
    }
    snprintf(o.node, sizeof o.node, "%s", node);
    if (host) snprintf(o.host, sizeof o.host, "%s", host);
    if (id) snprintf(o.run_id, sizeof o.run_id, "%s", id);
    else { /* the run directory names the job: its path, in the characters a key part takes */
        size_t n = 0;
        for (const char *p = run_dir; *p && n + 1 < sizeof o.run_id; p++)
            if (*p != '/' || n > 0) o.run_id[n++] = name_ok((char[]){*p, 0}, 2) ? *p : '_';
        o.run_id[n] = 0;
    }

    keel_config cfg;
    keel_status st = cli_load_config(&cfg, argv[optind], sets, n_sets);
    int code = 1;
    if (st == KEEL_OK) st = keel_agent_run(&cfg, run_dir, &o, &code);
    keel_config_free(&cfg);
    return st == KEEL_OK ? code : keel_status_exit_code(st);
}
