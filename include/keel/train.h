/* train: the worker loop — micro-batches, accumulation, optimizer step, eval,
 * metrics, signals — and evaluation of a finished run.
 *
 * Run directory written by keel_train_run:
 *   RUN/config.json    the resolved config (every key, defaults filled in)
 *   RUN/metrics.jsonl  one JSON object per optimizer step (+ eval lines)
 *   RUN/weights.bin    final parameters (format in keel/ckpt.h)
 *   RUN/summary.json   status, steps, final_loss, params_xxh3, peak_rss_bytes, ...
 */
#ifndef KEEL_TRAIN_H
#define KEEL_TRAIN_H

#include "keel/core.h"

/* Validate everything (data, tokenizer, run directory) before writing
 * anything, then train. cfg must be finalized. A run directory that exists
 * must be empty, or hold a run of the same model (its config.json) to resume
 * from its newest good checkpoint; then cfg's train.grad_accum_steps may be
 * changed to keep the checkpoint's global batch. */
keel_status keel_train_run(keel_config *cfg, const char *run_dir);

/* For a distributed run: validate like keel_train_run, then create RUN with
 * config.json and RUN/logs/ for the ranks to fill. */
keel_status keel_train_prepare_run_dir(keel_config *cfg, const char *run_dir, int world_size);
/* One rank of a distributed run (`keel worker RUN`, started by the launcher):
 * joins MPI, reads RUN/config.json, resumes from the newest checkpoint, trains
 * with the others; rank 0 writes metrics.jsonl, summary.json, weights.bin and
 * the progress line; every rank logs to RUN/logs/rank-R.log and beats
 * RUN/heartbeats/rank-R (keel/resil.h) for the supervisor. */
keel_status keel_train_worker(const char *run_dir);

/* Bytes one rank needs (parameters, gradients, optimizer, compute copies,
 * activations) on world_size ranks, and the size of one checkpoint. */
int64_t keel_train_memory_need(const keel_config *cfg, int world_size);
int64_t keel_train_checkpoint_bytes(const keel_config *cfg, int world_size);

/* Print what a config needs (parameters, memory per rank by category) on
 * world_size ranks without allocating it: `keel train --dry-run [--nproc N]`. */
keel_status keel_train_dry_run(const keel_config *cfg, int world_size);

/* Mean loss of RUN_DIR's weights over every sequence of data_path (a prepared
 * directory — its val split if it has one, else train — or one shard file). */
keel_status keel_eval_run(const char *run_dir, const char *data_path, double *mean_loss,
                          uint64_t *tokens);

#endif
