/* tests/fuzz/fuzz_config.c: keel's config — the first byte chooses: even, the
 * rest is a config file's JSON (keel_config_load_string, what
 * keel_config_load_file parses with); odd, lines of --set assignments
 * (keel_config_set). Then keel_config_finalize, and a config that passes must
 * print as JSON that loads back to the same JSON. */
#include "fuzz.h"

static void round_trip(keel_config *cfg) {
    char *json = keel_config_to_json(cfg);
    keel_config again;
    keel_config_defaults(&again);
    fuzz_quiet();
    keel_status st = keel_config_load_string(&again, json, "resolved config");
    if (st != KEEL_OK) {
        fprintf(stderr, "the resolved config does not load back: %s\n%s\n", keel_last_error(), json);
        abort();
    }
    char *json2 = keel_config_to_json(&again);
    if (strcmp(json, json2) != 0) {
        fprintf(stderr, "the resolved config changes on a round trip:\n%s\n%s\n", json, json2);
        abort();
    }
    free(json2);
    free(json);
    keel_config_free(&again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    fuzz_quiet();
    char *text = fuzz_cstring(data + 1, size - 1);
    keel_config cfg;
    keel_config_defaults(&cfg);
    keel_status st = KEEL_OK;
    if (data[0] % 2 == 0) {
        st = keel_config_load_string(&cfg, text, "fuzz.json");
        fuzz_expect_error_line(st, "keel_config_load_string");
    } else {
        char *save = NULL;
        for (char *line = strtok_r(text, "\n", &save); line && st == KEEL_OK; line = strtok_r(NULL, "\n", &save)) {
            st = keel_config_set(&cfg, line);
            fuzz_expect_error_line(st, "keel_config_set");
        }
    }
    if (st == KEEL_OK) {
        st = keel_config_finalize(&cfg);
        fuzz_expect_error_line(st, "keel_config_finalize");
        if (st == KEEL_OK) round_trip(&cfg);
    }
    keel_config_free(&cfg);
    free(text);
    return 0;
}
