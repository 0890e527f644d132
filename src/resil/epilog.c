/* resil/epilog.c: `keel health --epilog` — a node's own health verdict
 * carried out in Slurm. Run as root by slurmd (slurm.conf Epilog= after
 * every job, or HealthCheckProgram= every HealthCheckInterval): a node that
 * fails a check is drained with reason "keel: <check>"; a node that passes
 * again, and was drained by keel, returns to service. A node drained for any
 * other reason (an administrator's) is never touched. Every scontrol call is
 * time-bounded. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/resil.h"

#define SCONTROL_TIMEOUT_S 30 /* a slurmctld that stops answering must not hold the epilog */
#define KEEL_REASON "keel: "

#define GPU_KEYS                                                                                          \
    "baseline, xid_max, xid_ignore, temp_max_c, ecc_uncorrected_max, remapped_rows_uncorrectable_max, " \
    "fail_on_row_remap_pending, fail_on_row_remap_failure, clock_events_fail, sm_clock_min_fraction, "   \
    "sm_clock_busy_util_pct"

/* One line naming the file, the key, its value and what it takes. */
static keel_status bad_gpu_value(const char *path, const cJSON *x, const char *takes) {
    char *value = cJSON_PrintUnformatted(x);
    keel_errorf("%s: gpu.%s: bad value %.200s (%s)", path, x->string, value ? value : "?", takes);
    free(value);
    return KEEL_ERR_INPUT;
}

/* A number in [lo, hi] into *out (integral when `integer`). */
static bool gpu_number(const cJSON *x, double lo, double hi, bool integer, double *out) {
    if (!cJSON_IsNumber(x) || !(x->valuedouble >= lo && x->valuedouble <= hi)) return false;
    if (integer && x->valuedouble != floor(x->valuedouble)) return false;
    *out = x->valuedouble;
    return true;
}

/* The node config's "gpu" object: the gpu check's limits over the defaults. */
static keel_status parse_gpu_limits(const cJSON *gpu, const char *path, keel_gpu_limits *l) {
    if (!cJSON_IsObject(gpu)) {
        keel_errorf("%s: gpu: expected an object of the gpu check's limits ({\"temp_max_c\": 87, ...}; keys: %s)",
                    path, GPU_KEYS);
        return KEEL_ERR_INPUT;
    }
    const cJSON *x;
    cJSON_ArrayForEach(x, gpu) {
        const char *k = x->string;
        if (!strcmp(k, "baseline")) {
            if (!cJSON_IsString(x) || !x->valuestring[0] || strlen(x->valuestring) >= sizeof l->baseline)
                return bad_gpu_value(path, x, "the XID baseline file's path, e.g. \"" KEEL_GPU_BASELINE_DEFAULT "\"");
            snprintf(l->baseline, sizeof l->baseline, "%s", x->valuestring);
        } else if (!strcmp(k, "xid_max")) {
            if (!gpu_number(x, 0, 1e9, true, &l->xid_max))
                return bad_gpu_value(path, x, "the XIDs a GPU may have since the baseline, an integer >= 0, e.g. 0");
        } else if (!strcmp(k, "xid_ignore")) {
            const cJSON *e;
            int n = 0;
            bool ok = cJSON_IsArray(x) && cJSON_GetArraySize(x) <= KEEL_GPU_XID_IGNORE_MAX;
            cJSON_ArrayForEach(e, x) {
                double xid;
                if (!ok || !gpu_number(e, 0, 1e6, true, &xid)) {
                    ok = false;
                    break;
                }
                l->xid_ignore[n++] = (unsigned)xid;
            }
            if (!ok)
                return bad_gpu_value(path, x, "a list of at most 32 XID numbers not to count, e.g. [13, 31, 43, "
                                              "45, 68]");
            l->n_xid_ignore = n;
        } else if (!strcmp(k, "temp_max_c")) {
            if (!gpu_number(x, 1, 200, false, &l->temp_max_c))
                return bad_gpu_value(path, x, "the hottest a GPU may be, degrees C in 1..200, e.g. 87");
        } else if (!strcmp(k, "ecc_uncorrected_max")) {
            if (!gpu_number(x, 0, 1e12, true, &l->ecc_uncorrected_max))
                return bad_gpu_value(path, x, "uncorrected volatile ECC errors a GPU may have, an integer >= 0, "
                                              "e.g. 0");
        } else if (!strcmp(k, "remapped_rows_uncorrectable_max")) {
            if (!gpu_number(x, 0, 1e12, true, &l->remapped_rows_uncorrectable_max))
                return bad_gpu_value(path, x, "rows a GPU may have remapped for uncorrectable errors, an integer "
                                              ">= 0, e.g. 63");
        } else if (!strcmp(k, "fail_on_row_remap_pending") || !strcmp(k, "fail_on_row_remap_failure")) {
            if (!cJSON_IsBool(x)) return bad_gpu_value(path, x, "true or false");
            if (!strcmp(k, "fail_on_row_remap_pending")) l->fail_on_row_remap_pending = cJSON_IsTrue(x);
            else l->fail_on_row_remap_failure = cJSON_IsTrue(x);
        } else if (!strcmp(k, "clock_events_fail")) {
            const cJSON *e;
            unsigned mask = 0;
            bool ok = cJSON_IsArray(x);
            cJSON_ArrayForEach(e, x) {
                unsigned bit = cJSON_IsString(e) ? keel_gpu_clock_event_bit(e->valuestring) : 0;
                if (!ok || !bit) {
                    ok = false;
                    break;
                }
                mask |= bit;
            }
            if (!ok) {
                char takes[400];
                snprintf(takes, sizeof takes, "a list of NVML's clock event reasons that fail a GPU, of: %s",
                         keel_gpu_clock_event_names());
                return bad_gpu_value(path, x, takes);
            }
            l->clock_events_fail = mask;
        } else if (!strcmp(k, "sm_clock_min_fraction")) {
            if (!gpu_number(x, 0, 1, false, &l->sm_clock_min_fraction))
                return bad_gpu_value(path, x, "the least SM clock of a busy GPU, a fraction of its max in 0..1, "
                                              "e.g. 0.5");
        } else if (!strcmp(k, "sm_clock_busy_util_pct")) {
            if (!gpu_number(x, 0, 100, false, &l->sm_clock_busy_util_pct))
                return bad_gpu_value(path, x, "the utilization, percent in 0..100, from which a GPU counts as "
                                              "busy, e.g. 50");
        } else {
            keel_errorf("%s: gpu: unknown key '%s' (the gpu check's limits are %s)", path, k, GPU_KEYS);
            return KEEL_ERR_INPUT;
        }
    }
    return KEEL_OK;
}

/* --node-config FILE: {"checks": ["gemm", ...], "gemm_floor_gflops": X,
 * "memory_floor_gib": Y, "dir": "PATH", "gpu": {...}}, every key optional, no
 * other key. */
keel_status keel_node_config_parse(const char *text, const char *path, keel_node_config *nc) {
    *nc = (keel_node_config){.gemm_floor = -1, .memory_floor = -1};
    keel_gpu_limits_defaults(&nc->gpu);
    keel_status st = KEEL_OK;
    cJSON *j = cJSON_Parse(text);
    if (!cJSON_IsObject(j)) {
        keel_errorf("%s: not a JSON object (a node config: {\"checks\": [...], \"gemm_floor_gflops\": X, "
                    "\"memory_floor_gib\": Y, \"dir\": \"PATH\"})", path);
        cJSON_Delete(j);
        return KEEL_ERR_INPUT;
    }
    const cJSON *x;
    cJSON_ArrayForEach(x, j) {
        const char *k = x->string;
        bool number = cJSON_IsNumber(x) && x->valuedouble >= 0;
        if (!strcmp(k, "checks") && cJSON_IsArray(x)) {
            char list[256] = "";
            const cJSON *c;
            cJSON_ArrayForEach(c, x) {
                if (!cJSON_IsString(c)) break;
                size_t at = strlen(list);
                snprintf(list + at, sizeof list - at, "%s%s", at ? "," : "", c->valuestring);
            }
            char origin[600];
            snprintf(origin, sizeof origin, "%s: checks", path);
            if (c || keel_health_checks_parse(list, origin, &nc->checks) != KEEL_OK) {
                if (c) keel_errorf("%s: checks: a list of check names, got a %s in it", path,
                                   cJSON_IsNumber(c) ? "number" : "non-string");
                st = KEEL_ERR_INPUT;
                break;
            }
            nc->has_checks = true;
        } else if (!strcmp(k, "gemm_floor_gflops") && number) {
            nc->gemm_floor = x->valuedouble;
        } else if (!strcmp(k, "memory_floor_gib") && number) {
            nc->memory_floor = x->valuedouble;
        } else if (!strcmp(k, "dir") && cJSON_IsString(x) && x->valuestring[0]) {
            keel_free(nc->dir); /* a key given twice: the last one */
            nc->dir = keel_xstrdup(x->valuestring);
        } else if (!strcmp(k, "gpu")) {
            if ((st = parse_gpu_limits(x, path, &nc->gpu)) != KEEL_OK) break;
        } else {
            bool known = !strcmp(k, "checks") || !strcmp(k, "gemm_floor_gflops") ||
                         !strcmp(k, "memory_floor_gib") || !strcmp(k, "dir");
            keel_errorf("%s: %s '%s' (a node config has checks: a list of names, gemm_floor_gflops and "
                        "memory_floor_gib: numbers >= 0, dir: a path, gpu: the gpu check's limits)", path,
                        known ? "bad value for" : "unknown key", k);
            st = KEEL_ERR_INPUT;
            break;
        }
    }
    cJSON_Delete(j);
    return st;
}

keel_status keel_node_config_load(const char *path, keel_node_config *nc) {
    *nc = (keel_node_config){.gemm_floor = -1, .memory_floor = -1};
    keel_gpu_limits_defaults(&nc->gpu);
    char *text;
    keel_status st = keel_read_file(path, &text, NULL);
    if (st != KEEL_OK) return st;
    st = keel_node_config_parse(text, path, nc);
    keel_free(text);
    return st;
}

/* Whether node is drained (or draining), and its reason without Slurm's
 * " [user@time]" suffix. false: scontrol did not answer for it. */
static bool drain_state(const char *node, bool *drained, char *reason, size_t n) {
    char name[256], out[8192];
    snprintf(name, sizeof name, "%s", node);
    char *argv[] = {"scontrol", "-o", "show", "node", name, NULL};
    if (keel_run_capture(argv, SCONTROL_TIMEOUT_S, out, sizeof out) != 0 || !strstr(out, "NodeName=")) return false;
    char state[128] = ""; /* IDLE+DRAIN, MIXED+DRAIN, DRAINED, ... */
    const char *at = strstr(out, " State=");
    if (at) sscanf(at + 7, "%127s", state);
    *drained = strstr(state, "DRAIN") != NULL;
    reason[0] = 0;
    const char *r = strstr(out, " Reason=");
    if (r) {
        snprintf(reason, n, "%s", r + 8);
        char *cut = strstr(reason, " [");
        if (!cut) cut = strchr(reason, '\n');
        if (cut) *cut = 0;
    }
    return true;
}

static bool update(const char *node, const char *state, const char *reason) {
    char name[300], st[64], why[128], out[1024];
    snprintf(name, sizeof name, "nodename=%s", node);
    snprintf(st, sizeof st, "state=%s", state);
    snprintf(why, sizeof why, "reason=%s", reason ? reason : "");
    char *argv[] = {"scontrol", "update", name, st, reason ? why : NULL, NULL};
    return keel_run_capture(argv, SCONTROL_TIMEOUT_S, out, sizeof out) == 0;
}

keel_status keel_health_epilog(const char *node, const keel_health_result *r, int n, char *said, size_t said_n) {
    const char *failed = NULL;
    for (int i = 0; i < n && !failed; i++)
        if (r[i].status == KEEL_HEALTH_FAIL) failed = keel_health_check_name(r[i].check);
    bool drained;
    char reason[512];
    if (!drain_state(node, &drained, reason, sizeof reason)) {
        keel_errorf("scontrol show node %s: no answer in %d s, or no such node (is SLURM_CONF right, and "
                    "SLURMD_NODENAME this node's name?)", node, SCONTROL_TIMEOUT_S);
        return KEEL_ERR_IO;
    }
    bool ours = drained && !strncmp(reason, KEEL_REASON, strlen(KEEL_REASON));
    if (failed) {
        char why[96];
        snprintf(why, sizeof why, KEEL_REASON "%s", failed);
        if (drained && !ours) { /* an administrator's drain stays as it is */
            snprintf(said, said_n, "node %s failed the %s check; already drained (%s)", node, failed, reason);
            return KEEL_OK;
        }
        if (!update(node, "drain", why)) {
            keel_errorf("scontrol update nodename=%s state=drain: failed or no answer in %d s", node,
                        SCONTROL_TIMEOUT_S);
            return KEEL_ERR_IO;
        }
        snprintf(said, said_n, "node %s failed the %s check: drained (reason \"%s\")", node, failed, why);
        return KEEL_OK;
    }
    if (!ours) {
        snprintf(said, said_n, "node %s healthy%s%s%s", node, drained ? " (drained by someone else: " : "",
                 drained ? reason : "", drained ? "; left drained)" : "");
        return KEEL_OK;
    }
    if (!update(node, "resume", NULL)) {
        keel_errorf("scontrol update nodename=%s state=resume: failed or no answer in %d s", node,
                    SCONTROL_TIMEOUT_S);
        return KEEL_ERR_IO;
    }
    snprintf(said, said_n, "node %s healthy again: returned to service (was drained: %s)", node, reason);
    return KEEL_OK;
}
