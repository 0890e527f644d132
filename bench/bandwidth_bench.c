/* bandwidth_bench.c: the machine's memory read bandwidth, the physical limit of
 * decoding one sequence (every weight read once a token). STREAM-like: a
 * buffer far larger than the caches (default 2 GiB) allocated as keel
 * allocates its weights (keel_xmalloc: transparent huge pages where the
 * system allows them) and written once so that every page is real, then read
 * and summed by keel's pool, each of the threads given a contiguous share.
 * The read pattern matters on this VM (a single stream ~14 GB/s, four
 * adjacent rows read side by side ~19), so a share is read as blocks of R
 * adjacent rows of L floats, the R rows side by side (a GEMV's pattern), for
 * several (R, L), with AVX2 loads into 16 independent sums; the bandwidth is
 * the best rep of the best pattern. A rep's rate is the bytes read over its
 * wall time; the patterns alternate within each rep so that a busy minute
 * falls on all of them. Run by bench/generate.sh; prints one line of
 * key=value pairs (GB = 1e9 bytes).
 *
 *   bandwidth_bench [threads [MiB [reps]]]   (defaults: 2, 2048, 5) */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/kernels.h"

typedef struct {
    const float *buf;
    int rows, row_floats;
    float partial[64]; /* per pool chunk: a use of the sums, so the loads stay */
} read_ctx;

/* Blocks [begin, end) of `rows` adjacent rows, read side by side. */
static void read_blocks(void *p, int64_t begin, int64_t end, int chunk) {
    read_ctx *c = p;
    int R = c->rows, L = c->row_floats, per_row = 16 / R; /* vectors of each row a step */
    __m256 acc[16];
    for (int j = 0; j < 16; j++) acc[j] = _mm256_setzero_ps();
    for (int64_t b = begin; b < end; b++) {
        const float *block = c->buf + b * (int64_t)R * L;
        for (int k = 0; k < L; k += 8 * per_row)
            for (int r = 0; r < R; r++)
                for (int v = 0; v < per_row; v++)
                    acc[r * per_row + v] =
                        _mm256_add_ps(acc[r * per_row + v], _mm256_load_ps(block + (int64_t)r * L + k + 8 * v));
    }
    for (int j = 1; j < 16; j++) acc[0] = _mm256_add_ps(acc[0], acc[j]);
    float lanes[8];
    _mm256_storeu_ps(lanes, acc[0]);
    c->partial[chunk] = lanes[0] + lanes[7];
}

int main(int argc, char **argv) {
    int threads = keel_kernels_init(argc > 1 ? atoi(argv[1]) : 2);
    int64_t mib = argc > 2 ? atoll(argv[2]) : 2048;
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    if (mib < 64 || reps < 1 || reps > 1000 || threads > 64) {
        fprintf(stderr, "usage: bandwidth_bench [threads <= 64 [MiB >= 64 [reps]]]\n");
        return 2;
    }
    size_t bytes = (size_t)mib << 20;
    float *buf = keel_xmalloc(bytes, "the buffer");
    memset(buf, 0, bytes);
    enum { PATTERNS = 4 };
    const int pattern[PATTERNS][2] = {{1, 8192}, {2, 4096}, {4, 2048}, {8, 1024}}; /* (R, L): 32 KiB blocks */
    double best[PATTERNS] = {0}, check = 0;
    read_ctx c = {.buf = buf, .rows = 1, .row_floats = 8192};
    int64_t blocks = (int64_t)(bytes / (8192 * sizeof(float)));
    keel_pool_for(blocks, 1, read_blocks, &c); /* warm-up */
    for (int r = 0; r < reps; r++)
        for (int i = 0; i < PATTERNS; i++) {
            c.rows = pattern[i][0], c.row_floats = pattern[i][1];
            double t0 = keel_now_s();
            keel_pool_for(blocks, 1, read_blocks, &c);
            double gbs = (double)bytes / (keel_now_s() - t0) / 1e9;
            if (gbs > best[i]) best[i] = gbs;
            for (int t = 0; t < threads; t++) check += c.partial[t];
        }
    int top = 0;
    printf("threads=%d mib=%lld reps=%d", threads, (long long)mib, reps);
    for (int i = 0; i < PATTERNS; i++) {
        printf(" rows%d_gbs=%.2f", pattern[i][0], best[i]);
        if (best[i] > best[top]) top = i;
    }
    printf(" best_gbs=%.2f sum=%g\n", best[top], check);
    keel_free(buf);
    keel_kernels_shutdown();
    return 0;
}
