/* monitor/exporter.c: the run in Prometheus' text format, read from the run
 * directory alone — metrics.jsonl (the leader's steps), events.jsonl (what
 * happened, counted by its fields) and each rank's heartbeat (its step, step
 * times, memory and CPU) — so the supervisor of an --nproc run and a single
 * process serve the same families. Both files are read incrementally: a
 * scrape parses only the lines appended since the last one. This node's
 * NVIDIA GPUs, where NVML is present, are read at each scrape and named as
 * dcgm-exporter names them. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "keel/monitor.h"
#include "keel/run.h"

static const char *const CAUSES[] = {"crash", "hang", "diverged", "preempted", "health", "straggler"};
#define N_CAUSES ((int)(sizeof CAUSES / sizeof *CAUSES))
#define MAX_NODES 256
#define MAX_RECOVERIES 1024
#define MAX_RECENT 500
#define MAX_SAMPLES 16

typedef struct { /* one JSON-lines file, read from where the last scrape stopped */
    char path[4200];
    long offset;
} tail;

struct keel_exporter {
    pthread_mutex_t lock;
    char run_dir[4096];
    double started_unix;
    tail metrics, events, samples_file;
    long metrics_before; /* metrics.jsonl's size when this process started: earlier steps are not its goodput */
    /* metrics.jsonl */
    bool have_step;
    double step, loss, lr, grad_norm, tokens_per_s, mfu, step_s, tokens, val_loss;
    bool have_val;
    double comm_wait_total, ckpt_stall_total;
    double *step_time; /* (n_step_time) the newest step_s of each step since this process began */
    int64_t n_step_time;
    /* events.jsonl */
    double failures[N_CAUSES], other_failures, restarts;
    double recovery[MAX_RECOVERIES];
    int n_recovery;
    bool have_ckpt;
    double ckpt_step, ckpt_bytes, ckpt_seconds;
    char *drained[MAX_NODES];
    int n_drained;
    /* the dashboard's history: every step's numbers (a rollback truncates to the redone step), the newest events */
    keel_step_point *points;
    int64_t n_points, cap_points;
    cJSON *recent;         /* array of the newest events (at most MAX_RECENT) */
    cJSON *samples;        /* array of the newest lines of samples.jsonl (at most MAX_SAMPLES) */
    /* this node's GPUs (opened at the first scrape; NULL without NVML) */
    bool gpus_tried;
    keel_gpus *gpus;
};

/* A run directory's file for reading, only when it is a regular file (a FIFO put in its place
 * must not block the endpoint); NULL otherwise. */
static FILE *open_run_file(const char *path) {
    int fd;
    char why[128];
    if (keel_open_read(path, false, &fd, why, sizeof why) != KEEL_OK) return NULL;
    FILE *f = fdopen(fd, "r");
    if (!f) close(fd);
    return f;
}

keel_exporter *keel_exporter_new(const char *run_dir) {
    keel_exporter *x = keel_xcalloc(sizeof *x, "exporter");
    pthread_mutex_init(&x->lock, NULL);
    snprintf(x->run_dir, sizeof x->run_dir, "%s", run_dir);
    x->started_unix = keel_unix_s();
    keel_run_path(x->metrics.path, sizeof x->metrics.path, run_dir, KEEL_RUN_METRICS);
    keel_run_path(x->events.path, sizeof x->events.path, run_dir, "events.jsonl");
    keel_run_path(x->samples_file.path, sizeof x->samples_file.path, run_dir, KEEL_RUN_SAMPLES);
    FILE *f = open_run_file(x->metrics.path);
    if (f) {
        fseek(f, 0, SEEK_END);
        x->metrics_before = ftell(f);
        fclose(f);
    }
    return x;
}

void keel_exporter_free(keel_exporter *x) {
    if (!x) return;
    keel_free(x->points);
    cJSON_Delete(x->recent);
    cJSON_Delete(x->samples);
    for (int i = 0; i < x->n_drained; i++) keel_free(x->drained[i]);
    keel_free(x->step_time);
    keel_gpus_close(x->gpus);
    pthread_mutex_destroy(&x->lock);
    keel_free(x);
}

/* Each whole line appended since the last call, parsed; a line still being
 * written (no newline yet) waits for the next call. */
static void read_tail(keel_exporter *x, tail *t, void (*take)(keel_exporter *, const cJSON *, long at)) {
    FILE *f = open_run_file(t->path);
    if (!f) return;
    if (fseek(f, t->offset, SEEK_SET) != 0) {
        fclose(f);
        return;
    }
    char line[16384];
    for (;;) {
        long at = ftell(f);
        if (!fgets(line, sizeof line, f)) break;
        size_t n = strlen(line);
        if (n == 0 || line[n - 1] != '\n') break; /* partial: next time */
        t->offset = at + (long)n;
        cJSON *o = cJSON_Parse(line);
        if (cJSON_IsObject(o)) take(x, o, at);
        cJSON_Delete(o);
    }
    fclose(f);
}

static bool number(const cJSON *o, const char *key, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v)) return false;
    *out = v->valuedouble;
    return true;
}

static void take_step(keel_exporter *x, const cJSON *o, long at) {
    double step;
    if (!number(o, "step", &step)) return;
    x->have_step = true;
    x->step = step;
    number(o, "loss", &x->loss);
    number(o, "lr", &x->lr);
    number(o, "grad_norm", &x->grad_norm);
    number(o, "tokens_per_s", &x->tokens_per_s);
    number(o, "mfu", &x->mfu);
    number(o, "step_s", &x->step_s);
    number(o, "tokens", &x->tokens);
    if (number(o, "val_loss", &x->val_loss)) x->have_val = true;
    keel_step_point pt = {.step = step, .loss = x->loss, .tokens_per_s = x->tokens_per_s, .mfu = x->mfu,
                          .step_s = x->step_s, .val_loss = NAN};
    number(o, "val_loss", &pt.val_loss);
    while (x->n_points > 0 && x->points[x->n_points - 1].step >= step) x->n_points--; /* rolled back */
    if (x->n_points == x->cap_points) {
        x->cap_points = x->cap_points ? 2 * x->cap_points : 1024;
        x->points = keel_xrealloc(x->points, sizeof *x->points * (size_t)x->cap_points, "step history");
    }
    x->points[x->n_points++] = pt;
    double v;
    if (number(o, "comm_wait_s", &v)) x->comm_wait_total += v;
    if (number(o, "ckpt_stall_s", &v)) x->ckpt_stall_total += v;
    if (at < x->metrics_before || step < 1 || step > 1e9) return;
    int64_t i = (int64_t)step - 1; /* a step done again after a rollback replaces the lost one */
    if (i >= x->n_step_time) {
        int64_t n = 2 * (i + 1);
        x->step_time = keel_xrealloc(x->step_time, sizeof(double) * (size_t)n, "step times");
        memset(x->step_time + x->n_step_time, 0, sizeof(double) * (size_t)(n - x->n_step_time));
        x->n_step_time = n;
    }
    x->step_time[i] = x->step_s;
}

static void take_event(keel_exporter *x, const cJSON *o, long at) {
    (void)at;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(o, "event");
    const cJSON *cause = cJSON_GetObjectItemCaseSensitive(o, "cause");
    const cJSON *node = cJSON_GetObjectItemCaseSensitive(o, "node");
    if (!cJSON_IsString(type)) return;
    const char *t = type->valuestring;
    if (!x->recent) x->recent = cJSON_CreateArray();
    if (cJSON_GetArraySize(x->recent) == MAX_RECENT) cJSON_DeleteItemFromArray(x->recent, 0);
    cJSON_AddItemToArray(x->recent, cJSON_Duplicate(o, true));
    double v;
    if (cJSON_IsString(cause)) {
        int c = 0;
        while (c < N_CAUSES && strcmp(CAUSES[c], cause->valuestring)) c++;
        if (c < N_CAUSES) x->failures[c]++;
        else x->other_failures++;
    }
    if (!strcmp(t, "restart")) x->restarts++;
    if (!strcmp(t, "recovered") && number(o, "seconds", &v) && x->n_recovery < MAX_RECOVERIES)
        x->recovery[x->n_recovery++] = v;
    if (!strcmp(t, "checkpoint_committed") && number(o, "step", &x->ckpt_step)) {
        x->have_ckpt = true;
        number(o, "bytes", &x->ckpt_bytes);
        number(o, "seconds", &x->ckpt_seconds);
    }
    if ((!strcmp(t, "node_drained") || !strcmp(t, "node_excluded")) && cJSON_IsString(node)) {
        bool seen = false;
        for (int i = 0; i < x->n_drained; i++) seen |= !strcmp(x->drained[i], node->valuestring);
        if (!seen && x->n_drained < MAX_NODES) x->drained[x->n_drained++] = keel_xstrdup(node->valuestring);
    }
}

/* A line of samples.jsonl (train.sample_every): kept as it is, the newest MAX_SAMPLES. */
static void take_sample(keel_exporter *x, const cJSON *o, long at) {
    (void)at;
    if (!x->samples) x->samples = cJSON_CreateArray();
    if (cJSON_GetArraySize(x->samples) == MAX_SAMPLES) cJSON_DeleteItemFromArray(x->samples, 0);
    cJSON_AddItemToArray(x->samples, cJSON_Duplicate(o, true));
}

/* ---- the text ------------------------------------------------------------------------ */

static void family(keel_strbuf *t, const char *name, const char *type, const char *help) {
    keel_strbuf_printf(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A sample value as Prometheus reads it. */
static void value(keel_strbuf *t, double v) {
    if (isnan(v)) keel_strbuf_printf(t, " NaN\n");
    else if (isinf(v)) keel_strbuf_printf(t, v > 0 ? " +Inf\n" : " -Inf\n");
    else keel_strbuf_printf(t, " %.17g\n", v);
}

static void gauge(keel_strbuf *t, const char *name, const char *help, double v) {
    family(t, name, "gauge", help);
    keel_strbuf_printf(t, "%s", name);
    value(t, v);
}

/* A label value: backslash, double quote and newline escaped. */
static void label_value(keel_strbuf *t, const char *s) {
    keel_strbuf_printf(t, "\"");
    for (; *s; s++) {
        if (*s == '\\' || *s == '"') keel_strbuf_printf(t, "\\%c", *s);
        else if (*s == '\n') keel_strbuf_printf(t, "\\n");
        else keel_strbuf_printf(t, "%c", *s);
    }
    keel_strbuf_printf(t, "\"");
}

typedef struct {
    int rank;
    keel_heartbeat_info hb;
} rank_beat;

static int by_rank(const void *a, const void *b) {
    return ((const rank_beat *)a)->rank - ((const rank_beat *)b)->rank;
}

/* Every rank's heartbeat in RUN/heartbeats, by rank. */
static int read_beats(const char *run_dir, rank_beat **out) {
    char dir[4200];
    keel_run_path(dir, sizeof dir, run_dir, "heartbeats");
    *out = NULL;
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int rank, end = 0;
        if (sscanf(e->d_name, "rank-%d%n", &rank, &end) != 1 || e->d_name[end] || rank < 0) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            *out = keel_xrealloc(*out, sizeof(rank_beat) * (size_t)cap, "heartbeats");
        }
        if (keel_heartbeat_read(run_dir, rank, &(*out)[n].hb)) (*out)[n++].rank = rank;
    }
    closedir(d);
    if (n > 1) qsort(*out, (size_t)n, sizeof **out, by_rank);
    return n;
}

static void rank_labels(keel_strbuf *t, const char *name, const rank_beat *b) {
    keel_strbuf_printf(t, "%s{rank=\"%d\",node=", name, b->rank);
    label_value(t, b->hb.node);
    keel_strbuf_printf(t, "}");
}

typedef enum {
    RANK_STEP, RANK_STEP_UNIX, RANK_BEAT_UNIX, RANK_PROGRESS_UNIX, RANK_STEP_S, RANK_COMPUTE_S, RANK_RSS, RANK_CPU_UTIL, RANK_CPU_S
} rank_field;

static double rank_value(const keel_heartbeat_info *h, rank_field f) {
    switch (f) {
    case RANK_STEP: return (double)h->step;
    case RANK_STEP_UNIX: return h->step_unix_s;
    case RANK_BEAT_UNIX: return h->unix_s;
    case RANK_PROGRESS_UNIX: return h->progress_unix_s;
    case RANK_STEP_S: return h->step_s;
    case RANK_COMPUTE_S: return h->compute_s;
    case RANK_RSS: return (double)h->rss_bytes;
    case RANK_CPU_UTIL: return h->cpu_util;
    case RANK_CPU_S: return h->cpu_s;
    }
    return NAN;
}

static void per_rank(keel_strbuf *t, const rank_beat *b, int n, const char *name, const char *type, const char *help,
                     rank_field f) {
    if (n == 0) return;
    family(t, name, type, help);
    for (int i = 0; i < n; i++) {
        rank_labels(t, name, &b[i]);
        value(t, rank_value(&b[i].hb, f));
    }
}

static void step_histogram(keel_strbuf *t, const rank_beat *b, int n) {
    const char *name = "keel_rank_step_seconds";
    family(t, name, "histogram", "Time of each optimizer step of this rank's current process.");
    for (int i = 0; i < n; i++) {
        const keel_heartbeat_info *h = &b[i].hb;
        uint64_t cumulative = 0;
        for (int k = 0; k <= KEEL_STEP_BUCKETS; k++) {
            cumulative += h->step_buckets[k];
            keel_strbuf_printf(t, "%s_bucket{rank=\"%d\",node=", name, b[i].rank);
            label_value(t, h->node);
            if (k < KEEL_STEP_BUCKETS) keel_strbuf_printf(t, ",le=\"%g\"}", keel_step_bucket_s[k]);
            else keel_strbuf_printf(t, ",le=\"+Inf\"}");
            value(t, (double)cumulative);
        }
        rank_labels(t, "keel_rank_step_seconds_sum", &b[i]);
        value(t, h->step_sum_s);
        rank_labels(t, "keel_rank_step_seconds_count", &b[i]);
        value(t, (double)cumulative);
    }
}

/* dcgm-exporter's name, type and help for each GPU reading it exports (its
 * etc/default-counters.csv), and its labels: existing DCGM dashboards and alerts
 * work unchanged. promtool's style lint complains about these names (camelCase
 * labels, counters without _total) as it does on dcgm-exporter's endpoint. */
static const struct {
    keel_gpu_field f;
    const char *name, *type, *help;
} GPU_FAMILIES[] = {
    {KEEL_GPU_SM_CLOCK, "DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."},
    {KEEL_GPU_MEM_CLOCK, "DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."},
    {KEEL_GPU_MAX_SM_CLOCK, "DCGM_FI_DEV_MAX_SM_CLOCK", "gauge", "Maximum supported SM clock (in MHz)."},
    {KEEL_GPU_TEMP, "DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."},
    {KEEL_GPU_POWER_USAGE, "DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."},
    {KEEL_GPU_TOTAL_ENERGY, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
     "Total energy consumption since boot (in mJ)."},
    {KEEL_GPU_PCIE_REPLAY, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."},
    {KEEL_GPU_UTIL, "DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."},
    {KEEL_GPU_MEM_COPY_UTIL, "DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."},
    {KEEL_GPU_XID_ERRORS, "DCGM_FI_DEV_XID_ERRORS", "gauge",
     "Value of the last XID error encountered (since this endpoint started)."},
    {KEEL_GPU_FB_FREE, "DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."},
    {KEEL_GPU_FB_USED, "DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."},
    {KEEL_GPU_ECC_SBE_VOL, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter",
     "Total number of single-bit volatile ECC errors."},
    {KEEL_GPU_ECC_DBE_VOL, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter",
     "Total number of double-bit volatile ECC errors."},
    {KEEL_GPU_UNCORRECTABLE_REMAPPED_ROWS, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
     "Number of remapped rows for uncorrectable errors"},
    {KEEL_GPU_CORRECTABLE_REMAPPED_ROWS, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
     "Number of remapped rows for correctable errors"},
    {KEEL_GPU_ROW_REMAP_FAILURE, "DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"},
    {KEEL_GPU_CLOCK_EVENT_REASONS, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge",
     "Current clock throttle reasons (bitmask of DCGM_CLOCKS_THROTTLE_REASON_*)."},
};

/* This node's GPUs, labelled as dcgm-exporter labels them; a reading a GPU does not support has no sample. */
static void gpu_families(keel_exporter *x, keel_strbuf *t) {
    if (!x->gpus_tried) {
        x->gpus_tried = true;
        char why[512];
        keel_status st = keel_gpus_open(&x->gpus, why, sizeof why);
        if (x->gpus) keel_log_info("metrics: %s", why);
        else if (st == KEEL_ERR_INPUT) keel_log_warn("metrics: no GPU readings: %s (unset it to use the driver's)", why);
        else if (st != KEEL_OK) keel_log_warn("metrics: no GPU readings: %s", why);
        else keel_log_debug("metrics: no GPU readings: %s", why);
    }
    gauge(t, "keel_nvml_up", "This node's NVIDIA GPUs are read through NVML (1) or there is no NVML (0).",
          x->gpus != NULL);
    int n = keel_gpus_count(x->gpus);
    if (n == 0) return;
    keel_gpu_sample *s = keel_xcalloc((size_t)n * sizeof *s, "GPU readings");
    for (int i = 0; i < n; i++) keel_gpus_read(x->gpus, i, &s[i]);
    char node[256];
    keel_node_name(node, sizeof node);
    for (size_t k = 0; k < sizeof GPU_FAMILIES / sizeof *GPU_FAMILIES; k++) {
        bool any = false;
        for (int i = 0; i < n; i++) any |= !isnan(s[i].v[GPU_FAMILIES[k].f]);
        if (!any) continue;
        family(t, GPU_FAMILIES[k].name, GPU_FAMILIES[k].type, GPU_FAMILIES[k].help);
        for (int i = 0; i < n; i++) {
            if (isnan(s[i].v[GPU_FAMILIES[k].f])) continue;
            keel_strbuf_printf(t, "%s{gpu=\"%d\",UUID=", GPU_FAMILIES[k].name, s[i].index);
            label_value(t, s[i].uuid);
            keel_strbuf_printf(t, ",pci_bus_id=");
            label_value(t, s[i].pci_bus_id);
            keel_strbuf_printf(t, ",device=\"nvidia%u\",modelName=", s[i].minor);
            label_value(t, s[i].model);
            keel_strbuf_printf(t, ",Hostname=");
            label_value(t, node);
            keel_strbuf_printf(t, "}");
            value(t, s[i].v[GPU_FAMILIES[k].f]);
        }
    }
    keel_free(s);
}

static void run_families(keel_exporter *x, keel_strbuf *t) {
    if (x->have_step) {
        gauge(t, "keel_step", "Optimizer steps done (the leader rank's metrics.jsonl).", x->step);
        gauge(t, "keel_loss", "Training loss of the last step.", x->loss);
        gauge(t, "keel_tokens_per_second", "Tokens per second of the last step, all ranks.", x->tokens_per_s);
        gauge(t, "keel_learning_rate", "Learning rate of the last step.", x->lr);
        gauge(t, "keel_grad_norm", "Global gradient norm of the last step (before clipping).", x->grad_norm);
        gauge(t, "keel_mfu", "Model FLOPs utilisation of the last step, 0-1.", x->mfu);
        gauge(t, "keel_step_seconds", "Time of the last optimizer step.", x->step_s);
        family(t, "keel_tokens_total", "counter", "Tokens trained on, all ranks.");
        keel_strbuf_printf(t, "keel_tokens_total");
        value(t, x->tokens);
        family(t, "keel_exposed_communication_seconds_total", "counter",
               "Seconds the leader's compute waited on FSDP communication.");
        keel_strbuf_printf(t, "keel_exposed_communication_seconds_total");
        value(t, x->comm_wait_total);
        family(t, "keel_checkpoint_stall_seconds_total", "counter", "Seconds training waited on checkpoint saves.");
        keel_strbuf_printf(t, "keel_checkpoint_stall_seconds_total");
        value(t, x->ckpt_stall_total);
    }
    if (x->have_val) gauge(t, "keel_val_loss", "Validation loss of the last evaluation.", x->val_loss);
    if (x->have_ckpt) {
        gauge(t, "keel_checkpoint_last_step", "Step of the newest committed checkpoint.", x->ckpt_step);
        gauge(t, "keel_checkpoint_bytes", "Bytes of the newest committed checkpoint.", x->ckpt_bytes);
        gauge(t, "keel_checkpoint_save_seconds", "Seconds the newest checkpoint took to write (slowest rank).",
              x->ckpt_seconds);
    }
    family(t, "keel_failures_total", "counter", "Failures by cause (events.jsonl events with a cause).");
    for (int c = 0; c < N_CAUSES; c++) {
        keel_strbuf_printf(t, "keel_failures_total{cause=\"%s\"}", CAUSES[c]);
        value(t, x->failures[c]);
    }
    if (x->other_failures > 0) {
        keel_strbuf_printf(t, "keel_failures_total{cause=\"other\"}");
        value(t, x->other_failures);
    }
    family(t, "keel_restarts_total", "counter", "Relaunches of the ranks after failures.");
    keel_strbuf_printf(t, "keel_restarts_total");
    value(t, x->restarts);
    if (x->n_recovery > 0) {
        double sorted[MAX_RECOVERIES];
        memcpy(sorted, x->recovery, sizeof(double) * (size_t)x->n_recovery);
        gauge(t, "keel_recovery_last_seconds", "From the last failure's detection to the first step after it.",
              x->recovery[x->n_recovery - 1]);
        gauge(t, "keel_recovery_median_seconds", "Median of every recovery's seconds.",
              keel_median(sorted, x->n_recovery));
    }
    gauge(t, "keel_drained_nodes", "Nodes drained or excluded after failing a health check.", x->n_drained);
    if (x->n_drained > 0) {
        family(t, "keel_node_drained", "gauge", "1 for each node drained or excluded by a failed health check.");
        for (int i = 0; i < x->n_drained; i++) {
            keel_strbuf_printf(t, "keel_node_drained{node=");
            label_value(t, x->drained[i]);
            keel_strbuf_printf(t, "}");
            value(t, 1);
        }
    }
    double productive = 0, wall = keel_unix_s() - x->started_unix;
    for (int64_t i = 0; i < x->n_step_time; i++) productive += x->step_time[i];
    gauge(t, "keel_goodput", "Share of the wall time since this process started spent on steps that were kept, 0-1.",
          wall > 0 ? fmin(1, productive / wall) : 0);
    char dir[4200];
    keel_run_path(dir, sizeof dir, x->run_dir, "checkpoints");
    struct statvfs fs;
    if (statvfs(dir, &fs) == 0 || statvfs(x->run_dir, &fs) == 0)
        gauge(t, "keel_checkpoint_dir_free_bytes", "Bytes free to unprivileged users where checkpoints go.",
              (double)fs.f_bavail * (double)fs.f_frsize);
}

static void add_number_or_null(cJSON *o, const char *key, double v) {
    if (isfinite(v)) cJSON_AddNumberToObject(o, key, v);
    else cJSON_AddNullToObject(o, key);
}

char *keel_exporter_json(keel_exporter *x) {
    cJSON *root = cJSON_CreateObject();
    double now = keel_unix_s();
    cJSON_AddStringToObject(root, "run_dir", x->run_dir);
    cJSON_AddNumberToObject(root, "unix_s", now);
    pthread_mutex_lock(&x->lock);
    read_tail(x, &x->metrics, take_step);
    read_tail(x, &x->events, take_event);
    /* steps as columns: [step...], [loss...], ... (compact for long runs) */
    cJSON *steps = cJSON_AddObjectToObject(root, "steps");
    static const char *const cols[] = {"step", "loss", "val_loss", "tokens_per_s", "mfu", "step_s"};
    for (int c = 0; c < 6; c++) {
        cJSON *a = cJSON_AddArrayToObject(steps, cols[c]);
        for (int64_t i = 0; i < x->n_points; i++) {
            const keel_step_point *p = &x->points[i];
            double v = c == 0 ? p->step : c == 1 ? p->loss : c == 2 ? p->val_loss : c == 3 ? p->tokens_per_s
                     : c == 4 ? p->mfu : p->step_s;
            cJSON_AddItemToArray(a, isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull());
        }
    }
    cJSON_AddItemToObject(root, "events", x->recent ? cJSON_Duplicate(x->recent, true) : cJSON_CreateArray());
    read_tail(x, &x->samples_file, take_sample);
    cJSON_AddItemToObject(root, "samples", x->samples ? cJSON_Duplicate(x->samples, true) : cJSON_CreateArray());
    cJSON *fail = cJSON_AddObjectToObject(root, "failures");
    for (int c = 0; c < N_CAUSES; c++) cJSON_AddNumberToObject(fail, CAUSES[c], x->failures[c]);
    cJSON_AddNumberToObject(root, "restarts", x->restarts);
    cJSON_AddNumberToObject(root, "drained_nodes", x->n_drained);
    if (x->have_ckpt) cJSON_AddNumberToObject(root, "checkpoint_step", x->ckpt_step);
    pthread_mutex_unlock(&x->lock);
    rank_beat *b;
    int n = read_beats(x->run_dir, &b);
    cJSON *ranks = cJSON_AddArrayToObject(root, "ranks");
    for (int i = 0; i < n; i++) {
        const keel_heartbeat_info *h = &b[i].hb;
        cJSON *r = cJSON_CreateObject();
        cJSON_AddNumberToObject(r, "rank", b[i].rank);
        cJSON_AddStringToObject(r, "node", h->node);
        cJSON_AddStringToObject(r, "phase", h->phase);
        cJSON_AddStringToObject(r, "doing", h->doing);
        add_number_or_null(r, "progress_age_s", h->progress_unix_s > 0 ? now - h->progress_unix_s : NAN);
        cJSON_AddNumberToObject(r, "step", (double)h->step);
        cJSON_AddNumberToObject(r, "pid", h->pid);
        cJSON_AddNumberToObject(r, "heartbeat_age_s", now - h->unix_s);
        add_number_or_null(r, "step_s", h->step_s > 0 ? h->step_s : NAN);
        add_number_or_null(r, "compute_s", h->step_s > 0 ? h->compute_s : NAN);
        add_number_or_null(r, "rss_bytes", h->rss_bytes > 0 ? (double)h->rss_bytes : NAN);
        add_number_or_null(r, "cpu_utilization", h->step_s > 0 ? h->cpu_util : NAN);
        cJSON_AddItemToArray(ranks, r);
    }
    keel_free(b);
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
}

char *keel_exporter_render(keel_exporter *x) {
    pthread_mutex_lock(&x->lock);
    read_tail(x, &x->metrics, take_step);
    read_tail(x, &x->events, take_event);
    keel_strbuf t = {0};
    run_families(x, &t);
    gpu_families(x, &t);
    pthread_mutex_unlock(&x->lock);
    rank_beat *b;
    int n = read_beats(x->run_dir, &b);
    per_rank(&t, b, n, "keel_rank_step", "gauge", "Steps this rank has done.", RANK_STEP);
    per_rank(&t, b, n, "keel_rank_last_step_timestamp_seconds", "gauge",
             "Unix time this rank finished its last step (alert when it stops moving).", RANK_STEP_UNIX);
    per_rank(&t, b, n, "keel_rank_heartbeat_timestamp_seconds", "gauge",
             "Unix time of this rank's last heartbeat (its beat thread writes every 0.5 s: old = frozen or dead).",
             RANK_BEAT_UNIX);
    per_rank(&t, b, n, "keel_rank_progress_timestamp_seconds", "gauge",
             "Unix time this rank last made progress (a unit's forward or backward, a phase): old while beating = stuck.",
             RANK_PROGRESS_UNIX);
    per_rank(&t, b, n, "keel_rank_last_step_seconds", "gauge", "Time of this rank's last step.", RANK_STEP_S);
    per_rank(&t, b, n, "keel_rank_compute_seconds", "gauge",
             "This rank's last step less its waits on peers: a straggler's is the largest.", RANK_COMPUTE_S);
    per_rank(&t, b, n, "keel_rank_rss_bytes", "gauge", "Resident memory of this rank at its last step.", RANK_RSS);
    per_rank(&t, b, n, "keel_rank_cpu_utilization", "gauge",
             "CPU use of this rank over its last step: CPU seconds over wall seconds x its threads, 0-1.",
             RANK_CPU_UTIL);
    per_rank(&t, b, n, "keel_rank_cpu_seconds_total", "counter", "CPU seconds of this rank's current process.",
             RANK_CPU_S);
    if (n > 0) step_histogram(&t, b, n);
    keel_free(b);
    return t.s;
}
