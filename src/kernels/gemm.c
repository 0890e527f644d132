/* kernels/gemm.c: linear layers through OpenBLAS sgemm, and thread setup. */
#include <cblas.h>
#include <unistd.h>

#include "keel/kernels.h"

int keel_kernels_init(int threads) {
    if (threads <= 0) threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    openblas_set_num_threads(threads);
    keel_pool_init(threads);
    return threads;
}

void keel_kernels_shutdown(void) { keel_pool_shutdown(); }

void keel_matmul_forward(float *out, const float *in, const float *w, int M, int N, int K,
                         bool accumulate) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, in, K, w, K,
                accumulate ? 1.0f : 0.0f, out, N);
}

void keel_matmul_backward(float *d_in, float *d_w, const float *d_out, const float *in,
                          const float *w, int M, int N, int K, bool accumulate_in) {
    if (d_in)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1.0f, d_out, N, w, K,
                    accumulate_in ? 1.0f : 0.0f, d_in, K);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, M, 1.0f, d_out, N, in, K, 1.0f,
                d_w, K);
}
