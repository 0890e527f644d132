/* tests/fuzz/fuzz_k8s_status.c: the two inputs of the `keel k8s` commands
 * that are not JSON specs. The first byte is the mode:
 *   even: kubectl's answers for `keel k8s status` — the job's JSON, a NUL, the
 *         pod list's JSON (keel_k8s_state_parse) — and the summary printed
 *         from them, which must be lines of printable ASCII only (nothing from
 *         a cluster may drive the terminal), a fixed number of them;
 *   odd:  a .env file of the AWS guide's variables (keel_k8s_env_parse): what
 *         it accepts holds no '$', '`' or '\' anywhere (nothing is expanded or
 *         run) and renders YAML of keel's few shapes (k8s_yaml.h).
 * A crash, a sanitizer report, a leak, or a failure without exactly one
 * error line is a finding too. */
#include "keel/k8s.h"

#include "fuzz.h"
#include "k8s_yaml.h" /* check_yaml */

static void status_mode(const char *data, size_t size) {
    const char *nul = memchr(data, 0, size);
    size_t job_len = nul ? (size_t)(nul - data) : size;
    const char *pods = nul ? nul + 1 : "";
    size_t pods_len = nul ? size - job_len - 1 : 0;
    keel_k8s_state st;
    keel_status rc = keel_k8s_state_parse(data, job_len, pods, pods_len, &st);
    fuzz_expect_error_line(rc, "keel_k8s_state_parse");
    if (rc == KEEL_OK) {
        char *out = NULL;
        size_t n = 0;
        FILE *f = open_memstream(&out, &n);
        if (!f) abort();
        keel_k8s_state_print(&st, 1800000000, f);
        if (fclose(f) != 0 || !n || out[n - 1] != '\n') abort();
        int lines = 0;
        for (size_t i = 0; i < n; i++) {
            if (out[i] == '\n') lines++;
            else if (out[i] < 0x20 || out[i] >= 0x7f) abort(); /* a byte that is not printable text */
        }
        if (lines != 3 + (st.n_pods ? 1 + st.n_pods : 1) + (st.more_pods > 0)) abort();
        free(out);
    }
    keel_k8s_state_free(&st);
}

static bool plain(const char *v) { return !v || !strpbrk(v, "$`\\"); }

static void env_mode(const char *data, size_t size) {
    keel_k8s_spec s;
    keel_status rc = keel_k8s_env_parse(data, size, "fuzz.env", "20260101-000000", &s);
    fuzz_expect_error_line(rc, "keel_k8s_env_parse");
    if (rc != KEEL_OK) return;
    if (!plain(s.name) || !plain(s.ns) || !plain(s.image) || !plain(s.claim) || !plain(s.checkpoint_mount) ||
        !plain(s.config) || !plain(s.run_id) || !plain(s.etcd_image))
        abort();
    char *yaml = keel_k8s_render(&s);
    check_yaml(yaml);
    keel_free(yaml);
    keel_k8s_spec_free(&s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    if (size == 0) return 0;
    if (data[0] % 2 == 0) status_mode((const char *)data + 1, size - 1);
    else env_mode((const char *)data + 1, size - 1);
    return 0;
}
