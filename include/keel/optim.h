/* optim: AdamW over a contiguous range of the flat parameter vector (the
 * whole model on one rank, the local shard under FSDP), the learning-rate
 * schedule, and gradient-norm clipping.
 *
 *     keel_optim *opt;
 *     keel_optim_build(&cfg.train, &layout, 0, layout.n_params, NULL, &opt); // NULL: the CPU backend
 *     double norm = sqrt(keel_optim_sumsq(opt, grads));  // all-reduced under FSDP
 *     keel_optim_update(opt, params, grads, step, keel_lr_at(&cfg.train, step),
 *                       keel_clip_scale(norm, cfg.train.grad_clip));
 */
#ifndef KEEL_OPTIM_H
#define KEEL_OPTIM_H

#include "keel/backend.h"
#include "keel/core.h"
#include "keel/model.h"

typedef struct keel_optim keel_optim;

/* Canonical parameters [begin, begin + len) stored from buffer_offset on in
 * the buffer the optimizer updates. */
typedef struct keel_param_range {
    int64_t begin, len, buffer_offset;
} keel_param_range;

/* Optimizer state (m, v) for a buffer of buffer_len floats whose listed
 * ranges hold parameters (FSDP: a rank's shard buffer, one range per unit;
 * the rest is padding and is never updated). The state lives in backend be's
 * memory (NULL: the CPU backend) and its updates run there, on parameters
 * and gradients in the same backend's memory. */
keel_status keel_optim_build_ranges(const keel_train_config *cfg, const keel_model_layout *lay,
                                    const keel_param_range *ranges, int n_ranges,
                                    int64_t buffer_len, const keel_backend *be, keel_optim **out);
/* The same for one contiguous range: parameters [begin, begin + len). */
keel_status keel_optim_build(const keel_train_config *cfg, const keel_model_layout *lay,
                             int64_t begin, int64_t len, const keel_backend *be, keel_optim **out);
void keel_optim_free(keel_optim *opt);
/* Persistent optimizer bytes (m and v). */
int64_t keel_optim_state_bytes(const keel_optim *opt);
/* AdamW's first and second moments, buffer_len floats each (checkpoints), in
 * the backend's memory. */
float *keel_optim_m(keel_optim *opt);
float *keel_optim_v(keel_optim *opt);
/* The sum of squares of a gradient buffer (buffer_len floats) on the
 * optimizer's backend: the square of the gradient norm. */
double keel_optim_sumsq(const keel_optim *opt, const float *grads);
/* The backend its state lives on. */
const keel_backend *keel_optim_backend(const keel_optim *opt);

/* Learning rate for optimizer step `step` (0-based of `total`): linear warmup
 * from lr/warmup to lr over warmup_steps, then cosine decay to min_lr at the
 * last step. */
double keel_lr_at(const keel_train_config *cfg, int step);
/* Factor that brings the global gradient norm down to clip (1 if under it or clip = 0). */
double keel_clip_scale(double grad_norm, double clip);

/* One AdamW step on params/grads, buffers of the optimizer's buffer_len. grads are multiplied by grad_scale first. step is
 * 0-based; Adam's bias correction uses step + 1. */
void keel_optim_update(keel_optim *opt, float *params, float *grads, int step, double lr,
                       double grad_scale);

#endif
