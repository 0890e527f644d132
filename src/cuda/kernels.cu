// cuda/kernels.cu: the CUDA backend's memory calls, its error record, and
// the kernels that are not GEMMs or attention (keel/cuda.h): the CPU kernels'
// contracts on device pointers, fp32 in and out, sums in fp32 over a block
// (the CPU reference sums in double; tests/cuda/gpu_parity.c states the
// tolerances). One block per row for RMSNorm and cross-entropy; grid-stride
// loops elsewhere; the bf16 conversions, the embedding and the sums of
// squares are bit-exact or double-accumulated as their comments say.
#include <cuda_runtime.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

extern "C" {
#define _Noreturn __attribute__((noreturn)) // C11's, in keel/core.h; nvcc compiles C++
#include "keel/cuda.h"
}
#include "common.h"

// The first failure since the last keel_cuda_sync, as the line it reports.
static bool g_failed;
static char g_first[512];

void keel_cuda_note(cudaError_t e, const char *what) {
    if (e == cudaSuccess || g_failed) return;
    g_failed = true;
    snprintf(g_first, sizeof g_first, "%s: %s", what, cudaGetErrorString(e));
}

void keel_cuda_note_failure(const char *fmt, ...) {
    if (g_failed) return;
    g_failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_first, sizeof g_first, fmt, ap);
    va_end(ap);
}

// a launch's error (a bad configuration; faults show at the next sync)
static void note(const char *kernel) { keel_cuda_note(cudaGetLastError(), kernel); }

static keel_status check(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return KEEL_OK;
    keel_errorf("CUDA %s: %s", what, cudaGetErrorString(e));
    return KEEL_ERR_IO;
}

extern "C" bool keel_cuda_built(void) { return true; }

extern "C" int keel_cuda_device_count(char *why, size_t n) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        snprintf(why, n, "no GPU the CUDA runtime can use (%s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "no device");
        return 0;
    }
    return count;
}

extern "C" keel_status keel_cuda_malloc(void **p, size_t bytes) { return check(cudaMalloc(p, bytes), "malloc"); }
extern "C" void keel_cuda_free(void *p) { cudaFree(p); }
extern "C" keel_status keel_cuda_to_device(void *dst, const void *src, size_t bytes) {
    return check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "copy to device");
}
extern "C" keel_status keel_cuda_to_host(void *dst, const void *src, size_t bytes) {
    return check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "copy to host");
}
extern "C" keel_status keel_cuda_memset0(void *p, size_t bytes) {
    return check(cudaMemsetAsync(p, 0, bytes, 0), "memset");
}
extern "C" keel_status keel_cuda_copy(void *dst, const void *src, size_t bytes) {
    return check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0), "copy within the device");
}
extern "C" keel_status keel_cuda_sync(void) {
    keel_cuda_note(cudaGetLastError(), "a kernel launch");
    keel_cuda_note(cudaDeviceSynchronize(), "kernels (cudaDeviceSynchronize)");
    if (!g_failed) return KEEL_OK;
    g_failed = false;
    keel_errorf("CUDA %s", g_first);
    return KEEL_ERR_IO;
}

#define THREADS KEEL_CUDA_THREADS

// the sum of v over the block (blockDim.x == THREADS), in every thread
__device__ static float block_sum(float v) {
    __shared__ float part[THREADS / 32];
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    __syncthreads(); // part[] may still be read by a previous call
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = lane < THREADS / 32 ? part[lane] : 0.0f;
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__global__ static void rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int C, float eps) {
    const float *row = x + (int64_t)blockIdx.x * C;
    float ss = 0;
    for (int j = threadIdx.x; j < C; j += THREADS) ss += row[j] * row[j];
    float r = rsqrtf(block_sum(ss) / C + eps);
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
    float *o = out + (int64_t)blockIdx.x * C;
    for (int j = threadIdx.x; j < C; j += THREADS) o[j] = row[j] * r * w[j];
}

// dx += r w dout - x r^3 (sum dout w x) / C per row; dw += dout x r, summed over rows with atomics
__global__ static void rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                                        const float *rstd, int C) {
    int64_t base = (int64_t)blockIdx.x * C;
    float r = rstd[blockIdx.x], s = 0;
    for (int j = threadIdx.x; j < C; j += THREADS) s += dout[base + j] * w[j] * x[base + j];
    s = block_sum(s);
    for (int j = threadIdx.x; j < C; j += THREADS) {
        dx[base + j] += r * w[j] * dout[base + j] - x[base + j] * r * r * r * s / C;
        if (dw) atomicAdd(&dw[j], dout[base + j] * x[base + j] * r); // NULL: a frozen weight
    }
}

__global__ static void swiglu_forward(float *h, const float *gate, const float *up, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float g = gate[i];
        h[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

__global__ static void swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate, const float *up,
                                       int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float g = gate[i], s = 1.0f / (1.0f + expf(-g));
        dup[i] = dh[i] * g * s;
        dgate[i] = dh[i] * up[i] * (s + g * s * (1.0f - s));
    }
}

__global__ static void adamw(float *param, const float *grad, float *m, float *v, int64_t n, float lr, float beta1,
                             float beta2, float eps, float decay, float grad_scale, float bc1, float bc2) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float g = grad[i] * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * g, vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        param[i] = param[i] * (1.0f - lr * decay) - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
    }
}

// x (B,T,H,HS) rotated in place, pair (i, i+HS/2) by the table's angle for position t;
// sign -1: the inverse rotation (backward). One thread per pair.
__global__ static void rope(float *x, const float *cs, int64_t pairs, int T, int H, int HS, float sign) {
    int half = HS / 2;
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < pairs; p += (int64_t)gridDim.x * blockDim.x) {
        int i = (int)(p % half);
        int64_t head = p / half; // (b*T + t)*H + h
        int t = (int)(head / H % T);
        float co = cs[((int64_t)t * half + i) * 2], si = sign * cs[((int64_t)t * half + i) * 2 + 1];
        float *v = x + head * HS;
        float x0 = v[i], x1 = v[i + half];
        v[i] = x0 * co - x1 * si;
        v[i + half] = x1 * co + x0 * si;
    }
}

// one block per row: loss[row] = logsumexp(z) - z[target]; with dscale, z becomes (softmax - onehot) * dscale
__global__ static void xent(float *logits, float *loss, const int32_t *targets, int V, float dscale) {
    __shared__ float shared_max[THREADS / 32];
    float *z = logits + (int64_t)blockIdx.x * V;
    int target = targets[blockIdx.x];
    if (target < 0) { // ignored (a masked target): no loss, no gradient
        if (threadIdx.x == 0) loss[blockIdx.x] = 0.0f;
        if (dscale != 0.0f)
            for (int j = threadIdx.x; j < V; j += THREADS) z[j] = 0.0f;
        return;
    }
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += THREADS) mx = fmaxf(mx, z[j]);
    for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (threadIdx.x % 32 == 0) shared_max[threadIdx.x / 32] = mx;
    __syncthreads();
    mx = shared_max[0];
    for (int w = 1; w < THREADS / 32; w++) mx = fmaxf(mx, shared_max[w]);
    float sum = 0;
    for (int j = threadIdx.x; j < V; j += THREADS) sum += expf(z[j] - mx);
    sum = block_sum(sum);
    if (threadIdx.x == 0) loss[blockIdx.x] = logf(sum) + mx - z[target];
    __syncthreads(); // z[target] read before it changes
    if (dscale != 0.0f)
        for (int j = threadIdx.x; j < V; j += THREADS)
            z[j] = expf(z[j] - mx) / sum * dscale - (j == target ? dscale : 0.0f);
}

static int blocks_for(int64_t n) { return keel_cuda_blocks_for(n); }

extern "C" void keel_cuda_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int C,
                                          float eps) {
    rmsnorm_forward<<<N, THREADS>>>(out, rstd, x, w, C, eps);
    note("rmsnorm_forward");
}

extern "C" void keel_cuda_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                                           const float *rstd, int N, int C) {
    rmsnorm_backward<<<N, THREADS>>>(dx, dw, dout, x, w, rstd, C);
    note("rmsnorm_backward");
}

extern "C" void keel_cuda_swiglu_forward(float *h, const float *gate, const float *up, int64_t n) {
    swiglu_forward<<<blocks_for(n), THREADS>>>(h, gate, up, n);
    note("swiglu_forward");
}

extern "C" void keel_cuda_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate,
                                          const float *up, int64_t n) {
    swiglu_backward<<<blocks_for(n), THREADS>>>(dgate, dup, dh, gate, up, n);
    note("swiglu_backward");
}

extern "C" void keel_cuda_adamw_update(float *param, const float *grad, float *m, float *v, int64_t n, float lr,
                                       float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                                       int64_t t) {
    float bc1 = (float)(1.0 - pow(beta1, (double)t)), bc2 = (float)(1.0 - pow(beta2, (double)t));
    adamw<<<blocks_for(n), THREADS>>>(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale, bc1,
                                       bc2);
    note("adamw_update");
}

extern "C" void keel_cuda_rope_forward(float *x, const float *cos_sin, int B, int T, int H, int HS) {
    int64_t pairs = (int64_t)B * T * H * (HS / 2);
    rope<<<blocks_for(pairs), THREADS>>>(x, cos_sin, pairs, T, H, HS, 1.0f);
    note("rope_forward");
}

extern "C" void keel_cuda_rope_backward(float *dx, const float *cos_sin, int B, int T, int H, int HS) {
    int64_t pairs = (int64_t)B * T * H * (HS / 2);
    rope<<<blocks_for(pairs), THREADS>>>(dx, cos_sin, pairs, T, H, HS, -1.0f);
    note("rope_backward");
}

extern "C" void keel_cuda_xent_forward_backward(float *logits, float *row_loss, const int32_t *targets, int N, int V,
                                                float dscale) {
    xent<<<N, THREADS>>>(logits, row_loss, targets, V, dscale);
    note("xent_forward_backward");
}

// ---- bf16 conversions: keel_bf16_from_float / keel_bf16_to_float (core.h), bit for bit ----

// Round to nearest even; a NaN stays a NaN, quietened (its top half | 0x40), as on the CPU.
__device__ static uint16_t bf16_from_float(float x) {
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

__global__ static void f32_to_bf16(keel_bf16 *dst, const float *src, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = bf16_from_float(src[i]);
}

__global__ static void bf16_to_f32(float *dst, const keel_bf16 *src, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __uint_as_float((uint32_t)src[i] << 16);
}

extern "C" void keel_cuda_f32_to_bf16(keel_bf16 *dst, const float *src, int64_t n) {
    if (n <= 0) return;
    f32_to_bf16<<<blocks_for(n), THREADS>>>(dst, src, n);
    note("f32_to_bf16");
}

extern "C" void keel_cuda_bf16_to_f32(float *dst, const keel_bf16 *src, int64_t n) {
    if (n <= 0) return;
    bf16_to_f32<<<blocks_for(n), THREADS>>>(dst, src, n);
    note("bf16_to_f32");
}

// ---- accumulation: a reduce-scatter's result added into a gradient shard ----

// One fp32 add per element, as keel_accumulate{,_bf16} do: bit-identical to the CPU's.
__global__ static void accumulate(float *dst, const float *src, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] += src[i];
}

__global__ static void accumulate_bf16(float *dst, const keel_bf16 *src, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] += __uint_as_float((uint32_t)src[i] << 16);
}

extern "C" void keel_cuda_accumulate(float *dst, const float *src, int64_t n) {
    if (n <= 0) return;
    accumulate<<<blocks_for(n), THREADS>>>(dst, src, n);
    note("accumulate");
}

extern "C" void keel_cuda_accumulate_bf16(float *dst, const keel_bf16 *src, int64_t n) {
    if (n <= 0) return;
    accumulate_bf16<<<blocks_for(n), THREADS>>>(dst, src, n);
    note("accumulate_bf16");
}

// ---- LoRA's scale and dropout: keel_scale_masked's mask, bit for bit ----

__global__ static void scale_masked(float *out, const float *x, int64_t n, float mult, uint64_t drop_below,
                                    uint64_t key, bool accumulate) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint64_t z = key + 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        float v = ((z ^ (z >> 31)) >> 11) >= drop_below ? mult * x[i] : 0.0f;
        out[i] = accumulate ? out[i] + v : v;
    }
}

extern "C" void keel_cuda_scale_masked(float *out, const float *x, int64_t n, float mult, float p, uint64_t key,
                                       bool accumulate) {
    if (n <= 0) return;
    uint64_t drop_below = p <= 0 ? 0 : (uint64_t)((double)p * 9007199254740992.0);
    scale_masked<<<blocks_for(n), THREADS>>>(out, x, n, mult, drop_below, key, accumulate);
    note("scale_masked");
}

// ---- token embedding -------------------------------------------------------

__device__ static float widen(float x) { return x; }
__device__ static float widen(keel_bf16 x) { return __uint_as_float((uint32_t)x << 16); }

// out row i = table row tokens[i]: rows spread over blocks, columns over threads (coalesced).
template <typename T>
__global__ static void embedding_forward(float *out, const T *table, const int32_t *tokens, int N, int C) {
    for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
        const T *row = table + (int64_t)tokens[i] * C;
        float *o = out + i * C;
        for (int j = threadIdx.x; j < C; j += blockDim.x) o[j] = widen(row[j]);
    }
}

// dtable row tokens[i] += dout row i for i = 0..N-1 in that order: one thread
// per column walks the rows, so a repeated token's rows add in the CPU's
// order (bit-identical to keel_embedding_backward, no atomics). Adjacent
// threads take adjacent columns (coalesced). Latency-bound for large N with
// few columns; sorting the tokens would let it run wider, later.
#define EMBED_THREADS 64
__global__ static void embedding_backward(float *dtable, const float *dout, const int32_t *tokens, int N, int C) {
    int j = blockIdx.x * EMBED_THREADS + threadIdx.x;
    if (j >= C) return;
    for (int i = 0; i < N; i++) dtable[(int64_t)tokens[i] * C + j] += dout[(int64_t)i * C + j];
}

extern "C" void keel_cuda_embedding_forward(float *out, const float *table, const int32_t *tokens, int N, int C) {
    if (N <= 0 || C <= 0) return;
    embedding_forward<float><<<N < 65535 ? N : 65535, THREADS>>>(out, table, tokens, N, C);
    note("embedding_forward");
}

extern "C" void keel_cuda_embedding_forward_bf16(float *out, const keel_bf16 *table, const int32_t *tokens, int N,
                                                 int C) {
    if (N <= 0 || C <= 0) return;
    embedding_forward<keel_bf16><<<N < 65535 ? N : 65535, THREADS>>>(out, table, tokens, N, C);
    note("embedding_forward_bf16");
}

extern "C" void keel_cuda_embedding_backward(float *dtable, const float *dout, const int32_t *tokens, int N, int C) {
    if (N <= 0 || C <= 0) return;
    embedding_backward<<<(C + EMBED_THREADS - 1) / EMBED_THREADS, EMBED_THREADS>>>(dtable, dout, tokens, N, C);
    note("embedding_backward");
}

// ---- sums in double: the gradient norm's sum of squares, the losses' sum ----

#define SUM_BLOCKS 1024
static double *g_partial; // SUM_BLOCKS doubles on the device, allocated on first use

// partial[block] = the block's sum of x[i] (squared when square), each thread
// and the block reduction in double.
__global__ static void sum_blocks(double *partial, const float *x, int64_t n, bool square) {
    __shared__ double part[THREADS / 32];
    double s = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        double v = x[i];
        s += square ? v * v : v;
    }
    for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0;
        for (int w = 0; w < THREADS / 32; w++) t += part[w];
        partial[blockIdx.x] = t;
    }
}

// The blocks' partial sums added on the host; waits for the device. NaN when
// a CUDA call failed (kept for keel_cuda_sync).
static double sum_on_device(const float *x, int64_t n, bool square, const char *what) {
    if (n <= 0) return 0;
    if (!g_partial) {
        cudaError_t e = cudaMalloc((void **)&g_partial, SUM_BLOCKS * sizeof(double));
        if (e != cudaSuccess) {
            g_partial = NULL;
            keel_cuda_note(e, "cudaMalloc of the sums' partials");
            return NAN;
        }
    }
    int blocks = blocks_for(n) < SUM_BLOCKS ? blocks_for(n) : SUM_BLOCKS;
    sum_blocks<<<blocks, THREADS>>>(g_partial, x, n, square);
    note(what);
    double host[SUM_BLOCKS], total = 0;
    cudaError_t e = cudaMemcpy(host, g_partial, (size_t)blocks * sizeof(double), cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        keel_cuda_note(e, what);
        return NAN;
    }
    for (int b = 0; b < blocks; b++) total += host[b];
    return total;
}

extern "C" double keel_cuda_sumsq(const float *x, int64_t n) { return sum_on_device(x, n, true, "sumsq"); }
extern "C" double keel_cuda_sum(const float *x, int64_t n) { return sum_on_device(x, n, false, "sum"); }
