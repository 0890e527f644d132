/* cli/cmd_train.c: `keel train CONFIG.json [--set key=value ...] [--run-dir DIR] [--nproc N]
 * [--launcher mpi|local] [--dry-run]`. */
#include <getopt.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "keel/cuda.h"
#include "keel/monitor.h"
#include "keel/resil.h"
#include "keel/run.h"
#include "keel/train.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: keel train CONFIG.json [--set key=value ...] [--run-dir DIR] [--nproc N] [--device D]\n"
            "                  [--launcher mpi|local] [--dry-run]\n"
            "  --set key=value  override a config key (dotted, e.g. train.steps=100); repeatable\n"
            "  --device D       cpu (the default) or cuda: --set device=D\n"
            "  --run-dir DIR    where the run writes (default runs/<config>-<time>); must be new or empty\n"
            "  --nproc N        train on N ranks started with mpirun (srun in a Slurm job) under a\n"
            "                   supervisor that relaunches them from the last checkpoint after failures\n"
            "  --launcher L     with --nproc: mpi (the default: mpirun, or srun in a Slurm job) or local\n"
            "                   (keel's own launcher on this machine, the ranks talking over Gloo)\n"
            "  --dry-run        print parameters and memory by category, train nothing\n"
            "exit status: 0 done, 2 bad input, 75 stopped on a signal with the state saved (run the\n"
            "  same command again to resume), 76 the loss became non-finite, 1 any other failure\n");
}

/* "device": "cuda" needs a GPU here, and without Slurm (whose ranks spread
 * over its nodes) one per rank: NCCL runs one rank per GPU. */
static keel_status cuda_ready(int nproc) {
    char why[512];
    int gpus = keel_cuda_device_count(why, sizeof why);
    if (gpus == 0) {
        keel_errorf("device cuda: %s; train on the CPU with \"device\": \"cpu\" (the default)", why);
        return KEEL_ERR_INPUT;
    }
    if (nproc > gpus && !getenv("SLURM_JOB_ID")) {
        keel_errorf("device cuda with --nproc %d: this machine has %d GPU(s) and FSDP runs one rank per GPU; use "
                    "--nproc %d or fewer", nproc, gpus, gpus);
        return KEEL_ERR_INPUT;
    }
    return KEEL_OK;
}

int keel_cmd_train(int argc, char **argv) {
    static const struct option options[] = {
        {"set", required_argument, NULL, 's'},
        {"run-dir", required_argument, NULL, 'r'},
        {"dry-run", no_argument, NULL, 'n'},
        {"nproc", required_argument, NULL, 'p'},
        {"device", required_argument, NULL, 'd'},
        {"launcher", required_argument, NULL, 'l'},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    char *sets[CLI_MAX_SETS + 1], device[64];
    int n_sets = 0;
    const char *run_dir = NULL, *launcher = NULL;
    bool dry_run = false;
    int nproc = 0, c;
    long long n;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 's':
            if (!cli_add_set(sets, &n_sets, optarg)) return 2;
            break;
        case 'r': run_dir = optarg; break;
        case 'd': /* after the --set options, whatever their order: the flag wins */
            snprintf(device, sizeof device, "device=%.56s", optarg);
            break;
        case 'n': dry_run = true; break;
        case 'p':
            if (!cli_parse_int("--nproc", optarg, 1, 4096, &n)) return 2;
            nproc = (int)n;
            break;
        case 'l':
            if (strcmp(optarg, "mpi") && strcmp(optarg, "local")) {
                keel_errorf("--launcher %s: use mpi (mpirun, or srun in a Slurm job) or local (keel's own, on "
                            "this machine)", optarg);
                return 2;
            }
            launcher = optarg;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (launcher && nproc == 0) {
        keel_errorf("--launcher %s starts ranks: give --nproc N too", launcher);
        return 2;
    }
    if (launcher) setenv("KEEL_LAUNCHER", launcher, 1);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--device") || !strncmp(argv[i], "--device=", 9)) sets[n_sets++] = device;
    if (optind != argc - 1) {
        keel_errorf("keel train takes exactly one CONFIG.json (got %d); see keel train --help",
                    argc - optind);
        return 2;
    }
    /* two layers that relaunch failed ranks must not nest */
    if (nproc > 0 && (getenv("KEEL_AUTO_RESUME_ATTEMPT") ||
                      getenv("SLURM_SPANK__SLURM_SPANK_OPTION_keel_auto_resume_auto_resume"))) {
        keel_errorf("keel train --nproc under srun/sbatch --auto-resume: keel's supervisor and the plugin "
                    "would both relaunch the ranks; drop --auto-resume, or run one rank per task without "
                    "--nproc: srun -n N --mpi=pmix --auto-resume keel train CONFIG --run-dir RUN");
        return 2;
    }
    keel_config cfg;
    keel_status st = cli_load_config(&cfg, argv[optind], sets, n_sets);
    if (st == KEEL_OK && !dry_run && cfg.device == KEEL_BACKEND_CUDA) st = cuda_ready(nproc);
    if (st == KEEL_OK && dry_run) st = keel_train_dry_run(&cfg, nproc > 0 ? nproc : 1);
    else if (st == KEEL_OK) {
        char default_dir[512];
        if (!run_dir) {
            char stem[256], *copy = keel_xstrdup(argv[optind]);
            snprintf(stem, sizeof stem, "%s", basename(copy));
            keel_free(copy);
            char *dot = strrchr(stem, '.');
            if (dot) *dot = 0;
            char stamp[32];
            time_t now = time(NULL);
            strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", localtime(&now));
            snprintf(default_dir, sizeof default_dir, "runs/%s-%s", stem, stamp);
            run_dir = default_dir;
        }
        /* a task of a Slurm step that is the whole job: one rank, no supervisor (srun --auto-resume) */
        bool task = nproc == 0 && keel_train_is_task();
        const char *procid = getenv("SLURM_PROCID");
        /* the endpoint first: a port the user set that is in use stops the run before anything
         * is written (one endpoint per job); named in the run directory once that exists */
        keel_metrics_server *metrics = NULL;
        if (!task || (procid && atoi(procid) == 0)) st = keel_metrics_serve(&cfg, run_dir, &metrics);
        if (st == KEEL_OK && task) st = keel_train_task(&cfg, run_dir, metrics);
        else if (st == KEEL_OK && nproc == 0) st = keel_train_run(&cfg, run_dir, metrics);
        else if (st == KEEL_OK && (st = keel_run_prepare(&cfg, run_dir, nproc)) == KEEL_OK) {
            int code;
            keel_metrics_publish(metrics);
            keel_supervise(&cfg, run_dir, nproc, &code);
            keel_metrics_stop(metrics);
            keel_config_free(&cfg);
            return code;
        }
        keel_metrics_stop(metrics);
    }
    keel_config_free(&cfg);
    return keel_status_exit_code(st);
}
