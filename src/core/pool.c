/* core/pool.c: a fixed pool of worker threads for keel's own kernels; they
 * spin a little, then block, between jobs. */
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "keel/core.h"

#define KEEL_POOL_MAX 64
/* A thread waiting for the next job (a worker) or for the workers to finish
 * a job (the caller) spins up to SPIN_S before it sleeps on the condition
 * variable, yielding its core from YIELD_S on. A decode step of generation
 * posts ~100 jobs of 50-300 us each, and a worker woken from sleep started
 * each one late: spinning took batch-1 bf16 decode on the 2-vCPU Zen 1 EPYC
 * from 65 to 70 tokens/s (medians of 5, 2026-12-06). Yielding keeps the spin
 * from holding a core that another thread is waiting for. */
#define SPIN_S 500e-6
#define YIELD_S 50e-6

static struct {
    int threads;
    pthread_t tids[KEEL_POOL_MAX];
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    _Atomic uint64_t generation; /* bumped for each job; workers wait for a new one */
    uint64_t start;      /* the generation when the workers started: jobs before it are not theirs */
    _Atomic int pending; /* workers still running the current job */
    _Atomic bool stop;
    keel_pool_fn fn;
    void *ctx;
    int64_t n;
} pool = {.threads = 1, .mu = PTHREAD_MUTEX_INITIALIZER,
          .work_cv = PTHREAD_COND_INITIALIZER, .done_cv = PTHREAD_COND_INITIALIZER};

static void chunk(int64_t n, int parts, int i, int64_t *begin, int64_t *end) {
    *begin = n * i / parts;
    *end = n * (i + 1) / parts;
}

static bool no_new_job(uint64_t seen) { return !pool.stop && pool.generation == seen; }
static bool workers_busy(uint64_t unused) { return (void)unused, pool.pending > 0; }

static void spin(bool (*waiting)(uint64_t), uint64_t arg) {
    double start = keel_now_s();
    for (int i = 1; waiting(arg); i++) {
        _mm_pause();
        if (i % 64 == 0) {
            double t = keel_now_s() - start;
            if (t > SPIN_S) return;
            if (t > YIELD_S) sched_yield();
        }
    }
}

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg; /* 1..threads-1; the caller is chunk 0 */
    pthread_mutex_lock(&pool.mu);
    /* Not pool.generation now: a job posted between pthread_create and this
     * lock is this worker's. Not 0: a pool started again after jobs would
     * run the last one's function on a context long gone. */
    uint64_t seen = pool.start;
    for (;;) {
        if (!pool.stop && pool.generation == seen) {
            pthread_mutex_unlock(&pool.mu);
            spin(no_new_job, seen);
            pthread_mutex_lock(&pool.mu);
        }
        while (!pool.stop && pool.generation == seen) pthread_cond_wait(&pool.work_cv, &pool.mu);
        if (pool.stop) break;
        seen = pool.generation;
        keel_pool_fn fn = pool.fn;
        void *ctx = pool.ctx;
        int64_t begin, end;
        chunk(pool.n, pool.threads, id, &begin, &end);
        pthread_mutex_unlock(&pool.mu);
        if (begin < end) fn(ctx, begin, end, id);
        pthread_mutex_lock(&pool.mu);
        if (--pool.pending == 0) pthread_cond_signal(&pool.done_cv);
    }
    pthread_mutex_unlock(&pool.mu);
    return NULL;
}

void keel_pool_init(int threads) {
    keel_pool_shutdown();
    KEEL_CHECK(threads >= 1 && threads <= KEEL_POOL_MAX, "threads=%d", threads);
    pool.threads = threads;
    pool.stop = false;
    pool.start = pool.generation;
    for (int i = 1; i < threads; i++)
        KEEL_CHECK(pthread_create(&pool.tids[i], NULL, worker, (void *)(intptr_t)i) == 0,
                   "cannot start pool thread %d", i);
}

void keel_pool_shutdown(void) {
    if (pool.threads <= 1) return;
    pthread_mutex_lock(&pool.mu);
    pool.stop = true;
    pthread_cond_broadcast(&pool.work_cv);
    pthread_mutex_unlock(&pool.mu);
    for (int i = 1; i < pool.threads; i++) pthread_join(pool.tids[i], NULL);
    pool.threads = 1;
}

int keel_pool_threads(void) { return pool.threads; }

void keel_pool_for(int64_t n, int64_t min_chunk, keel_pool_fn fn, void *ctx) {
    if (n <= 0) return;
    if (pool.threads == 1 || n < 2 * (min_chunk > 0 ? min_chunk : 1)) {
        fn(ctx, 0, n, 0);
        return;
    }
    pthread_mutex_lock(&pool.mu);
    pool.fn = fn;
    pool.ctx = ctx;
    pool.n = n;
    pool.pending = pool.threads - 1;
    pool.generation++;
    pthread_cond_broadcast(&pool.work_cv);
    pthread_mutex_unlock(&pool.mu);

    int64_t begin, end;
    chunk(n, pool.threads, 0, &begin, &end);
    if (begin < end) fn(ctx, begin, end, 0);

    spin(workers_busy, 0);
    pthread_mutex_lock(&pool.mu);
    while (pool.pending > 0) pthread_cond_wait(&pool.done_cv, &pool.mu);
    pthread_mutex_unlock(&pool.mu);
}
