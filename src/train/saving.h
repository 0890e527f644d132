/* train/saving.h: checkpoint saves — when a run saves, what, and the commit
 * over ranks (saving.c). Every function here is collective (all ranks call it
 * at the same point) unless it says otherwise. Internal to the train module. */
#ifndef KEEL_TRAIN_SAVING_H
#define KEEL_TRAIN_SAVING_H

#include "train/trainer.h"

/* After t->packed is set up: the saving state (t->saving). Not collective. */
void trainer_save_init(trainer *t);
void trainer_save_free(trainer *t);
/* The step boundary after steps_done steps: agree on a stop signal, save if
 * due (or when `last` — the end of training or a stop — and checkpointing is
 * on), commit a finished background save. *stop becomes true if any rank got
 * a signal. */
void trainer_save_boundary(trainer *t, int steps_done, bool last, bool *stop);
/* Before the optimizer changes the arrays: wait until a save has copied them. */
void trainer_save_before_update(trainer *t);
/* The step of the last checkpoint this run committed or resumed from (0: none). */
int trainer_save_committed_step(const trainer *t);
/* A resume loaded the state of `step`; the newest committed checkpoint is
 * committed_step (the same, or older when it came from memory). Not collective. */
void trainer_save_resumed(trainer *t, int step, int committed_step);
/* Bytes of the host buffer async saves copy into (0 without one). */
int64_t trainer_save_buffer_bytes(const trainer *t);
/* Seconds the loop was held up by checkpointing since the last call. */
double trainer_save_take_stall(trainer *t);

#endif
