/* train/stop.h: a stop on a signal (SIGINT, SIGTERM, SIGUSR1) and its
 * deadline — what every rank of a run agrees to stop on. Internal to the
 * train module. */
#ifndef KEEL_TRAIN_STOP_H
#define KEEL_TRAIN_STOP_H

#include <signal.h>
#include <stdbool.h>

/* The handlers a run replaced (SIGINT, SIGTERM, SIGUSR1, SIGALRM), put back
 * by trainer_stop_restore. */
#define TRAINER_STOP_SIGNALS 4
typedef struct {
    struct sigaction old[TRAINER_STOP_SIGNALS];
} trainer_stop_handlers;

/* Catch SIGINT, SIGTERM and SIGUSR1 (stop after the current step) and
 * SIGALRM (the stop's deadline), from the start, so a stop during set-up
 * ends the run after one step. grace_ms: how long a rank may wait on its
 * peers after a stop signal before it exits (0: no limit, one process);
 * on_peers: whether it waits on them now. */
void trainer_stop_catch(trainer_stop_handlers *saved, int grace_ms, bool on_peers);
void trainer_stop_restore(const trainer_stop_handlers *saved);
/* Whether a stop signal came; when the first one did (wall clock, 0: none). */
bool trainer_stop_requested(void);
double trainer_stop_signal_unix(void);
/* The deadline after a step that took step_s: two such steps (a rank mid-step
 * needs at most one), at least 2 s. */
void trainer_stop_grace_after(double step_s);
/* Whether this rank now waits on its peers (true: a stop signal's deadline
 * runs) or on disks (false: a save takes what it takes). */
void trainer_stop_deadline(bool on_peers);

#endif
