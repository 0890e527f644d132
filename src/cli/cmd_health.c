/* cli/cmd_health.c: `keel health [--json] [--dir PATH] [--config CONFIG] [--nproc N]
 * [--checks a,b] [--gemm-floor GFLOPS] [--node-config NODE] [--gpu-baseline FILE]
 * [--epilog]` — node health checks (keel/resil.h). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "keel/resil.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: keel health [--json] [--dir PATH] [--config CONFIG.json] [--nproc N] [--checks LIST]\n"
            "                   [--gemm-floor GFLOPS] [--node-config NODE.json] [--gpu-baseline FILE] [--epilog]\n"
            "  --json            print the report as JSON (one object: node, ok, checks[])\n"
            "  --dir PATH        checkpoint directory to probe (default: the current directory)\n"
            "  --config FILE     the job: memory need, checkpoint size, resilience.health_checks,\n"
            "                    resilience.gemm_floor_gflops\n"
            "  --nproc N         the job's ranks (mpi check size, memory need on this node; default 2)\n"
            "  --checks LIST     comma-separated: gemm, memory, checkpoint_dir, mpi, gpu (default: all,\n"
            "                    or the config's resilience.health_checks)\n"
            "  --gemm-floor X    fail the gemm check below X GFLOP/s per core (default 10, or the config's)\n"
            "  --node-config F   this node's checks and thresholds: {\"checks\": [...], \"gemm_floor_gflops\":\n"
            "                    X, \"memory_floor_gib\": Y, \"dir\": PATH, \"gpu\": {the gpu check's limits:\n"
            "                    \"temp_max_c\": 87, \"xid_max\": 0, ... (docs/auto-resume.md, Health checks)}} (options win)\n"
            "  --gpu-baseline F  the gpu check's XID baseline: XIDs in the kernel log count from it on; the\n"
            "                    first check writes it (default " KEEL_GPU_BASELINE_DEFAULT ",\n"
            "                    or the node config's gpu.baseline; remove it to accept the XIDs logged since)\n"
            "  --epilog          Slurm's Epilog or HealthCheckProgram (as root, on the node): a failed check\n"
            "                    drains this node (SLURMD_NODENAME) with reason \"keel: <check>\", passing\n"
            "                    returns a node keel drained to service; the node-local checks only\n"
            "exit status: 0 healthy, 1 a check failed, 2 bad arguments; --epilog: 0 when the verdict was\n"
            "carried out (drained or not), 1 when scontrol failed\n");
}

int keel_cmd_health(int argc, char **argv) {
    static const struct option options[] = {
        {"json", no_argument, NULL, 'j'},           {"dir", required_argument, NULL, 'd'},
        {"config", required_argument, NULL, 'c'},   {"nproc", required_argument, NULL, 'p'},
        {"checks", required_argument, NULL, 'k'},   {"gemm-floor", required_argument, NULL, 'g'},
        {"mpi-probe", no_argument, NULL, 'm'},      {"epilog", no_argument, NULL, 'e'},
        {"node-config", required_argument, NULL, 'n'}, {"gpu-baseline", required_argument, NULL, 'b'},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    bool json = false, probe = false, epilog = false;
    const char *dir = NULL, *config = NULL, *checks = NULL, *node_path = NULL, *gpu_baseline = NULL;
    int nproc = 2, c;
    double floor = -1;
    long long number;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 'j': json = true; break;
        case 'd': dir = optarg; break;
        case 'c': config = optarg; break;
        case 'k': checks = optarg; break;
        case 'm': probe = true; break;
        case 'e': epilog = true; break;
        case 'n': node_path = optarg; break;
        case 'b': gpu_baseline = optarg; break;
        case 'p':
            if (!cli_parse_int("--nproc", optarg, 1, 4096, &number)) return 2;
            nproc = (int)number;
            break;
        case 'g':
            if (!cli_parse_double("--gemm-floor", optarg, 0, 1e12, &floor)) return 2;
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
    keel_node_config nc = {.gemm_floor = -1, .memory_floor = -1};
    keel_gpu_limits_defaults(&nc.gpu);
    if (gpu_baseline && (!*gpu_baseline || strlen(gpu_baseline) >= sizeof nc.gpu.baseline)) {
        keel_errorf("--gpu-baseline '%.100s': expected the XID baseline file's path (at most %zu bytes)", gpu_baseline,
                    sizeof nc.gpu.baseline - 1);
        return 2;
    }
    if (node_path) {
        keel_status st = keel_node_config_load(node_path, &nc);
        if (st != KEEL_OK) {
            keel_free(nc.dir);
            return keel_status_exit_code(st);
        }
    }
    if (!dir) dir = nc.dir ? nc.dir : ".";
    if (gpu_baseline) snprintf(nc.gpu.baseline, sizeof nc.gpu.baseline, "%s", gpu_baseline);
    if (floor < 0) floor = nc.gemm_floor;
    keel_config cfg;
    keel_config_defaults(&cfg);
    if (config) {
        keel_status st = keel_config_load_file(&cfg, config);
        if (st == KEEL_OK) st = keel_config_finalize(&cfg);
        if (st != KEEL_OK) {
            keel_config_free(&cfg);
            keel_free(nc.dir);
            return keel_status_exit_code(st);
        }
    }
    /* an epilog runs on one node after a job: no ranks to all-reduce over */
    unsigned mask = (nc.has_checks ? nc.checks : cfg.resilience.health_checks) &
                    (epilog && !nc.has_checks ? ~(1u << KEEL_CHECK_MPI) : ~0u);
    if (checks && keel_health_checks_parse(checks, "--checks", &mask) != KEEL_OK) {
        keel_config_free(&cfg);
        keel_free(nc.dir);
        return 2;
    }
    if (epilog && (mask & (1u << KEEL_CHECK_MPI))) {
        keel_errorf("%s%s: the mpi check needs a job's ranks; keel health --epilog runs the node-local checks "
                    "(gemm, memory, checkpoint_dir, gpu)", checks ? "--checks " : node_path,
                    checks ? checks : ": checks");
        keel_config_free(&cfg);
        keel_free(nc.dir);
        return 2;
    }
    keel_health_options o = {.cfg = config ? &cfg : NULL, .dir = dir, .nproc = nproc,
                             .checks = mask,
                             .gemm_floor_gflops = floor >= 0 ? floor : cfg.resilience.gemm_floor_gflops,
                             .memory_floor_gib = nc.memory_floor > 0 ? nc.memory_floor : 0, .gpu = &nc.gpu};
    keel_health_result r[KEEL_CHECK_COUNT];
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
        for (int i = 0; i < n; i++)
            printf("  %-15s %-4s  %s\n", keel_health_check_name(r[i].check), status[r[i].status], r[i].detail);
        printf("%s\n", keel_health_all_ok(r, n) ? "healthy" : "UNHEALTHY");
    }
    keel_config_free(&cfg);
    keel_free(nc.dir);
    if (!epilog) return keel_health_all_ok(r, n) ? 0 : 1;
    /* exit 0 once the verdict is carried out: a failing Epilog would make
     * Slurm drain the node again as "Epilog error", hiding the check's name */
    char said[768];
    keel_status st = keel_health_epilog(node, r, n, said, sizeof said);
    if (st == KEEL_OK) keel_log_info("%s", said); /* stderr: --json keeps stdout one object */
    return st == KEEL_OK ? 0 : 1;
}
