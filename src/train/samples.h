/* train/samples.h: text samples while training (train.sample_every), in
 * samples.c. Internal to the train module. */
#ifndef KEEL_TRAIN_SAMPLES_H
#define KEEL_TRAIN_SAMPLES_H

#include "train/trainer.h"

/* With train.sample_every: the tokenizer (data.tokenizer, else the one
 * init_from carries) and the prompts, each leaving room for a new token in
 * the context; one line naming the key and KEEL_ERR_INPUT when it cannot
 * sample. Every rank, before training. */
keel_status trainer_samples_init(trainer *t);
/* After step `step` (1-based), when it is a multiple of train.sample_every:
 * every rank gathers the whole model and generates the same samples (so no
 * rank waits on another, and none is taken for hung), the leader appends
 * them to RUN/samples.jsonl. The training's state is only read. */
void trainer_samples_boundary(trainer *t, int step);
void trainer_samples_free(trainer *t);

#endif
