/* resil/health.c: is this node fit to train? `keel health` and the
 * supervisor's checks after a failure.
 *
 *   gemm            one core's fp32 GEMM GFLOP/s against a floor (a throttled or
 *                   sick node is slow long before it fails)
 *   memory          MemAvailable against what the job's ranks on this node need
 *   checkpoint_dir  the checkpoint directory takes a write + fsync, and has room
 *                   for two checkpoints
 *   mpi             all-reduce of known values over the job's ranks: exact sum
 *                   and bus bandwidth (keel health --mpi-probe on every rank)
 *   gpu             through NVML when the driver is there: XIDs since a
 *                   baseline, ECC errors, row remapping, clock event reasons,
 *                   temperature, SM clock while busy, each held to the node
 *                   config's limits (health_gpu.c); "no GPU" otherwise */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "keel/ckpt.h"
#include "keel/comm.h"
#include "keel/fsdp.h"
#include "keel/kernels.h"
#include "keel/resil.h"

static void say(keel_health_result *r, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(keel_health_result *r, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->detail, sizeof r->detail, fmt, ap);
    va_end(ap);
    r->status = status;
}

#define MPI_PROBE_TIMEOUT_S 60

static double gib(double bytes) { return bytes / (1024.0 * 1024 * 1024); }

/* Best of a few 512^3 products on one thread (~0.1 s in all). */
/* CPU seconds this thread has run. */
static double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void check_gemm(const keel_health_options *o, keel_health_result *r) {
    const int n = 512;
    float *a = keel_xmalloc(sizeof(float) * n * n, "gemm check"), *b = keel_xmalloc(sizeof(float) * n * n, "gemm check"),
          *c = keel_xmalloc(sizeof(float) * n * n, "gemm check");
    for (int i = 0; i < n * n; i++) a[i] = (float)(i % 7) * 0.25f, b[i] = (float)(i % 5) * 0.5f;
    /* Timed in this thread's CPU time, not the wall clock: a core that is slow
     * (throttled, faulty) computes less per second it runs; a machine that is
     * merely busy with other work runs this thread less often, which says
     * nothing of the node's health (and slow ranks are the straggler check's). */
    keel_kernels_init(1);
    double best = 1e30;
    for (int rep = 0; rep < 6; rep++) {
        double t0 = thread_cpu_s();
        keel_matmul_forward(c, a, b, n, n, n, false);
        best = fmin(best, thread_cpu_s() - t0);
    }
    keel_kernels_shutdown();
    /* a wrong product is a sick node too: c[0] = sum_k a[k] * b[k] */
    double want = 0;
    for (int k = 0; k < n; k++) want += (double)a[k] * b[k];
    bool right = fabs(c[0] - want) <= 1e-3 * fabs(want);
    keel_free(a);
    keel_free(b);
    keel_free(c);
    r->value = 2.0 * n * n * n / best / 1e9;
    r->limit = o->gemm_floor_gflops;
    snprintf(r->unit, sizeof r->unit, "GFLOP/s");
    if (!right) say(r, KEEL_HEALTH_FAIL, "fp32 GEMM gave a wrong result (%g, want %g)", c[0], want);
    else if (r->value < r->limit)
        say(r, KEEL_HEALTH_FAIL, "one core does %.1f GFLOP/s of fp32 GEMM per second it runs, below the floor of "
            "%.1f (resilience.gemm_floor_gflops): a throttled or faulty CPU", r->value, r->limit);
    else say(r, KEEL_HEALTH_PASS, "one core does %.1f GFLOP/s of fp32 GEMM per second it runs (floor %.1f)", r->value,
             r->limit);
}

static void check_memory(const keel_health_options *o, keel_health_result *r) {
    r->value = gib((double)keel_mem_available_bytes());
    snprintf(r->unit, sizeof r->unit, "GiB");
    if (!o->cfg) {
        r->limit = o->memory_floor_gib;
        say(r, r->value > 0 && r->value >= r->limit ? KEEL_HEALTH_PASS : KEEL_HEALTH_FAIL,
            "%.1f GiB available (no job given; floor %.1f GiB)", r->value, r->limit);
        return;
    }
    int world = o->nproc > 0 ? o->nproc : 1;
    /* outside Slurm every rank is on this machine; in Slurm nproc is this node's share */
    keel_fsdp_memory m;
    keel_fsdp_memory_plan(o->cfg, world, &m);
    r->limit = gib((double)keel_fsdp_memory_total(&m) * world);
    if (r->value < r->limit)
        say(r, KEEL_HEALTH_FAIL, "%.1f GiB available, the job's %d rank(s) here need %.1f GiB", r->value,
            world, r->limit);
    else say(r, KEEL_HEALTH_PASS, "%.1f GiB available, the job's %d rank(s) here need %.1f GiB", r->value,
             world, r->limit);
}

static void check_dir(const keel_health_options *o, keel_health_result *r) {
    const char *dir = o->dir ? o->dir : ".";
    snprintf(r->unit, sizeof r->unit, "GiB");
    keel_error_capture(true);
    keel_status made = keel_mkdirs(dir);
    keel_error_capture(false);
    if (made != KEEL_OK) {
        say(r, KEEL_HEALTH_FAIL, "%s", keel_last_error());
        return;
    }
    char probe[PATH_MAX + 64];
    snprintf(probe, sizeof probe, "%s/.keel-health-%d", dir, (int)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    char block[4096] = {0};
    if (fd < 0 || keel_write_all(fd, block, sizeof block, NULL) != KEEL_OK || fsync(fd) != 0) {
        say(r, KEEL_HEALTH_FAIL, "%s: not writable: %s (read-only or broken mount?)", dir, strerror(errno));
        if (fd >= 0) close(fd), unlink(probe);
        return;
    }
    close(fd);
    unlink(probe);
    struct statvfs vfs;
    if (statvfs(dir, &vfs) != 0) {
        say(r, KEEL_HEALTH_FAIL, "%s: statvfs: %s", dir, strerror(errno));
        return;
    }
    r->value = gib((double)vfs.f_bavail * vfs.f_frsize);
    r->limit = o->cfg ? gib(2.0 * (double)keel_ckpt_bytes(&o->cfg->model, o->nproc > 0 ? o->nproc : 1)) : 0;
    if (r->value < r->limit)
        say(r, KEEL_HEALTH_FAIL, "%s: %.2f GiB free, two checkpoints need %.2f GiB", dir, r->value, r->limit);
    else say(r, KEEL_HEALTH_PASS, "%s: writable, %.2f GiB free (two checkpoints: %.2f GiB)", dir, r->value,
             r->limit);
}

/* Launch `keel health --mpi-probe` on the job's ranks and read rank 0's line. */
static void check_mpi(const keel_health_options *o, keel_health_result *r) {
    char self[PATH_MAX];
    snprintf(r->unit, sizeof r->unit, "GB/s");
    if (keel_self_path(self, sizeof self) != KEEL_OK) {
        say(r, KEEL_HEALTH_FAIL, "cannot find the keel executable");
        return;
    }
    keel_launch_env();
    keel_launch_spec spec = {.nproc = o->nproc > 0 ? o->nproc : 2, .nodelist = o->nodelist, .nodes = o->nodes};
    const char *args[] = {"health", "--mpi-probe", NULL};
    char **argv = keel_launch_argv(self, &spec, args);
    char out[4096];
    /* bounded: a dead peer or a wedged network would hang the collective for good */
    int code = keel_run_capture(argv, MPI_PROBE_TIMEOUT_S, out, sizeof out);
    cJSON *j = cJSON_Parse(out);
    const cJSON *ok = cJSON_GetObjectItemCaseSensitive(j, "ok"), *bw = cJSON_GetObjectItemCaseSensitive(j, "bus_gbps"),
                *d = cJSON_GetObjectItemCaseSensitive(j, "detail");
    r->value = cJSON_IsNumber(bw) ? bw->valuedouble : 0;
    if (code == 0 && cJSON_IsTrue(ok))
        say(r, KEEL_HEALTH_PASS, "%s", cJSON_IsString(d) ? d->valuestring : "");
    else if (code == 124)
        say(r, KEEL_HEALTH_FAIL, "the all-reduce probe did not finish in %d s (a dead or unreachable rank?)",
            MPI_PROBE_TIMEOUT_S);
    else
        say(r, KEEL_HEALTH_FAIL, "%s", cJSON_IsString(d) ? d->valuestring
                                       : "the all-reduce probe did not run; is OpenMPI installed?");
    cJSON_Delete(j);
    keel_launch_argv_free(argv);
}

keel_status keel_health_mpi_probe(void) {
    keel_comm *world;
    keel_status st = keel_comm_init(&world);
    if (st != KEEL_OK) return st;
    char detail[256];
    double bus;
    bool ok = keel_comm_probe(world, &bus, detail, sizeof detail);
    if (keel_comm_rank(world) == 0)
        printf("{\"ok\": %s, \"bus_gbps\": %.3f, \"detail\": \"%s\"}\n", ok ? "true" : "false", bus, detail);
    fflush(stdout);
    keel_comm_finalize(world);
    return ok ? KEEL_OK : KEEL_ERR_IO;
}

int keel_health_run(const keel_health_options *o, keel_health_result *out) {
    int n = 0;
    for (int c = 0; c < KEEL_CHECK_COUNT; c++) {
        if (!(o->checks & (1u << c))) continue;
        keel_health_result *r = &out[n++];
        memset(r, 0, sizeof *r);
        r->check = (keel_health_check)c;
        switch (r->check) {
        case KEEL_CHECK_GEMM: check_gemm(o, r); break;
        case KEEL_CHECK_MEMORY: check_memory(o, r); break;
        case KEEL_CHECK_CHECKPOINT_DIR: check_dir(o, r); break;
        case KEEL_CHECK_MPI: check_mpi(o, r); break;
        case KEEL_CHECK_GPU: keel_health_check_gpu(o, r); break;
        case KEEL_CHECK_COUNT: break;
        }
    }
    return n;
}

bool keel_health_all_ok(const keel_health_result *r, int n) {
    for (int i = 0; i < n; i++)
        if (r[i].status == KEEL_HEALTH_FAIL) return false;
    return true;
}

char *keel_health_json(const char *node, const keel_health_result *r, int n) {
    static const char *status[] = {"pass", "fail", "skipped"};
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "node", node);
    cJSON_AddBoolToObject(o, "ok", keel_health_all_ok(r, n));
    cJSON *checks = cJSON_AddArrayToObject(o, "checks");
    for (int i = 0; i < n; i++) {
        cJSON *c = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "name", keel_health_check_name(r[i].check));
        cJSON_AddStringToObject(c, "status", status[r[i].status]);
        cJSON_AddNumberToObject(c, "value", r[i].value);
        cJSON_AddNumberToObject(c, "limit", r[i].limit);
        cJSON_AddStringToObject(c, "unit", r[i].unit);
        cJSON_AddStringToObject(c, "detail", r[i].detail);
        cJSON_AddItemToArray(checks, c);
    }
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    return text;
}
