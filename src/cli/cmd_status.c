/* cli/cmd_status.c: `keel status RUN [--watch [SECONDS]] [--json]` and
 * `keel plot RUN --out FILE.svg|FILE.png`. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "keel/monitor.h"

static volatile sig_atomic_t g_quit;
static void on_quit(int sig) { (void)sig, g_quit = 1; }

int keel_cmd_status(int argc, char **argv) {
    static const struct option options[] = {
        {"watch", optional_argument, NULL, 'w'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    double every = 0;
    bool json = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 'w':
            every = 2;
            if (optarg && !cli_parse_double("--watch", optarg, 0.1, 3600, &every)) return 2;
            break;
        case 'j': json = true; break;
        case 'h':
            printf("usage: keel status RUN_DIR [--watch[=SECONDS]] [--json]\n"
                   "  the run's step, loss, throughput, checkpoint, failures; per rank its phase, step, heartbeat\n"
                   "  age, step and compute time, memory and CPU; the last events. --watch redraws every SECONDS\n"
                   "  (default 2) until Ctrl-C; --json prints the view the dashboard draws (GET /api/run)\n");
            return 0;
        default: return 2;
        }
    }
    if (optind != argc - 1) {
        keel_errorf("keel status takes exactly one RUN_DIR (got %d); see keel status --help", argc - optind);
        return 2;
    }
    if (every <= 0) return keel_status_exit_code(keel_run_status_print(argv[optind], stdout, json));
    signal(SIGINT, on_quit);
    signal(SIGTERM, on_quit);
    while (!g_quit) {
        fputs(isatty(STDOUT_FILENO) ? "\033[H\033[J" : "\n", stdout);
        keel_status st = keel_run_status_print(argv[optind], stdout, json);
        fflush(stdout);
        if (st != KEEL_OK) return keel_status_exit_code(st);
        for (double t = 0; t < every && !g_quit; t += 0.1) usleep(100000);
    }
    return 0;
}

int keel_cmd_plot(int argc, char **argv) {
    static const struct option options[] = {
        {"out", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    const char *out = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 'o': out = optarg; break;
        case 'h':
            printf("usage: keel plot RUN_DIR --out FILE.svg|FILE.png\n"
                   "  loss and val loss, and tokens/s, by step; failures (red) and recoveries (blue) marked\n");
            return 0;
        default: return 2;
        }
    }
    if (optind != argc - 1 || !out) {
        keel_errorf("keel plot takes one RUN_DIR and --out FILE.svg or FILE.png; see keel plot --help");
        return 2;
    }
    return keel_status_exit_code(keel_run_plot(argv[optind], out));
}
