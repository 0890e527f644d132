/* resil/health_gpu.c: keel health's gpu check — each GPU's signals through
 * NVML (core/gpu.c) held to the node config's limits (keel_gpu_limits), and
 * the XIDs the driver logged since a baseline.
 *
 * XIDs: the driver logs each as a kernel log line "NVRM: Xid (PCI:0000:19:00):
 * 79, pid=..., ..." that stays there until reboot, so counting them since boot
 * fails a GPU forever for an XID of last week. The check counts them per PCI
 * bus against a baseline file instead (KEEL_GPU_BASELINE_DEFAULT, or the
 * limits' baseline): a JSON record of this boot's kernel log as it was — per
 * bus the XIDs in it and the time of the last one. The first check that finds
 * no baseline writes it (tmp + rename) and says so; later checks fail on XIDs
 * after it. A new boot starts a new log: every XID in it is then newer than the
 * baseline. To accept XIDs after a repair, remove the file. XID events NVML
 * delivers while the check runs are new by construction (NVML reports only
 * events after registration) and need no baseline.
 *
 * Test and debug hook: KEEL_KERNEL_LOG=FILE makes the check read FILE (dmesg's
 * format, "[ seconds] message" lines) instead of the kernel's ring buffer. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/klog.h>
#include <time.h>

#include "keel/resil.h"

#define BASELINE_FORMAT "keel-gpu-baseline"
#define BASELINE_VERSION 1
#define SYSLOG_ACTION_READ_ALL 3
#define SYSLOG_ACTION_SIZE_BUFFER 10
#define LIST_XIDS 6 /* XIDs named in a detail line per GPU */

/* ---- the limits ---------------------------------------------------------------- */

static const struct {
    unsigned bit;
    const char *name;
} CLOCK_EVENTS[] = {
    {KEEL_GPU_CLOCKS_GPU_IDLE, "gpu_idle"},
    {KEEL_GPU_CLOCKS_APPLICATIONS_CLOCKS_SETTING, "applications_clocks_setting"},
    {KEEL_GPU_CLOCKS_SW_POWER_CAP, "sw_power_cap"},
    {KEEL_GPU_CLOCKS_HW_SLOWDOWN, "hw_slowdown"},
    {KEEL_GPU_CLOCKS_SYNC_BOOST, "sync_boost"},
    {KEEL_GPU_CLOCKS_SW_THERMAL_SLOWDOWN, "sw_thermal_slowdown"},
    {KEEL_GPU_CLOCKS_HW_THERMAL_SLOWDOWN, "hw_thermal_slowdown"},
    {KEEL_GPU_CLOCKS_HW_POWER_BRAKE_SLOWDOWN, "hw_power_brake_slowdown"},
    {KEEL_GPU_CLOCKS_DISPLAY_CLOCK_SETTING, "display_clock_setting"},
};
#define N_CLOCK_EVENTS (sizeof CLOCK_EVENTS / sizeof *CLOCK_EVENTS)

const char *keel_gpu_clock_event_name(unsigned bit) {
    for (size_t k = 0; k < N_CLOCK_EVENTS; k++)
        if (CLOCK_EVENTS[k].bit == bit) return CLOCK_EVENTS[k].name;
    return NULL;
}

unsigned keel_gpu_clock_event_bit(const char *name) {
    for (size_t k = 0; k < N_CLOCK_EVENTS; k++)
        if (!strcmp(CLOCK_EVENTS[k].name, name)) return CLOCK_EVENTS[k].bit;
    return 0;
}

const char *keel_gpu_clock_event_names(void) {
    static char names[256];
    if (!names[0])
        for (size_t k = 0; k < N_CLOCK_EVENTS; k++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k ? ", " : "", CLOCK_EVENTS[k].name);
    return names;
}

void keel_gpu_limits_defaults(keel_gpu_limits *l) {
    /* The application XIDs NVIDIA's Kubernetes device plugin skips: a program's
     * fault (a bad kernel, a page fault, a killed context), the GPU still sound. */
    static const unsigned application_xids[] = {13, 31, 43, 45, 68};
    *l = (keel_gpu_limits){
        .xid_max = 0,
        .temp_max_c = 87, /* Hopper SXM's "GPU Max Operating Temp" (nvidia-smi -q) */
        .ecc_uncorrected_max = 0,
        /* DCGM's limit of retired pages (63), the mechanism row remapping replaced */
        .remapped_rows_uncorrectable_max = 63,
        .fail_on_row_remap_pending = true, /* DCGM's diagnostic fails on both flags */
        .fail_on_row_remap_failure = true,
        .clock_events_fail = KEEL_GPU_CLOCKS_HW_SLOWDOWN | KEEL_GPU_CLOCKS_SW_THERMAL_SLOWDOWN |
                             KEEL_GPU_CLOCKS_HW_THERMAL_SLOWDOWN | KEEL_GPU_CLOCKS_HW_POWER_BRAKE_SLOWDOWN,
        .sm_clock_min_fraction = 0.5,
        .sm_clock_busy_util_pct = 50,
    };
    l->n_xid_ignore = (int)(sizeof application_xids / sizeof *application_xids);
    memcpy(l->xid_ignore, application_xids, sizeof application_xids);
}

static bool ignored(const keel_gpu_limits *l, unsigned xid) {
    for (int k = 0; k < l->n_xid_ignore; k++)
        if (l->xid_ignore[k] == xid) return true;
    return false;
}

/* ---- the kernel log's XIDs ------------------------------------------------------ */

typedef struct {
    char pci[16];  /* "0000:19:00": domain, bus, device (the log's form) */
    double time_s; /* seconds since boot, -1 when the line has no time */
    unsigned xid;
} xid_line;

typedef struct {
    xid_line *lines;
    int n, cap;
    char source[300]; /* where the log came from, for the baseline and the detail */
} xid_log;

/* NVML's "00000000:19:00.0" as the log's "0000:19:00"; false when it is not a bus id */
static bool pci_key(const char *bus_id, char out[16]) {
    unsigned domain, bus, device;
    if (sscanf(bus_id, "%x:%x:%x", &domain, &bus, &device) != 3) return false;
    snprintf(out, 16, "%04x:%02x:%02x", domain & 0xffff, bus & 0xff, device & 0xff);
    return true;
}

/* One line: "<6>[ 1234.567890] NVRM: Xid (PCI:0000:19:00): 79, pid=..." (the
 * <level> and the time are optional; drivers before R450 wrote no "PCI:"). */
static bool parse_xid_line(const char *line, xid_line *x) {
    const char *at = strstr(line, "NVRM: Xid (");
    if (!at) return false;
    x->time_s = -1;
    const char *p = line;
    if (*p == '<' && (p = strchr(p, '>'))) p++;
    else p = line;
    while (*p == ' ') p++;
    if (*p == '[') x->time_s = strtod(p + 1, NULL);
    at += strlen("NVRM: Xid (");
    if (!strncmp(at, "PCI:", 4)) at += 4;
    char bus[32];
    int used = 0;
    if (sscanf(at, "%31[0-9a-fA-F:.]%n", bus, &used) != 1 || !pci_key(bus, x->pci)) return false;
    return sscanf(at + used, "): %u", &x->xid) == 1;
}

static void xid_log_free(xid_log *log) { keel_free(log->lines); }

/* This boot's kernel log (or $KEEL_KERNEL_LOG's file), its XID lines in
 * order. false with *why when it cannot be read. */
static bool xid_log_read(xid_log *log, char *why, size_t why_n) {
    *log = (xid_log){0};
    const char *hook = getenv("KEEL_KERNEL_LOG");
    char *text = NULL;
    if (hook && *hook) {
        snprintf(log->source, sizeof log->source, "KEEL_KERNEL_LOG=%s", hook);
        if (keel_read_file_quiet(hook, 0, &text, NULL) != KEEL_OK) {
            snprintf(why, why_n, "%s: %s", log->source, strerror(errno));
            return false;
        }
    } else {
        /* what dmesg reads, without a child process or its stderr */
        snprintf(log->source, sizeof log->source, "the kernel log");
        int size = klogctl(SYSLOG_ACTION_SIZE_BUFFER, NULL, 0);
        if (size > 0) {
            text = keel_xmalloc((size_t)size + 1, "kernel log");
            int got = klogctl(SYSLOG_ACTION_READ_ALL, text, size);
            if (got >= 0) text[got] = 0;
            else keel_free(text), text = NULL;
        }
        if (!text) {
            snprintf(why, why_n, "the kernel log is not readable here (%s; kernel.dmesg_restrict: root reads it)",
                     strerror(errno));
            return false;
        }
    }
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        xid_line x;
        if (!parse_xid_line(line, &x)) continue;
        if (log->n == log->cap) {
            log->cap = log->cap ? 2 * log->cap : 64;
            log->lines = keel_xrealloc(log->lines, (size_t)log->cap * sizeof *log->lines, "XID lines");
        }
        log->lines[log->n++] = x;
    }
    keel_free(text);
    return true;
}

/* ---- the baseline ---------------------------------------------------------------- */

typedef struct {
    char pci[16];
    int xids;      /* XID lines of this bus in the log at the baseline (ignored ones too) */
    double last_s; /* the last one's time, -1 when unknown */
} baseline_bus;

typedef struct {
    char boot_id[64];
    int n;
    baseline_bus bus[128];
} baseline;

static void boot_id(char *out, size_t n) {
    char *text = NULL;
    out[0] = 0;
    if (keel_read_file_quiet("/proc/sys/kernel/random/boot_id", 256, &text, NULL) != KEEL_OK) return;
    snprintf(out, n, "%s", text);
    out[strcspn(out, " \n")] = 0;
    keel_free(text);
}

static const baseline_bus *lookup_bus(const baseline *b, const char *pci) {
    for (int k = 0; k < b->n; k++)
        if (!strcmp(b->bus[k].pci, pci)) return &b->bus[k];
    return NULL;
}

/* pci's entry, added when missing (NULL when the table is full). */
static baseline_bus *find_bus(baseline *b, const char *pci) {
    for (int k = 0; k < b->n; k++)
        if (!strcmp(b->bus[k].pci, pci)) return &b->bus[k];
    if (b->n == (int)(sizeof b->bus / sizeof *b->bus)) return NULL;
    baseline_bus *x = &b->bus[b->n++];
    *x = (baseline_bus){.last_s = -1};
    snprintf(x->pci, sizeof x->pci, "%s", pci);
    return x;
}

/* The baseline in path: KEEL_OK, KEEL_ERR_INPUT when there is none, KEEL_ERR_IO
 * (with *why) when it cannot be read or is not one. */
static keel_status baseline_load(const char *path, baseline *b, char *why, size_t why_n) {
    *b = (baseline){0};
    char *text;
    if (keel_read_file_quiet(path, 1 << 20, &text, NULL) != KEEL_OK) {
        if (errno == ENOENT || errno == ENOTDIR) return KEEL_ERR_INPUT; /* none (yet) */
        snprintf(why, why_n, "XID baseline %.300s: %s", path, strerror(errno));
        return KEEL_ERR_IO;
    }
    cJSON *j = cJSON_Parse(text);
    keel_free(text);
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(j, "format"),
                *version = cJSON_GetObjectItemCaseSensitive(j, "version"),
                *boot = cJSON_GetObjectItemCaseSensitive(j, "boot_id"),
                *buses = cJSON_GetObjectItemCaseSensitive(j, "buses");
    const char *wrong = NULL;
    if (!cJSON_IsString(format) || strcmp(format->valuestring, BASELINE_FORMAT))
        wrong = "no \"format\": \"" BASELINE_FORMAT "\"";
    else if (!cJSON_IsNumber(version) || version->valuedouble != BASELINE_VERSION) wrong = "a version other than 1";
    else if (!cJSON_IsString(boot) || !cJSON_IsArray(buses)) wrong = "no boot_id or buses";
    else {
        snprintf(b->boot_id, sizeof b->boot_id, "%s", boot->valuestring);
        const cJSON *x;
        cJSON_ArrayForEach(x, buses) {
            const cJSON *pci = cJSON_GetObjectItemCaseSensitive(x, "pci"),
                        *xids = cJSON_GetObjectItemCaseSensitive(x, "xids"),
                        *last = cJSON_GetObjectItemCaseSensitive(x, "last_s");
            char key[16];
            baseline_bus *bus;
            if (!cJSON_IsString(pci) || !pci_key(pci->valuestring, key) || !cJSON_IsNumber(xids) ||
                xids->valuedouble < 0 || !cJSON_IsNumber(last) || !(bus = find_bus(b, key))) {
                wrong = "a bus without pci, xids >= 0 and last_s";
                break;
            }
            bus->xids = (int)xids->valuedouble, bus->last_s = last->valuedouble;
        }
    }
    cJSON_Delete(j);
    if (wrong) {
        snprintf(why, why_n, "%.300s is not a keel GPU baseline (%s): remove it and the next check takes a new one",
                 path, wrong);
        return KEEL_ERR_IO;
    }
    return KEEL_OK;
}

/* The log as it is now as a baseline: every bus in it and every GPU's. */
static void baseline_from_log(baseline *b, const char *boot, const xid_log *log, const keel_gpu_sample *s, int n_gpus) {
    *b = (baseline){0};
    snprintf(b->boot_id, sizeof b->boot_id, "%s", boot);
    for (int i = 0; i < n_gpus; i++) {
        char key[16];
        if (pci_key(s[i].pci_bus_id, key)) find_bus(b, key);
    }
    for (int k = 0; k < log->n; k++) {
        baseline_bus *bus = find_bus(b, log->lines[k].pci);
        if (!bus) continue;
        bus->xids++;
        bus->last_s = log->lines[k].time_s;
    }
}

/* Write b to path durably (tmp + rename: a crash leaves the old file or
 * none, never half of one); false with *why. */
static bool baseline_write(const char *path, const baseline *b, const char *source, const keel_gpu_sample *s,
                           int n_gpus, char *why, size_t why_n) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "format", BASELINE_FORMAT);
    cJSON_AddNumberToObject(o, "version", BASELINE_VERSION);
    cJSON_AddStringToObject(o, "boot_id", b->boot_id);
    char node[256], when[32];
    keel_node_name(node, sizeof node);
    time_t now = time(NULL);
    struct tm utc;
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &utc));
    cJSON_AddStringToObject(o, "node", node);
    cJSON_AddStringToObject(o, "taken_at", when);
    cJSON_AddStringToObject(o, "kernel_log", source);
    cJSON *buses = cJSON_AddArrayToObject(o, "buses");
    for (int k = 0; k < b->n; k++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "pci", b->bus[k].pci);
        for (int i = 0; i < n_gpus; i++) {
            char key[16];
            if (pci_key(s[i].pci_bus_id, key) && !strcmp(key, b->bus[k].pci)) {
                cJSON_AddNumberToObject(x, "gpu", s[i].index);
                cJSON_AddStringToObject(x, "uuid", s[i].uuid);
            }
        }
        cJSON_AddNumberToObject(x, "xids", b->bus[k].xids);
        cJSON_AddNumberToObject(x, "last_s", b->bus[k].last_s);
        cJSON_AddItemToArray(buses, x);
    }
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    char *dir = keel_xstrdup(path), *slash = strrchr(dir, '/');
    bool has_dir = slash && slash != dir;
    if (has_dir) *slash = 0;
    keel_error_capture(true);
    keel_status st = has_dir ? keel_mkdirs(dir) : KEEL_OK;
    if (st == KEEL_OK) st = keel_write_file_atomic(path, text, strlen(text));
    keel_error_capture(false);
    if (st != KEEL_OK) snprintf(why, why_n, "%s", keel_last_error());
    keel_free(dir);
    free(text);
    return st == KEEL_OK;
}

/* ---- the check ---------------------------------------------------------------------- */

typedef struct {
    char *text;
    size_t n;
    int problems;
} report;

static void add(report *rep, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(report *rep, const char *fmt, ...) {
    size_t at = strlen(rep->text);
    if (at + 1 >= rep->n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rep->text + at, rep->n - at, fmt, ap);
    va_end(ap);
}

static void problem(report *rep, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void problem(report *rep, const char *fmt, ...) {
    size_t at = strlen(rep->text);
    if (rep->problems++ && at + 3 < rep->n) strcat(rep->text, "; "), at += 2;
    if (at + 1 >= rep->n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rep->text + at, rep->n - at, fmt, ap);
    va_end(ap);
}

/* "79, 48" */
static void xid_list(char *out, size_t n, const unsigned *xids, int count) {
    out[0] = 0;
    for (int k = 0; k < count && k < LIST_XIDS; k++)
        snprintf(out + strlen(out), n - strlen(out), "%s%u", k ? ", " : "", xids[k]);
    if (count > LIST_XIDS) snprintf(out + strlen(out), n - strlen(out), ", ...");
}

/* The XIDs of bus pci in the log that are newer than the baseline's, not ignored. */
static int new_xids(const xid_log *log, const baseline *base, const char *pci, const keel_gpu_limits *l,
                    unsigned *out, int out_n) {
    static const baseline_bus none = {.last_s = -1};
    const baseline_bus *b = base ? lookup_bus(base, pci) : NULL;
    if (!b) b = &none;
    bool timed = true;
    for (int k = 0; k < log->n; k++)
        if (!strcmp(log->lines[k].pci, pci)) timed &= log->lines[k].time_s >= 0;
    /* newer: after the baseline's last XID by the log's clock where both have
     * times (old lines rotated out of the ring buffer do not hide new ones),
     * else the lines past the baseline's count */
    bool by_time = timed && b->xids > 0 && b->last_s >= 0;
    int skip = by_time ? 0 : b->xids, seen = 0, count = 0;
    for (int k = 0; k < log->n; k++) {
        const xid_line *x = &log->lines[k];
        if (strcmp(x->pci, pci)) continue;
        bool newer = by_time ? x->time_s > b->last_s : seen++ >= skip;
        if (!newer || ignored(l, x->xid)) continue;
        if (count < out_n) out[count] = x->xid;
        count++;
    }
    return count;
}

/* One GPU's readings against the limits. */
static void judge_readings(const keel_gpu_sample *s, const keel_gpu_limits *l, report *rep) {
    const double *v = s->v;
    int i = s->index;
    if (v[KEEL_GPU_TEMP] > l->temp_max_c)
        problem(rep, "gpu%d: %.0f C, above gpu.temp_max_c %g", i, v[KEEL_GPU_TEMP], l->temp_max_c);
    if (v[KEEL_GPU_ECC_DBE_VOL] > l->ecc_uncorrected_max)
        problem(rep, "gpu%d: %.0f uncorrected ECC error(s) since the driver loaded, above gpu.ecc_uncorrected_max %g",
                i, v[KEEL_GPU_ECC_DBE_VOL], l->ecc_uncorrected_max);
    if (l->fail_on_row_remap_failure && v[KEEL_GPU_ROW_REMAP_FAILURE] > 0)
        problem(rep, "gpu%d: row remapping failed (gpu.fail_on_row_remap_failure)", i);
    if (l->fail_on_row_remap_pending && v[KEEL_GPU_ROW_REMAP_PENDING] > 0)
        problem(rep, "gpu%d: a row remap is pending until the GPU is reset (gpu.fail_on_row_remap_pending)", i);
    if (v[KEEL_GPU_UNCORRECTABLE_REMAPPED_ROWS] > l->remapped_rows_uncorrectable_max)
        problem(rep, "gpu%d: %.0f rows remapped for uncorrectable errors, above gpu.remapped_rows_uncorrectable_max %g",
                i, v[KEEL_GPU_UNCORRECTABLE_REMAPPED_ROWS], l->remapped_rows_uncorrectable_max);
    double reasons = v[KEEL_GPU_CLOCK_EVENT_REASONS];
    unsigned failing = isnan(reasons) ? 0 : (unsigned)reasons & l->clock_events_fail;
    if (failing) {
        char names[200] = "";
        for (unsigned bit = 1; bit; bit <<= 1)
            if ((failing & bit) && keel_gpu_clock_event_name(bit))
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", names[0] ? ", " : "",
                         keel_gpu_clock_event_name(bit));
        problem(rep, "gpu%d: clocks held down by %s (0x%x, in gpu.clock_events_fail)", i, names, failing);
    }
    double sm = v[KEEL_GPU_SM_CLOCK], max = v[KEEL_GPU_MAX_SM_CLOCK], util = v[KEEL_GPU_UTIL];
    if (util >= l->sm_clock_busy_util_pct && max > 0 && sm < l->sm_clock_min_fraction * max)
        problem(rep, "gpu%d: SM clock %.0f of %.0f MHz (%.2f) at %.0f%% busy, below gpu.sm_clock_min_fraction %g",
                i, sm, max, sm / max, util, l->sm_clock_min_fraction);
}

/* A reading for the detail line: "?" when NVML does not report it. */
static const char *shown(char out[16], double v) {
    if (isnan(v)) return "?";
    snprintf(out, 16, "%.0f", v);
    return out;
}

/* NVML's XID events during the check, and the kernel log's since the baseline, per GPU and per bus without one. */
static void judge_xids(const keel_gpu_sample *s, int n_gpus, const xid_log *log, const baseline *base,
                       const keel_gpu_limits *l, report *rep) {
    unsigned xids[LIST_XIDS];
    char list[128];
    for (int i = 0; i < n_gpus; i++) {
        if (s[i].index < 0) continue; /* not read */
        int events = 0;
        for (int k = 0; k < s[i].n_new_xids && k < KEEL_GPU_NEW_XIDS_MAX; k++) {
            unsigned xid = s[i].new_xids[k];
            if (ignored(l, xid)) continue;
            if (events < LIST_XIDS) xids[events] = xid;
            events++;
        }
        xid_list(list, sizeof list, xids, events);
        if (events > l->xid_max)
            problem(rep, "gpu%d: %d XID event(s) from NVML during the check (%s), above gpu.xid_max %g", s[i].index,
                    events, list, l->xid_max);
    }
    if (!log) return;
    /* every bus the log names: a GPU that fell off the bus (XID 79) may be gone from NVML's list */
    baseline buses = {0};
    for (int k = 0; k < log->n; k++) find_bus(&buses, log->lines[k].pci);
    for (int k = 0; k < buses.n; k++) {
        const char *pci = buses.bus[k].pci;
        int count = new_xids(log, base, pci, l, xids, LIST_XIDS);
        if (count <= l->xid_max) continue;
        xid_list(list, sizeof list, xids, count);
        int gpu = -1;
        for (int i = 0; i < n_gpus; i++) {
            char key[16];
            if (s[i].index >= 0 && pci_key(s[i].pci_bus_id, key) && !strcmp(key, pci)) gpu = s[i].index;
        }
        if (gpu >= 0)
            problem(rep, "gpu%d: %d XID(s) in the kernel log since the baseline (%s), above gpu.xid_max %g", gpu,
                    count, list, l->xid_max);
        else
            problem(rep, "PCI %s (no GPU NVML lists: fallen off the bus?): %d XID(s) in the kernel log since the "
                    "baseline (%s), above gpu.xid_max %g", pci, count, list, l->xid_max);
    }
}

/* The kernel log against the baseline: *use_log and *base set when the log is
 * judged; a note for the detail; false when the baseline itself is a failure. */
static bool kernel_log_and_baseline(const keel_gpu_limits *l, const keel_gpu_sample *s, int n_gpus, xid_log *log,
                                    bool *use_log, baseline *base, bool *have_base, char *note, size_t note_n) {
    const char *path = l->baseline[0] ? l->baseline : KEEL_GPU_BASELINE_DEFAULT;
    bool named = l->baseline[0] != 0;
    char why[600];
    *use_log = *have_base = false;
    if (!xid_log_read(log, why, sizeof why)) {
        snprintf(note, note_n, "kernel-log XIDs not judged: %s", why);
        return true;
    }
    char boot[64];
    boot_id(boot, sizeof boot);
    keel_status st = baseline_load(path, base, why, sizeof why);
    if (st == KEEL_ERR_IO) {
        snprintf(note, note_n, "%s", why);
        return false;
    }
    if (st == KEEL_ERR_INPUT) {
        baseline_from_log(base, boot, log, s, n_gpus);
        if (!baseline_write(path, base, log->source, s, n_gpus, why, sizeof why)) {
            if (named) {
                snprintf(note, note_n, "XID baseline %.300s cannot be written: %.400s", path, why);
                return false;
            }
            snprintf(note, note_n, "kernel-log XIDs not judged: no XID baseline at %.300s, and it cannot be "
                     "written: %.300s (run keel health once as root, or name a writable file: --gpu-baseline, "
                     "the node config's gpu.baseline)", path, why);
            return true;
        }
        *use_log = *have_base = true; /* against itself: nothing new */
        snprintf(note, note_n, "XID baseline written to %.300s: the %d XID line(s) in %.300s so far accepted", path,
                 log->n, log->source);
        return true;
    }
    *use_log = true;
    if (boot[0] && base->boot_id[0] && strcmp(boot, base->boot_id)) {
        /* a new boot: the log restarted after the baseline, so all of it is newer */
        snprintf(note, note_n, "kernel log: %d XID line(s), all since this boot (the baseline %.300s is of an earlier "
                 "boot)", log->n, path);
        return true;
    }
    *have_base = true;
    int before = 0;
    for (int k = 0; k < base->n; k++) before += base->bus[k].xids;
    snprintf(note, note_n, "kernel log: %d XID line(s), %d before the baseline %.300s", log->n, before, path);
    return true;
}

void keel_health_check_gpu(const keel_health_options *o, keel_health_result *r) {
    keel_gpu_limits defaults;
    keel_gpu_limits_defaults(&defaults);
    const keel_gpu_limits *l = o && o->gpu ? o->gpu : &defaults;
    char why[512];
    keel_gpus *g;
    keel_status st = keel_gpus_open(&g, why, sizeof why);
    snprintf(r->unit, sizeof r->unit, "C");
    r->limit = l->temp_max_c;
    if (!g) {
        r->status = st == KEEL_OK ? KEEL_HEALTH_SKIPPED : KEEL_HEALTH_FAIL;
        snprintf(r->detail, sizeof r->detail, st == KEEL_OK ? "no GPU (%s)" : "NVML does not answer: %s", why);
        return;
    }
    int n = keel_gpus_count(g);
    keel_gpu_sample *s = keel_xcalloc((size_t)(n ? n : 1) * sizeof *s, "GPU readings");
    for (int i = 0; i < n; i++)
        if (keel_gpus_read(g, i, &s[i]) != KEEL_OK) s[i].index = -1;
    keel_gpus_close(g);

    xid_log log;
    baseline base;
    bool use_log, have_base;
    char note[900], problems[1024] = "", summary[1024] = "";
    bool base_ok = kernel_log_and_baseline(l, s, n, &log, &use_log, &base, &have_base, note, sizeof note);
    report rep = {problems, sizeof problems, 0}, sum = {summary, sizeof summary, 0};
    if (!base_ok) problem(&rep, "%s", note);
    double hottest = 0;
    for (int i = 0; i < n; i++) {
        if (s[i].index < 0) continue;
        judge_readings(&s[i], l, &rep);
        const double *v = s[i].v;
        if (!isnan(v[KEEL_GPU_TEMP])) hottest = fmax(hottest, v[KEEL_GPU_TEMP]);
        char t[16], sm[16], max[16], util[16];
        add(&sum, "%sgpu%d %s C, SM %s/%s MHz, %s%% busy", i ? "; " : "", s[i].index, shown(t, v[KEEL_GPU_TEMP]),
            shown(sm, v[KEEL_GPU_SM_CLOCK]), shown(max, v[KEEL_GPU_MAX_SM_CLOCK]), shown(util, v[KEEL_GPU_UTIL]));
    }
    judge_xids(s, n, use_log ? &log : NULL, have_base ? &base : NULL, l, &rep);
    r->value = hottest;
    r->status = rep.problems ? KEEL_HEALTH_FAIL : KEEL_HEALTH_PASS;
    if (rep.problems)
        snprintf(r->detail, sizeof r->detail, "%d GPU(s), %d problem(s): %s | %s%s%s", n, rep.problems, problems,
                 summary, base_ok ? "; " : "", base_ok ? note : "");
    else
        snprintf(r->detail, sizeof r->detail, "%d GPU(s) within limits: %s; %s; %s", n, summary,
                 use_log ? "no new XID" : "no XID event from NVML", note);
    xid_log_free(&log);
    keel_free(s);
}
