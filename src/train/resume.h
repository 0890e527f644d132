/* train/resume.h: where a launch resumes from — the one decision between an
 * in-memory snapshot and a checkpoint on disk (resume.c). Internal to the
 * train module. */
#ifndef KEEL_TRAIN_RESUME_H
#define KEEL_TRAIN_RESUME_H

#include "train/trainer.h"

/* Load the newest in-memory snapshot every rank holds, when it is at least as
 * new as the newest checkpoint, else the newest committed checkpoint that
 * verifies (resharding as needed), into the optimizer state; t->start_step
 * becomes its step (0 if none) and t->restored_from says which. A damaged one
 * is reported (log line + event) and the next is tried; none usable among
 * several is an input error. Collective; after trainer_save_init and
 * trainer_snap_init. */
keel_status trainer_resume(trainer *t);

#endif
