/* cli/cmd_eval.c: `keel eval RUN_DIR --data PATH` prints {"loss": x, "tokens": n}. */
#include <getopt.h>
#include <stdio.h>

#include "cli/cli.h"
#include "keel/train.h"

int keel_cmd_eval(int argc, char **argv) {
    static const struct option options[] = {
        {"data", required_argument, NULL, 'd'},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0},
    };
    const char *data = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (c) {
        case 'd': data = optarg; break;
        case 'h':
            printf("usage: keel eval RUN_DIR --data PATH\n"
                   "  PATH: a directory from `keel data prepare` (its val split if present) or one shard file\n");
            return 0;
        default: return 2;
        }
    }
    if (optind != argc - 1 || !data) {
        keel_errorf("usage: keel eval RUN_DIR --data PATH (see keel eval --help)");
        return 2;
    }
    double loss;
    uint64_t tokens;
    keel_status st = keel_eval_run(argv[optind], data, &loss, &tokens);
    if (st != KEEL_OK) return keel_status_exit_code(st);
    printf("{\"loss\": %.6f, \"tokens\": %llu}\n", loss, (unsigned long long)tokens);
    return 0;
}
