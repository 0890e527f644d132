// tests/cuemu/include/mma.h: nvcuda::wmma m16n16k16 with bf16 operands and
// fp32 accumulators, for the host emulator, with WMMA's documented semantics
// only. The element-to-lane layout is unspecified by the API, so here every
// lane's fragment holds the whole 16x16 matrix:
//   load_matrix_sync   each lane reads the whole tile itself (any lane may
//                      read any element on the hardware, so a write by
//                      another lane needs a __syncwarp first);
//   store_matrix_sync  each lane writes its share (elements e = lane mod 32):
//                      a read by another lane needs a __syncwarp after;
//   accumulators       a lane holds its share (elements e = lane mod 32) of
//                      an accumulator it computed: mma_sync works out d = a b
//                      + c (bf16 products, exact in fp32; fp32 sums in k
//                      order) for those elements only, which is all that
//                      store_matrix_sync and the next mma_sync read of them
//                      (the other elements stay NaN);
//   a fresh fragment   NaN (registers hold garbage until written).
// Alignment as the API requires: pointers 256-bit aligned, ldm a multiple of
// 8 (bf16) or 4 (float); anything else stops the run.
#ifndef KEEL_CUEMU_MMA_H
#define KEEL_CUEMU_MMA_H

#include "cuda_bf16.h"
#include "cuda_runtime.h"

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "only m16n16k16 is emulated");
    static_assert(std::is_same<Use, accumulator>::value
                      ? (std::is_same<T, float>::value && std::is_void<Layout>::value)
                      : (std::is_same<T, __nv_bfloat16>::value &&
                         (std::is_same<Layout, row_major>::value || std::is_same<Layout, col_major>::value)),
                  "emulated: bf16 matrix_a/matrix_b with a layout, float accumulators without");
    float m[256]; // the logical matrix, row-major: A(i, k), B(k, j), C(i, j) at [row * 16 + col]
    fragment() {
        for (int i = 0; i < 256; i++) m[i] = __builtin_nanf("");
    }
};

namespace detail {
static inline int lane() { return (int)((threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32); }
static inline void check_align(const void *p, unsigned ldm, unsigned mult, int line, const char *what) {
    if ((uintptr_t)p % 32 != 0) cuemu_fail("line %d: %s: pointer %p is not 256-bit aligned", line, what, p);
    if (ldm % mult != 0) cuemu_fail("line %d: %s: ldm %u is not a multiple of %u", line, what, ldm, mult);
}
} // namespace detail

template <typename Use, typename T, typename Layout>
static inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout> &f, float v) {
    const float x = std::is_same<T, float>::value ? v : __bfloat162float(__float2bfloat16_rn(v));
    for (int i = 0; i < 256; i++) f.m[i] = x;
}

// matrix_a: row_major A(i, k) = p[i * ldm + k]; col_major A(i, k) = p[k * ldm + i]
// matrix_b: row_major B(k, j) = p[k * ldm + j]; col_major B(k, j) = p[j * ldm + k]
template <typename Use, typename Layout>
static inline void load_matrix_sync_at(int line, fragment<Use, 16, 16, 16, __nv_bfloat16, Layout> &f,
                                       const __nv_bfloat16 *p, unsigned ldm) {
    constexpr bool rowm = std::is_same<Layout, row_major>::value;
    detail::check_align(p, ldm, 8, line, "load_matrix_sync (bf16)");
    for (int r = 0; r < 16; r++) // memory element (r, c) = p[r * ldm + c]
        for (int c = 0; c < 16; c++) f.m[rowm ? r * 16 + c : c * 16 + r] = __bfloat162float(p[r * ldm + c]);
}

static inline void load_matrix_sync_at(int line, fragment<accumulator, 16, 16, 16, float> &f, const float *p,
                                       unsigned ldm, layout_t l) {
    detail::check_align(p, ldm, 4, line, "load_matrix_sync (accumulator)");
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) f.m[i * 16 + j] = l == mem_row_major ? p[i * ldm + j] : p[j * ldm + i];
}

static inline void store_matrix_sync_at(int line, float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                                        unsigned ldm, layout_t l) {
    detail::check_align(p, ldm, 4, line, "store_matrix_sync");
    for (int e = detail::lane(); e < 256; e += 32) {
        const int i = e / 16, j = e % 16;
        if (l == mem_row_major) p[i * ldm + j] = f.m[e];
        else p[j * ldm + i] = f.m[e];
    }
}

template <typename LA, typename LB>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                            const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &a,
                            const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b,
                            const fragment<accumulator, 16, 16, 16, float> &c) {
    for (int e = detail::lane(); e < 256; e += 32) { // d may be c: element e reads only c's element e
        const int i = e / 16, j = e % 16;
        float r = c.m[e];
        for (int k = 0; k < 16; k++) r += a.m[i * 16 + k] * b.m[k * 16 + j];
        d.m[e] = r;
    }
}

} // namespace wmma
} // namespace nvcuda

#define load_matrix_sync(...) load_matrix_sync_at(__LINE__, __VA_ARGS__)
#define store_matrix_sync(...) store_matrix_sync_at(__LINE__, __VA_ARGS__)

#endif
