/* cli/cmd_launch.c: `keel launch -n N -- PROGRAM ARGS...` — N ranks of PROGRAM
 * on this machine over Gloo, no mpirun (what keel train --launcher local runs). */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "keel/resil.h"

int keel_cmd_launch(int argc, char **argv) {
    long long n = 0;
    if (argc < 5 || strcmp(argv[1], "-n") || strcmp(argv[3], "--")) {
        keel_errorf("usage: keel launch -n N -- PROGRAM [ARGS...] (N ranks of PROGRAM on this machine, talking "
                    "over Gloo; keel train --nproc N --launcher local runs it)");
        return 2;
    }
    if (!cli_parse_int("-n", argv[2], 1, 4096, &n)) return 2;
    int code;
    keel_status st = keel_launch_local((int)n, argv + 4, &code);
    return st == KEEL_OK ? code : keel_status_exit_code(st);
}
