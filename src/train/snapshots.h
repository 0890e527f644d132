/* train/snapshots.h: in-memory snapshots (snapshots.c) — collective like the
 * saves, except free. Off (every call a no-op) outside the supervisor or with
 * resilience.snapshot_every_steps 0. Internal to the train module. */
#ifndef KEEL_TRAIN_SNAPSHOTS_H
#define KEEL_TRAIN_SNAPSHOTS_H

#include "train/trainer.h"

/* After t->packed is set up: the snapshot state (t->snap). */
void trainer_snap_init(trainer *t);
/* completed: the run is over, its segments go too. Not collective. */
void trainer_snap_free(trainer *t, bool completed);
/* Load the newest snapshot every rank can get (its own, or its buddy's
 * replica) that is at least as new as the newest checkpoint `disk`; true
 * when loaded (t->start_step, t->restored_from set). A failed try leaves the
 * arrays zeroed. */
bool trainer_snap_resume(trainer *t, int64_t disk);
/* Before the update: wait for the snapshot's copy, send it to the buddy. */
void trainer_snap_before_update(trainer *t);
/* The step boundary after steps_done steps (after trainer_save_boundary):
 * commit the buddy's replica, snapshot if due (never at the last step or a stop). */
void trainer_snap_boundary(trainer *t, int steps_done, bool last_or_stop);
/* Bytes of this rank's segments: its own and the replica it keeps. */
int64_t trainer_snap_bytes(const trainer *t);
/* Seconds the loop waited on snapshots since the last call. */
double trainer_snap_take_stall(trainer *t);

#endif
