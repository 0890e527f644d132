/* cli/cmd_worker.c: `keel worker RUN_DIR` — one rank of a distributed run (started by keel train --nproc). */
#include <stdio.h>

#include "cli/cli.h"
#include "keel/train.h"

int keel_cmd_worker(int argc, char **argv) {
    if (argc != 2) {
        keel_errorf("usage: keel worker RUN_DIR (started by `keel train --nproc N`, not by hand)");
        return 2;
    }
    return keel_status_exit_code(keel_train_worker(argv[1]));
}
