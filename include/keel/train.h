/* train: the worker loop — micro-batches, accumulation, optimizer step, eval,
 * metrics, signals — and evaluation of a finished run. What it writes into the
 * run directory (config.json, metrics.jsonl, summary.json, weights.bin,
 * checkpoints/, heartbeats/, logs/) is laid out in keel/run.h.
 */
#ifndef KEEL_TRAIN_H
#define KEEL_TRAIN_H

#include "keel/core.h"
#include "keel/monitor.h"

/* Train in this process: keel_run_prepare (validate, new or resume, create),
 * then the loop. cfg must be finalized; a resume may change its
 * train.grad_accum_steps to keep the checkpoint's global batch. endpoint:
 * the metrics endpoint this process serves (or NULL), named in the run
 * directory once it exists (keel_metrics_publish). */
keel_status keel_train_run(keel_config *cfg, const char *run_dir, keel_metrics_server *endpoint);

/* One rank of a distributed run (`keel worker RUN`, started by the launcher in
 * a directory keel_run_prepare made): joins MPI, reads RUN/config.json,
 * resumes from the newest checkpoint, trains with the others; rank 0 writes
 * metrics.jsonl, summary.json, weights.bin and the progress line; every rank
 * logs to RUN/logs/rank-R.log and beats RUN/heartbeats/rank-R (keel/run.h). */
keel_status keel_train_worker(const char *run_dir);

/* One task of a Slurm step that is the whole job (`srun -n N --mpi=pmix
 * keel train CONFIG --run-dir RUN`, under srun --auto-resume: no supervisor
 * of keel's): joins MPI; rank 0 prepares RUN (new, or resumed from its newest
 * in-memory snapshot or checkpoint) and the others wait for it; the task
 * that serves the metrics endpoint (task 0; the others pass NULL) names it
 * there; then each trains as keel_train_worker. keel_train_is_task says
 * whether this process is one (SLURM_STEP_ID set and more than one task in
 * the step). */
bool keel_train_is_task(void);
keel_status keel_train_task(keel_config *cfg, const char *run_dir, keel_metrics_server *endpoint);

/* Print what a config needs (parameters, memory per rank by category) on
 * world_size ranks without allocating it: `keel train --dry-run [--nproc N]`. */
keel_status keel_train_dry_run(const keel_config *cfg, int world_size);

/* Mean loss over every sequence of data_path (a prepared directory — its val
 * split if it has one, else train — or one shard file) of the model at path:
 * a run's final weights (RUN/weights.bin), else a checkpoint or a run's
 * newest good checkpoint. With a loss mask, over the targets it keeps
 * (*tokens counts them). */
keel_status keel_eval_run(const char *path, const char *data_path, double *mean_loss, uint64_t *tokens);

#endif
