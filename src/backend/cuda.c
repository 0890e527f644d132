/* backend/cuda.c: the CUDA backend — keel/cuda.h's kernels on device memory,
 * issued in order on the default stream; the collectives are NCCL's on a
 * stream of their own (cuda_nccl.c). Out of device memory is fatal with a
 * line (as out of host memory is); a kernel's error surfaces at the next call
 * that waits (to_host, xent, sync) with the kernel named. */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda_table.h"
#include "keel/cuda.h"

#ifndef KEEL_HAVE_CUDA
const keel_backend *keel_backend_cuda_table(void) { return NULL; }
#else
#include <cuda_runtime_api.h>

/* Dense (no sparsity) peaks from NVIDIA's datasheets, per GPU: bf16 on tensor
 * cores, and fp32 without TF32 (the fp32 GEMMs ask for CUBLAS_COMPUTE_32F). */
static const struct {
    const char *name_has, *and_has; /* substrings of cudaDeviceProp.name */
    double bf16, fp32;
} PEAKS[] = {
    {"H200", NULL, 989.4e12, 66.9e12},
    {"H100", "PCIe", 756.5e12, 51.2e12},
    {"H100", "NVL", 835.5e12, 60.0e12},
    {"H100", NULL, 989.4e12, 66.9e12}, /* SXM (HBM3) */
    {"GH200", NULL, 989.4e12, 66.9e12},
    {"A100", NULL, 312.0e12, 19.5e12},
};

static double gpu_peak_flops(bool bf16) {
    const char *env = getenv("KEEL_PEAK_FLOPS");
    if (env && atof(env) > 0) return atof(env);
    struct cudaDeviceProp prop;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) return 0;
    for (size_t i = 0; i < sizeof PEAKS / sizeof PEAKS[0]; i++)
        if (strstr(prop.name, PEAKS[i].name_has) && (!PEAKS[i].and_has || strstr(prop.name, PEAKS[i].and_has)))
            return bf16 ? PEAKS[i].bf16 : PEAKS[i].fp32;
    keel_log_warn("%s: keel does not know this GPU's peak FLOP/s: MFU is not reported (set KEEL_PEAK_FLOPS)",
                  prop.name);
    return 0;
}

static int64_t gpu_allocs;
static int64_t gpu_allocations(void) { return gpu_allocs; }

static void *gpu_alloc(size_t bytes, const char *what) {
    void *p = NULL;
    gpu_allocs++;
    if (keel_cuda_malloc(&p, bytes ? bytes : 1) != KEEL_OK || keel_cuda_memset0(p, bytes) != KEEL_OK) {
        keel_errorf("out of GPU memory allocating %zu bytes (%.2f GiB) for %s", bytes,
                    (double)bytes / (1024.0 * 1024 * 1024), what);
        abort();
    }
    return p;
}

static void gpu_free(void *p) {
    if (p) keel_cuda_free(p);
}

/* A failed copy or memset is a broken device: fatal, like a failed kernel launch would be. */
static void must(keel_status st) {
    if (st != KEEL_OK) abort(); /* the call has said why */
}
static void gpu_zero(void *p, size_t bytes) { must(keel_cuda_memset0(p, bytes)); }
static void gpu_copy(void *dst, const void *src, size_t bytes) { must(keel_cuda_copy(dst, src, bytes)); }
static void gpu_to_device(void *dst, const void *src, size_t bytes) { must(keel_cuda_to_device(dst, src, bytes)); }
static void gpu_to_host(void *dst, const void *src, size_t bytes) { must(keel_cuda_to_host(dst, src, bytes)); }

/* ---- host buffers and copies that overlap the compute ---------------------- */

/* cudaHostRegister on memory keel already has (a buffer, a mapping): a
 * system that will not pin (memlock limits, too little memory) still has
 * it, and copies into it are merely slower. */
static void gpu_pin(void *p, size_t bytes, const char *what) {
    cudaError_t e = p && bytes ? cudaHostRegister(p, bytes, cudaHostRegisterDefault) : cudaSuccess;
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        keel_log_warn("%s: cannot pin %.2f GiB of host memory (%s): copies into it will not overlap the compute",
                      what, (double)bytes / (1024.0 * 1024 * 1024), cudaGetErrorString(e));
    }
}

static void gpu_unpin(void *p) {
    if (p && cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError(); /* it was never pinned */
}

static void cuda_must(cudaError_t e, const char *call) {
    if (e == cudaSuccess) return;
    keel_errorf("CUDA %s: %s", call, cudaGetErrorString(e));
    abort();
}

static cudaStream_t g_copies; /* device -> host copies, beside the compute (the legacy default stream) */
static cudaEvent_t g_copy_after;
static int g_copy_device;

static void gpu_to_host_async(void *dst, const void *src, size_t bytes) {
    if (!g_copies) {
        cuda_must(cudaStreamCreateWithFlags(&g_copies, cudaStreamNonBlocking), "cudaStreamCreateWithFlags (copies)");
        cuda_must(cudaEventCreateWithFlags(&g_copy_after, cudaEventDisableTiming), "cudaEventCreateWithFlags");
        cuda_must(cudaGetDevice(&g_copy_device), "cudaGetDevice");
    }
    /* after the kernels issued so far, which may still be writing src */
    cuda_must(cudaEventRecord(g_copy_after, 0), "cudaEventRecord (compute stream)");
    cuda_must(cudaStreamWaitEvent(g_copies, g_copy_after, 0), "cudaStreamWaitEvent (copy stream)");
    cuda_must(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, g_copies), "cudaMemcpyAsync (to the host)");
}

/* From any thread: bound to the rank's GPU first, so a writer thread never
 * makes a context on GPU 0 (CUDA's default for a new thread). */
static void gpu_copies_wait(void) {
    if (!g_copies) return;
    cuda_must(cudaSetDevice(g_copy_device), "cudaSetDevice (a thread waiting for copies)");
    cuda_must(cudaStreamSynchronize(g_copies), "cudaStreamSynchronize (copies to the host)");
}

/* Each row's loss goes to a device buffer kept between calls, then its sum to the host. */
static double gpu_xent(float *logits, const int32_t *targets, int N, int V, float dscale) {
    static float *row_loss;
    static int rows;
    if (N > rows) {
        gpu_free(row_loss);
        row_loss = gpu_alloc(sizeof(float) * (size_t)N, "the cross-entropy's row losses");
        rows = N;
    }
    keel_cuda_xent_forward_backward(logits, row_loss, targets, N, V, dscale);
    return keel_cuda_sum(row_loss, N);
}

/* The GPU kernels have no document masking yet (document_masking false: the trainer refuses
 * data.document_mask on this backend, so kv_start is always NULL here). */
#define NO_KV_START(ks) KEEL_CHECK((ks) == NULL, "document masking given to the CUDA attention")
static void gpu_attention_forward(float *o, float *l, const float *q, const float *k, const float *v,
                                  const int32_t *ks, int B, int T, int NH, int NKV, int HS) {
    NO_KV_START(ks);
    keel_cuda_attention_forward(o, l, q, k, v, B, T, NH, NKV, HS);
}
static void gpu_attention_forward_bf16(float *o, float *l, const float *q, const float *k, const float *v,
                                       const int32_t *ks, int B, int T, int NH, int NKV, int HS) {
    NO_KV_START(ks);
    keel_cuda_attention_forward_bf16(o, l, q, k, v, B, T, NH, NKV, HS);
}
static void gpu_attention_backward(float *dq, float *dk, float *dv, const float *dy, const float *o, const float *l,
                                   const float *q, const float *k, const float *v, const int32_t *ks, int B, int T,
                                   int NH, int NKV, int HS) {
    NO_KV_START(ks);
    keel_cuda_attention_backward(dq, dk, dv, dy, o, l, q, k, v, B, T, NH, NKV, HS);
}
static void gpu_attention_backward_bf16(float *dq, float *dk, float *dv, const float *dy, const float *o,
                                        const float *l, const float *q, const float *k, const float *v,
                                        const int32_t *ks, int B, int T, int NH, int NKV, int HS) {
    NO_KV_START(ks);
    keel_cuda_attention_backward_bf16(dq, dk, dv, dy, o, l, q, k, v, B, T, NH, NKV, HS);
}

static void gpu_adamw(float *param, const float *grad, float *m, float *v, int64_t n, const keel_adamw_step *s) {
    keel_cuda_adamw_update(param, grad, m, v, n, s->lr, s->beta1, s->beta2, s->eps, s->weight_decay, s->grad_scale,
                           s->t);
}

static int64_t gpu_memory_free(void) {
    size_t free_b = 0, total_b = 0;
    return cudaMemGetInfo(&free_b, &total_b) == cudaSuccess ? (int64_t)free_b : 0;
}

static const keel_backend CUDA = {
    .name = "cuda",
    .kind = KEEL_BACKEND_CUDA,
    .peak_flops = gpu_peak_flops,
    .memory_free = gpu_memory_free,
    .allocations = gpu_allocations,
    .alloc = gpu_alloc,
    .free = gpu_free,
    .zero = gpu_zero,
    .copy = gpu_copy,
    .to_device = gpu_to_device,
    .to_host = gpu_to_host,
    .sync = keel_cuda_sync,
    .pin = gpu_pin,
    .unpin = gpu_unpin,
    .to_host_async = gpu_to_host_async,
    .copies_wait = gpu_copies_wait,
    .matmul_forward = keel_cuda_matmul_forward,
    .matmul_backward = keel_cuda_matmul_backward,
    .gemm_bf16 = keel_cuda_gemm_bf16,
    .f32_to_bf16 = keel_cuda_f32_to_bf16,
    .bf16_to_f32 = keel_cuda_bf16_to_f32,
    .rmsnorm_forward = keel_cuda_rmsnorm_forward,
    .rmsnorm_backward = keel_cuda_rmsnorm_backward,
    .rope_forward = keel_cuda_rope_forward,
    .rope_backward = keel_cuda_rope_backward,
    .attention_forward = gpu_attention_forward,
    .attention_backward = gpu_attention_backward,
    .attention_forward_bf16 = gpu_attention_forward_bf16,
    .attention_backward_bf16 = gpu_attention_backward_bf16,
    .document_masking = false,
    .swiglu_forward = keel_cuda_swiglu_forward,
    .swiglu_backward = keel_cuda_swiglu_backward,
    .xent_forward_backward = gpu_xent,
    .embedding_forward = keel_cuda_embedding_forward,
    .embedding_forward_bf16 = keel_cuda_embedding_forward_bf16,
    .embedding_backward = keel_cuda_embedding_backward,
    .adamw_update = gpu_adamw,
    .sumsq = keel_cuda_sumsq,
    .accumulate = keel_cuda_accumulate,
    .accumulate_bf16 = keel_cuda_accumulate_bf16,
    .scale_masked = keel_cuda_scale_masked,
    .attach = keel_backend_cuda_attach,
    .iallgather = keel_backend_cuda_iallgather,
    .ireduce_scatter = keel_backend_cuda_ireduce_scatter,
    .allreduce = keel_backend_cuda_allreduce,
    .wait = keel_backend_cuda_wait,
    .release_group = keel_backend_cuda_release_group,
    .comm_stall_s = keel_backend_cuda_comm_stall_s,
};

const keel_backend *keel_backend_cuda_table(void) { return &CUDA; }
#endif
