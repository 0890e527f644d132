/* train/startup.h: the start-up deadline (resilience.startup_timeout_s) — MPI
 * initialisation and the first collective with the other ranks must end in
 * time, or the rank exits with one line saying what it waited for (startup.c).
 * Internal to the train module. */
#ifndef KEEL_TRAIN_STARTUP_H
#define KEEL_TRAIN_STARTUP_H

#include "keel/core.h"

/* The deadline in seconds: the config's, or from the world size the launcher
 * announces in the environment (mpirun's, srun's): 30 + 30 x log2(ranks). */
double trainer_startup_timeout(const keel_resilience_config *rc);
/* Start the clock: past timeout_s without trainer_startup_done, one error line
 * names the stage it was in and the transport settings to check, and the
 * process exits 1 (it cannot leave MPI's start-up any other way). */
void trainer_startup_arm(double timeout_s);
/* What the rank waits for now, for that line. */
void trainer_startup_stage(const char *what);
void trainer_startup_done(void);

#endif
