/* core/host.c: readings of this process and this machine — clocks, memory,
 * the node's name. */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "keel/core.h"

/* A /proc file's "<key>: <n> kB" line in bytes, 0 if absent. */
static uint64_t proc_kb_field(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[256];
    size_t klen = strlen(key);
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, klen) && line[klen] == ':' && sscanf(line + klen + 1, "%llu", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

uint64_t keel_peak_rss_bytes(void) { return proc_kb_field("/proc/self/status", "VmHWM"); }

uint64_t keel_rss_bytes(void) { return proc_kb_field("/proc/self/status", "VmRSS"); }

uint64_t keel_mem_available_bytes(void) { return proc_kb_field("/proc/meminfo", "MemAvailable"); }

double keel_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double keel_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double keel_median(double *x, int64_t n) {
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return x[n / 2];
}

double keel_unix_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int keel_cores_online(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int keel_cores_allowed(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return keel_cores_online();
    int n = CPU_COUNT(&set);
    return n > 0 ? n : 1;
}

void keel_sleep_s(double s) {
    if (!(s > 0)) return;
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    nanosleep(&ts, NULL);
}

void keel_node_name(char *out, size_t n) {
    /* Emulated Slurm nodes share one hostname: SLURMD_NODENAME names the node. */
    const char *node = getenv("SLURMD_NODENAME");
    if (node && node[0]) snprintf(out, n, "%s", node);
    else if (gethostname(out, n) != 0 || !out[0]) snprintf(out, n, "localhost");
    out[n - 1] = 0;
    for (char *p = out; *p; p++) /* one word: it goes into space-separated lines */
        if (*p == ' ') *p = '_';
}

char keel_pid_state(int pid) {
    char path[64], *stat;
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    if (keel_read_file_quiet(path, 4096, &stat, NULL) != KEEL_OK) return 0;
    /* "pid (comm) S ...": the state follows the last ')' (comm may hold one) */
    const char *close_paren = strrchr(stat, ')');
    char state = close_paren && close_paren[1] == ' ' ? close_paren[2] : 0;
    keel_free(stat);
    return state;
}

bool keel_pid_alive(int pid) {
    char s = keel_pid_state(pid);
    return s != 0 && s != 'Z' && s != 'X';
}

void keel_block_async_signals(void) {
    sigset_t set;
    sigemptyset(&set);
    int signals[] = {SIGINT, SIGTERM, SIGUSR1, SIGUSR2, SIGHUP, SIGALRM, SIGQUIT};
    for (size_t i = 0; i < sizeof signals / sizeof signals[0]; i++) sigaddset(&set, signals[i]);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
}
