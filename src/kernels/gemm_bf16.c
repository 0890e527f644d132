/* kernels/gemm_bf16.c: bf16 GEMMs through oneDNN's matmul, fp32 accumulation
 * and output, and the fp32 <-> bf16 conversions around them. Where the
 * active instruction set has no bf16 (isa.c), gemm_bf16_emulated.c runs
 * instead: oneDNN 2.6 has no bf16 matmul below AVX512_BF16.
 *
 * As with OpenBLAS (gemm.c), keel's pool splits each GEMM into column blocks
 * and every pool thread runs a single-threaded oneDNN matmul on its block:
 * Debian's oneDNN uses OpenMP, and one OpenMP team per keel thread (capped at
 * one thread each) keeps OpenMP's spinning workers out of keel's way.
 * Primitives are created once per shape (about a millisecond each) and kept
 * in a small cache; each thread brings its own stream and scratchpad, so
 * threads may run the same primitive at once. */
#include <dnnl.h>
#include <omp.h>
#include <pthread.h>

#include "keel/kernels.h"
#include "kernels/gemm_bf16_emulated.h"

#define DNNL_OK(call) KEEL_CHECK((call) == dnnl_success, "oneDNN: %s failed", #call)

typedef struct {
    int M, n, K, ldb, ldc; /* the block: out (M, n) with row stride ldc */
    bool a_t, b_t, accumulate;
} shape;

typedef struct {
    shape key;
    dnnl_primitive_t prim;
    size_t scratch_bytes;
} cached;

static struct {
    pthread_mutex_t lock;
    dnnl_engine_t engine;
    cached **entries; /* never moved once created: threads keep pointers */
    int n, cap;
} cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Each calling thread's stream and scratchpad, listed so that
 * keel_gemm_bf16_release can free them; a thread whose state was released
 * (older generation) makes a new one. */
typedef struct {
    dnnl_stream_t stream;
    void *scratch;
    size_t scratch_bytes;
} thread_state;
static _Thread_local thread_state *tls;
static _Thread_local int tls_generation = -1; /* tls is valid while this matches */
static _Thread_local bool omp_capped;
static struct {
    thread_state **all;
    int n, generation;
} threads;

static dnnl_engine_t engine(void) {
    if (!cache.engine) DNNL_OK(dnnl_engine_create(&cache.engine, dnnl_cpu, 0));
    return cache.engine;
}

static bool has(dnnl_cpu_isa_t got, dnnl_cpu_isa_t want) { return (got & want) == want; }

/* Decided once: oneDNN where keel's active instruction set has bf16 and
 * oneDNN (which may be capped on its own, ONEDNN_MAX_CPU_ISA) agrees. */
static struct {
    pthread_once_t once;
    bool native;
    const char *path;
} choice = {.once = PTHREAD_ONCE_INIT};

static void choose(void) {
    keel_isa level = keel_isa_active(); /* first: it caps oneDNN before oneDNN's first use */
    dnnl_cpu_isa_t got = dnnl_get_effective_cpu_isa();
    choice.native = level >= KEEL_ISA_AVX512_BF16 && has(got, dnnl_cpu_isa_avx512_core_bf16);
    if (choice.native)
        choice.path = has(got, dnnl_cpu_isa_avx512_core_amx) ? "oneDNN AMX" : "oneDNN AVX512_BF16";
    else if (level < KEEL_ISA_AVX512_BF16)
        choice.path = keel_isa_cpu() < KEEL_ISA_AVX512_BF16
                          ? "emulated (this CPU has no AVX512_BF16 or AMX: bf16 operands widened "
                            "to fp32 for OpenBLAS sgemm)"
                          : "emulated (KEEL_MAX_ISA is below avx512_bf16: bf16 operands widened "
                            "to fp32 for OpenBLAS sgemm)";
    else
        choice.path = "emulated (oneDNN is capped below AVX512_BF16, ONEDNN_MAX_CPU_ISA: bf16 "
                      "operands widened to fp32 for OpenBLAS sgemm)";
}

bool keel_bf16_native(const char **path) {
    pthread_once(&choice.once, choose);
    if (path) *path = choice.path;
    return choice.native;
}

static dnnl_memory_desc_t desc(int rows, int cols, int64_t s0, int64_t s1, dnnl_data_type_t type) {
    dnnl_memory_desc_t d;
    dnnl_dims_t dims = {rows, cols}, strides = {s0, s1};
    DNNL_OK(dnnl_memory_desc_init_by_strides(&d, 2, dims, type, strides));
    return d;
}

static cached *create(const shape *s) {
    dnnl_memory_desc_t a = s->a_t ? desc(s->M, s->K, 1, s->M, dnnl_bf16)
                                  : desc(s->M, s->K, s->K, 1, dnnl_bf16);
    dnnl_memory_desc_t b = s->b_t ? desc(s->K, s->n, 1, s->ldb, dnnl_bf16)
                                  : desc(s->K, s->n, s->ldb, 1, dnnl_bf16);
    dnnl_memory_desc_t c = desc(s->M, s->n, s->ldc, 1, dnnl_f32);
    dnnl_matmul_desc_t md;
    DNNL_OK(dnnl_matmul_desc_init(&md, &a, &b, NULL, &c));
    dnnl_primitive_attr_t attr;
    DNNL_OK(dnnl_primitive_attr_create(&attr));
    DNNL_OK(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    if (s->accumulate) {
        dnnl_post_ops_t po;
        DNNL_OK(dnnl_post_ops_create(&po));
        DNNL_OK(dnnl_post_ops_append_sum(po, 1.0f));
        DNNL_OK(dnnl_primitive_attr_set_post_ops(attr, po));
        dnnl_post_ops_destroy(po);
    }
    dnnl_primitive_desc_t pd;
    DNNL_OK(dnnl_primitive_desc_create(&pd, &md, attr, engine(), NULL));
    dnnl_primitive_attr_destroy(attr);
    if (cache.n == cache.cap) {
        cache.cap = cache.cap ? 2 * cache.cap : 32;
        cache.entries = keel_xrealloc(cache.entries, sizeof(cached *) * (size_t)cache.cap, "gemm cache");
    }
    cached *e = keel_xmalloc(sizeof *e, "gemm cache");
    cache.entries[cache.n++] = e;
    e->key = *s;
    const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    e->scratch_bytes = sp ? dnnl_memory_desc_get_size(sp) : 0;
    DNNL_OK(dnnl_primitive_create(&e->prim, pd));
    dnnl_primitive_desc_destroy(pd);
    return e;
}

static bool same_shape(const shape *x, const shape *y) {
    return x->M == y->M && x->n == y->n && x->K == y->K && x->ldb == y->ldb && x->ldc == y->ldc &&
           x->a_t == y->a_t && x->b_t == y->b_t && x->accumulate == y->accumulate;
}

/* The primitive for a block shape and this thread's state, scratchpad large enough. */
static cached *lookup(const shape *s) {
    if (!omp_capped) {
        omp_set_num_threads(1); /* this thread's OpenMP teams: itself only */
        omp_capped = true;
    }
    pthread_mutex_lock(&cache.lock);
    cached *hit = NULL;
    for (int i = 0; i < cache.n && !hit; i++)
        if (same_shape(&cache.entries[i]->key, s)) hit = cache.entries[i];
    if (!hit) hit = create(s);
    if (tls_generation != threads.generation) {
        tls = keel_xcalloc(sizeof *tls, "oneDNN thread state");
        tls_generation = threads.generation;
        DNNL_OK(dnnl_stream_create(&tls->stream, engine(), dnnl_stream_default_flags));
        threads.all = keel_xrealloc(threads.all, sizeof(thread_state *) * (size_t)(threads.n + 1),
                                    "oneDNN thread states");
        threads.all[threads.n++] = tls;
    }
    pthread_mutex_unlock(&cache.lock);
    if (hit->scratch_bytes > tls->scratch_bytes) {
        keel_free(tls->scratch);
        tls->scratch = keel_xmalloc(hit->scratch_bytes, "oneDNN scratchpad");
        tls->scratch_bytes = hit->scratch_bytes;
    }
    return hit;
}

static dnnl_memory_t wrap(const dnnl_primitive_t prim, dnnl_query_t what, void *ptr) {
    const_dnnl_primitive_desc_t pd;
    DNNL_OK(dnnl_primitive_get_primitive_desc(prim, &pd));
    dnnl_memory_t mem;
    DNNL_OK(dnnl_memory_create(&mem, dnnl_primitive_desc_query_md(pd, what, 0), engine(), ptr));
    return mem;
}

typedef struct {
    float *out;
    const keel_bf16 *a, *b;
    int M, N, K;
    bool a_t, b_t, accumulate;
} gemm_ctx;

static void gemm_columns(void *p, int64_t begin, int64_t end, int chunk) {
    (void)chunk;
    const gemm_ctx *c = p;
    int lo = (int)begin;
    shape s = {.M = c->M, .n = (int)(end - begin), .K = c->K, .ldb = c->b_t ? c->K : c->N,
               .ldc = c->N, .a_t = c->a_t, .b_t = c->b_t, .accumulate = c->accumulate};
    cached *e = lookup(&s);
    const keel_bf16 *b = c->b + (c->b_t ? (int64_t)lo * c->K : lo);
    dnnl_exec_arg_t args[4] = {
        {DNNL_ARG_SRC, wrap(e->prim, dnnl_query_src_md, (void *)c->a)},
        {DNNL_ARG_WEIGHTS, wrap(e->prim, dnnl_query_weights_md, (void *)b)},
        {DNNL_ARG_DST, wrap(e->prim, dnnl_query_dst_md, c->out + lo)},
    };
    int nargs = 3;
    if (e->scratch_bytes)
        args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD,
                                          wrap(e->prim, dnnl_query_scratchpad_md, tls->scratch)};
    DNNL_OK(dnnl_primitive_execute(e->prim, tls->stream, nargs, args));
    DNNL_OK(dnnl_stream_wait(tls->stream));
    for (int i = 0; i < nargs; i++) dnnl_memory_destroy(args[i].memory);
}

void keel_gemm_bf16(float *out, const keel_bf16 *a, bool a_t, const keel_bf16 *b, bool b_t, int M,
                    int N, int K, bool accumulate) {
    if (!keel_bf16_native(NULL)) {
        keel_gemm_bf16_emulated(out, a, a_t, b, b_t, M, N, K, accumulate);
        return;
    }
    gemm_ctx c = {out, a, b, M, N, K, a_t, b_t, accumulate};
    keel_pool_for(N, 64, gemm_columns, &c);
}

void keel_gemm_bf16_release(void) {
    keel_gemm_bf16_emulated_release();
    pthread_mutex_lock(&cache.lock);
    for (int i = 0; i < cache.n; i++) {
        dnnl_primitive_destroy(cache.entries[i]->prim);
        keel_free(cache.entries[i]);
    }
    keel_free(cache.entries);
    cache.entries = NULL;
    cache.n = cache.cap = 0;
    for (int i = 0; i < threads.n; i++) {
        dnnl_stream_destroy(threads.all[i]->stream);
        keel_free(threads.all[i]->scratch);
        keel_free(threads.all[i]);
    }
    keel_free(threads.all);
    threads.all = NULL;
    threads.n = 0;
    threads.generation++;
    if (cache.engine) dnnl_engine_destroy(cache.engine);
    cache.engine = NULL;
    pthread_mutex_unlock(&cache.lock);
}

