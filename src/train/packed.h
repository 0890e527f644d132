/* train/packed.h: this rank's optimizer state — parameters, AdamW m and v of
 * the canonical ranges it holds — in the layout of its checkpoint file (its
 * shard plan, padding included; one process: a plan of one rank). Checkpoint
 * saves, in-memory snapshots and both resumes copy through it. Internal to
 * the train module. */
#ifndef KEEL_TRAIN_PACKED_H
#define KEEL_TRAIN_PACKED_H

#include "keel/ckpt.h"
#include "keel/fsdp.h"
#include "keel/model.h"
#include "keel/optim.h"

typedef struct {
    keel_fsdp_plan own_plan;          /* one process: the plan of one shard rank */
    const keel_fsdp_plan *plan;       /* the layout */
    float *arrays[KEEL_CKPT_ARRAYS];  /* the live parameters, m, v */
    const keel_backend *be;           /* whose memory the arrays are */
    keel_param_range *ranges;         /* the canonical ranges this rank holds */
    int n_ranges;
} trainer_packed;

/* The layout of a rank's state: under FSDP (fsdp set) its shard's, else the
 * whole model's as one shard rank. Free with trainer_packed_free. */
void trainer_packed_init(trainer_packed *p, keel_model *model, keel_optim *opt, keel_fsdp *fsdp);
void trainer_packed_free(trainer_packed *p);
/* Floats of the packed state: parameters, m and v of the whole shard. */
int64_t trainer_packed_floats(const trainer_packed *p);
/* Copy the live arrays into dst in the packed layout (padding untouched).
 * async: the backend's to_host_async, done at its copies_wait. */
void trainer_packed_copy_out(const trainer_packed *p, float *dst, bool async);
/* The live arrays as pieces of the packed layout, for keel_snap_fill (host
 * memory only): KEEL_CKPT_ARRAYS * n_ranges of them into out. How many. */
int trainer_packed_pieces(const trainer_packed *p, keel_snap_piece *out);
/* Copy a packed state back into the live arrays. */
void trainer_packed_copy_in(const trainer_packed *p, const float *src);
/* Zero every live array (the ranges this rank holds). */
void trainer_packed_clear(const trainer_packed *p);
/* Verify the checkpoint's files this rank reads, then read its ranges of
 * every array into the live arrays (a device's through a host buffer). An
 * error leaves the arrays partly read. */
keel_status trainer_packed_read(const trainer_packed *p, keel_ckpt *ck);

#endif
