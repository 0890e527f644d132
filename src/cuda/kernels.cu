// cuda/kernels.cu: the CUDA backend's first kernels (keel/cuda.h), the CPU
// kernels' contracts on device pointers: fp32 in and out, sums in fp32 over a
// block (the CPU reference sums in double; tests/cuda/gpu_parity.c states the
// tolerances). One block per row for RMSNorm; grid-stride loops elsewhere.
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>

extern "C" {
#define _Noreturn __attribute__((noreturn)) // C11's, in keel/core.h; nvcc compiles C++
#include "keel/cuda.h"
}

static cudaError_t g_first_error = cudaSuccess;

static void note(cudaError_t e) {
    if (e != cudaSuccess && g_first_error == cudaSuccess) g_first_error = e;
}

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
extern "C" keel_status keel_cuda_sync(void) {
    note(cudaGetLastError());
    note(cudaDeviceSynchronize());
    cudaError_t e = g_first_error;
    g_first_error = cudaSuccess;
    return check(e, "kernel");
}

#define THREADS 256

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
        atomicAdd(&dw[j], dout[base + j] * x[base + j] * r);
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
    int target = targets[blockIdx.x];
    if (threadIdx.x == 0) loss[blockIdx.x] = logf(sum) + mx - z[target];
    __syncthreads(); // z[target] read before it changes
    if (dscale != 0.0f)
        for (int j = threadIdx.x; j < V; j += THREADS)
            z[j] = expf(z[j] - mx) / sum * dscale - (j == target ? dscale : 0.0f);
}

static int blocks_for(int64_t n) {
    int64_t b = (n + THREADS - 1) / THREADS;
    return (int)(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

extern "C" void keel_cuda_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int C,
                                          float eps) {
    rmsnorm_forward<<<N, THREADS>>>(out, rstd, x, w, C, eps);
    note(cudaGetLastError());
}

extern "C" void keel_cuda_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                                           const float *rstd, int N, int C) {
    rmsnorm_backward<<<N, THREADS>>>(dx, dw, dout, x, w, rstd, C);
    note(cudaGetLastError());
}

extern "C" void keel_cuda_swiglu_forward(float *h, const float *gate, const float *up, int64_t n) {
    swiglu_forward<<<blocks_for(n), THREADS>>>(h, gate, up, n);
    note(cudaGetLastError());
}

extern "C" void keel_cuda_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate,
                                          const float *up, int64_t n) {
    swiglu_backward<<<blocks_for(n), THREADS>>>(dgate, dup, dh, gate, up, n);
    note(cudaGetLastError());
}

extern "C" void keel_cuda_adamw_update(float *param, const float *grad, float *m, float *v, int64_t n, float lr,
                                       float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                                       int64_t t) {
    float bc1 = (float)(1.0 - pow(beta1, (double)t)), bc2 = (float)(1.0 - pow(beta2, (double)t));
    adamw<<<blocks_for(n), THREADS>>>(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale, bc1,
                                       bc2);
    note(cudaGetLastError());
}

extern "C" void keel_cuda_rope_forward(float *x, const float *cos_sin, int B, int T, int H, int HS) {
    int64_t pairs = (int64_t)B * T * H * (HS / 2);
    rope<<<blocks_for(pairs), THREADS>>>(x, cos_sin, pairs, T, H, HS, 1.0f);
    note(cudaGetLastError());
}

extern "C" void keel_cuda_rope_backward(float *dx, const float *cos_sin, int B, int T, int H, int HS) {
    int64_t pairs = (int64_t)B * T * H * (HS / 2);
    rope<<<blocks_for(pairs), THREADS>>>(dx, cos_sin, pairs, T, H, HS, -1.0f);
    note(cudaGetLastError());
}

extern "C" void keel_cuda_xent_forward_backward(float *logits, float *row_loss, const int32_t *targets, int N, int V,
                                                float dscale) {
    xent<<<N, THREADS>>>(logits, row_loss, targets, V, dscale);
    note(cudaGetLastError());
}
