/* cli/cmd_plan.c: `keel plan CONFIG [--set key=value ...] [--nodes N] [--per-node G]
 * [--device cpu|h100|h200|a100] [--net GBPS] [--intra GBPS] [--mfu X] [--memory GIB] [--json]`
 * — memory and step time of a run before running it (keel/plan.h). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "keel/plan.h"
#include "keel/resil.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: keel plan CONFIG.json [--set key=value ...] [--nodes N] [--per-node G]\n"
            "                 [--device cpu|h100|h200|a100] [--net GBPS] [--intra GBPS] [--mfu X] [--memory GIB]\n"
            "                 [--json]\n"
            "  memory per rank by category and time per step for every FSDP strategy, and the\n"
            "  fastest plan that fits (strategy, checkpointing, micro-batch)\n"
            "  --set key=value  override a config key, as keel train; repeatable\n"
            "  --nodes N        nodes (default 1)\n"
            "  --per-node G     ranks per node (default 8 GPUs; cpu 1); hybrid_shard's group is a node\n"
            "  --device D       cpu (this machine, measured; default), h100, h200 or a100 (presets)\n"
            "  --net GBPS       network per node, Gbit/s (default h100/h200 3200, a100 1600, cpu 10)\n"
            "  --intra GBPS     link per rank inside a node, Gbit/s (default: NVLink; cpu: measured\n"
            "                   with keel health's mpi check)\n"
            "  --mfu X          compute efficiency, 0-1 (default h100/h200 0.40, a100 0.50; cpu:\n"
            "                   measured on a slice of the model)\n"
            "  --memory GIB     memory a rank may use (default: a GPU's, the preset's; cpu: MemAvailable\n"
            "                   divided by --per-node), e.g. a GPU's free memory less a margin\n"
            "  --json           the plan as JSON (schema in docs/planning.md)\n"
            "exit status: 0 a plan fits, 1 none fits (or a measurement failed), 2 bad input\n");
}

typedef struct {
    int nodes, per_node;
    const char *device;
    double net_gbps, intra_gbps, mfu, memory_gib; /* 0 = the device's */
    bool json;
} plan_args;

/* The shared-memory bandwidth a node's ranks get: keel health's mpi check
 * over per_node ranks (an all-reduce through mpirun). */
static keel_status measure_intra(int per_node, keel_device *dev) {
    keel_health_options o = {.nproc = per_node, .checks = 1u << KEEL_CHECK_MPI};
    keel_health_result r;
    keel_health_run(&o, &r);
    if (r.status != KEEL_HEALTH_PASS || r.value <= 0) {
        keel_errorf("could not measure the MPI bandwidth between %d ranks (%s); pass --intra GBPS", per_node,
                    r.detail);
        return KEEL_ERR_IO;
    }
    static char source[96];
    snprintf(source, sizeof source, "measured: keel health's mpi check, all-reduce over %d ranks", per_node);
    keel_plan_device_set_intra(dev, r.value * 8, 1.0, source);
    return KEEL_OK;
}

static keel_status make_device(const keel_config *cfg, const plan_args *a, keel_device *dev) {
    keel_status st = keel_plan_device(a->device, dev);
    if (st != KEEL_OK) return st;
    if (a->net_gbps > 0) keel_plan_device_set_net(dev, a->net_gbps);
    if (a->intra_gbps > 0) keel_plan_device_set_intra(dev, a->intra_gbps, 0.8, "--intra");
    if (a->mfu > 0) dev->mfu = a->mfu, dev->mfu_source = "--mfu";
    /* a cpu node's memory is shared by its ranks: the budget is memory_bytes / per_node */
    double per_rank = a->memory_gib * 1073741824.0, ranks = dev->kind == KEEL_DEVICE_CPU ? a->per_node : 1;
    if (a->memory_gib > 0) dev->memory_bytes = per_rank * ranks;
    if (dev->kind != KEEL_DEVICE_CPU) return KEEL_OK;
    if (a->intra_gbps == 0 && a->per_node > 4 * dev->cores) { /* mpirun would start them all here */
        keel_errorf("--per-node %d: more than 4 ranks per core of this machine (%d cores) to measure MPI between; "
                    "pass --intra GBPS", a->per_node, dev->cores);
        return KEEL_ERR_INPUT;
    }
    if (a->intra_gbps == 0 && a->per_node > 1 && (st = measure_intra(a->per_node, dev)) != KEEL_OK) return st;
    return keel_plan_measure_cpu(cfg, a->mfu > 0, a->per_node, dev);
}

static bool parse(int argc, char **argv, plan_args *a, char **sets, int *n_sets, int *code) {
    static const struct option options[] = {
        {"set", required_argument, NULL, 's'},    {"nodes", required_argument, NULL, 'n'},
        {"per-node", required_argument, NULL, 'g'}, {"device", required_argument, NULL, 'd'},
        {"net", required_argument, NULL, 'b'},    {"intra", required_argument, NULL, 'i'},
        {"mfu", required_argument, NULL, 'm'},    {"json", no_argument, NULL, 'j'},
        {"memory", required_argument, NULL, 'M'}, {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    long long number;
    int c;
    *code = 2;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 's':
            if (!cli_add_set(sets, n_sets, optarg)) return false;
            break;
        case 'n':
            if (!cli_parse_int("--nodes", optarg, 1, 1000000, &number)) return false;
            a->nodes = (int)number;
            break;
        case 'g':
            if (!cli_parse_int("--per-node", optarg, 1, 4096, &number)) return false;
            a->per_node = (int)number;
            break;
        case 'd': a->device = optarg; break;
        case 'b':
            if (!cli_parse_double("--net", optarg, 1e-3, 1e6, &a->net_gbps)) return false;
            break;
        case 'i':
            if (!cli_parse_double("--intra", optarg, 1e-3, 1e6, &a->intra_gbps)) return false;
            break;
        case 'm':
            if (!cli_parse_double("--mfu", optarg, 1e-4, 1, &a->mfu)) return false;
            break;
        case 'M':
            if (!cli_parse_double("--memory", optarg, 1.0 / 1024, 1 << 20, &a->memory_gib)) return false;
            break;
        case 'j': a->json = true; break;
        case 'h': usage(stdout); *code = 0; return false;
        default: usage(stderr); return false;
        }
    }
    if (optind != argc - 1) {
        keel_errorf("keel plan takes exactly one CONFIG.json (got %d); see keel plan --help", argc - optind);
        return false;
    }
    if ((double)a->nodes * a->per_node > 1e6) {
        keel_errorf("--nodes %d x --per-node %d: more than a million ranks", a->nodes, a->per_node);
        return false;
    }
    return true;
}

int keel_cmd_plan(int argc, char **argv) {
    plan_args a = {.nodes = 1, .device = "cpu"};
    char *sets[CLI_MAX_SETS];
    int n_sets = 0, code;
    if (!parse(argc, argv, &a, sets, &n_sets, &code)) return code;
    if (a.per_node == 0) a.per_node = strcmp(a.device, "cpu") ? 8 : 1; /* a GPU node has 8 */
    keel_config cfg;
    keel_status st = cli_load_config(&cfg, argv[optind], sets, n_sets);
    keel_device dev;
    if (st == KEEL_OK) st = make_device(&cfg, &a, &dev);
    if (st != KEEL_OK) {
        keel_config_free(&cfg);
        return keel_status_exit_code(st);
    }
    keel_cluster cl = {.nodes = a.nodes, .per_node = a.per_node, .device = dev};
    keel_plan p;
    keel_plan_make(&cfg, &cl, &p);
    if (a.json) {
        char *text = keel_plan_json(&p);
        printf("%s\n", text);
        free(text);
    } else {
        keel_plan_print(stdout, &p);
    }
    code = p.best.fits ? 0 : 1;
    keel_config_free(&cfg);
    return code;
}
