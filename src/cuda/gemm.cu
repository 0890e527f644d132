// cuda/gemm.cu: the GEMMs of keel/cuda.h on cuBLASLt — fp32 (keel_matmul_*'s
// contract, CUBLAS_COMPUTE_32F: no TF32, for parity with the CPU) and bf16
// inputs with fp32 accumulation and output (keel_gemm_bf16's contract, the
// GEMMs of fsdp.mixed_precision bf16).
//
// Row-major to column-major. cuBLASLt is column-major; a row-major (r, c)
// buffer with row stride c is, read column-major, the (c, r) matrix — its
// transpose — with leading dimension c. So a row-major C = A·B is computed as
// the column-major Cᵀ = Bᵀ·Aᵀ: cuBLASLt's "A" is our B's buffer, its "B" our
// A's, m = our N, n = our M, and each buffer already is the transpose that
// product needs when it is stored row-major untransposed (op N); a buffer
// stored transposed is read with op T. Per entry point (cuBLASLt's op(A),
// op(B) over the buffers; ld = the buffer's row length):
//   matmul_forward   out(M,N) = in(M,K)·w(N,K)ᵀ:  outᵀ(N,M) = w(N,K) · inᵀ(K,M)
//                    A = w op T (stored K×N, ld K), B = in op N (K×M, ld K), m N, n M, k K, ldc N
//   matmul_backward  d_in(M,K) = d_out(M,N)·w(N,K): d_inᵀ(K,M) = wᵀ(K,N) · d_outᵀ(N,M)
//                    A = w op N (K×N, ld K), B = d_out op N (N×M, ld N), m K, n M, k N, ldc K
//                    d_w(N,K) += d_outᵀ(N,M)·in(M,K): d_wᵀ(K,N) = inᵀ(K,M) · d_out(M,N)
//                    A = in op N (K×M, ld K), B = d_out op T (N×M, ld N), m K, n N, k M, ldc K
//   gemm_bf16        out(M,N) = op(a)(M,K)·op(b)(K,N): outᵀ(N,M) = op(b)ᵀ(N,K) · op(a)ᵀ(K,M)
//                    A = b: op N (N×K, ld N) when b is (K,N); op T (K×N, ld K) when b_t, stored (N,K)
//                    B = a: op N (K×M, ld K) when a is (M,K); op T (M×K, ld M) when a_t, stored (K,M)
//                    m N, n M, k K, ldc N
// beta = accumulate ? 1 : 0 (d_w: always 1); D is C, in place.
//
// One cuBLASLt handle and a 32 MiB workspace, made on first use; the
// heuristic's algorithm is cached per shape (ops, sizes, lds, type, pointer
// alignments). Where the heuristic offers no algorithm for a shape, a plain
// tiled kernel with the same semantics runs instead (fp32 sums), with a
// warning once per shape. Everything runs on the default stream, in order
// with keel's other kernels.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#define _Noreturn __attribute__((noreturn)) // C11's, in keel/core.h; nvcc compiles C++
#include "keel/cuda.h"
}
#include "common.h"

// cuBLASLt is opened on the first GEMM (dlopen), not linked: the library is
// half a GiB, and loading it at start cost every keel command, GPU or not,
// ~0.8 s and ~200 MB of resident memory. Its header still gives the types.
#define LT_FUNCTIONS(X) \
    X(cublasLtCreate, lt_Create) \
    X(cublasLtDestroy, lt_Destroy) \
    X(cublasLtGetStatusName, lt_GetStatusName) \
    X(cublasLtGetStatusString, lt_GetStatusString) \
    X(cublasLtMatmul, lt_Matmul) \
    X(cublasLtMatmulAlgoGetHeuristic, lt_MatmulAlgoGetHeuristic) \
    X(cublasLtMatmulDescCreate, lt_MatmulDescCreate) \
    X(cublasLtMatmulDescDestroy, lt_MatmulDescDestroy) \
    X(cublasLtMatmulDescSetAttribute, lt_MatmulDescSetAttribute) \
    X(cublasLtMatmulPreferenceCreate, lt_MatmulPreferenceCreate) \
    X(cublasLtMatmulPreferenceDestroy, lt_MatmulPreferenceDestroy) \
    X(cublasLtMatmulPreferenceSetAttribute, lt_MatmulPreferenceSetAttribute) \
    X(cublasLtMatrixLayoutCreate, lt_MatrixLayoutCreate) \
    X(cublasLtMatrixLayoutDestroy, lt_MatrixLayoutDestroy) \

#define DECLARE(sym, ours) static decltype(&::sym) ours;
LT_FUNCTIONS(DECLARE)
#undef DECLARE
#define STR_(x) #x
#define STR(x) STR_(x)

// The library and its functions, once; false with a failure noted for keel_cuda_sync.
static bool lt_load(void) {
    static int loaded; // 0 not tried, 1 ok, -1 failed
    if (loaded) return loaded > 0;
    loaded = -1;
    const char *names[] = {"libcublasLt.so." STR(CUBLAS_VER_MAJOR), "libcublasLt.so"};
    void *lib = NULL;
    for (size_t i = 0; !lib && i < sizeof names / sizeof *names; i++) lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        keel_cuda_note_failure("cannot load cuBLASLt (%s): %s; put the CUDA toolkit's lib64 on LD_LIBRARY_PATH",
                               names[0], dlerror());
        return false;
    }
#define LOAD(sym, ours)                                                                    \
    if (!(ours = (decltype(ours))dlsym(lib, #sym))) {                                     \
        keel_cuda_note_failure("%s has no %s (an older cuBLASLt?)", names[0], #sym);      \
        return false;                                                                      \
    }
    LT_FUNCTIONS(LOAD)
#undef LOAD
    loaded = 1;
    return true;
}

#define WORKSPACE_BYTES ((size_t)32 << 20)
#define CACHE_SLOTS 256

static cublasLtHandle_t g_lt;
static void *g_workspace;

typedef struct {
    int32_t ta, tb; // cublasOperation_t
    int32_t m, n, k;
    int64_t lda, ldb, ldc;
    int32_t ab;                        // cudaDataType_t of A and B
    uint32_t align_a, align_b, align_c; // bytes, powers of two up to 256
} shape_key;

typedef struct {
    shape_key key;
    bool used;
    bool fallback; // the heuristic had nothing: the plain kernel
    cublasLtMatmulAlgo_t algo;
} cache_slot;

static cache_slot g_cache[CACHE_SLOTS];
static int g_cache_next; // round robin once full

// false, with the status kept for keel_cuda_sync, when s is not success
static bool lt_ok(cublasStatus_t s, const char *call, const char *shape) {
    if (s == CUBLAS_STATUS_SUCCESS) return true;
    keel_cuda_note_failure("cuBLASLt %s (%s): %s (%s)", call, shape, lt_GetStatusName(s),
                           lt_GetStatusString(s));
    return false;
}

static bool lt_init(void) {
    if (g_lt) return true;
    if (!lt_load()) return false;
    cublasLtHandle_t h;
    if (!lt_ok(lt_Create(&h), "cublasLtCreate", "first GEMM")) return false;
    void *ws = NULL;
    cudaError_t e = cudaMalloc(&ws, WORKSPACE_BYTES);
    if (e != cudaSuccess) {
        keel_cuda_note(e, "cudaMalloc of cuBLASLt's 32 MiB workspace");
        lt_Destroy(h);
        return false;
    }
    g_lt = h;
    g_workspace = ws;
    return true;
}

// the largest power of two (<= 256) that p's address is a multiple of
static uint32_t alignment(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && a % al) al /= 2;
    return al;
}

// ---- the fallback: C (m, n) column-major = op(A)·op(B) + beta C, 16 x 16 tiles ----

__device__ static float load_dev(const float *p, int64_t i) { return p[i]; }
__device__ static float load_dev(const keel_bf16 *p, int64_t i) { return __uint_as_float((uint32_t)p[i] << 16); }

template <typename T>
__global__ static void gemm_plain(bool ta, bool tb, int m, int n, int k, const T *A, int64_t lda, const T *B,
                                  int64_t ldb, float *C, int64_t ldc, float beta) {
    __shared__ float As[16][17], Bs[16][17]; // As[p][i] = op(A)(i, p); Bs[j][p] = op(B)(p, j)
    int tx = threadIdx.x, ty = threadIdx.y;
    int i = blockIdx.x * 16 + tx, j = blockIdx.y * 16 + ty;
    float acc = 0;
    for (int p0 = 0; p0 < k; p0 += 16) {
        int ap = p0 + ty; // op(A)(i, ap): tx runs along i
        As[ty][tx] = i < m && ap < k ? load_dev(A, ta ? ap + (int64_t)i * lda : i + (int64_t)ap * lda) : 0.0f;
        int bp = p0 + tx, bj = j; // op(B)(bp, bj): tx runs along p
        Bs[ty][tx] = bp < k && bj < n ? load_dev(B, tb ? bj + (int64_t)bp * ldb : bp + (int64_t)bj * ldb) : 0.0f;
        __syncthreads();
        for (int p = 0; p < 16; p++) acc += As[p][tx] * Bs[ty][p];
        __syncthreads();
    }
    if (i < m && j < n) {
        float *c = C + i + (int64_t)j * ldc;
        *c = beta != 0.0f ? acc + beta * *c : acc;
    }
}

// C (m, n) column-major, ld ldc = op(A)·op(B) + beta C; A and B fp32 or bf16 (ab).
static void lt_matmul(const char *name, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                      const void *A, int64_t lda, const void *B, int64_t ldb, cudaDataType_t ab, float *C,
                      int64_t ldc, float beta) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0) { // a sum of nothing: C = beta C (ldc == m in every caller: contiguous)
        if (beta == 0.0f) keel_cuda_note(cudaMemsetAsync(C, 0, (size_t)ldc * n * sizeof(float), 0), name);
        return;
    }
    char shape[200];
    snprintf(shape, sizeof shape, "%s: column-major m=%d n=%d k=%d op %c%c lda=%lld ldb=%lld ldc=%lld %s", name, m,
             n, k, ta == CUBLAS_OP_T ? 'T' : 'N', tb == CUBLAS_OP_T ? 'T' : 'N', (long long)lda, (long long)ldb,
             (long long)ldc, ab == CUDA_R_16BF ? "bf16" : "fp32");
    shape_key key;
    memset(&key, 0, sizeof key); // padding too: keys compare with memcmp
    key.ta = ta, key.tb = tb, key.m = m, key.n = n, key.k = k, key.lda = lda, key.ldb = ldb, key.ldc = ldc;
    key.ab = ab, key.align_a = alignment(A), key.align_b = alignment(B), key.align_c = alignment(C);

    cache_slot *slot = NULL;
    for (int s = 0; s < CACHE_SLOTS && !slot; s++)
        if (g_cache[s].used && memcmp(&g_cache[s].key, &key, sizeof key) == 0) slot = &g_cache[s];
    if (!lt_init()) return;

    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    int32_t opa = ta, opb = tb;
    bool ok = lt_ok(lt_MatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate", shape) &&
              lt_ok(lt_MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa),
                    "lt_MatmulDescSetAttribute(TRANSA)", shape) &&
              lt_ok(lt_MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb),
                    "lt_MatmulDescSetAttribute(TRANSB)", shape) &&
              // layouts describe the buffers as stored: (rows, cols) before the op
              lt_ok(lt_MatrixLayoutCreate(&la, ab, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, lda),
                    "lt_MatrixLayoutCreate(A)", shape) &&
              lt_ok(lt_MatrixLayoutCreate(&lb, ab, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, ldb),
                    "lt_MatrixLayoutCreate(B)", shape) &&
              lt_ok(lt_MatrixLayoutCreate(&lc, CUDA_R_32F, m, n, ldc), "lt_MatrixLayoutCreate(C)", shape);
    if (ok && !slot) {
        cublasLtMatmulHeuristicResult_t result;
        memset(&result, 0, sizeof result);
        int found = 0;
        uint64_t ws = WORKSPACE_BYTES;
        ok = lt_ok(lt_MatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate", shape) &&
             lt_ok(lt_MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
                   "lt_MatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)", shape) &&
             // the buffers' real alignments: the default (256) would admit
             // algorithms that need more than a pointer into a tensor has
             lt_ok(lt_MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                        &key.align_a, sizeof key.align_a),
                   "lt_MatmulPreferenceSetAttribute(MIN_ALIGNMENT_A_BYTES)", shape) &&
             lt_ok(lt_MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                        &key.align_b, sizeof key.align_b),
                   "lt_MatmulPreferenceSetAttribute(MIN_ALIGNMENT_B_BYTES)", shape) &&
             lt_ok(lt_MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                        &key.align_c, sizeof key.align_c),
                   "lt_MatmulPreferenceSetAttribute(MIN_ALIGNMENT_C_BYTES)", shape) &&
             lt_ok(lt_MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                        &key.align_c, sizeof key.align_c),
                   "lt_MatmulPreferenceSetAttribute(MIN_ALIGNMENT_D_BYTES)", shape);
        if (ok) {
            cublasStatus_t s = lt_MatmulAlgoGetHeuristic(g_lt, op, la, lb, lc, lc, pref, 1, &result, &found);
            if (s != CUBLAS_STATUS_SUCCESS && s != CUBLAS_STATUS_NOT_SUPPORTED)
                ok = lt_ok(s, "cublasLtMatmulAlgoGetHeuristic", shape);
            else if (s != CUBLAS_STATUS_SUCCESS || result.state != CUBLAS_STATUS_SUCCESS)
                found = 0;
        }
        if (ok) {
            slot = &g_cache[g_cache_next];
            g_cache_next = (g_cache_next + 1) % CACHE_SLOTS;
            slot->key = key;
            slot->used = true;
            slot->fallback = found < 1;
            if (found >= 1) slot->algo = result.algo;
            else
                keel_log_warn("cuBLASLt has no algorithm for %s; a plain CUDA kernel runs it instead", shape);
        }
    }
    if (ok && slot->fallback) {
        dim3 grid((unsigned)((m + 15) / 16), (unsigned)((n + 15) / 16)), block(16, 16);
        if (grid.y > 65535) keel_cuda_note_failure("%s: n too large for the plain kernel's grid", shape);
        else if (ab == CUDA_R_16BF)
            gemm_plain<keel_bf16><<<grid, block>>>(ta == CUBLAS_OP_T, tb == CUBLAS_OP_T, m, n, k,
                                                   (const keel_bf16 *)A, lda, (const keel_bf16 *)B, ldb, C, ldc, beta);
        else
            gemm_plain<float><<<grid, block>>>(ta == CUBLAS_OP_T, tb == CUBLAS_OP_T, m, n, k, (const float *)A, lda,
                                               (const float *)B, ldb, C, ldc, beta);
        keel_cuda_note(cudaGetLastError(), name);
    } else if (ok) {
        float alpha = 1.0f;
        lt_ok(lt_Matmul(g_lt, op, &alpha, A, la, B, lb, &beta, C, lc, C, lc, &slot->algo, g_workspace,
                             WORKSPACE_BYTES, 0),
              "cublasLtMatmul", shape);
    }
    if (pref) lt_MatmulPreferenceDestroy(pref);
    if (lc) lt_MatrixLayoutDestroy(lc);
    if (lb) lt_MatrixLayoutDestroy(lb);
    if (la) lt_MatrixLayoutDestroy(la);
    if (op) lt_MatmulDescDestroy(op);
}

extern "C" void keel_cuda_matmul_forward(float *out, const float *in, const float *w, int M, int N, int K,
                                         bool accumulate) {
    lt_matmul("matmul_forward", CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, w, K, in, K, CUDA_R_32F, out, N,
              accumulate ? 1.0f : 0.0f);
}

extern "C" void keel_cuda_matmul_backward(float *d_in, float *d_w, const float *d_out, const float *in,
                                          const float *w, int M, int N, int K, bool accumulate_in) {
    if (d_in)
        lt_matmul("matmul_backward d_in", CUBLAS_OP_N, CUBLAS_OP_N, K, M, N, w, K, d_out, N, CUDA_R_32F, d_in, K,
                  accumulate_in ? 1.0f : 0.0f);
    if (d_w) // NULL: a frozen weight
        lt_matmul("matmul_backward d_w", CUBLAS_OP_N, CUBLAS_OP_T, K, N, M, in, K, d_out, N, CUDA_R_32F, d_w, K, 1.0f);
}

extern "C" void keel_cuda_gemm_bf16(float *out, const keel_bf16 *a, bool a_t, const keel_bf16 *b, bool b_t, int M,
                                    int N, int K, bool accumulate) {
    lt_matmul("gemm_bf16", b_t ? CUBLAS_OP_T : CUBLAS_OP_N, a_t ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, b, b_t ? K : N,
              a, a_t ? M : K, CUDA_R_16BF, out, N, accumulate ? 1.0f : 0.0f);
}
