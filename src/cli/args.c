/* cli/args.c: strict numeric arguments — the whole text is the number, in
 * range, or one error line says what was expected (never a silent 0) — and a
 * config file with its --set overrides, as every command that takes one reads it. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "cli/cli.h"
#include "keel/core.h"

bool cli_parse_int(const char *flag, const char *text, long long min, long long max, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end || v < min || v > max) {
        keel_errorf("%s '%s': expected a whole number from %lld to %lld", flag, text, min, max);
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_double(const char *flag, const char *text, double min, double max, double *out) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !isfinite(v) || v < min || v > max) {
        keel_errorf("%s '%s': expected a number from %g to %g", flag, text, min, max);
        return false;
    }
    *out = v;
    return true;
}

bool cli_add_set(char **sets, int *n_sets, char *text) {
    if (*n_sets == CLI_MAX_SETS) {
        keel_errorf("too many --set options (at most %d)", CLI_MAX_SETS);
        return false;
    }
    sets[(*n_sets)++] = text;
    return true;
}

keel_status cli_load_config(keel_config *cfg, const char *path, char **sets, int n_sets) {
    keel_config_defaults(cfg);
    keel_status st = keel_config_load_file(cfg, path);
    for (int i = 0; st == KEEL_OK && i < n_sets; i++) st = keel_config_set(cfg, sets[i]);
    if (st == KEEL_OK) st = keel_config_finalize(cfg);
    return st;
}
