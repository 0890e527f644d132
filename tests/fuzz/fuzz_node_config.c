/* tests/fuzz/fuzz_node_config.c: the node config of `keel health
 * --node-config` and a cluster spec's HealthCheck (keel_node_config_parse,
 * what keel_node_config_load parses a file with). */
#include "keel/resil.h"

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    char *text = fuzz_cstring(data, size);
    keel_node_config nc;
    keel_status st = keel_node_config_parse(text, "fuzz-node.json", &nc);
    fuzz_expect_error_line(st, "keel_node_config_parse");
    if (st == KEEL_OK && (nc.checks >> KEEL_CHECK_COUNT || nc.gpu.n_xid_ignore > KEEL_GPU_XID_IGNORE_MAX ||
                          memchr(nc.gpu.baseline, 0, sizeof nc.gpu.baseline) == NULL))
        abort();
    keel_free(nc.dir);
    free(text);
    return 0;
}
