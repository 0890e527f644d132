/* kernels/gemm.c: linear layers through OpenBLAS sgemm, and thread setup.
 *
 * OpenBLAS runs single-threaded; keel splits each GEMM into column blocks of
 * its output over its own pool. One set of threads for everything means
 * OpenBLAS's workers never spin-yield against keel's kernels between calls
 * (measured: 4-5% of a step went to that), and GEMM speed is the same. */
#include <cblas.h>
#include <unistd.h>

#include "keel/kernels.h"

int keel_kernels_init(int threads) {
    if (threads <= 0) threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    openblas_set_num_threads(1);
    keel_isa_active(); /* caps oneDNN (KEEL_MAX_ISA) before anything uses it */
    keel_pool_init(threads);
    return threads;
}

void keel_kernels_shutdown(void) {
    keel_gemm_bf16_release();
    keel_matmul_few_rows_release();
    keel_attention_release();
    keel_pool_shutdown();
}

typedef enum { FORWARD, BACKWARD_INPUT, BACKWARD_WEIGHT } gemm_kind;

typedef struct {
    gemm_kind kind;
    float *out;
    const float *a, *b;
    int M, N, K;
    float beta;
} gemm_ctx;

/* Columns [begin, end) of the output of one of the three GEMMs of a linear layer. */
static void gemm_columns(void *p, int64_t begin, int64_t end, int chunk) {
    (void)chunk;
    const gemm_ctx *c = p;
    int lo = (int)begin, n = (int)(end - begin);
    switch (c->kind) {
    case FORWARD: /* out (M,N) = in (M,K) · wᵀ: columns are rows of w */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, c->M, n, c->K, 1.0f, c->a, c->K,
                    c->b + (int64_t)lo * c->K, c->K, c->beta, c->out + lo, c->N);
        break;
    case BACKWARD_INPUT: /* d_in (M,K) = d_out (M,N) · w (N,K): columns of w */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, c->M, n, c->N, 1.0f, c->a, c->N,
                    c->b + lo, c->K, c->beta, c->out + lo, c->K);
        break;
    case BACKWARD_WEIGHT: /* d_w (N,K) += d_outᵀ · in: rows of d_w are columns of d_out */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, c->K, c->M, 1.0f, c->a + lo, c->N,
                    c->b, c->K, 1.0f, c->out + (int64_t)lo * c->K, c->K);
        break;
    }
}

/* Blocks of at least 64 columns keep each thread's GEMM efficient. */
static void run(gemm_ctx *c, int columns) { keel_pool_for(columns, 64, gemm_columns, c); }

void keel_matmul_forward(float *out, const float *in, const float *w, int M, int N, int K,
                         bool accumulate) {
    gemm_ctx c = {FORWARD, out, in, w, M, N, K, accumulate ? 1.0f : 0.0f};
    run(&c, N);
}

void keel_matmul_backward(float *d_in, float *d_w, const float *d_out, const float *in,
                          const float *w, int M, int N, int K, bool accumulate_in) {
    if (d_in) {
        gemm_ctx c = {BACKWARD_INPUT, d_in, d_out, w, M, N, K, accumulate_in ? 1.0f : 0.0f};
        run(&c, K);
    }
    if (!d_w) return; /* a frozen weight */
    gemm_ctx c = {BACKWARD_WEIGHT, d_w, d_out, in, M, N, K, 1.0f};
    run(&c, N);
}
