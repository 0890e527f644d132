/* tests/cuemu/fake_cublaslt.c: a stand-in for the 14 cuBLASLt functions that
 * src/cuda/gemm.cu opens (its LT_FUNCTIONS), built as libcublasLt.so.13 for
 * the CUDA emulator (cuemu.h). Test infrastructure: it multiplies on the host,
 * and nothing it computes or measures is a GPU result.
 *
 * It implements exactly what gemm.cu uses: compute CUBLAS_COMPUTE_32F with
 * fp32 scale and host pointer mode, ops N and T, column-major layouts of fp32
 * or bf16 A and B with fp32 C and D. Any other type, attribute or option
 * returns CUBLAS_STATUS_NOT_SUPPORTED rather than being ignored.
 *
 * Numerics: D(i,j) = alpha * sum + beta * C(i,j), the sum over p = 0, 1, ...,
 * k-1 in that order of op(A)(i,p) * op(B)(p,j), every product and sum rounded
 * to fp32 (bf16 inputs widen exactly); C is not read when beta is 0.
 *
 * cublasLtMatmul validates and copies its arguments on the calling thread and
 * queues the work on its stream (cuemu_enqueue); the device thread reads A, B
 * and C and writes D later, as a GPU would.
 *
 * The heuristic offers one algorithm, tagged so that cublasLtMatmul can tell
 * it from garbage; it records the preference's minimum alignments and
 * cublasLtMatmul refuses pointers less aligned than that, as a real algorithm
 * chosen for those alignments may. With CUEMU_CUBLASLT_NO_ALGO set
 * (non-empty) it offers none, which sends keel to its fallback kernel. */
#include <cublasLt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuemu.h"

/* Products and sums round separately in fp32 (no FMA) though keel's CMake
 * passes -ffp-contract=fast: GCC's pragma overrides that flag (clang's
 * -ffp-contract=fast would override its pragma: GCC builds keel). */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#else
#pragma GCC optimize("fp-contract=off")
#endif

/* Each object starts with its kind's tag, checked on every use: passing one
 * kind of handle for another, or a stray pointer, fails loudly. */
#define HANDLE_MAGIC 0x4c74684eu /* "Nhtl" */
#define DESC_MAGIC 0x4c74644du
#define LAYOUT_MAGIC 0x4c746c4cu
#define PREF_MAGIC 0x4c747050u
#define ALGO_MAGIC UINT64_C(0x31744c756d657563) /* "cuemuLt1" */

/* Semi-opaque algo bytes (cublasLtMatmulAlgo_t.data) as this library fills them. */
enum { ALGO_TAG, ALGO_TYPE, ALGO_ALIGN_A, ALGO_ALIGN_B, ALGO_ALIGN_C, ALGO_ALIGN_D };

/* The header declares the handle's struct but never defines it. */
struct cublasLtContext {
    uint32_t magic;
};

/* The descriptor handles point at these (cast): their header structs are
 * only placeholders for the caller to hold. */
typedef struct {
    uint32_t magic;
    cublasOperation_t ta, tb;
} lt_desc;

typedef struct {
    uint32_t magic;
    cudaDataType_t type;
    int64_t rows, cols, ld;
} lt_layout;

typedef struct {
    uint32_t magic;
    uint32_t align[4]; /* MIN_ALIGNMENT_{A,B,C,D}_BYTES */
} lt_pref;

/* One queued multiplication: everything the device thread needs, copied. */
typedef struct {
    bool ta, tb, bf16;
    int64_t m, n, k;
    const void *A, *B;
    int64_t lda, ldb;
    const float *C;
    int64_t ldc;
    float *D;
    int64_t ldd;
    float alpha, beta;
} lt_work;

static void check_magic(const void *object, uint32_t magic, const char *kind, const char *fn) {
    if (*(const uint32_t *)object != magic) cuemu_fail("%s: %p is not a live %s", fn, object, kind);
}

static lt_desc *desc_of(cublasLtMatmulDesc_t h, const char *fn) {
    check_magic(h, DESC_MAGIC, "cublasLtMatmulDesc_t", fn);
    return (lt_desc *)(void *)h;
}

static lt_layout *layout_of(cublasLtMatrixLayout_t h, const char *fn) {
    check_magic(h, LAYOUT_MAGIC, "cublasLtMatrixLayout_t", fn);
    return (lt_layout *)(void *)h;
}

static lt_pref *pref_of(cublasLtMatmulPreference_t h, const char *fn) {
    check_magic(h, PREF_MAGIC, "cublasLtMatmulPreference_t", fn);
    return (lt_pref *)(void *)h;
}

/* ---- handle and status names ---- */

cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle) {
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    struct cublasLtContext *h = malloc(sizeof *h);
    if (!h) return CUBLAS_STATUS_ALLOC_FAILED;
    h->magic = HANDLE_MAGIC;
    *handle = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    check_magic(handle, HANDLE_MAGIC, "cublasLtHandle_t", "cublasLtDestroy");
    handle->magic = 0;
    free(handle);
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasLtGetStatusName(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "<unrecognized cublasStatus_t>";
}

const char *cublasLtGetStatusString(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "an error was detected when checking the current licensing";
    }
    return "unknown error";
}

/* ---- descriptors ---- */

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc, cublasComputeType_t computeType,
                                        cudaDataType_t scaleType) {
    if (!matmulDesc) return CUBLAS_STATUS_INVALID_VALUE;
    if (computeType != CUBLAS_COMPUTE_32F || scaleType != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    lt_desc *d = malloc(sizeof *d);
    if (!d) return CUBLAS_STATUS_ALLOC_FAILED;
    *d = (lt_desc){.magic = DESC_MAGIC, .ta = CUBLAS_OP_N, .tb = CUBLAS_OP_N};
    *matmulDesc = (cublasLtMatmulDesc_t)(void *)d;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
    if (!matmulDesc) return CUBLAS_STATUS_INVALID_VALUE;
    lt_desc *d = desc_of(matmulDesc, "cublasLtMatmulDescDestroy");
    d->magic = 0;
    free(d);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t sizeInBytes) {
    if (!matmulDesc) return CUBLAS_STATUS_INVALID_VALUE;
    lt_desc *d = desc_of(matmulDesc, "cublasLtMatmulDescSetAttribute");
    if (attr != CUBLASLT_MATMUL_DESC_TRANSA && attr != CUBLASLT_MATMUL_DESC_TRANSB) return CUBLAS_STATUS_NOT_SUPPORTED;
    int32_t op;
    if (!buf || sizeInBytes != sizeof op) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&op, buf, sizeof op);
    if (op != CUBLAS_OP_N && op != CUBLAS_OP_T) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (attr == CUBLASLT_MATMUL_DESC_TRANSA) d->ta = (cublasOperation_t)op;
    else d->tb = (cublasOperation_t)op;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
    if (!matLayout) return CUBLAS_STATUS_INVALID_VALUE;
    if (type != CUDA_R_32F && type != CUDA_R_16BF) return CUBLAS_STATUS_NOT_SUPPORTED;
    /* keel's sizes are positive ints; it never describes an empty matrix */
    if (rows == 0 || cols == 0 || rows > INT32_MAX || cols > INT32_MAX) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (ld < 0 || (uint64_t)ld < rows) return CUBLAS_STATUS_INVALID_VALUE;
    /* every offset and byte count of the matrix, cols * ld fp32s at most, fits a ptrdiff_t */
    if ((uint64_t)ld > (uint64_t)PTRDIFF_MAX / sizeof(float) / cols) return CUBLAS_STATUS_INVALID_VALUE;
    lt_layout *l = malloc(sizeof *l);
    if (!l) return CUBLAS_STATUS_ALLOC_FAILED;
    *l = (lt_layout){.magic = LAYOUT_MAGIC, .type = type, .rows = (int64_t)rows, .cols = (int64_t)cols, .ld = ld};
    *matLayout = (cublasLtMatrixLayout_t)(void *)l;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
    if (!matLayout) return CUBLAS_STATUS_INVALID_VALUE;
    lt_layout *l = layout_of(matLayout, "cublasLtMatrixLayoutDestroy");
    l->magic = 0;
    free(l);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
    if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
    lt_pref *p = malloc(sizeof *p);
    if (!p) return CUBLAS_STATUS_ALLOC_FAILED;
    *p = (lt_pref){.magic = PREF_MAGIC, .align = {256, 256, 256, 256}}; /* the header's defaults */
    *pref = (cublasLtMatmulPreference_t)(void *)p;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
    lt_pref *p = pref_of(pref, "cublasLtMatmulPreferenceDestroy");
    p->magic = 0;
    free(p);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t sizeInBytes) {
    if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
    lt_pref *p = pref_of(pref, "cublasLtMatmulPreferenceSetAttribute");
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
        /* checked, not kept: the one algorithm needs no workspace, so any limit is met */
        return buf && sizeInBytes == sizeof(uint64_t) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
        if (!buf || sizeInBytes != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&p->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, sizeof(uint32_t));
        return CUBLAS_STATUS_SUCCESS;
    default:
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
}

/* ---- the problem: op(A) m x k, op(B) k x n, C and D m x n ---- */

typedef struct {
    int64_t m, n, k;
} dims;

static cublasStatus_t check_problem(const lt_desc *op, const lt_layout *a, const lt_layout *b, const lt_layout *c,
                                    const lt_layout *d, dims *out) {
    if (a->type != b->type || c->type != CUDA_R_32F || d->type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    int64_t m = op->ta == CUBLAS_OP_N ? a->rows : a->cols, k = op->ta == CUBLAS_OP_N ? a->cols : a->rows;
    int64_t kb = op->tb == CUBLAS_OP_N ? b->rows : b->cols, n = op->tb == CUBLAS_OP_N ? b->cols : b->rows;
    if (kb != k || c->rows != m || c->cols != n || d->rows != m || d->cols != n) return CUBLAS_STATUS_INVALID_VALUE;
    *out = (dims){m, n, k};
    return CUBLAS_STATUS_SUCCESS;
}

static bool no_algo(void) {
    const char *e = getenv("CUEMU_CUBLASLT_NO_ALGO");
    return e && *e;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int *returnAlgoCount) {
    static const char fn[] = "cublasLtMatmulAlgoGetHeuristic";
    if (!lightHandle) return CUBLAS_STATUS_NOT_INITIALIZED;
    check_magic(lightHandle, HANDLE_MAGIC, "cublasLtHandle_t", fn);
    if (!operationDesc || !Adesc || !Bdesc || !Cdesc || !Ddesc || !preference || requestedAlgoCount <= 0 ||
        !heuristicResultsArray || !returnAlgoCount)
        return CUBLAS_STATUS_INVALID_VALUE;
    const lt_layout *a = layout_of(Adesc, fn);
    const lt_pref *p = pref_of(preference, fn);
    dims dm;
    cublasStatus_t s = check_problem(desc_of(operationDesc, fn), a, layout_of(Bdesc, fn), layout_of(Cdesc, fn),
                                     layout_of(Ddesc, fn), &dm);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    *returnAlgoCount = 0;
    if (no_algo()) return CUBLAS_STATUS_NOT_SUPPORTED;

    cublasLtMatmulHeuristicResult_t *r = &heuristicResultsArray[0];
    memset(r, 0, sizeof *r);
    r->algo.data[ALGO_TAG] = ALGO_MAGIC;
    r->algo.data[ALGO_TYPE] = (uint64_t)a->type;
    for (int i = 0; i < 4; i++) r->algo.data[ALGO_ALIGN_A + i] = p->align[i];
    r->workspaceSize = 0;
    r->state = CUBLAS_STATUS_SUCCESS;
    r->wavesCount = 1.0f;
    *returnAlgoCount = 1;
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- the multiplication, on the device thread ---- */

static float *alloc_floats(int64_t count) {
    float *p = malloc((size_t)count * sizeof(float));
    if (!p) cuemu_fail("cublasLtMatmul: out of host memory for %lld floats", (long long)count);
    return p;
}

static float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* op(X), rows x cols, as a contiguous column-major fp32 copy; X stored with ld
 * (op N: X(r,c) at r + c*ld; op T: op(X)(r,c) = X(c,r) at c + r*ld). */
static float *pack(const void *x, bool bf16, bool t, int64_t ld, int64_t rows, int64_t cols) {
    float *out = alloc_floats(rows * cols);
    for (int64_t c = 0; c < cols; c++)
        for (int64_t r = 0; r < rows; r++) {
            int64_t at = t ? c + r * ld : r + c * ld;
            out[r + c * rows] = bf16 ? bf16_to_float(((const uint16_t *)x)[at]) : ((const float *)x)[at];
        }
    return out;
}

/* Output blocks of ROWS_BLOCK x COLS_BLOCK accumulate over all of k in an
 * 8 KiB buffer that stays in L1; the inner loop runs down a column, where
 * each element's sum is its own, so it vectorises without reordering any. */
#define ROWS_BLOCK 256
#define COLS_BLOCK 8

/* acc (ROWS_BLOCK x nj) = a[0..ni) x b[.., 0..nj) over all of k, a and b being
 * the packed copies (column-major, leading dimensions m and k). The stand-in's
 * own hot loop, left out of the sanitizers: it reads only the copies, which
 * pack() made under them from device memory. */
__attribute__((no_sanitize("address", "undefined"))) static void
accumulate_block(float *acc, const float *a, int64_t m, const float *b, int64_t k, int64_t ni, int64_t nj) {
    memset(acc, 0, sizeof(float) * ROWS_BLOCK * COLS_BLOCK);
    for (int64_t p = 0; p < k; p++) {
        const float *ap = a + p * m;
        for (int64_t jj = 0; jj < nj; jj++) {
            float bv = b[p + jj * k];
            float *col = acc + jj * ROWS_BLOCK;
            for (int64_t i = 0; i < ni; i++) col[i] += ap[i] * bv;
        }
    }
}

static void run_matmul(void *arg) {
    lt_work *w = arg;
    int64_t m = w->m, n = w->n, k = w->k;
    /* A and B, and C unless it is D itself, are copied before D is written:
     * D may then overlap any of them and still get the product of their
     * values before the call. C in place is read just before each element is
     * written, which needs no copy. */
    float *a = pack(w->A, w->bf16, w->ta, w->lda, m, k);
    float *b = pack(w->B, w->bf16, w->tb, w->ldb, k, n);
    float *c_copy = NULL;
    const float *c = w->C;
    int64_t ldc = w->ldc;
    if (w->beta != 0.0f && (w->C != w->D || w->ldc != w->ldd)) {
        c = c_copy = pack(w->C, false, false, w->ldc, m, n);
        ldc = m;
    }
    float *acc = alloc_floats(ROWS_BLOCK * COLS_BLOCK);
    for (int64_t j0 = 0; j0 < n; j0 += COLS_BLOCK) {
        int64_t nj = n - j0 < COLS_BLOCK ? n - j0 : COLS_BLOCK;
        for (int64_t i0 = 0; i0 < m; i0 += ROWS_BLOCK) {
            int64_t ni = m - i0 < ROWS_BLOCK ? m - i0 : ROWS_BLOCK;
            accumulate_block(acc, a + i0, m, b + j0 * k, k, ni, nj);
            for (int64_t jj = 0; jj < nj; jj++)
                for (int64_t i = 0; i < ni; i++) {
                    int64_t row = i0 + i, colj = j0 + jj;
                    float v = w->alpha * acc[i + jj * ROWS_BLOCK];
                    if (w->beta != 0.0f) v += w->beta * c[row + colj * ldc];
                    w->D[row + colj * w->ldd] = v;
                }
        }
    }
    free(acc);
    free(c_copy);
    free(b);
    free(a);
    free(w);
}

static bool aligned(const void *p, uint64_t alignment) { return alignment == 0 || (uintptr_t)p % alignment == 0; }

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t Adesc, const void *B, cublasLtMatrixLayout_t Bdesc,
                              const void *beta, const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo, void *workspace,
                              size_t workspaceSizeInBytes, cudaStream_t stream) {
    static const char fn[] = "cublasLtMatmul";
    (void)workspace, (void)workspaceSizeInBytes; /* the algorithm needs none */
    if (!lightHandle) return CUBLAS_STATUS_NOT_INITIALIZED;
    check_magic(lightHandle, HANDLE_MAGIC, "cublasLtHandle_t", fn);
    if (!computeDesc || !Adesc || !Bdesc || !Cdesc || !Ddesc || !alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
    const lt_desc *op = desc_of(computeDesc, fn);
    const lt_layout *la = layout_of(Adesc, fn), *lb = layout_of(Bdesc, fn);
    const lt_layout *lc = layout_of(Cdesc, fn), *ld = layout_of(Ddesc, fn);
    dims dm;
    cublasStatus_t s = check_problem(op, la, lb, lc, ld, &dm);
    if (s != CUBLAS_STATUS_SUCCESS) return s;

    /* host pointer mode: the scalars are read now, the matrices later */
    float al, be;
    memcpy(&al, alpha, sizeof al);
    memcpy(&be, beta, sizeof be);

    size_t ab_size = la->type == CUDA_R_16BF ? sizeof(uint16_t) : sizeof(float);
    if (!A || !B || !D || (!C && be != 0.0f)) return CUBLAS_STATUS_INVALID_VALUE;
    if (!aligned(A, ab_size) || !aligned(B, ab_size) || !aligned(C, sizeof(float)) || !aligned(D, sizeof(float)))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!algo) { /* the library picks: the same one algorithm, if the heuristic would offer it */
        if (no_algo()) return CUBLAS_STATUS_NOT_SUPPORTED;
    } else {
        if (algo->data[ALGO_TAG] != ALGO_MAGIC) return CUBLAS_STATUS_INVALID_VALUE;
        if (algo->data[ALGO_TYPE] != (uint64_t)la->type || !aligned(A, algo->data[ALGO_ALIGN_A]) ||
            !aligned(B, algo->data[ALGO_ALIGN_B]) || !aligned(C, algo->data[ALGO_ALIGN_C]) ||
            !aligned(D, algo->data[ALGO_ALIGN_D]))
            return CUBLAS_STATUS_NOT_SUPPORTED;
    }

    lt_work *w = malloc(sizeof *w);
    if (!w) return CUBLAS_STATUS_ALLOC_FAILED;
    *w = (lt_work){.ta = op->ta == CUBLAS_OP_T, .tb = op->tb == CUBLAS_OP_T, .bf16 = la->type == CUDA_R_16BF,
                   .m = dm.m, .n = dm.n, .k = dm.k, .A = A, .B = B, .lda = la->ld, .ldb = lb->ld,
                   .C = C, .ldc = lc->ld, .D = D, .ldd = ld->ld, .alpha = al, .beta = be};
    cuemu_enqueue(stream, "cublasLtMatmul", run_matmul, w);
    return CUBLAS_STATUS_SUCCESS;
}
