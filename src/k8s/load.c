/* k8s/load.c: a `keel k8s manifest` spec file read — a JSON spec (spec.c), or
 * a .env file of the AWS guide's shell variables (env.c) — with the default run
 * id of a spec rendered now. */
#include <string.h>
#include <time.h>

#include "k8s/spec.h"

/* A file ending in ".env" holds shell variables; any other is JSON. */
static bool env_file(const char *path) {
    size_t n = strlen(path);
    return n >= 4 && !strcmp(path + n - 4, ".env");
}

keel_status keel_k8s_spec_load(const char *path, keel_k8s_spec *s) {
    *s = (keel_k8s_spec){0};
    char *text = NULL, why[160];
    size_t len = 0;
    keel_status st = keel_read_regular(path, K8S_SPEC_MAX_BYTES, &text, &len, why, sizeof why);
    if (st != KEEL_OK) {
        keel_errorf("%s: cannot read the spec: %s (a spec is a small JSON or .env file: see docs/kubernetes.md)",
                    path, why);
        return st;
    }
    char stamp[32];
    time_t now = time(NULL);
    struct tm utc;
    gmtime_r(&now, &utc);
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &utc);
    st = env_file(path) ? keel_k8s_env_parse(text, len, path, stamp, s)
                        : keel_k8s_spec_parse(text, len, path, stamp, s);
    keel_free(text);
    return st;
}
