/* cuda: keel's CUDA backend (issue 14), built where CMake finds nvcc
 * (KEEL_CUDA=ON, the default; KEEL_HAVE_CUDA is then defined). Today: the
 * runtime's view of the GPUs and the first kernels — RMSNorm, RoPE, SwiGLU,
 * softmax cross-entropy, AdamW —
 * on device pointers, each parity-tested against the CPU reference on a
 * machine with a GPU (tests/cuda/gpu_parity.c, scripts/gpu-check.sh). The
 * model does not run on them yet: `"device": "cuda"` is refused with the
 * reason.
 *
 *     char why[256];
 *     if (keel_cuda_device_count(why, sizeof why) == 0) puts(why);
 */
#ifndef KEEL_CUDA_H
#define KEEL_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "keel/core.h"

/* Whether this keel was built with the CUDA backend. */
bool keel_cuda_built(void);
/* GPUs the CUDA runtime sees; 0 with why (no backend, no driver, no device). */
int keel_cuda_device_count(char *why, size_t n);

#ifdef KEEL_HAVE_CUDA
/* Device memory and copies; KEEL_ERR_IO with an error line on failure. */
keel_status keel_cuda_malloc(void **p, size_t bytes);
void keel_cuda_free(void *p);
keel_status keel_cuda_to_device(void *dst, const void *src, size_t bytes);
keel_status keel_cuda_to_host(void *dst, const void *src, size_t bytes);
/* Wait for the kernels issued so far; their first error, with a line. */
keel_status keel_cuda_sync(void);

/* The CPU kernels' contracts (keel/kernels.h), on device pointers. */
void keel_cuda_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps);
void keel_cuda_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                                const float *rstd, int N, int C);
void keel_cuda_swiglu_forward(float *h, const float *gate, const float *up, int64_t n);
void keel_cuda_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate, const float *up,
                               int64_t n);
/* x (B,T,H,HS) in place with keel_rope_table's cos_sin (T,HS/2,2), copied to the device */
void keel_cuda_rope_forward(float *x, const float *cos_sin, int B, int T, int H, int HS);
void keel_cuda_rope_backward(float *dx, const float *cos_sin, int B, int T, int H, int HS);
/* keel_xent_forward_backward, each row's loss in row_loss (N) instead of their sum */
void keel_cuda_xent_forward_backward(float *logits, float *row_loss, const int32_t *targets, int N, int V,
                                     float dscale);
/* lr, beta1, beta2, eps, weight_decay, grad_scale as keel_adamw_step; t >= 1 */
void keel_cuda_adamw_update(float *param, const float *grad, float *m, float *v, int64_t n, float lr, float beta1,
                            float beta2, float eps, float weight_decay, float grad_scale, int64_t t);
#endif

#endif
