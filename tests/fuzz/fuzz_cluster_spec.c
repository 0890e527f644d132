/* tests/fuzz/fuzz_cluster_spec.c: a `keel cluster` spec (keel_cluster_spec_parse,
 * what keel_cluster_spec_load parses a file with) or a hosts file for a fixed
 * spec (keel_cluster_hosts_parse), and what keel makes of what it accepts:
 * `keel cluster env`'s text and slurm.conf. A spec is data,
 * never code: once accepted, every path is absolute with no '..' and no
 * character outside the grammar, and the generated text holds no control
 * character but its line ends, each env line an export of a single-quoted
 * value. Anything else is a finding (abort). */
#include "keel/cluster.h"

#include "fuzz.h"

static void check_path(const char *p) {
    if (!p) return;
    if (p[0] != '/' || strstr(p, "/../") || (strlen(p) >= 3 && !strcmp(p + strlen(p) - 3, "/..")) ||
        strlen(p) > KEEL_CLUSTER_PATH_MAX)
        abort();
    for (const char *c = p; *c; c++)
        if (!strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-/", *c)) abort();
}

static void check_text(const char *t) {
    if (!t) return;
    for (const unsigned char *c = (const unsigned char *)t; *c; c++)
        if ((*c < 0x20 && *c != '\n' && *c != '\t') || *c == 0x7f) abort();
}

/* "export NAME=" and a value made only of '...' chunks and \' escapes (what sh
 * reads as one word, nothing expanded), then '\n'; the next line. */
static const char *export_line(const char *c) {
    if (strncmp(c, "export ", 7)) abort();
    c += 7;
    while (*c == '_' || (*c >= 'A' && *c <= 'Z')) c++;
    if (*c++ != '=' || *c != '\'') abort();
    while (*c != '\n') {
        const char *q = *c == '\'' ? strchr(c + 1, '\'') : NULL;
        if (c[0] == '\\' && c[1] == '\'') c += 2;
        else if (q && !memchr(c, '\n', (size_t)(q - c))) c = q + 1;
        else abort();
    }
    return c + 1;
}

/* An input that starts "#hosts\n" is a hosts file (`keel cluster slurm-conf --hosts`) for this spec. */
#define HOSTS_MARK "#hosts\n"
static const char hosts_spec[] =
    "{\"ClusterName\": \"prod\", \"InstanceGroups\": ["
    "{\"InstanceGroupName\": \"ctl\", \"Role\": \"controller\", \"InstanceCount\": 1},"
    "{\"InstanceGroupName\": \"gpu\", \"Role\": \"worker\", \"InstanceCount\": 2, \"Gpus\": 8}]}";

static void fuzz_hosts(const uint8_t *data, size_t size) {
    keel_cluster_spec s;
    if (keel_cluster_spec_parse(hosts_spec, strlen(hosts_spec), "fuzz-spec.json", "/srv", &s) != KEEL_OK) abort();
    keel_status st = keel_cluster_hosts_parse(&s, (const char *)data, size, "fuzz-hosts");
    fuzz_expect_error_line(st, "keel_cluster_hosts_parse");
    if (st == KEEL_OK) {
        keel_cluster_files f = {.local = false, .conf_dir = "/etc/slurm", .keel = "/usr/bin/keel",
                                .plugin = "/usr/lib/keel/keel_auto_resume.so"};
        for (int i = 0; i < s.nnodes; i++)
            if (!s.nodes[i].name[0] || !s.nodes[i].addr[0]) abort();
        char *conf = keel_cluster_slurm_conf(&s, &f);
        check_text(conf);
        keel_free(conf);
    }
    keel_cluster_spec_free(&s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    if (size >= strlen(HOSTS_MARK) && !memcmp(data, HOSTS_MARK, strlen(HOSTS_MARK))) {
        fuzz_hosts(data + strlen(HOSTS_MARK), size - strlen(HOSTS_MARK));
        return 0;
    }
    keel_cluster_spec s;
    keel_status st = keel_cluster_spec_parse((const char *)data, size, "fuzz-cluster.json", "/srv/specs", &s);
    fuzz_expect_error_line(st, "keel_cluster_spec_parse");
    if (st != KEEL_OK) return 0;
    check_path(s.state_dir);
    check_path(s.shared_dir);
    check_path(s.plugin);
    if (strlen(s.state_dir) > KEEL_CLUSTER_STATE_DIR_MAX) abort();
    for (int g = 0; g < s.ngroups; g++) check_path(s.groups[g].on_create), check_path(s.groups[g].source_dir);

    char *env = keel_cluster_env_text(&s);
    if (!env) fuzz_expect_error_line(KEEL_ERR_INPUT, "keel_cluster_env_text");
    check_text(env);
    for (const char *line = env; line && *line;) line = export_line(line);
    keel_free(env);

    char *keel = keel_cluster_keel_path(&s), *plugin = keel_cluster_plugin_path(&s);
    keel_cluster_files f = {.local = true, .conf_dir = s.state_dir, .keel = keel, .plugin = plugin};
    char *conf = keel_cluster_slurm_conf(&s, &f);
    check_text(conf);
    keel_free(conf);
    keel_free(keel);
    keel_free(plugin);
    keel_cluster_spec_free(&s);
    return 0;
}
