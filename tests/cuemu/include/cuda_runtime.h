// tests/cuemu/include/cuda_runtime.h: what a .cu file of keel needs from the
// CUDA language, for the host emulator (../cuemu.cpp). The runtime API's
// types and declarations are the toolkit's own (cuda_runtime_api.h); this
// adds the execution space qualifiers as host C++, the built-in variables,
// the device functions keel's kernels call, and the launch that
// translate.sh puts where the source has <<<...>>>. Host C++ only.
#ifndef KEEL_CUEMU_CUDA_RUNTIME_H
#define KEEL_CUEMU_CUDA_RUNTIME_H

#include <cuda_runtime_api.h>
#include <vector_functions.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

#include "../cuemu.h"

// ---- the qualifiers, as host C++ ----
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __shared__
#undef __align__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static // blocks run one at a time on one thread: a static is a block's shared memory
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)

// ---- built-in variables: the running CUDA thread's (the scheduler sets them) ----
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
static const int warpSize = 32;

namespace cuemu {
// the running block's dynamic shared memory (translate.sh's `extern __shared__`)
void *dynamic_smem();
// collectives of the running thread; line: the call in the kernel source
void syncthreads(int line);
void syncwarp(int line, unsigned mask);
uint64_t shfl_xor_bits(int line, unsigned mask, uint64_t bits, int lane_mask, int width);
int all_sync(int line, unsigned mask, int pred);

template <typename T> T shfl_xor(int line, unsigned mask, T v, int lane_mask, int width = 32) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "32- and 64-bit shuffles");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    b = shfl_xor_bits(line, mask, b, lane_mask, width);
    memcpy(&v, &b, sizeof v);
    return v;
}
struct syncwarp_at { // __syncwarp(mask = every lane) at a line
    int line;
    void operator()(unsigned mask = 0xffffffffu) const { syncwarp(line, mask); }
};

// A launch: checks the configuration (an error goes to cudaGetLastError, as
// a real launch's does) and queues the grid on the stream.
typedef void (*block_body)(void *closure);
void launch_grid(const void *kernel, const char *name, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                 void (*body)(void *), void *closure, void (*destroy)(void *));

template <typename... P> struct launcher {
    void (*kernel)(P...);
    const char *name;
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    template <typename... A> void operator()(A &&...a) const {
        static_assert(sizeof...(P) == sizeof...(A), "kernel argument count");
        struct closure {
            void (*kernel)(P...);
            std::tuple<typename std::decay<P>::type...> params; // converted as a launch converts them
        };
        closure *c = new closure{kernel, std::tuple<typename std::decay<P>::type...>(std::forward<A>(a)...)};
        launch_grid((const void *)kernel, name, grid, block, smem, stream,
                    [](void *p) {
                        closure *c = (closure *)p;
                        std::apply(c->kernel, c->params);
                    },
                    c, [](void *p) { delete (closure *)p; });
    }
};
template <typename... P>
launcher<P...> launch(void (*kernel)(P...), const char *name, dim3 grid, dim3 block, size_t smem = 0,
                      cudaStream_t stream = 0) {
    return launcher<P...>{kernel, name, grid, block, smem, stream};
}
} // namespace cuemu

#define __syncthreads() cuemu::syncthreads(__LINE__)
#define __syncwarp(...) cuemu::syncwarp_at{__LINE__}(__VA_ARGS__)
#define __shfl_xor_sync(...) cuemu::shfl_xor(__LINE__, __VA_ARGS__)
#define __all_sync(...) cuemu::all_sync(__LINE__, __VA_ARGS__)

// ---- device functions ----
static inline float __uint_as_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint32_t __float_as_uint(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
// one device thread runs every CUDA thread, so an atomic is a plain update
template <typename T> static inline T atomicAdd(T *p, T v) {
    T old = *p;
    *p = old + v;
    return old;
}
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }

// cudaFuncSetAttribute on a kernel (cuda_runtime.h's C++ overload)
template <typename T> static inline cudaError_t cudaFuncSetAttribute(T *entry, cudaFuncAttribute attr, int value) {
    return cudaFuncSetAttribute((const void *)entry, attr, value);
}

#endif
