/* tests/fuzz/fuzz_k8s_spec.c: a `keel k8s manifest` spec (keel_k8s_spec_parse,
 * what keel_k8s_spec_load parses a file with) and the YAML keel renders from
 * what it accepts. A spec is data, never code: every rendered line is a
 * comment, a "---", or `[- ]key:` with nothing, a number, "{}" or one
 * double-quoted scalar after it (or `- "scalar"`), the scalar closed on its
 * own line with no raw control byte; the job has the shape the spec asked
 * for. Anything else is a finding (abort). */
#include "keel/k8s.h"

#include "fuzz.h"

/* One double-quoted scalar at c: its end (just past the closing quote), or abort. */
static const char *quoted(const char *c) {
    if (*c++ != '"') abort();
    for (; *c != '"'; c++) {
        if (!*c || *c == '\n' || (unsigned char)*c < 0x20 || (unsigned char)*c >= 0x7f) abort();
        if (*c == '\\') {
            c++;
            if (*c == 'x') {
                if (!c[1] || !strchr("0123456789abcdef", c[1]) || !c[2] || !strchr("0123456789abcdef", c[2]))
                    abort();
                c += 2;
            } else if (*c != '"' && *c != '\\') abort();
        }
    }
    return c + 1;
}

static bool key_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '/' ||
           c == '-';
}

/* One line of the YAML (without its '\n'), held to keel's few shapes. */
static void check_line(const char *c) {
    if (!strcmp(c, "---") || !strncmp(c, "# ", 2)) return;
    while (*c == ' ') c++;
    if (c[0] == '-' && c[1] == ' ') {
        c += 2;
        if (*c == '"') {
            if (*quoted(c)) abort();
            return;
        }
    }
    const char *k = c;
    while (key_char(*c)) c++;
    if (c == k || *c++ != ':') abort();
    if (!*c) return;
    if (*c++ != ' ') abort();
    if (*c == '"') c = quoted(c);
    else if (!strcmp(c, "{}")) c += 2;
    else {
        if (!(*c >= '0' && *c <= '9')) abort();
        while (*c >= '0' && *c <= '9') c++;
    }
    if (*c) abort();
}

static void check_yaml(const char *yaml) {
    char *copy = strdup(yaml);
    if (!copy) abort();
    for (char *line = copy, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (!next) abort(); /* every line ends */
        *next++ = 0;
        check_line(line);
    }
    free(copy);
}

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
