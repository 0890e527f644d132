/* train/profile.h: train.profile_steps (profile.c). The backend becomes
 * keel_backend_profiled's (with the key set: before the model is built), and
 * the window covers the steps after the launch's first (its warm-up: first
 * GEMM plans, lazy loading), or the first when it is the only one. The leader
 * writes RUN/profile.json and prints a table as the window's last step ends,
 * or at the end of a run stopped inside it. Internal to the train module. */
#ifndef KEEL_TRAIN_PROFILE_H
#define KEEL_TRAIN_PROFILE_H

#include "train/trainer.h"

void trainer_profile_init(trainer *t);
/* Around a step's work: true when step is profiled (its window is open until
 * trainer_profile_end). */
bool trainer_profile_begin(trainer *t, int step);
void trainer_profile_end(trainer *t, double step_s);
/* The report, once: when the window is complete, or (final) whatever it holds. */
void trainer_profile_report(trainer *t, bool final);

#endif
