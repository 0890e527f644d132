/* kernels/gemm_bf16_emulated.c: keel_gemm_bf16 on CPUs (or caps) without bf16
 * instructions — the same semantics through OpenBLAS sgemm.
 *
 * A bf16 value widens to fp32 exactly (it is fp32's top half) and the product
 * of two bf16 values is exact in fp32 (8 + 8 significant bits), so widening
 * the operands and calling sgemm gives bf16 products summed in fp32: what
 * oneDNN's bf16 matmul computes, up to the order of the sums.
 *
 * Widening whole operands would need fp32 copies of both (the 32000-wide
 * output head's gradient alone is 131 MB at B*T = 1024), so each pool chunk
 * of output columns is done in tiles: a KC-deep panel of b, NC columns wide,
 * is widened once, and an MC-row block of a is widened for each panel — a
 * widening per MC*NC*KC multiply-adds, under 1% of the time, into a fixed
 * per-chunk scratch. The tiles are large enough that sgemm runs at its full
 * rate (measured in docs/cpus.md). Stored layouts are kept (a transposed
 * operand is widened as stored and passed to sgemm as transposed). */
#include <cblas.h>

#include "keel/kernels.h"
#include "kernels/gemm_bf16_emulated.h"

#define MC 256
#define KC 256
#define NC 1024

typedef struct {
    float *out;
    const keel_bf16 *a, *b;
    int M, N, K;
    bool a_t, b_t, accumulate;
    float *scratch; /* per chunk: MC*KC floats of a, then KC*NC of b */
} emul_ctx;

/* Per-chunk scratch, grown before the pool runs; freed by
 * keel_gemm_bf16_release. */
static struct {
    float *mem;
    size_t floats;
} scratch;

/* dst (rows, cols) fp32, row stride cols, from src's block at (r0, c0) with
 * row stride ld: bf16 -> fp32 is a 16-bit shift, exact. */
static void widen(float *dst, const keel_bf16 *src, int64_t ld, int r0, int c0, int rows,
                  int cols) {
    for (int r = 0; r < rows; r++) {
        const keel_bf16 *s = src + (int64_t)(r0 + r) * ld + c0;
        float *d = dst + (int64_t)r * cols;
        for (int c = 0; c < cols; c++) d[c] = keel_bf16_to_float(s[c]);
    }
}

static int min_int(int x, int y) { return x < y ? x : y; }

static void emul_columns(void *p, int64_t begin, int64_t end, int chunk) {
    const emul_ctx *c = p;
    float *aw = c->scratch + (size_t)chunk * (MC * KC + KC * NC), *bw = aw + MC * KC;
    for (int n0 = (int)begin; n0 < (int)end; n0 += NC) {
        int nc = min_int(NC, (int)end - n0);
        for (int k0 = 0; k0 < c->K; k0 += KC) {
            int kc = min_int(KC, c->K - k0);
            /* b's panel: stored (N,K) rows n0.. if b_t, else (K,N) rows k0.. */
            if (c->b_t) widen(bw, c->b, c->K, n0, k0, nc, kc);
            else widen(bw, c->b, c->N, k0, n0, kc, nc);
            float beta = k0 == 0 && !c->accumulate ? 0.0f : 1.0f;
            for (int m0 = 0; m0 < c->M; m0 += MC) {
                int mc = min_int(MC, c->M - m0);
                if (c->a_t) widen(aw, c->a, c->M, k0, m0, kc, mc);
                else widen(aw, c->a, c->K, m0, k0, mc, kc);
                cblas_sgemm(CblasRowMajor, c->a_t ? CblasTrans : CblasNoTrans,
                            c->b_t ? CblasTrans : CblasNoTrans, mc, nc, kc, 1.0f, aw,
                            c->a_t ? mc : kc, bw, c->b_t ? kc : nc, beta,
                            c->out + (int64_t)m0 * c->N + n0, c->N);
            }
        }
    }
}

void keel_gemm_bf16_emulated(float *out, const keel_bf16 *a, bool a_t, const keel_bf16 *b,
                             bool b_t, int M, int N, int K, bool accumulate) {
    if (K == 0) { /* no panel to run: the product is zero */
        if (!accumulate)
            for (int64_t i = 0; i < (int64_t)M * N; i++) out[i] = 0;
        return;
    }
    size_t want = (size_t)(MC * KC + KC * NC) * (size_t)keel_pool_threads();
    if (want > scratch.floats) {
        keel_free(scratch.mem);
        scratch.mem = keel_xmalloc(sizeof(float) * want, "emulated bf16 GEMM scratch");
        scratch.floats = want;
    }
    emul_ctx c = {out, a, b, M, N, K, a_t, b_t, accumulate, scratch.mem};
    keel_pool_for(N, 64, emul_columns, &c);
}

void keel_gemm_bf16_emulated_release(void) {
    keel_free(scratch.mem);
    scratch.mem = NULL;
    scratch.floats = 0;
}
