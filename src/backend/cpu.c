/* backend/cpu.c: the CPU backend — keel/kernels.h's kernels on host memory,
 * called directly; its collectives keel/comm.h's on the buffers. */
#include <stdlib.h>
#include <string.h>

#include "keel/backend.h"
#include "keel/kernels.h"

static int64_t cpu_allocs;
static void *cpu_alloc(size_t bytes, const char *what) {
    cpu_allocs++;
    return keel_xcalloc(bytes, what);
}
static int64_t cpu_allocations(void) { return cpu_allocs; }
static void cpu_free(void *p) { keel_free(p); }
/* Transfers, on any thread (a snapshot's copies run beside the step): plain
 * memmove. The compute thread's copy and zero run on the kernel pool
 * (keel_copy, keel_zero), which only that thread may use. */
static void cpu_copy(void *dst, const void *src, size_t bytes) { memmove(dst, src, bytes); }
static keel_status cpu_sync(void) { return KEEL_OK; }
static void cpu_copies_wait(void) {}
static void cpu_pin(void *p, size_t bytes, const char *what) { (void)p, (void)bytes, (void)what; }
static void cpu_unpin(void *p) { (void)p; }
static int64_t cpu_memory_free(void) { return (int64_t)keel_mem_available_bytes(); }

/* Collectives: keel/comm.h's, on the buffers themselves; a request is comm's. */
static keel_status cpu_attach(keel_comm *world) {
    (void)world;
    return KEEL_OK;
}
static void cpu_iallgather(keel_comm *c, const void *send, void *recv, size_t count, keel_comm_dtype dtype,
                           keel_backend_req **req) {
    keel_comm_req *r;
    KEEL_CHECK(keel_comm_iallgather(c, send, recv, count, dtype, &r) == KEEL_OK, "all-gather");
    *req = (keel_backend_req *)r;
}
static void cpu_ireduce_scatter(keel_comm *c, const void *send, void *recv, size_t count, keel_comm_dtype dtype,
                                keel_backend_req **req) {
    keel_comm_req *r;
    KEEL_CHECK(keel_comm_ireduce_scatter(c, send, recv, count, dtype, KEEL_COMM_SUM, &r) == KEEL_OK,
               "reduce-scatter");
    *req = (keel_backend_req *)r;
}
static void cpu_allreduce(keel_comm *c, void *buf, size_t count, keel_comm_dtype dtype) {
    KEEL_CHECK(keel_comm_allreduce(c, buf, buf, count, dtype, KEEL_COMM_SUM) == KEEL_OK, "all-reduce");
}
static void cpu_wait(keel_backend_req *req) {
    KEEL_CHECK(keel_comm_wait((keel_comm_req *)req) == KEEL_OK, "collective wait");
}
static void cpu_window_gather(keel_comm_window *w, int s, void *part, const float *src, int64_t n, bool bf16) {
    if (bf16) keel_f32_to_bf16(part, src, n);
    else memcpy(part, src, sizeof(float) * (size_t)n);
    keel_comm_window_publish(w, s);
}
static void cpu_window_reduce_scatter(keel_comm_window *w, int s, size_t stride, size_t count, keel_comm_dtype dtype,
                                      keel_backend_req **req) {
    keel_comm_req *r;
    KEEL_CHECK(keel_comm_window_ireduce_scatter(w, s, stride, count, dtype, &r) == KEEL_OK, "window reduce-scatter");
    *req = (keel_backend_req *)r;
}
static void cpu_release_group(keel_comm *c) { (void)c; }
static double no_stalls(void) { return 0; } /* wait blocks the host: its clock counts it */

static const keel_backend CPU = {
    .name = "cpu",
    .kind = KEEL_BACKEND_CPU,
    .host_memory = true,
    .peak_flops = keel_peak_flops,
    .memory_free = cpu_memory_free,
    .allocations = cpu_allocations,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .zero = keel_zero,
    .copy = keel_copy,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .sync = cpu_sync,
    .pin = cpu_pin,
    .unpin = cpu_unpin,
    .to_host_async = cpu_copy,
    .copies_wait = cpu_copies_wait,
    .matmul_forward = keel_matmul_forward,
    .matmul_backward = keel_matmul_backward,
    .gemm_bf16 = keel_gemm_bf16,
    .matmul_few_rows = keel_matmul_few_rows,
    .matmul_few_rows_bf16 = keel_matmul_few_rows_bf16,
    .f32_to_bf16 = keel_f32_to_bf16,
    .bf16_to_f32 = keel_bf16_to_f32,
    .rmsnorm_forward = keel_rmsnorm_forward,
    .rmsnorm_backward = keel_rmsnorm_backward,
    .rope_forward = keel_rope_forward,
    .rope_at = keel_rope_at,
    .attention_cached = keel_attention_cached,
    .attention_cached_bf16 = keel_attention_cached_bf16,
    .rope_backward = keel_rope_backward,
    .attention_forward = keel_attention_forward,
    .attention_backward = keel_attention_backward,
    .attention_forward_bf16 = keel_attention_forward_bf16,
    .attention_backward_bf16 = keel_attention_backward_bf16,
    .document_masking = true,
    .swiglu_forward = keel_swiglu_forward,
    .swiglu_backward = keel_swiglu_backward,
    .xent_forward_backward = keel_xent_forward_backward,
    .embedding_forward = keel_embedding_forward,
    .embedding_forward_bf16 = keel_embedding_forward_bf16,
    .embedding_backward = keel_embedding_backward,
    .adamw_update = keel_adamw_update,
    .sumsq = keel_sumsq,
    .accumulate = keel_accumulate,
    .accumulate_bf16 = keel_accumulate_bf16,
    .scale_masked = keel_scale_masked,
    .attach = cpu_attach,
    .iallgather = cpu_iallgather,
    .ireduce_scatter = cpu_ireduce_scatter,
    .allreduce = cpu_allreduce,
    .wait = cpu_wait,
    .window_create = keel_comm_window_create,
    .window_claim = keel_comm_window_claim,
    .window_gather = cpu_window_gather,
    .window_wait = keel_comm_window_await,
    .window_release = keel_comm_window_release,
    .window_reduce_scatter = cpu_window_reduce_scatter,
    .window_free = keel_comm_window_free,
    .release_group = cpu_release_group,
    .comm_stall_s = no_stalls,
};

const keel_backend *keel_backend_cpu(void) { return &CPU; }
