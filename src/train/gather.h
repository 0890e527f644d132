/* train/gather.h: the whole model's parameters on the host, a piece at a
 * time (gather.c). Internal to the train module. */
#ifndef KEEL_TRAIN_GATHER_H
#define KEEL_TRAIN_GATHER_H

#include "train/trainer.h"

/* fn gets canonical parameters [at, at + n), in order, covering every one. */
typedef keel_status (*trainer_piece_fn)(void *ctx, int64_t at, const float *values, int64_t n);
/* Hand every parameter to fn: on the leader only, or on every rank when
 * every_rank. Collective under FSDP: every rank gathers every unit (its
 * buffer holds one unit), so call it on every rank. Stops calling fn at its
 * first error, which comes back (the gathers go on). */
keel_status trainer_each_param(trainer *t, bool every_rank, trainer_piece_fn fn, void *ctx);

#endif
