/* kernels/gemm_few_rows.c: linear layers of a few rows — generation's decode
 * steps (keel_matmul_few_rows in keel/kernels.h), fp32 and bf16 weights.
 *
 * A decode step multiplies M = 1..8 rows (one per sequence) by every weight
 * matrix: 2 FLOPs per weight element per row, so memory sets the time, and
 * the physical limit is reading each weight once. OpenBLAS's sgemm first
 * packs (copies) the whole weight matrix, which at M = 1 triples the traffic
 * (perf of a decode step: sgemm_incopy 48%, its kernel 32%). Here each pool
 * thread takes a contiguous range of weight rows and streams it once: a tile
 * of 4 weight rows meets 2 input rows at a time in 8 AVX2 accumulators, the
 * tile staying in L1/L2 while the other input rows pass. AVX2 + FMA is keel's
 * baseline, so the same code runs on AVX-512 and AMX CPUs; wider vectors
 * would not read memory faster. Sums are fp32, eight lanes per dot product
 * added in a fixed order: results depend on K alone, not on M, the thread
 * count or where a row falls in a tile. Training never calls these. */
#include <immintrin.h>

#include "keel/kernels.h"

enum { TILE_W = 4, TILE_X = 2 };

/* The bf16 form's scratch: its input rows widened to fp32, (M, K), once per
 * call; and per pool chunk, a tile's weight rows widened, (TILE_W, K), when
 * more than TILE_X input rows pass over them (each pass would widen them
 * again: batch-8 bf16 decode ran slower than fp32 that way). */
static struct {
    float *mem;
    size_t floats;
} widened;

static inline __m256 load_w(const float *w) { return _mm256_loadu_ps(w); }
static inline __m256 load_w16(const keel_bf16 *w) { /* bf16 -> fp32: the 16 bits on top, exact */
    __m128i h = _mm_loadu_si128((const __m128i *)w);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* bf16 -> fp32 on this thread (keel_bf16_to_f32 would start the pool from inside it) */
static void widen_rows(float *dst, const keel_bf16 *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_w16(src + i));
    for (; i < n; i++) dst[i] = keel_bf16_to_float(src[i]);
}

static inline float hsum(__m256 v) { /* lanes (0+4, 1+5, 2+6, 3+7), then pairs: a fixed order */
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* out[m][r] (+)= x row m · w row r for nw <= TILE_W weight rows and nx <=
 * TILE_X input rows; nw and nx are constants where it is inlined, so the
 * accumulators stay in registers. The K % 8 tail is added after the lanes. */
#define TILE_BODY(LOAD)                                                                                            \
    __m256 acc[TILE_X][TILE_W];                                                                                    \
    for (int m = 0; m < nx; m++)                                                                                   \
        for (int r = 0; r < nw; r++) acc[m][r] = _mm256_setzero_ps();                                              \
    int k = 0;                                                                                                     \
    for (; k + 8 <= K; k += 8) {                                                                                   \
        __m256 xv[TILE_X];                                                                                         \
        for (int m = 0; m < nx; m++) xv[m] = _mm256_loadu_ps(x + (size_t)m * K + k);                               \
        for (int r = 0; r < nw; r++) {                                                                             \
            __m256 wv = LOAD(w + (size_t)r * K + k);                                                               \
            __asm__("" : "+x"(wv)); /* one load for the TILE_X uses: GCC would fold one into each FMA */           \
            for (int m = 0; m < nx; m++) acc[m][r] = _mm256_fmadd_ps(wv, xv[m], acc[m][r]);                        \
        }                                                                                                          \
    }                                                                                                              \
    for (int m = 0; m < nx; m++)                                                                                   \
        for (int r = 0; r < nw; r++) {                                                                             \
            float s = hsum(acc[m][r]);                                                                             \
            for (int t = k; t < K; t++) s += WIDEN(w[(size_t)r * K + t]) * x[(size_t)m * K + t];                   \
            float *o = out + (size_t)m * N + r;                                                                    \
            *o = accumulate ? *o + s : s;                                                                          \
        }

#define WIDEN(v) (v)
static inline __attribute__((always_inline)) void tile(float *out, const float *x, const float *w, int nx, int nw,
                                                       int N, int K, bool accumulate) {
    TILE_BODY(load_w)
}
#undef WIDEN
#define WIDEN(v) keel_bf16_to_float(v)
static inline __attribute__((always_inline)) void tile16(float *out, const float *x, const keel_bf16 *w, int nx,
                                                         int nw, int N, int K, bool accumulate) {
    TILE_BODY(load_w16)
}
#undef WIDEN

typedef struct {
    float *out;
    const float *x;
    const void *w; /* float or keel_bf16 */
    int M, N, K;
    bool accumulate, bf16;
    float *w_tiles; /* bf16 with M > TILE_X: (threads, TILE_W, K) */
} few_ctx;

/* Weight rows [begin, end): tiles of TILE_W rows (then single rows) against
 * every input row, TILE_X at a time (then a single one). */
static void rows_range(void *p, int64_t begin, int64_t end, int chunk) {
    const few_ctx *c = p;
    int M = c->M, N = c->N, K = c->K;
    for (int64_t r0 = begin; r0 < end;) {
        int nw = end - r0 >= TILE_W ? TILE_W : 1;
        const float *wide = NULL; /* the tile's rows in fp32, when widened once for every pass */
        if (c->bf16 && M > TILE_X) {
            float *t = c->w_tiles + (size_t)chunk * TILE_W * K;
            widen_rows(t, (const keel_bf16 *)c->w + (size_t)r0 * K, (int64_t)nw * K);
            wide = t;
        }
        for (int m0 = 0; m0 < M;) {
            int nx = M - m0 >= TILE_X ? TILE_X : 1;
            float *o = c->out + (size_t)m0 * N + r0;
            const float *x = c->x + (size_t)m0 * K;
            if (c->bf16 && !wide) {
                const keel_bf16 *w = (const keel_bf16 *)c->w + (size_t)r0 * K;
                if (nw == TILE_W && nx == TILE_X) tile16(o, x, w, TILE_X, TILE_W, N, K, c->accumulate);
                else if (nw == TILE_W) tile16(o, x, w, 1, TILE_W, N, K, c->accumulate);
                else if (nx == TILE_X) tile16(o, x, w, TILE_X, 1, N, K, c->accumulate);
                else tile16(o, x, w, 1, 1, N, K, c->accumulate);
            } else {
                const float *w = wide ? wide : (const float *)c->w + (size_t)r0 * K;
                if (nw == TILE_W && nx == TILE_X) tile(o, x, w, TILE_X, TILE_W, N, K, c->accumulate);
                else if (nw == TILE_W) tile(o, x, w, 1, TILE_W, N, K, c->accumulate);
                else if (nx == TILE_X) tile(o, x, w, TILE_X, 1, N, K, c->accumulate);
                else tile(o, x, w, 1, 1, N, K, c->accumulate);
            }
            m0 += nx;
        }
        r0 += nw;
    }
}

/* Chunks of at least 64 weight rows: a few pool wake-ups per matrix. */
static void run(few_ctx *c) { keel_pool_for(c->N, 64, rows_range, c); }

void keel_matmul_few_rows(float *out, const float *in, const float *w, int M, int N, int K, bool accumulate) {
    few_ctx c = {out, in, w, M, N, K, accumulate, false, NULL};
    run(&c);
}

void keel_matmul_few_rows_bf16(float *out, const keel_bf16 *in, const keel_bf16 *w, int M, int N, int K,
                               bool accumulate) {
    size_t n = (size_t)M * K, tiles = M > TILE_X ? (size_t)keel_pool_threads() * TILE_W * K : 0;
    if (n + tiles > widened.floats) {
        keel_free(widened.mem);
        widened.mem = keel_xmalloc(sizeof(float) * (n + tiles), "few-row GEMM scratch");
        widened.floats = n + tiles;
    }
    widen_rows(widened.mem, in, (int64_t)n);
    few_ctx c = {out, widened.mem, w, M, N, K, accumulate, true, widened.mem + n};
    run(&c);
}

void keel_matmul_few_rows_release(void) {
    keel_free(widened.mem);
    widened.mem = NULL;
    widened.floats = 0;
}
