/* kernels/gemm_few_rows.c: linear layers of a few rows — generation's decode
 * steps (keel_matmul_few_rows in keel/kernels.h), fp32 and bf16 weights.
 *
 * A decode step multiplies M = 1..8 rows (one per sequence) by every weight
 * matrix: 2 FLOPs per weight element per row, so memory sets the time, and
 * the physical limit is reading each weight once. OpenBLAS's sgemm first
 * packs (copies) the whole weight matrix, which at M = 1 triples the traffic
 * (perf of a decode step: sgemm_incopy 48%, its kernel 32%). Here each pool
 * thread takes blocks of contiguous weight rows and streams them once: a tile
 * of 4 weight rows meets 2 input rows at a time in 8 AVX2 accumulators, the
 * tile staying in L1/L2 while the other input rows pass. AVX2 + FMA is keel's
 * baseline, so the same code runs on AVX-512 and AMX CPUs; wider vectors
 * would not read memory faster. Sums are fp32, eight lanes per dot product
 * added in a fixed order: results depend on K alone, not on M, the thread
 * count or where a row falls in a tile. Training never calls these.
 *
 * bf16 weights are widened as they are read, 16 at a time by interleaving
 * with zeros (vpunpck{l,h}wd: one instruction per 8 values, where a zero
 * extension and a shift took two, and made bf16 decode no faster than
 * fp32). Interleaving keeps each 128-bit half's order, so a 16-block comes
 * out as elements (0-3, 8-11) then (4-7, 12-15): the input rows are widened
 * into the same order once per call ("paired" order, widen_paired), and so
 * are weight tiles widened ahead for many input rows. */
#include <immintrin.h>
#include <stdatomic.h>

#include "keel/kernels.h"

enum { TILE_W = 4, TILE_X = 2 };
/* bf16 weight rows are prefetched this many bytes ahead of their loads (past
 * a row's end: the rows after it, which come next). The hardware's prefetch
 * alone left them (more work per byte than fp32) at 14 GB/s, 18 with this, on
 * this VM's 2 cores; fp32 rows stream at 22 either way (5% less with it). */
enum { PREFETCH_BYTES = 4096 };

/* The bf16 form's scratch: its input rows widened to fp32 in paired order,
 * (M, K), once per call; and per pool chunk, a tile's weight rows widened the
 * same way, (TILE_W, K), when more than TILE_X input rows pass over them
 * (each pass would widen them again: batch-8 bf16 decode ran slower than fp32
 * that way). */
static struct {
    float *mem;
    size_t floats;
} widened;

static inline __m256 load_w16(const keel_bf16 *w) { /* 8 bf16 -> fp32, in order: the 16 bits on top, exact */
    __m128i h = _mm_loadu_si128((const __m128i *)w);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
/* 16 bf16 -> fp32 in paired order: *lo = elements 0-3, 8-11; *hi = 4-7, 12-15 */
static inline void load_w16_paired(const keel_bf16 *w, __m256 *lo, __m256 *hi) {
    __m256i v = _mm256_loadu_si256((const __m256i *)w), zero = _mm256_setzero_si256();
    *lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v));
    *hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v));
}

/* Rows of K bf16 -> fp32 on this thread: each 16-block in paired order, then
 * one 8-block and the tail (K % 8) in order, as tile_bf16 reads them. */
static void widen_paired(float *dst, const keel_bf16 *src, int rows, int K) {
    for (int r = 0; r < rows; r++, dst += K, src += K) {
        int k = 0;
        for (; k + 16 <= K; k += 16) {
            __m256 lo, hi;
            _mm_prefetch((const char *)(src + k) + PREFETCH_BYTES, _MM_HINT_T0);
            load_w16_paired(src + k, &lo, &hi);
            _mm256_storeu_ps(dst + k, lo);
            _mm256_storeu_ps(dst + k + 8, hi);
        }
        if (k + 8 <= K) _mm256_storeu_ps(dst + k, load_w16(src + k)), k += 8;
        for (; k < K; k++) dst[k] = keel_bf16_to_float(src[k]);
    }
}

static inline float hsum(__m256 v) { /* lanes (0+4, 1+5, 2+6, 3+7), then pairs: a fixed order */
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* out[m][r] (+)= the lanes of acc[m][r], then the K % 8 tail in order. */
#define TILE_STORE(WIDEN)                                                                                          \
    for (int m = 0; m < nx; m++)                                                                                   \
        for (int r = 0; r < nw; r++) {                                                                             \
            float s = hsum(acc[m][r]);                                                                             \
            for (int t = k; t < K; t++) s += WIDEN(w[(size_t)r * K + t]) * x[(size_t)m * K + t];                   \
            float *o = out + (size_t)m * N + r;                                                                    \
            *o = accumulate ? *o + s : s;                                                                          \
        }
#define AS_IS(v) (v)

/* out[m][r] (+)= x row m · w row r for nw <= TILE_W weight rows and nx <=
 * TILE_X input rows; nw and nx are constants where it is inlined, so the
 * accumulators stay in registers. */
static inline __attribute__((always_inline)) void tile_f32(float *out, const float *x, const float *w, int nx, int nw,
                                                           int N, int K, bool accumulate) {
    __m256 acc[TILE_X][TILE_W];
    for (int m = 0; m < nx; m++)
        for (int r = 0; r < nw; r++) acc[m][r] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 xv[TILE_X];
        for (int m = 0; m < nx; m++) xv[m] = _mm256_loadu_ps(x + (size_t)m * K + k);
        for (int r = 0; r < nw; r++) {
            __m256 wv = _mm256_loadu_ps(w + (size_t)r * K + k);
            __asm__("" : "+x"(wv)); /* one load for the TILE_X uses: GCC would fold one into each FMA */
            for (int m = 0; m < nx; m++) acc[m][r] = _mm256_fmadd_ps(wv, xv[m], acc[m][r]);
        }
    }
    TILE_STORE(AS_IS)
}

/* The same for bf16 weights, widened as read, against input rows in paired
 * order: the same products in the same order as tile_f32 on widen_paired's
 * weights, so a result does not depend on which of the two ran. */
static inline __attribute__((always_inline)) void tile_bf16(float *out, const float *x, const keel_bf16 *w, int nx,
                                                            int nw, int N, int K, bool accumulate) {
    __m256 acc[TILE_X][TILE_W];
    for (int m = 0; m < nx; m++)
        for (int r = 0; r < nw; r++) acc[m][r] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 16 <= K; k += 16) {
        __m256 xlo[TILE_X], xhi[TILE_X];
        for (int m = 0; m < nx; m++) {
            xlo[m] = _mm256_loadu_ps(x + (size_t)m * K + k);
            xhi[m] = _mm256_loadu_ps(x + (size_t)m * K + k + 8);
        }
        for (int r = 0; r < nw; r++) {
            __m256 lo, hi;
            _mm_prefetch((const char *)(w + (size_t)r * K + k) + PREFETCH_BYTES, _MM_HINT_T0);
            load_w16_paired(w + (size_t)r * K + k, &lo, &hi);
            for (int m = 0; m < nx; m++) acc[m][r] = _mm256_fmadd_ps(lo, xlo[m], acc[m][r]);
            for (int m = 0; m < nx; m++) acc[m][r] = _mm256_fmadd_ps(hi, xhi[m], acc[m][r]);
        }
    }
    if (k + 8 <= K) {
        for (int r = 0; r < nw; r++) {
            __m256 wv = load_w16(w + (size_t)r * K + k);
            for (int m = 0; m < nx; m++)
                acc[m][r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + (size_t)m * K + k), acc[m][r]);
        }
        k += 8;
    }
    TILE_STORE(keel_bf16_to_float)
}

typedef struct {
    float *out;
    const float *x;
    const void *w; /* float or keel_bf16 */
    int M, N, K;
    bool accumulate, bf16;
    float *w_tiles;      /* bf16 with M > TILE_X: (threads, TILE_W, K) */
    _Atomic int64_t next; /* the first weight row no thread has taken */
} few_ctx;

/* Weight rows [begin, end): tiles of TILE_W rows (then single rows) against
 * every input row, TILE_X at a time (then a single one). */
static void rows_range(const few_ctx *c, int64_t begin, int64_t end, int chunk) {
    int M = c->M, N = c->N, K = c->K;
    for (int64_t r0 = begin; r0 < end;) {
        int nw = end - r0 >= TILE_W ? TILE_W : 1;
        const float *wide = NULL; /* the tile's rows in fp32, when widened once for every pass */
        if (c->bf16 && M > TILE_X) {
            float *t = c->w_tiles + (size_t)chunk * TILE_W * K;
            widen_paired(t, (const keel_bf16 *)c->w + (size_t)r0 * K, nw, K);
            wide = t;
        }
        for (int m0 = 0; m0 < M;) {
            int nx = M - m0 >= TILE_X ? TILE_X : 1;
            float *o = c->out + (size_t)m0 * N + r0;
            const float *x = c->x + (size_t)m0 * K;
            if (c->bf16 && !wide) {
                const keel_bf16 *w = (const keel_bf16 *)c->w + (size_t)r0 * K;
                if (nw == TILE_W && nx == TILE_X) tile_bf16(o, x, w, TILE_X, TILE_W, N, K, c->accumulate);
                else if (nw == TILE_W) tile_bf16(o, x, w, 1, TILE_W, N, K, c->accumulate);
                else if (nx == TILE_X) tile_bf16(o, x, w, TILE_X, 1, N, K, c->accumulate);
                else tile_bf16(o, x, w, 1, 1, N, K, c->accumulate);
            } else {
                const float *w = wide ? wide : (const float *)c->w + (size_t)r0 * K;
                if (nw == TILE_W && nx == TILE_X) tile_f32(o, x, w, TILE_X, TILE_W, N, K, c->accumulate);
                else if (nw == TILE_W) tile_f32(o, x, w, 1, TILE_W, N, K, c->accumulate);
                else if (nx == TILE_X) tile_f32(o, x, w, TILE_X, 1, N, K, c->accumulate);
                else tile_f32(o, x, w, 1, 1, N, K, c->accumulate);
            }
            m0 += nx;
        }
        r0 += nw;
    }
}

/* Each pool thread takes blocks of BLOCK_ROWS weight rows until none are
 * left, rather than a fixed half: on a machine shared with other work a
 * thread that loses its core for a while takes fewer blocks, where with fixed
 * shares every matrix waited for it (a decode step runs ~100 matrices). Which
 * thread computes a row does not change its result. */
enum { BLOCK_ROWS = 64 };
static void take_blocks(void *p, int64_t begin, int64_t end, int chunk) {
    (void)begin, (void)end;
    few_ctx *c = p;
    for (;;) {
        int64_t r0 = atomic_fetch_add_explicit(&c->next, BLOCK_ROWS, memory_order_relaxed);
        if (r0 >= c->N) return;
        rows_range(c, r0, r0 + BLOCK_ROWS < c->N ? r0 + BLOCK_ROWS : c->N, chunk);
    }
}

static void run(few_ctx *c) {
    atomic_init(&c->next, 0);
    int threads = keel_pool_threads();
    if (c->N < 2 * BLOCK_ROWS || threads == 1) rows_range(c, 0, c->N, 0);
    else keel_pool_for(threads, 1, take_blocks, c);
}

void keel_matmul_few_rows(float *out, const float *in, const float *w, int M, int N, int K, bool accumulate) {
    few_ctx c = {out, in, w, M, N, K, accumulate, false, NULL, 0};
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
    widen_paired(widened.mem, in, M, K);
    few_ctx c = {out, widened.mem, w, M, N, K, accumulate, true, widened.mem + n, 0};
    run(&c);
}

void keel_matmul_few_rows_release(void) {
    keel_free(widened.mem);
    widened.mem = NULL;
    widened.floats = 0;
}
