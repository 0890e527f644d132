/* cli/cmd_health.c: `keel health [--json] [--dir PATH] [--config CONFIG] [--nproc N]
 * [--checks a,b] [--gemm-floor GFLOPS]` — node health checks (keel/resil.h). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "keel/resil.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: keel health [--json] [--dir PATH] [--config CONFIG.json] [--nproc N] [--checks LIST]\n"
            "                   [--gemm-floor GFLOPS]\n"
            "  --json            print the report as JSON (one object: node, ok, checks[])\n"
            "  --dir PATH        checkpoint directory to probe (default: the current directory)\n"
            "  --config FILE     the job: memory need, checkpoint size, resilience.health_checks,\n"
            "                    resilience.gemm_floor_gflops\n"
            "  --nproc N         the job's ranks (mpi check size, memory need on this node; default 2)\n"
            "  --checks LIST     comma-separated: gemm, memory, checkpoint_dir, mpi, gpu (default: all,\n"
            "                    or the config's resilience.health_checks)\n"
            "  --gemm-floor X    fail the gemm check below X GFLOP/s per core (default 10, or the config's)\n"
            "exit status: 0 healthy, 1 a check failed, 2 bad arguments\n");
}

int keel_cmd_health(int argc, char **argv) {
    static const struct option options[] = {
        {"json", no_argument, NULL, 'j'},           {"dir", required_argument, NULL, 'd'},
        {"config", required_argument, NULL, 'c'},   {"nproc", required_argument, NULL, 'p'},
        {"checks", required_argument, NULL, 'k'},   {"gemm-floor", required_argument, NULL, 'g'},
        {"mpi-probe", no_argument, NULL, 'm'},      {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    bool json = false, probe = false;
    const char *dir = ".", *config = NULL, *checks = NULL;
    int nproc = 2, c;
    double floor = -1;
    char *end;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 'j': json = true; break;
        case 'd': dir = optarg; break;
        case 'c': config = optarg; break;
        case 'k': checks = optarg; break;
        case 'm': probe = true; break;
        case 'p':
            nproc = (int)strtol(optarg, &end, 10);
            if (*end || nproc < 1 || nproc > 4096) {
                keel_errorf("--nproc '%s': expected a number of ranks from 1 to 4096", optarg);
                return 2;
            }
            break;
        case 'g':
            floor = strtod(optarg, &end);
            if (*end || !(floor >= 0)) {
                keel_errorf("--gemm-floor '%s': expected GFLOP/s per core, a number >= 0", optarg);
                return 2;
            }
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind != argc) {
        keel_errorf("keel health takes no positional arguments (got '%s'); see keel health --help", argv[optind]);
        return 2;
    }
    if (probe) return keel_status_exit_code(keel_health_mpi_probe());
    keel_config cfg;
    keel_config_defaults(&cfg);
    if (config) {
        keel_status st = keel_config_load_file(&cfg, config);
        if (st == KEEL_OK) st = keel_config_finalize(&cfg);
        if (st != KEEL_OK) {
            keel_config_free(&cfg);
            return keel_status_exit_code(st);
        }
    }
    static const char *known[] = {"gemm", "memory", "checkpoint_dir", "mpi", "gpu"};
    char *names = keel_xstrdup(checks ? checks : cfg.resilience.health_checks), *save = NULL;
    for (char *n = strtok_r(names, ",", &save); n; n = strtok_r(NULL, ",", &save)) {
        bool ok = false;
        for (size_t i = 0; i < sizeof known / sizeof *known; i++) ok |= !strcmp(n, known[i]);
        if (!ok) {
            keel_errorf("--checks: unknown check '%s'; the checks are gemm, memory, checkpoint_dir, mpi, gpu", n);
            keel_free(names);
            keel_config_free(&cfg);
            return 2;
        }
    }
    keel_free(names);
    keel_health_options o = {.cfg = config ? &cfg : NULL, .dir = dir, .nproc = nproc,
                             .checks = checks ? checks : cfg.resilience.health_checks,
                             .gemm_floor_gflops = floor >= 0 ? floor : cfg.resilience.gemm_floor_gflops};
    keel_health_result r[KEEL_HEALTH_MAX];
    int n = keel_health_run(&o, r);
    char node[64];
    keel_node_name(node, sizeof node);
    if (json) {
        char *text = keel_health_json(node, r, n);
        printf("%s\n", text);
        free(text);
    } else {
        static const char *status[] = {"pass", "FAIL", "skip"};
        printf("node %s\n", node);
        for (int i = 0; i < n; i++) printf("  %-15s %-4s  %s\n", r[i].name, status[r[i].status], r[i].detail);
        printf("%s\n", keel_health_all_ok(r, n) ? "healthy" : "UNHEALTHY");
    }
    keel_config_free(&cfg);
    return keel_health_all_ok(r, n) ? 0 : 1;
}
