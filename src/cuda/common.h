// cuda/common.h: what the CUDA backend's files (kernels.cu, gemm.cu,
// attention.cu, attention_tc.cu) share and keel/cuda.h does not show: the
// first error since the last keel_cuda_sync, kept with a line naming the call
// that failed (a kernel launch, a CUDA runtime call, a cuBLASLt status), the
// launch-size helper, and attention backward's rowsum(dO ∘ O). nvcc only (C++).
#ifndef KEEL_CUDA_INTERNAL_H
#define KEEL_CUDA_INTERNAL_H

#include <cuda_runtime.h>
#include <stdint.h>

// Keeps e (when an error, and the first since the last sync) with `what`,
// the call or kernel that returned it; keel_cuda_sync reports it.
void keel_cuda_note(cudaError_t e, const char *what);
// Keeps a failure that is not a cudaError_t (a cuBLASLt status, an
// unsupported shape), printf-style, under the same rule.
void keel_cuda_note_failure(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define KEEL_CUDA_THREADS 256

// Blocks of KEEL_CUDA_THREADS for a grid-stride loop over n items.
static inline int keel_cuda_blocks_for(int64_t n) {
    int64_t b = (n + KEEL_CUDA_THREADS - 1) / KEEL_CUDA_THREADS;
    return (int)(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

// Attention backward's D = rowsum(dO ∘ O) per query and head (dO rounded to
// bf16 when bf16), launched into a (B, NH, T) device scratch that
// attention.cu keeps between calls and grows when a call needs more; the
// scratch, or NULL after a failed allocation (noted under `what`).
float *keel_cuda_attention_rowdot(const float *dout, const float *out, int B, int T, int NH, int HS, bool bf16,
                                  const char *what);

#endif
