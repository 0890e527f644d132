/* train/startup.c: the start-up deadline (train/startup.h). A rank whose
 * MPI cannot reach the others (a stale OMPI_MCA_btl_tcp_if_include=lo on
 * hosts that talk over eth0, a firewall) otherwise sits in MPI_Init or its
 * first collective for as long as the job lives, with no line of keel's. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "train/startup.h"

extern char **environ;

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool armed, done;
    double timeout_s;
    char stage[160];
    pthread_t thread;
} g_startup = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

/* The launcher's world size, before MPI says it (1 when none does). */
static int announced_world_size(void) {
    const char *names[] = {"OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const char *v = getenv(names[i]);
        int n = v ? atoi(v) : 0;
        if (n > 0) return n;
    }
    return 1;
}

double trainer_startup_timeout(const keel_resilience_config *rc) {
    if (rc->startup_timeout_s > 0) return rc->startup_timeout_s;
    int w = announced_world_size();
    return 30 + 30 * log2(w > 1 ? w : 2);
}

/* The environment's transport settings: OpenMPI's and PMIx's MCA parameters. */
static void transport_settings(char *out, size_t n) {
    size_t used = 0;
    out[0] = 0;
    for (char **e = environ; *e && used + 1 < n; e++)
        if (!strncmp(*e, "OMPI_MCA_", 9) || !strncmp(*e, "PMIX_MCA_", 9)) {
            int k = snprintf(out + used, n - used, "%s%s", used ? " " : "", *e);
            if (k < 0 || (size_t)k >= n - used) break;
            used += (size_t)k;
        }
    if (!out[0])
        snprintf(out, n, "none: OpenMPI picks the interfaces itself (check the hosts reach each other: "
                         "interfaces, firewall)");
}

static void *deadline_thread(void *arg) {
    (void)arg;
    pthread_mutex_lock(&g_startup.mu);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    double whole = floor(g_startup.timeout_s);
    until.tv_sec += (time_t)whole;
    until.tv_nsec += (long)((g_startup.timeout_s - whole) * 1e9);
    until.tv_sec += until.tv_nsec / 1000000000L, until.tv_nsec %= 1000000000L;
    while (!g_startup.done)
        if (pthread_cond_timedwait(&g_startup.cv, &g_startup.mu, &until) != 0 && !g_startup.done) {
            char settings[1024];
            transport_settings(settings, sizeof settings);
            keel_errorf("start-up did not finish in %g s (resilience.startup_timeout_s): still waiting for %s; "
                        "the transport settings in the environment: %s", g_startup.timeout_s, g_startup.stage,
                        settings);
            fflush(NULL);
            _exit(1);
        }
    pthread_mutex_unlock(&g_startup.mu);
    return NULL;
}

void trainer_startup_arm(double timeout_s) {
    pthread_mutex_lock(&g_startup.mu);
    g_startup.timeout_s = timeout_s;
    g_startup.done = false;
    g_startup.armed = true;
    snprintf(g_startup.stage, sizeof g_startup.stage, "the start");
    pthread_mutex_unlock(&g_startup.mu);
    KEEL_CHECK(pthread_create(&g_startup.thread, NULL, deadline_thread, NULL) == 0, "start-up deadline thread");
}

void trainer_startup_stage(const char *what) {
    pthread_mutex_lock(&g_startup.mu);
    snprintf(g_startup.stage, sizeof g_startup.stage, "%s", what);
    pthread_mutex_unlock(&g_startup.mu);
}

void trainer_startup_done(void) {
    pthread_mutex_lock(&g_startup.mu);
    bool armed = g_startup.armed;
    g_startup.done = true;
    g_startup.armed = false;
    pthread_cond_signal(&g_startup.cv);
    pthread_mutex_unlock(&g_startup.mu);
    if (armed) pthread_join(g_startup.thread, NULL);
}
