/* backend/fenced.c: the CPU backend on fenced memory (keel_backend_fenced in
 * keel/backend.h): one arena, reserved with mmap, PROT_NONE except while a
 * backend call runs; a bump allocator in it. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend/passthrough.h"
#include "keel/backend.h"

static char *arena;
static size_t arena_size, arena_used;
static int64_t calls, allocs;

static void fence(int prot) {
    if (mprotect(arena, arena_size, prot) != 0) {
        keel_errorf("fenced backend: mprotect: %s", strerror(errno));
        abort();
    }
}
static void open_fence(void) {
    calls++;
    fence(PROT_READ | PROT_WRITE);
}
static void close_fence(void) { fence(PROT_NONE); }

static void *f_alloc(size_t bytes, const char *what) {
    if (!arena) {
        const char *env = getenv("KEEL_FENCED_ARENA_GIB");
        double gib = env && atof(env) > 0 ? atof(env) : 16;
        arena_size = (size_t)(gib * 1073741824.0) / 4096 * 4096;
        arena = mmap(NULL, arena_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (arena == MAP_FAILED) {
            keel_errorf("fenced backend: reserving %.1f GiB: %s (set KEEL_FENCED_ARENA_GIB lower)", gib,
                        strerror(errno));
            abort();
        }
    }
    size_t at = (arena_used + 63) / 64 * 64;
    if (at + bytes > arena_size) {
        keel_errorf("fenced backend: its %.1f GiB arena is full allocating %zu bytes for %s (set "
                    "KEEL_FENCED_ARENA_GIB higher)", (double)arena_size / 1073741824.0, bytes, what);
        abort();
    }
    arena_used = at + bytes;
    allocs++;
    open_fence();
    memset(arena + at, 0, bytes);
    close_fence();
    return arena + at;
}
static void f_free(void *p) { (void)p; } /* never reused: a stale pointer still points into the fence */

static const keel_backend *cpu;
/* A wrapper per call: open the fence, run the CPU backend's function, close it. */
#define FENCED(name, params, args)                                                                                     \
    static void f_##name params {                                                                                      \
        open_fence();                                                                                                  \
        cpu->name args;                                                                                                \
        close_fence();                                                                                                 \
    }
KEEL_BACKEND_FLOP_CALLS(FENCED)
KEEL_BACKEND_OTHER_CALLS(FENCED)
#define FENCED_DOUBLE(name, params, args)                                                                              \
    static double f_##name params {                                                                                    \
        open_fence();                                                                                                  \
        double r = cpu->name args;                                                                                     \
        close_fence();                                                                                                 \
        return r;                                                                                                      \
    }
KEEL_BACKEND_DOUBLE_CALLS(FENCED_DOUBLE)
static keel_status f_sync(void) { return KEEL_OK; }
static void f_copies_wait(void) { cpu->copies_wait(); }
static void f_pin(void *p, size_t bytes, const char *what) { cpu->pin(p, bytes, what); }
static void f_unpin(void *p) { cpu->unpin(p); }

/* Collectives staged through host memory: the comm thread (and MPI) never
 * touch the fence, as a GPU's NCCL is the only thing that touches its memory.
 * The send buffer is copied out as the collective is issued (in order, as a
 * device's would read it) and the result copied in at the wait: the same
 * collectives on the same values as the CPU backend's. */
struct keel_backend_req {
    keel_comm_req *r;
    char *host;         /* the whole (size*count) staging array */
    void *dst;          /* where its result goes */
    size_t at, bytes;   /* the result's part of host */
};

/* A request staging `total` bytes, whose bytes [at, at+bytes) go to dst at the wait. */
static keel_backend_req *staged(size_t total, void *dst, size_t at, size_t bytes) {
    keel_backend_req *q = keel_xmalloc(sizeof *q, "fenced collective");
    *q = (keel_backend_req){.host = keel_xmalloc(total, "fenced collective staging"), .dst = dst, .at = at,
                            .bytes = bytes};
    return q;
}
static keel_status f_attach(keel_comm *world) { return cpu->attach(world); }
static void f_iallgather(keel_comm *c, const void *send, void *recv, size_t count, keel_comm_dtype dtype,
                         keel_backend_req **req) {
    size_t chunk = count * keel_comm_dtype_size(dtype), all = (size_t)keel_comm_size(c) * chunk;
    size_t own = (size_t)keel_comm_rank(c) * chunk;
    keel_backend_req *q = staged(all, recv, 0, all);
    f_to_host(q->host + own, send, chunk);
    KEEL_CHECK(keel_comm_iallgather(c, q->host + own, q->host, count, dtype, &q->r) == KEEL_OK, "all-gather");
    *req = q;
}
static void f_ireduce_scatter(keel_comm *c, const void *send, void *recv, size_t count, keel_comm_dtype dtype,
                              keel_backend_req **req) {
    size_t chunk = count * keel_comm_dtype_size(dtype), all = (size_t)keel_comm_size(c) * chunk;
    size_t own = (size_t)keel_comm_rank(c) * chunk;
    keel_backend_req *q = staged(all, recv, own, chunk);
    f_to_host(q->host, send, all);
    KEEL_CHECK(keel_comm_ireduce_scatter(c, q->host, q->host + own, count, dtype, KEEL_COMM_SUM, &q->r) == KEEL_OK,
               "reduce-scatter");
    *req = q;
}
static void f_wait(keel_backend_req *q) {
    KEEL_CHECK(keel_comm_wait(q->r) == KEEL_OK, "collective wait");
    f_to_device(q->dst, q->host + q->at, q->bytes);
    keel_free(q->host);
    keel_free(q);
}
static void f_allreduce(keel_comm *c, void *buf, size_t count, keel_comm_dtype dtype) {
    size_t bytes = count * keel_comm_dtype_size(dtype);
    char *host = keel_xmalloc(bytes, "fenced all-reduce staging");
    f_to_host(host, buf, bytes);
    KEEL_CHECK(keel_comm_allreduce(c, host, host, count, dtype, KEEL_COMM_SUM) == KEEL_OK, "all-reduce");
    f_to_device(buf, host, bytes);
    keel_free(host);
}
static void f_release_group(keel_comm *c) { cpu->release_group(c); }
static double f_comm_stall_s(void) { return cpu->comm_stall_s(); }
static int64_t f_memory_free(void) { return cpu->memory_free(); }
static int64_t f_allocations(void) { return allocs; }

static const keel_backend FENCED_BACKEND = {
    .name = "fenced", .kind = KEEL_BACKEND_CPU, .document_masking = true, .peak_flops = keel_peak_flops, .memory_free = f_memory_free, .allocations = f_allocations, .alloc = f_alloc, .free = f_free, .zero = f_zero, .copy = f_copy,
    .to_device = f_to_device, .to_host = f_to_host, .sync = f_sync, .pin = f_pin, .unpin = f_unpin,
    .to_host_async = f_to_host, .copies_wait = f_copies_wait, .matmul_forward = f_matmul_forward,
    .matmul_backward = f_matmul_backward, .gemm_bf16 = f_gemm_bf16,
    .matmul_few_rows = f_matmul_few_rows, .matmul_few_rows_bf16 = f_matmul_few_rows_bf16, .f32_to_bf16 = f_f32_to_bf16,
    .bf16_to_f32 = f_bf16_to_f32, .rmsnorm_forward = f_rmsnorm_forward, .rmsnorm_backward = f_rmsnorm_backward,
    .rope_forward = f_rope_forward, .rope_backward = f_rope_backward, .rope_at = f_rope_at,
    .attention_cached = f_attention_cached, .attention_cached_bf16 = f_attention_cached_bf16,
    .attention_forward = f_attention_forward,
    .attention_backward = f_attention_backward, .attention_forward_bf16 = f_attention_forward_bf16,
    .attention_backward_bf16 = f_attention_backward_bf16, .swiglu_forward = f_swiglu_forward,
    .swiglu_backward = f_swiglu_backward, .xent_forward_backward = f_xent_forward_backward,
    .embedding_forward = f_embedding_forward, .embedding_forward_bf16 = f_embedding_forward_bf16,
    .embedding_backward = f_embedding_backward, .adamw_update = f_adamw_update, .sumsq = f_sumsq,
    .accumulate = f_accumulate, .accumulate_bf16 = f_accumulate_bf16,
    .scale_masked = f_scale_masked, .attach = f_attach, .iallgather = f_iallgather,
    .ireduce_scatter = f_ireduce_scatter, .allreduce = f_allreduce, .wait = f_wait, .release_group = f_release_group,
    .comm_stall_s = f_comm_stall_s,
};

const keel_backend *keel_backend_fenced(void) {
    cpu = keel_backend_cpu();
    return &FENCED_BACKEND;
}

int64_t keel_backend_fenced_calls(void) { return calls; }

