/* backend: where the model's tensors live and which kernels run on them — the
 * one boundary between the model's code path and a device.
 *
 * A backend is a table of functions: memory (allocations, copies to and from
 * the host), and every kernel the model's forward and backward use, each with
 * the contract of its CPU kernel in keel/kernels.h, on the backend's memory.
 * The model calls nothing else on its tensors: it never reads or writes
 * backend memory from the host, so the same code runs wherever the table
 * points (tests/model/test_backend_boundary.c holds it to that with a backend
 * whose memory is unreadable outside its own calls).
 *
 *   cpu   today's kernels (OpenBLAS, oneDNN, keel's pool) on host memory,
 *         called directly: the same speed and bit-identical results as before
 *         the boundary existed.
 *   cuda  keel/cuda.h's kernels on device memory, in order on one stream;
 *         only where keel was built with the CUDA backend and a GPU is seen.
 *
 *     const keel_backend *be;
 *     if (keel_backend_get(KEEL_BACKEND_CUDA, &be) != KEEL_OK) ...  // one line says why
 *     float *x = be->alloc(bytes, "activations");  // zeroed; exits with a line when out of memory
 *     be->to_device(x, host, bytes);
 *
 * Calls are issued in order; a function that returns a host value (xent's
 * loss) or copies to the host waits for what came before it. Like the
 * kernels, a backend is used from one thread at a time. */
#ifndef KEEL_BACKEND_H
#define KEEL_BACKEND_H

#include <stddef.h>

#include "keel/core.h"
#include "keel/comm.h"
#include "keel/kernels.h"

/* A backend's non-blocking collective; its wait consumes it. */
typedef struct keel_backend_req keel_backend_req;

typedef struct keel_backend {
    const char *name; /* "cpu", "cuda", "fenced" */
    keel_backend_kind kind;
    /* The host may read and write this backend's memory in place (the CPU
     * backend): the initial parameters, a resumed checkpoint, init_from and
     * the final weights then go straight in and out, not through a host
     * staging buffer (which would cost a CPU run memory its plan does not
     * have). Nothing else may depend on it. */
    bool host_memory;
    /* The attention calls take a kv_start (document masking, data.document_mask). */
    bool document_masking;

    /* The MFU yardstick: FLOP/s one process does at best in the precision the
     * GEMMs run in (bf16 or fp32); 0 when unknown. cpu: keel_peak_flops
     * (measured); cuda: the GPU's dense tensor-core (bf16) or fp32 peak from
     * its datasheet. KEEL_PEAK_FLOPS overrides either. */
    double (*peak_flops)(bool bf16);
    /* Bytes of its memory free for allocations now (the host's MemAvailable on the CPU). */
    int64_t (*memory_free)(void);
    /* Allocations made so far by this process. keel allocates its buffers
     * when it builds the model and FSDP, sized by the memory plan, and none in
     * a step: there is nothing for a caching allocator to cache, and a GPU
     * never synchronises on cudaMalloc/cudaFree mid-step. summary.json's
     * backend_allocations_in_steps holds every run to it. */
    int64_t (*allocations)(void);

    /* ---- memory ---------------------------------------------------------- */
    /* bytes of zeroed memory; exits with a line naming `what` and the size
     * when there is not enough. free(NULL) does nothing. */
    void *(*alloc)(size_t bytes, const char *what);
    void (*free)(void *p);
    void (*zero)(void *p, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes);            /* within the backend */
    void (*to_device)(void *dst, const void *host_src, size_t bytes);  /* host -> backend */
    void (*to_host)(void *host_dst, const void *src, size_t bytes);    /* backend -> host, waits */
    /* Wait for everything issued; the first error since the last sync, with a line. */
    keel_status (*sync)(void);
    /* Make host memory (a buffer, a shared-memory mapping) one the device
     * copies into fastest, beside the compute (cuda: page-locked with
     * cudaHostRegister; a warning naming `what` where the system refuses, and
     * the memory works unpinned); elsewhere nothing. unpin before freeing or
     * unmapping it (nothing when it was never pinned). */
    void (*pin)(void *p, size_t bytes, const char *what);
    void (*unpin)(void *p);
    /* backend -> host without waiting: the copy reads what the calls before
     * it left and runs beside the calls after it (cuda: a copy stream); the
     * source must not change and the destination not be read until
     * copies_wait returns. copies_wait waits for every such copy issued, and
     * may be called from another thread than the one that issued them (a
     * checkpoint's writer). Where copies cannot overlap (cpu, fenced) the
     * copy is done at once. */
    void (*to_host_async)(void *host_dst, const void *src, size_t bytes);
    void (*copies_wait)(void);

    /* ---- GEMMs and precision (keel/kernels.h's contracts) ----------------- */
    void (*matmul_forward)(float *out, const float *in, const float *w, int M, int N, int K, bool accumulate);
    void (*matmul_backward)(float *d_in, float *d_w, const float *d_out, const float *in, const float *w, int M,
                            int N, int K, bool accumulate_in);
    void (*gemm_bf16)(float *out, const keel_bf16 *a, bool a_t, const keel_bf16 *b, bool b_t, int M, int N, int K,
                      bool accumulate);
    /* Generation's decode steps (keel_matmul_few_rows, _bf16: a few rows, weights
     * streamed once); NULL where the backend has none (cuda): the decoder then
     * calls matmul_forward and gemm_bf16. */
    void (*matmul_few_rows)(float *out, const float *in, const float *w, int M, int N, int K, bool accumulate);
    void (*matmul_few_rows_bf16)(float *out, const keel_bf16 *in, const keel_bf16 *w, int M, int N, int K,
                                 bool accumulate);
    void (*f32_to_bf16)(keel_bf16 *dst, const float *src, int64_t n);
    void (*bf16_to_f32)(float *dst, const keel_bf16 *src, int64_t n);

    /* ---- the layer's kernels ---------------------------------------------- */
    void (*rmsnorm_forward)(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps);
    void (*rmsnorm_backward)(float *dx, float *dw, const float *dout, const float *x, const float *w,
                             const float *rstd, int N, int C);
    /* cos_sin: keel_rope_table's (T, HS/2, 2), in backend memory */
    void (*rope_forward)(float *x, const float *cos_sin, int B, int T, int H, int HS);
    void (*rope_backward)(float *dx, const float *cos_sin, int B, int T, int H, int HS);
    /* kv_start (B, T) in backend memory, or NULL: document masking (keel_attention_forward);
     * a backend without it (cuda) is never given one (the trainer refuses data.document_mask) */
    void (*attention_forward)(float *out, float *lse, const float *q, const float *k, const float *v,
                              const int32_t *kv_start, int B, int T, int NH, int NKV, int HS);
    void (*attention_backward)(float *dq, float *dk, float *dv, const float *dout, const float *out,
                               const float *lse, const float *q, const float *k, const float *v,
                               const int32_t *kv_start, int B, int T, int NH, int NKV, int HS);
    void (*attention_forward_bf16)(float *out, float *lse, const float *q, const float *k, const float *v,
                                   const int32_t *kv_start, int B, int T, int NH, int NKV, int HS);
    void (*attention_backward_bf16)(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                    const float *lse, const float *q, const float *k, const float *v,
                                    const int32_t *kv_start, int B, int T, int NH, int NKV, int HS);
    /* Generation (keel/kernels.h's keel_rope_at, keel_attention_cached(_bf16)), on
     * positions and caches in backend memory; NULL where the backend has no
     * such kernels yet (cuda): keel generate then says so. */
    void (*rope_at)(float *x, const float *cos_sin, const int32_t *pos, int N, int H, int HS);
    void (*attention_cached)(float *out, const float *q, const float *k, const float *v, float *kcache,
                             float *vcache, const int32_t *seq, const int32_t *pos, int N, int NH, int NKV, int HS,
                             int T_max);
    void (*attention_cached_bf16)(float *out, const float *q, const float *k, const float *v, keel_bf16 *kcache,
                                  keel_bf16 *vcache, const int32_t *seq, const int32_t *pos, int N, int NH, int NKV,
                                  int HS, int T_max);
    void (*swiglu_forward)(float *h, const float *gate, const float *up, int64_t n);
    void (*swiglu_backward)(float *dgate, float *dup, const float *dh, const float *gate, const float *up,
                            int64_t n);
    /* keel_xent_forward_backward: the summed loss, returned to the host (waits) */
    double (*xent_forward_backward)(float *logits, const int32_t *targets, int N, int V, float dscale);
    /* out row i = table row tokens[i] (N rows of C), from an fp32 or a bf16 table */
    void (*embedding_forward)(float *out, const float *table, const int32_t *tokens, int N, int C);
    void (*embedding_forward_bf16)(float *out, const keel_bf16 *table, const int32_t *tokens, int N, int C);
    /* dtable row tokens[i] += dout row i, for i = 0, 1, ..., N-1 in that
     * order: repeated tokens add up in a fixed order, run after run */
    void (*embedding_backward)(float *dtable, const float *dout, const int32_t *tokens, int N, int C);

    /* ---- the optimizer ---------------------------------------------------- */
    void (*adamw_update)(float *param, const float *grad, float *m, float *v, int64_t n, const keel_adamw_step *s);
    double (*sumsq)(const float *x, int64_t n); /* returned to the host (waits) */
    /* dst[i] += src[i]: a reduce-scatter's result added into a gradient shard */
    void (*accumulate)(float *dst, const float *src, int64_t n);
    void (*accumulate_bf16)(float *dst, const keel_bf16 *src, int64_t n);
    /* LoRA's scale and dropout mask (keel_scale_masked) */
    void (*scale_masked)(float *out, const float *x, int64_t n, float mult, float p, uint64_t key, bool accumulate);

    /* ---- collectives: FSDP's, over keel/comm.h's groups, on this backend's memory
     * keel/comm.h's semantics (counts per rank, in-place forms, every rank
     * issuing the same sequence), sums only. A collective is issued in the
     * backend's order: it reads its send buffer as the calls before it left
     * it. wait(req) orders every later call of the backend after the result:
     *   cpu     keel/comm.h's collectives on the buffers; wait blocks.
     *   fenced  staged through host buffers, so the comm thread never reads
     *           the fence: the CPU's results, bit for bit.
     *   cuda    NCCL on a communication stream, ordered by events: the host
     *           never blocks; wait makes the compute stream wait for the
     *           collective's event. Each group gets its NCCL communicator on
     *           its first collective, bootstrapped through the group's MPI
     *           (the unique id broadcast from its rank 0).
     * Failures are fatal with a line (MPI is fail-stop too). */
    /* Once per distributed process, before its first allocation: bind this
     * rank to its device (cuda: the local rank's GPU). A line and an error
     * when it cannot (more ranks on a machine than GPUs). */
    keel_status (*attach)(keel_comm *world);
    void (*iallgather)(keel_comm *c, const void *send, void *recv, size_t count, keel_comm_dtype dtype,
                       keel_backend_req **req);
    void (*ireduce_scatter)(keel_comm *c, const void *send, void *recv, size_t count, keel_comm_dtype dtype,
                            keel_backend_req **req);
    void (*allreduce)(keel_comm *c, void *buf, size_t count, keel_comm_dtype dtype); /* in place */
    void (*wait)(keel_backend_req *req);
    /* Node windows (keel/comm.h): slots that every rank of c maps, one copy
     * on the machine, so a gather copies nothing. cpu only (its memory is
     * the host's); NULL in fenced (its memory is its arena) and cuda. Made
     * collectively over c; NULL on every rank where they do not share a
     * machine. A gather into slot s: window_claim returns once every rank
     * has released the slot's last unit; window_gather writes this rank's
     * part at `part` inside it from n fp32 values at src — rounded to bf16 or
     * copied — and publishes it; window_wait returns when every rank's part
     * is there; window_release: this rank reads the slot no more. */
    keel_comm_window *(*window_create)(keel_comm *c, const size_t *bytes, int n);
    void (*window_claim)(keel_comm_window *w, int s);
    void (*window_gather)(keel_comm_window *w, int s, void *part, const float *src, int64_t n, bool bf16);
    void (*window_wait)(keel_comm_window *w, int s);
    void (*window_release)(keel_comm_window *w, int s);
    /* A reduce-scatter of every rank's part of slot s in place
     * (keel_comm_window_ireduce_scatter: parts `stride` elements apart, the
     * result in this rank's slice of its own part), instead of window_gather,
     * window_wait and window_release; after window_claim, waited with wait. */
    void (*window_reduce_scatter)(keel_comm_window *w, int s, size_t stride, size_t count, keel_comm_dtype dtype,
                                  keel_backend_req **req);
    void (*window_free)(keel_comm_window *w);
    /* Before keel_comm_free(c): what the backend holds for the group (cuda: its communicator). */
    void (*release_group)(keel_comm *c);
    /* Seconds the device's compute sat waiting in wait() (and allreduce)
     * since the last call, as the device timed them: cuda brackets each wait
     * with timed events, read here (call it when the step's work is done —
     * it waits for them). cpu and fenced: 0, since their wait blocks the
     * host, whose clock around it already counts the time. */
    double (*comm_stall_s)(void);
} keel_backend;

/* The CPU backend: always there. */
const keel_backend *keel_backend_cpu(void);
/* The CPU backend with its memory fenced (fenced.c): allocations come from one
 * arena that is PROT_NONE except while one of the backend's calls runs, so a
 * host read or write of backend memory anywhere else faults at once — the bug
 * that would read device memory from the host on a GPU, found on a CPU. The
 * results are the CPU backend's, bit for bit. A debugging aid for small runs:
 * slower (two mprotect calls per kernel), the arena (KEEL_FENCED_ARENA_GIB,
 * default 16) is reserved, not committed, and never reused. */
const keel_backend *keel_backend_fenced(void);
/* Calls the fenced backend has run (tests). */
int64_t keel_backend_fenced_calls(void);
/* Profiling (train.profile_steps): `inner` with its calls timed while a
 * window is open. Each call is waited for (inner's sync) before it starts and
 * after it returns, so on a GPU its time is its own, without overlap, and the
 * window's steps run slower than the others; on the CPU, whose calls return
 * when done, that costs nothing. Outside the window the calls pass straight
 * on. One profiled backend per process (the same inner every call). */
const keel_backend *keel_backend_profiled(const keel_backend *inner);
void keel_backend_profile_window(bool open);
/* A call's totals over the windows so far: flops counts the useful work of
 * GEMMs and attention (2 per multiply-add; attention causal), 0 for the rest.
 * op names the backend's function ("gemm_bf16"), or all_gather,
 * reduce_scatter, all_reduce and collective_wait (on a GPU an issued
 * collective's time includes its run: the sync waits for every stream; on
 * the CPU only the issue, and the wait shows in collective_wait). */
typedef struct {
    const char *op;
    int64_t calls;
    double seconds, flops;
} keel_backend_op_time;
#define KEEL_BACKEND_PROFILE_OPS 64
/* The calls made in a window, most time first, at most cap of them: how many. */
int keel_backend_profile_read(keel_backend_op_time *out, int cap);

/* The backend of a kind; KEEL_ERR_INPUT with a line saying why it is not
 * here (a keel built without CUDA, no driver, no GPU). For cpu, the
 * environment variable KEEL_FENCED_BACKEND=1 gives the fenced backend. */
keel_status keel_backend_get(keel_backend_kind kind, const keel_backend **out);

#endif
