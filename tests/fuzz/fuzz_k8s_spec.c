/* tests/fuzz/fuzz_k8s_spec.c: a `keel k8s manifest` spec (keel_k8s_spec_parse,
 * what keel_k8s_spec_load parses a file with) and the YAML keel renders from
 * what it accepts. A spec is data, never code: every rendered line is one of
 * the few shapes keel writes (k8s_yaml.h); the job has the shape the spec
 * asked for. Anything else is a finding (abort). */
#include "keel/k8s.h"

#include "fuzz.h"
#include "k8s_yaml.h" /* check_yaml: every line one of keel's few shapes */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    keel_k8s_spec s;
    keel_status st = keel_k8s_spec_parse((const char *)data, size, "fuzz-k8s.json", "20260101-000000", &s);
    fuzz_expect_error_line(st, "keel_k8s_spec_parse");
    if (st != KEEL_OK) return 0;
    if (s.nodes < 1 || s.nproc_per_node < 1 || (s.gpus_per_node && s.gpus_per_node != s.nproc_per_node) ||
        (s.elastic && (s.master || s.min_nodes > s.max_nodes || s.nodes < s.min_nodes || s.nodes > s.max_nodes)) ||
        (s.kind == KEEL_K8S_MPIJOB && (s.master || s.elastic)) || !s.image[0] || s.config[0] != '/' ||
        s.checkpoint_mount[0] != '/')
        abort();
    char *yaml = keel_k8s_render(&s);
    check_yaml(yaml);
    const char *kind = s.kind == KEEL_K8S_MPIJOB ? "\nkind: \"MPIJob\"\n" : "\nkind: \"PyTorchJob\"\n";
    if (!strstr(yaml, kind) || (s.kind == KEEL_K8S_PYTORCHJOB && !strstr(yaml, "\nkind: \"Service\"\n")) ||
        (s.elastic != (strstr(yaml, "  elasticPolicy:\n") != NULL)) || (s.master != (strstr(yaml, "    Master:\n") != NULL)))
        abort();
    keel_free(yaml);
    keel_k8s_spec_free(&s);
    return 0;
}
