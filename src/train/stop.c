/* train/stop.c: a stop on a signal and its deadline (train/stop.h).
 *
 * A rank of a distributed run, after a stop signal, may wait on its peers to
 * reach the step's end only so long. A peer that is gone keeps it in a
 * collective for good, and Slurm, having cancelled the step for that peer,
 * would wait KillWait (30 s by default) before SIGKILL: a relaunch's time.
 * The deadline runs only while the rank waits on peers (set-up, a step, the
 * boundary's agreement, the snapshot exchange), never while a save waits on
 * disks. */
#include <math.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "train/stop.h"

static volatile sig_atomic_t g_stop_signal;
/* when the first stop signal came (CLOCK_REALTIME; set before g_stop_signal) */
static volatile sig_atomic_t g_stop_sec, g_stop_ms;
/* in ms (0: no limit); whether the rank waits on peers now */
static volatile sig_atomic_t g_stop_grace_ms, g_on_peers;

static void arm_deadline(void) {
    struct itimerval it = {.it_value = {.tv_sec = g_stop_grace_ms / 1000, .tv_usec = g_stop_grace_ms % 1000 * 1000}};
    setitimer(ITIMER_REAL, &it, NULL);
}
static void disarm_deadline(void) {
    struct itimerval it = {0};
    setitimer(ITIMER_REAL, &it, NULL);
}
static void on_stop_signal(int sig) {
    if (!g_stop_signal) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts); /* async-signal-safe */
        g_stop_sec = (sig_atomic_t)ts.tv_sec, g_stop_ms = (sig_atomic_t)(ts.tv_nsec / 1000000);
        if (g_stop_grace_ms > 0 && g_on_peers) arm_deadline();
    }
    g_stop_signal = sig;
}
static void on_stop_deadline(int sig) {
    (void)sig;
    static const char msg[] = "keel: error: a stop signal came and this rank did not reach the end of its step "
                              "in time (a peer gone?): exiting\n";
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)w;
    _exit(1);
}

void trainer_stop_deadline(bool on_peers) {
    g_on_peers = on_peers;
    if (on_peers && g_stop_signal && g_stop_grace_ms > 0) arm_deadline(); /* a stop that came meanwhile */
    if (!on_peers) disarm_deadline();
}

bool trainer_stop_requested(void) { return g_stop_signal != 0; }

double trainer_stop_signal_unix(void) { return g_stop_signal ? (double)g_stop_sec + g_stop_ms * 1e-3 : 0; }

void trainer_stop_grace_after(double step_s) { g_stop_grace_ms = (sig_atomic_t)ceil(1000 * fmax(2, 2 * step_s)); }

static const int STOP_SIGNALS[TRAINER_STOP_SIGNALS] = {SIGINT, SIGTERM, SIGUSR1, SIGALRM};

void trainer_stop_catch(trainer_stop_handlers *saved, int grace_ms, bool on_peers) {
    struct sigaction sa = {.sa_handler = on_stop_signal};
    sigemptyset(&sa.sa_mask);
    g_stop_signal = 0;
    for (int i = 0; i < TRAINER_STOP_SIGNALS; i++) {
        sa.sa_handler = STOP_SIGNALS[i] == SIGALRM ? on_stop_deadline : on_stop_signal;
        sigaction(STOP_SIGNALS[i], &sa, &saved->old[i]);
    }
    g_stop_grace_ms = grace_ms;
    g_on_peers = on_peers;
}

void trainer_stop_restore(const trainer_stop_handlers *saved) {
    disarm_deadline();
    g_stop_grace_ms = 0;
    g_on_peers = 0;
    for (int i = 0; i < TRAINER_STOP_SIGNALS; i++) sigaction(STOP_SIGNALS[i], &saved->old[i], NULL);
}
