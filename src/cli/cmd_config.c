/* cli/cmd_config.c: `keel config keys` (the key table) and `keel config show CONFIG [--set ...]`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "keel/core.h"

int keel_cmd_config(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "keys")) {
        keel_config_print_keys();
        return 0;
    }
    if (argc >= 3 && !strcmp(argv[1], "show")) {
        keel_config cfg;
        keel_config_defaults(&cfg);
        keel_status st = keel_config_load_file(&cfg, argv[2]);
        for (int i = 3; st == KEEL_OK && i < argc; i++) {
            if (!strcmp(argv[i], "--set") && i + 1 < argc) st = keel_config_set(&cfg, argv[++i]);
            else {
                keel_errorf("keel config show: unexpected argument '%s'", argv[i]);
                st = KEEL_ERR_INPUT;
            }
        }
        if (st == KEEL_OK) st = keel_config_finalize(&cfg);
        if (st == KEEL_OK) {
            char *text = keel_config_to_json(&cfg);
            printf("%s\n", text);
            free(text);
        }
        keel_config_free(&cfg);
        return keel_status_exit_code(st);
    }
    fprintf(argc >= 2 && !strcmp(argv[1], "--help") ? stdout : stderr,
            "usage: keel config keys | keel config show CONFIG.json [--set key=value ...]\n");
    return argc >= 2 && !strcmp(argv[1], "--help") ? 0 : 2;
}
