/* cuda: keel's CUDA backend, built where CMake finds nvcc
 * (KEEL_CUDA=ON, the default; KEEL_HAVE_CUDA is then defined). It holds the
 * runtime's view of the GPUs, device memory, and the kernels on device
 * pointers — cuBLASLt GEMMs (fp32 without TF32, bf16 in with fp32
 * accumulation), the bf16 conversions, RMSNorm, RoPE, flash-style causal
 * attention with grouped-query heads (fp32 and bf16, forward and backward,
 * deterministic; bf16 on the tensor cores at head sizes 64 and 128),
 * SwiGLU, softmax cross-entropy, the token embedding, AdamW, the sums of the
 * gradient norm and the loss, and the accumulation of a reduce-scatter's
 * result into a gradient — each with the contract of
 * its CPU kernel (keel/kernels.h) and parity-tested against it on a machine
 * with a GPU (tests/cuda/gpu_parity.c, scripts/gpu-check.sh). Calls run in
 * order on the default stream; a launch's or cuBLASLt's failure is kept and
 * reported by the next keel_cuda_sync with a line naming the call. The model
 * reaches them through the backend interface (keel/backend.h, src/backend/cuda.c).
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
/* Stream-ordered (after the kernels issued so far): zero bytes at p; copy
 * device to device. */
keel_status keel_cuda_memset0(void *p, size_t bytes);
keel_status keel_cuda_copy(void *dst, const void *src, size_t bytes);
/* Wait for the kernels issued so far; their first error, with a line. */
keel_status keel_cuda_sync(void);

/* The CPU kernels' contracts (keel/kernels.h), on device pointers. */
/* keel_matmul_forward / _backward: out (M,N) = in (M,K) · w (N,K)ᵀ; d_in
 * skipped when NULL, d_w always accumulates. cuBLASLt, CUBLAS_COMPUTE_32F. */
void keel_cuda_matmul_forward(float *out, const float *in, const float *w, int M, int N, int K, bool accumulate);
void keel_cuda_matmul_backward(float *d_in, float *d_w, const float *d_out, const float *in, const float *w, int M,
                               int N, int K, bool accumulate_in);
/* keel_gemm_bf16: out (M,N) = a · b (+ out), bf16 in, fp32 accumulation and out */
void keel_cuda_gemm_bf16(float *out, const keel_bf16 *a, bool a_t, const keel_bf16 *b, bool b_t, int M, int N, int K,
                         bool accumulate);
/* keel_bf16_from_float / keel_bf16_to_float over arrays, bit for bit (NaNs included) */
void keel_cuda_f32_to_bf16(keel_bf16 *dst, const float *src, int64_t n);
void keel_cuda_bf16_to_f32(float *dst, const keel_bf16 *src, int64_t n);
void keel_cuda_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps);
void keel_cuda_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                                const float *rstd, int N, int C);
/* keel_attention_*: causal, query head h reads kv head h / (NH/NKV); q, out
 * (B,T,NH*HS), k, v (B,T,NKV*HS), lse (B,NH,T); HS 1..128. Backward
 * overwrites dq, dk, dv, is deterministic (no atomics), and keeps a
 * (B,NH,T) float scratch on the device between calls. */
void keel_cuda_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T,
                                 int NH, int NKV, int HS);
void keel_cuda_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                  const float *lse, const float *q, const float *k, const float *v, int B, int T,
                                  int NH, int NKV, int HS);
void keel_cuda_attention_forward_bf16(float *out, float *lse, const float *q, const float *k, const float *v, int B,
                                      int T, int NH, int NKV, int HS);
void keel_cuda_attention_backward_bf16(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                       const float *lse, const float *q, const float *k, const float *v, int B,
                                       int T, int NH, int NKV, int HS);
/* The bf16 attention's two implementations, which the two above choose
 * between (tests call them directly): _tc on the tensor cores (WMMA, bf16
 * operands into fp32 accumulators; HS 64 and 128 only, other head sizes are
 * refused) and _simt on the CUDA cores (HS 1..128). The functions above take
 * _tc where it applies unless the environment has KEEL_CUDA_ATTENTION=simt,
 * read at their first call and again after keel_cuda_attention_reread_env. */
void keel_cuda_attention_forward_bf16_tc(float *out, float *lse, const float *q, const float *k, const float *v,
                                         int B, int T, int NH, int NKV, int HS);
void keel_cuda_attention_backward_bf16_tc(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                          const float *lse, const float *q, const float *k, const float *v, int B,
                                          int T, int NH, int NKV, int HS);
void keel_cuda_attention_forward_bf16_simt(float *out, float *lse, const float *q, const float *k, const float *v,
                                           int B, int T, int NH, int NKV, int HS);
void keel_cuda_attention_backward_bf16_simt(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                            const float *lse, const float *q, const float *k, const float *v, int B,
                                            int T, int NH, int NKV, int HS);
void keel_cuda_attention_reread_env(void);
void keel_cuda_swiglu_forward(float *h, const float *gate, const float *up, int64_t n);
void keel_cuda_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate, const float *up,
                               int64_t n);
/* x (B,T,H,HS) in place with keel_rope_table's cos_sin (T,HS/2,2), copied to the device */
void keel_cuda_rope_forward(float *x, const float *cos_sin, int B, int T, int H, int HS);
void keel_cuda_rope_backward(float *dx, const float *cos_sin, int B, int T, int H, int HS);
/* keel_xent_forward_backward, each row's loss in row_loss (N) instead of their sum */
void keel_cuda_xent_forward_backward(float *logits, float *row_loss, const int32_t *targets, int N, int V,
                                     float dscale);
/* keel_embedding_*: out row i = table row tokens[i]; backward adds dout's
 * rows into dtable in the order i = 0..N-1, bit-identical to the CPU's */
void keel_cuda_embedding_forward(float *out, const float *table, const int32_t *tokens, int N, int C);
void keel_cuda_embedding_forward_bf16(float *out, const keel_bf16 *table, const int32_t *tokens, int N, int C);
void keel_cuda_embedding_backward(float *dtable, const float *dout, const int32_t *tokens, int N, int C);
/* lr, beta1, beta2, eps, weight_decay, grad_scale as keel_adamw_step; t >= 1 */
void keel_cuda_adamw_update(float *param, const float *grad, float *m, float *v, int64_t n, float lr, float beta1,
                            float beta2, float eps, float weight_decay, float grad_scale, int64_t t);
/* Sum of squares (keel_sumsq) and plain sum (e.g. xent's row losses), double
 * accumulation per block, the blocks added on the host; they wait for the
 * device (NaN when a CUDA call failed, kept for keel_cuda_sync). */
double keel_cuda_sumsq(const float *x, int64_t n);
double keel_cuda_sum(const float *x, int64_t n);
/* keel_accumulate / keel_accumulate_bf16: dst[i] += src[i] (bf16 widened
 * exactly), one fp32 add each: bit-identical to the CPU's */
void keel_cuda_accumulate(float *dst, const float *src, int64_t n);
void keel_cuda_accumulate_bf16(float *dst, const keel_bf16 *src, int64_t n);
/* keel_scale_masked: the same mask, bit for bit (keel_mask_keeps) */
void keel_cuda_scale_masked(float *out, const float *x, int64_t n, float mult, float p, uint64_t key, bool accumulate);
#endif

#endif
