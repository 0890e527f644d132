// cuda/attention_tc.cu: attention.cu's bf16 flash attention on the tensor
// cores, for head sizes 64 and 128 (keel_cuda_attention_*_bf16_tc, keel/cuda.h;
// keel_cuda_attention_*_bf16 take them there unless KEEL_CUDA_ATTENTION=simt).
// The same contract and algorithm (FlashAttention-2 forward with an online
// softmax; backward recomputing P from lse, dK and dV per key tile, dQ per
// query tile), with every product on the tensor cores, bf16 operands into
// fp32 accumulators: exactly the bf16 semantics (operands rounded to nearest
// even, sums in fp32), up to the order of the fp32 sums. The softmax and its
// backward stay fp32.
//
// Blocks of 4 warps (128 threads), tiles of 64 queries x 64 keys. A warp owns
// 16 rows of its block's result, so what happens between a warp's products
// (scores, softmax, P, dS) touches only that warp's rows; __syncthreads only
// around the tiles all warps read.
//   forward   warp_mma.h's mma.m16n8k16, whose register layouts PTX
//             documents: everything about the warp's rows stays in
//             registers (Q's fragments, loaded once; S, P, O, m, l). q, k, v
//             are rounded to bf16 copies first (keel_cuda_f32_to_bf16, into
//             a scratch kept between calls), which cp.async copies into
//             shared memory as they are: K and V in two stages, the next key
//             tile landing while this one is used. [64][HS + 8] bf16 tiles
//             (the row stride moves each row 16 bytes on, so an ldmatrix's 8
//             rows hit distinct banks): Q + 2 x (K, V) = 46,080 B (HS 64, 3
//             blocks/SM by registers) or 87,040 B (HS 128, 2 blocks/SM).
//             Block = (head, batch, query tile), heavy tiles first; warp w
//             rows 16w..16w+15; per key tile up to the diagonal S = Q Kᵀ,
//             the online softmax (a row's 64 scores in the 4 lanes of a quad:
//             two shuffles), O = O corr + P V with P's accumulators as the A
//             fragments; at the end out = O / l, lse = m + log l.
//   backward  WMMA m16n16k16 on tiles rounded to bf16 as loaded
//             (__float2bfloat16_rn), row-major [64][HS + 8] in shared memory:
//             Kᵀ, Vᵀ, Qᵀ, dOᵀ are the same tiles read as col_major matrix_b.
//             An accumulator's element layout is unspecified, so what
//             row-wise math needs goes through shared memory
//             (store_matrix_sync, row-major, ldm a multiple of 4).
//   dK, dV    block = (kv head, batch, key tile), heavy tiles first; warp w
//             keys 16w..16w+15, their dK and dV in registers (2 x HS/16
//             fragments). For each query head of the group and each query
//             tile at or past the diagonal, per 16 queries: Sᵀ = K Qᵀ and
//             dPᵀ = V dOᵀ into the warp's fp32 16x24 scratch, P and dS by its
//             lanes into its bf16 Pᵀ and dSᵀ [16][72]; then dV += Pᵀ dO,
//             dK += dSᵀ Q.
//   dQ        block = (head, batch, query tile), heavy tiles first; warp w
//             queries 16w..16w+15, dQ in registers. Per key tile up to the
//             diagonal, per 16 keys: S and dP into the scratch, dS into the
//             warp's bf16 [16][72]; then dQ += dS K.
//             Both: K, V, Q, dO 4 x 64 x (HS+8) x 2 + per warp 2 x 16 x 24 x 4
//             + 2 x 16 x 72 x 2 + lse, D 2 x 64 x 4: 68,096 B (HS 64, 3
//             blocks/SM), 100,864 B (HS 128, 2 blocks/SM).
//             D = rowsum(dO ∘ O) is attention.cu's kernel and scratch.
//             Results leave through shared memory (a warp's rows, once every
//             warp is done with the operand tiles they overwrite), rows < T
//             only, coalesced.
// Deterministic: every output element has one owner warp, which adds its
// terms in a fixed order (dK, dV over the group's heads and query tiles in
// turn, like attention.cu); no atomics, and each element is written once.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <mma.h>
#include <stdint.h>
#include <string.h>

extern "C" {
#define _Noreturn __attribute__((noreturn)) // C11's, in keel/core.h; nvcc compiles C++
#include "keel/cuda.h"
}
#include "internal.h"
#include "warp_mma.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "attention_tc.cu: bf16 WMMA needs sm_80 or newer (KEEL_CUDA_ARCHITECTURES)"
#endif

namespace wmma = nvcuda::wmma;
typedef __nv_bfloat16 bf16;

#define TC_THREADS 128      // 4 warps
#define TC_TILE 64          // queries and keys per tile: 4 fragments of 16
#define TC_PL (TC_TILE + 8) // bf16 P and dS: row stride
#define TC_WL 24            // backward's fp32 16x16 scratch: row stride

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> frag_a;  // A(m, k) = p[m * ldm + k]
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> frag_b;  // B(k, n) = p[k * ldm + n]
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> frag_bt; // B(k, n) = p[n * ldm + k]
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;

// dst [64][HS + 8] = rows r0.. of src (row stride ld floats) rounded to bf16,
// zeros past T; the padding columns are never read. float4 loads where src is
// 16-byte aligned (HS and ld are multiples of 4, so then every row is).
template <int HS> __device__ static void load_rows(bf16 *dst, const float *src, int64_t ld, int r0, int T) {
    constexpr int LD = HS + 8;
    if ((reinterpret_cast<uintptr_t>(src) & 15) == 0) {
        for (int e = threadIdx.x; e < TC_TILE * HS / 4; e += TC_THREADS) {
            const int r = e / (HS / 4), d = e % (HS / 4) * 4;
            float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (r0 + r < T) x = *reinterpret_cast<const float4 *>(src + (int64_t)(r0 + r) * ld + d);
            __nv_bfloat162 *o = reinterpret_cast<__nv_bfloat162 *>(dst + r * LD + d); // 8-byte aligned
            o[0] = __floats2bfloat162_rn(x.x, x.y);
            o[1] = __floats2bfloat162_rn(x.z, x.w);
        }
    } else {
        for (int e = threadIdx.x; e < TC_TILE * HS; e += TC_THREADS) {
            const int r = e / HS, d = e % HS;
            dst[r * LD + d] = __float2bfloat16_rn(r0 + r < T ? src[(int64_t)(r0 + r) * ld + d] : 0.0f);
        }
    }
}

// A warp's 16 x HS accumulators to rows r0.. of dst (row stride ld), those
// < T, through its stage [16][HS + 4] in shared memory
template <int HS>
__device__ __forceinline__ static void write_rows(float *dst, int64_t ld, int r0, int T, float *stage,
                                                  const frag_c (&acc)[HS / 16], int lane) {
    constexpr int OL = HS + 4;
    __syncwarp(); // the warp's reads of stage before (a previous call) are done
#pragma unroll
    for (int dt = 0; dt < HS / 16; dt++) wmma::store_matrix_sync(stage + 16 * dt, acc[dt], OL, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 16 * HS; e += 32) {
        const int i = e / HS, d = e % HS;
        if (r0 + i < T) dst[(int64_t)(r0 + i) * ld + d] = stage[i * OL + d];
    }
}

// ---- forward -----------------------------------------------------------------

template <int HS> struct fwd_smem {
    static constexpr int LD = HS + 8; // bf16 row stride: 16 bytes past a multiple of 128, so the 8 rows of an
                                      // ldmatrix hit distinct banks
    static constexpr size_t tile = (size_t)TC_TILE * LD * sizeof(bf16);
    static constexpr size_t bytes = 5 * tile; // Q, K and V twice (the tile in use and the next, landing)
};

// rows r0.. (64 of them, HS bf16 each) of src (row stride ld) to dst [64][HS + 8],
// asynchronously (this thread's share, in the group the caller commits); zeros past T
template <int HS>
__device__ __forceinline__ static void copy_rows_async(bf16 *dst, const bf16 *src, int64_t ld, int r0, int T) {
    constexpr int LD = HS + 8, CHUNKS = HS / 8; // 16 bytes = 8 bf16
#pragma unroll
    for (int e = threadIdx.x; e < TC_TILE * CHUNKS; e += TC_THREADS) {
        const int r = e / CHUNKS, c = e % CHUNKS * 8;
        const bool in = r0 + r < T;
        cp_async_16(dst + r * LD + c, src + (int64_t)(in ? r0 + r : 0) * ld + c, in);
    }
}

__device__ __forceinline__ static uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); // .x, the low half, from lo
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

// Block = (head, batch, query tile), heavy tiles first; warp w owns query rows
// 16w..16w+15 and keeps everything about them in registers: Q's fragments,
// the scores S (16 x 64 as 8 mma tiles of 16 x 8), P, the output O (HS/8
// tiles) and the softmax's m and l. Lane (g, t) holds rows g and g + 8, and
// of each 8-column tile the columns 2t and 2t + 1: a row's values live in the
// 4 lanes of its quad, so its max and sum take two shuffles, and P's
// accumulator tiles are already A fragments for P V. K and V come in by
// cp.async, the next key tile landing while the current one is used.
template <int HS>
__global__ static void __launch_bounds__(TC_THREADS)
    tc_forward(float *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, int T, int NH, int NKV,
               float scale) {
    typedef fwd_smem<HS> L;
    constexpr int LD = L::LD, KT = HS / 16, DT = HS / 8, NT = TC_TILE / 8;
    extern __shared__ __align__(128) unsigned char smem[];
    // Q, then K and V of stage 0, then of stage 1: [64][LD] each
    bf16 *Qs = (bf16 *)smem;
    auto Ks = [&](int stage) { return (bf16 *)(smem + (1 + 2 * stage) * L::tile); };
    auto Vs = [&](int stage) { return (bf16 *)(smem + (2 + 2 * stage) * L::tile); };
    const int h = blockIdx.x, b = blockIdx.y, nq = (T + TC_TILE - 1) / TC_TILE;
    const int q0 = (nq - 1 - (int)blockIdx.z) * TC_TILE; // the longest rows first
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int kvh = h / (NH / NKV);
    const int64_t ldq = (int64_t)NH * HS, ldkv = (int64_t)NKV * HS;
    const bf16 *qh = q + (int64_t)b * T * ldq + (int64_t)h * HS;
    const bf16 *kh = k + (int64_t)b * T * ldkv + (int64_t)kvh * HS, *vh = v + (int64_t)b * T * ldkv + (int64_t)kvh * HS;
    const int kend = min(T, q0 + TC_TILE); // keys [0, kend): up to the tile's last query
    const int ntiles = (kend + TC_TILE - 1) / TC_TILE;
    copy_rows_async<HS>(Qs, qh, ldq, q0, T);
    copy_rows_async<HS>(Ks(0), kh, ldkv, 0, T);
    copy_rows_async<HS>(Vs(0), vh, ldkv, 0, T);
    cp_async_commit();

    const int qi[2] = {q0 + 16 * w + g, q0 + 16 * w + g + 8}; // the lane's two rows
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    float o[DT][4];
#pragma unroll
    for (int d = 0; d < DT; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    uint32_t qf[KT][4]; // the warp's 16 rows of Q as A fragments, loaded once
    // ldmatrix row addresses: lane l points at row l % 16 (and l % 8 + 8 (l / 16)), column 8 (l / 16) (and 8 (l / 8 % 2))
    const int ar = lane % 16, ac = lane / 16 * 8;               // A: matrices (rows 0-7 | 8-15) x (cols 0-7 | 8-15)
    const int br = lane % 8 + lane / 16 * 8, bc = lane / 8 % 2 * 8; // B: (keys 0-7 | 8-15) x (d 0-7 | 8-15)
    for (int j = 0; j < ntiles; j++) {
        const int k0 = j * TC_TILE;
        const bf16 *Kt = Ks(j % 2), *Vt = Vs(j % 2);
        if (j + 1 < ntiles) { // the next tile lands while this one is used
            copy_rows_async<HS>(Ks((j + 1) % 2), kh, ldkv, k0 + TC_TILE, T);
            copy_rows_async<HS>(Vs((j + 1) % 2), vh, ldkv, k0 + TC_TILE, T);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads(); // tile j (and Q) landed for every thread
        if (j == 0)
#pragma unroll
            for (int kk = 0; kk < KT; kk++) ldmatrix_x4(qf[kk], Qs + (16 * w + ar) * LD + 16 * kk + ac);
        // S = Q Kᵀ: B(d, key) = K[key][d], K's rows read as B by plain ldmatrix
        float s[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KT; kk++)
#pragma unroll
            for (int np = 0; np < NT / 2; np++) { // keys 16np..16np+15: two 8-key tiles
                uint32_t r[4];
                ldmatrix_x4(r, Kt + (16 * np + br) * LD + 16 * kk + bc);
                const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
                mma_bf16_16816(s[2 * np], qf[kk], b0);
                mma_bf16_16816(s[2 * np + 1], qf[kk], b1);
            }
        // online softmax per row (registers c 0-1: row g; 2-3: row g + 8), masked above the diagonal
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            float mx = -INFINITY;
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const int key = k0 + 8 * n + 2 * t + c;
                    float x = key <= qi[hr] ? s[n][2 * hr + c] * scale : -INFINITY;
                    s[n][2 * hr + c] = x;
                    mx = fmaxf(mx, x);
                }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mnew = fmaxf(m[hr], mx);
            const float base = mnew == -INFINITY ? 0.0f : mnew; // a row that has seen no key yet
            const float corr = expf(m[hr] - base);              // 0 on the first tile (m = -inf)
            float sum = 0.0f;
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const float p = expf(s[n][2 * hr + c] - base);
                    s[n][2 * hr + c] = p;
                    sum += p;
                }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            l[hr] = l[hr] * corr + sum;
            m[hr] = mnew;
#pragma unroll
            for (int d = 0; d < DT; d++) o[d][2 * hr] *= corr, o[d][2 * hr + 1] *= corr;
        }
        // O += P V: P's accumulator tiles 2kc and 2kc + 1 are the A fragment of keys 16kc..16kc+15;
        // B(key, d) = V[key][d], V's rows read as B by ldmatrix .trans
#pragma unroll
        for (int kc = 0; kc < TC_TILE / 16; kc++) {
            const uint32_t a[4] = {pack_bf16(s[2 * kc][0], s[2 * kc][1]), pack_bf16(s[2 * kc][2], s[2 * kc][3]),
                                   pack_bf16(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                                   pack_bf16(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
            for (int dp = 0; dp < DT / 2; dp++) { // d 16dp..16dp+15: two 8-wide tiles
                uint32_t r[4];
                ldmatrix_x4_trans(r, Vt + (16 * kc + ar) * LD + 16 * dp + ac);
                const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
                mma_bf16_16816(o[2 * dp], a, b0);
                mma_bf16_16816(o[2 * dp + 1], a, b1);
            }
        }
        __syncthreads(); // every warp is done with tile j before its buffers take tile j + 2
    }
    // out = O / l, lse = m + log l: rows < T, each lane its columns 2t, 2t + 1 of every 8
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        if (qi[hr] >= T) continue;
        const float inv = 1.0f / l[hr];
        float *row = out + ((int64_t)b * T + qi[hr]) * ldq + (int64_t)h * HS;
#pragma unroll
        for (int d = 0; d < DT; d++)
            *reinterpret_cast<float2 *>(row + 8 * d + 2 * t) = make_float2(o[d][2 * hr] * inv, o[d][2 * hr + 1] * inv);
        if (t == 0) lse[((int64_t)b * NH + h) * T + qi[hr]] = m[hr] + logf(l[hr]);
    }
}

// ---- backward ------------------------------------------------------------------

template <int HS> struct bwd_smem {
    static constexpr int LD = HS + 8, OL = HS + 4;
    static constexpr size_t tile = (size_t)TC_TILE * LD * sizeof(bf16);      // K, V, Q, dO each
    static constexpr size_t wf = (size_t)2 * 16 * TC_WL * sizeof(float);     // a warp's S, dP scratch
    static constexpr size_t wb = (size_t)2 * 16 * TC_PL * sizeof(bf16);      // a warp's P, dS
    static constexpr size_t bytes = 4 * tile + 4 * wf + 4 * wb + 2 * TC_TILE * sizeof(float);
    static_assert(tile % 32 == 0 && wf / 2 % 32 == 0 && wb / 2 % 32 == 0, "fragments 32-byte aligned");
    static_assert(4 * 16 * OL * sizeof(float) <= 2 * tile, "the warps' result stages fit in two operand tiles");
};

// Q, dO (bf16), lse and D of query rows q0.. of head h into shared memory
// Both backward kernels' pair of 16x16 products over the head: x = a1 b1ᵀ and
// y = a2 b2ᵀ (a: 16 rows of an operand tile, b: 16 rows read as bᵀ), stored
// row-major into the warp's fp32 scratch tiles x_out and y_out.
template <int HS>
__device__ static void two_products(float *x_out, const bf16 *a1, const bf16 *b1, float *y_out, const bf16 *a2,
                                    const bf16 *b2) {
    constexpr int LD = bwd_smem<HS>::LD;
    frag_c x, y;
    wmma::fill_fragment(x, 0.0f);
    wmma::fill_fragment(y, 0.0f);
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) {
        frag_a a;
        frag_bt bt;
        wmma::load_matrix_sync(a, a1 + 16 * kk, LD);
        wmma::load_matrix_sync(bt, b1 + 16 * kk, LD);
        wmma::mma_sync(x, a, bt, x);
        wmma::load_matrix_sync(a, a2 + 16 * kk, LD);
        wmma::load_matrix_sync(bt, b2 + 16 * kk, LD);
        wmma::mma_sync(y, a, bt, y);
    }
    wmma::store_matrix_sync(x_out, x, TC_WL, wmma::mem_row_major);
    wmma::store_matrix_sync(y_out, y, TC_WL, wmma::mem_row_major);
}

template <int HS>
__device__ static void load_queries(bf16 *Qs, bf16 *dOs, float *lse_s, float *D_s, const float *q, const float *dout,
                                    const float *lse, const float *Dv, int b, int h, int q0, int T, int NH) {
    const int64_t ldq = (int64_t)NH * HS, at = (int64_t)b * T * ldq + (int64_t)h * HS;
    load_rows<HS>(Qs, q + at, ldq, q0, T);
    load_rows<HS>(dOs, dout + at, ldq, q0, T);
    if (threadIdx.x < TC_TILE) {
        const int qi = q0 + (int)threadIdx.x;
        const int64_t li = ((int64_t)b * NH + h) * T + qi;
        lse_s[threadIdx.x] = qi < T ? lse[li] : 0.0f;
        D_s[threadIdx.x] = qi < T ? Dv[li] : 0.0f;
    }
}

// Sizes and places of the backward kernels' shared memory, warp w's pieces
template <int HS> struct bwd_at {
    bf16 *Ks, *Vs, *Qs, *dOs; // [64][HS + 8]
    float *Sw, *dPw;          // warp w's [16][TC_WL]
    bf16 *Pw, *dSw;           // warp w's [16][TC_PL]
    float *lse_s, *D_s;       // [64]
    __device__ bwd_at(unsigned char *smem, int w) {
        typedef bwd_smem<HS> L;
        Ks = (bf16 *)smem, Vs = (bf16 *)(smem + L::tile), Qs = (bf16 *)(smem + 2 * L::tile);
        dOs = (bf16 *)(smem + 3 * L::tile);
        Sw = (float *)(smem + 4 * L::tile + w * L::wf), dPw = Sw + 16 * TC_WL;
        Pw = (bf16 *)(smem + 4 * L::tile + 4 * L::wf + w * L::wb), dSw = Pw + 16 * TC_PL;
        lse_s = (float *)(smem + 4 * L::tile + 4 * L::wf + 4 * L::wb), D_s = lse_s + TC_TILE;
    }
};

template <int HS>
__global__ static void __launch_bounds__(TC_THREADS)
    tc_backward_dkdv(float *dk, float *dv, const float *dout, const float *lse, const float *Dv, const float *q,
                     const float *k, const float *v, int T, int NH, int NKV, float scale) {
    constexpr int LD = HS + 8, OL = HS + 4, DT = HS / 16;
    extern __shared__ __align__(128) unsigned char smem[];
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const bwd_at<HS> s(smem, w);
    const int g = blockIdx.x, b = blockIdx.y, k0 = blockIdx.z * TC_TILE; // the longest columns first
    const int group = NH / NKV, kw = k0 + 16 * w;                      // kw: the warp's first key
    const int64_t ldkv = (int64_t)NKV * HS, at = (int64_t)b * T * ldkv + (int64_t)g * HS;
    load_rows<HS>(s.Ks, k + at, ldkv, k0, T);
    load_rows<HS>(s.Vs, v + at, ldkv, k0, T);

    frag_c dK[DT], dV[DT]; // the warp's keys x HS
#pragma unroll
    for (int dt = 0; dt < DT; dt++) wmma::fill_fragment(dK[dt], 0.0f), wmma::fill_fragment(dV[dt], 0.0f);
    for (int h = g * group; h < (g + 1) * group; h++)
        for (int q0 = k0; q0 < T; q0 += TC_TILE) { // the query tiles that see these keys
            __syncthreads(); // every warp is done with the last tile's Q, dO, lse and D
            load_queries<HS>(s.Qs, s.dOs, s.lse_s, s.D_s, q, dout, lse, Dv, b, h, q0, T, NH);
            __syncthreads();
#pragma unroll 1
            for (int qt = 0; qt < TC_TILE / 16; qt++) {
                // Sᵀ = K Qᵀ and dPᵀ = V dOᵀ: the warp's 16 keys x queries 16qt..16qt+15
                two_products<HS>(s.Sw, s.Ks + 16 * w * LD, s.Qs + 16 * qt * LD, s.dPw, s.Vs + 16 * w * LD,
                                 s.dOs + 16 * qt * LD);
                __syncwarp();
                // P (masked, from lse) and dS = scale P ∘ (dP - D), rounded for their products
                for (int e = lane; e < 256; e += 32) {
                    const int i = e / 16, r = 16 * qt + e % 16, qi = q0 + r; // key kw + i, query row r
                    float p = 0.0f, ds = 0.0f;
                    if (qi < T && kw + i <= qi) {
                        p = expf(s.Sw[i * TC_WL + e % 16] * scale - s.lse_s[r]);
                        ds = scale * p * (s.dPw[i * TC_WL + e % 16] - s.D_s[r]);
                    }
                    s.Pw[i * TC_PL + r] = __float2bfloat16_rn(p);
                    s.dSw[i * TC_PL + r] = __float2bfloat16_rn(ds);
                }
                __syncwarp(); // scratch read (the next piece overwrites it), Pᵀ and dSᵀ written
            }
            // dV += Pᵀ dO, dK += dSᵀ Q over the tile's 64 queries (not unrolled:
            // dK and dV hold 128 registers at HS 128)
#pragma unroll 1
            for (int kk = 0; kk < TC_TILE / 16; kk++) {
                frag_a pa, sa;
                wmma::load_matrix_sync(pa, s.Pw + 16 * kk, TC_PL);
                wmma::load_matrix_sync(sa, s.dSw + 16 * kk, TC_PL);
#pragma unroll
                for (int dt = 0; dt < DT; dt++) {
                    frag_b bb;
                    wmma::load_matrix_sync(bb, s.dOs + 16 * kk * LD + 16 * dt, LD);
                    wmma::mma_sync(dV[dt], pa, bb, dV[dt]);
                    wmma::load_matrix_sync(bb, s.Qs + 16 * kk * LD + 16 * dt, LD);
                    wmma::mma_sync(dK[dt], sa, bb, dK[dt]);
                }
            }
        }
    __syncthreads(); // every warp is done with Q and dO: the stages take their place
    float *stage = (float *)s.Qs + w * 16 * OL;
    write_rows<HS>(dv + at, ldkv, kw, T, stage, dV, lane);
    write_rows<HS>(dk + at, ldkv, kw, T, stage, dK, lane);
}

template <int HS>
__global__ static void __launch_bounds__(TC_THREADS)
    tc_backward_dq(float *dq, const float *dout, const float *lse, const float *Dv, const float *q, const float *k,
                   const float *v, int T, int NH, int NKV, float scale) {
    constexpr int LD = HS + 8, OL = HS + 4, DT = HS / 16;
    extern __shared__ __align__(128) unsigned char smem[];
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const bwd_at<HS> s(smem, w);
    const int h = blockIdx.x, b = blockIdx.y, nq = (T + TC_TILE - 1) / TC_TILE;
    const int q0 = (nq - 1 - (int)blockIdx.z) * TC_TILE; // the longest rows first
    const int g = h / (NH / NKV);
    const int64_t ldkv = (int64_t)NKV * HS, at = (int64_t)b * T * ldkv + (int64_t)g * HS;
    load_queries<HS>(s.Qs, s.dOs, s.lse_s, s.D_s, q, dout, lse, Dv, b, h, q0, T, NH);

    frag_c dQ[DT]; // the warp's queries x HS
#pragma unroll
    for (int dt = 0; dt < DT; dt++) wmma::fill_fragment(dQ[dt], 0.0f);
    const int kend = min(T, q0 + TC_TILE);
    for (int k0 = 0; k0 < kend; k0 += TC_TILE) {
        __syncthreads(); // every warp is done with the last tile's K and V
        load_rows<HS>(s.Ks, k + at, ldkv, k0, T);
        load_rows<HS>(s.Vs, v + at, ldkv, k0, T);
        __syncthreads();
#pragma unroll 1
        for (int jt = 0; jt < TC_TILE / 16; jt++) {
            // S = Q Kᵀ and dP = dO Vᵀ: the warp's 16 queries x keys 16jt..16jt+15
            two_products<HS>(s.Sw, s.Qs + 16 * w * LD, s.Ks + 16 * jt * LD, s.dPw, s.dOs + 16 * w * LD,
                             s.Vs + 16 * jt * LD);
            __syncwarp();
            for (int e = lane; e < 256; e += 32) {
                const int i = e / 16, j = e % 16, r = 16 * w + i, qi = q0 + r; // query row r, key k0 + 16jt + j
                float ds = 0.0f;
                if (qi < T && k0 + 16 * jt + j <= qi) {
                    const float p = expf(s.Sw[i * TC_WL + j] * scale - s.lse_s[r]);
                    ds = scale * p * (s.dPw[i * TC_WL + j] - s.D_s[r]);
                }
                s.dSw[i * TC_PL + 16 * jt + j] = __float2bfloat16_rn(ds);
            }
            __syncwarp(); // scratch read, dS written
        }
        // dQ += dS K over the tile's 64 keys
#pragma unroll
        for (int kk = 0; kk < TC_TILE / 16; kk++) {
            frag_a a;
            wmma::load_matrix_sync(a, s.dSw + 16 * kk, TC_PL);
#pragma unroll
            for (int dt = 0; dt < DT; dt++) {
                frag_b kb;
                wmma::load_matrix_sync(kb, s.Ks + 16 * kk * LD + 16 * dt, LD);
                wmma::mma_sync(dQ[dt], a, kb, dQ[dt]);
            }
        }
    }
    __syncthreads(); // every warp is done with K and V: the stages take their place
    const int64_t ldq = (int64_t)NH * HS;
    write_rows<HS>(dq + (int64_t)b * T * ldq + (int64_t)h * HS, ldq, q0 + 16 * w, T, (float *)s.Ks + w * 16 * OL, dQ,
                   lane);
}

// ---- launches --------------------------------------------------------------------

static bool tc_shape_ok(const char *what, int B, int T, int NH, int NKV, int HS) {
    if (NKV < 1 || NH % NKV != 0 || (HS != 64 && HS != 128) || B > 65535 || (T + TC_TILE - 1) / TC_TILE > 65535) {
        keel_cuda_note_failure("%s: unsupported shape B=%d T=%d NH=%d NKV=%d HS=%d (NH a multiple of NKV, "
                               "HS 64 or 128)",
                               what, B, T, NH, NKV, HS);
        return false;
    }
    return true;
}

// The forward's bf16 copies of q, k and v (their layouts), grown when a call
// needs more: what cp.async copies into shared memory as it is
static bf16 *g_qkv;
static size_t g_qkv_elems;

template <int HS>
static void tc_forward_at(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T,
                          int NH, int NKV, const char *what) {
    const int64_t nq = (int64_t)B * T * NH * HS, nkv = (int64_t)B * T * NKV * HS;
    if ((size_t)(nq + 2 * nkv) > g_qkv_elems) {
        if (g_qkv) keel_cuda_note(cudaFree(g_qkv), what); // in order after the kernels that read it
        g_qkv = NULL, g_qkv_elems = 0;
        cudaError_t e = cudaMalloc((void **)&g_qkv, (size_t)(nq + 2 * nkv) * sizeof(bf16));
        if (e != cudaSuccess) {
            g_qkv = NULL;
            keel_cuda_note(e, "cudaMalloc of the tensor-core attention's bf16 q, k, v");
            return;
        }
        g_qkv_elems = (size_t)(nq + 2 * nkv);
    }
    bf16 *qb = g_qkv, *kb = g_qkv + nq, *vb = g_qkv + nq + nkv; // 16-byte aligned: nq, nkv multiples of 64
    keel_cuda_f32_to_bf16((keel_bf16 *)qb, q, nq);
    keel_cuda_f32_to_bf16((keel_bf16 *)kb, k, nkv);
    keel_cuda_f32_to_bf16((keel_bf16 *)vb, v, nkv);
    const size_t smem = fwd_smem<HS>::bytes;
    keel_cuda_note(cudaFuncSetAttribute(tc_forward<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), what);
    dim3 grid((unsigned)NH, (unsigned)B, (unsigned)((T + TC_TILE - 1) / TC_TILE));
    tc_forward<HS><<<grid, TC_THREADS, smem>>>(out, lse, qb, kb, vb, T, NH, NKV, 1.0f / sqrtf((float)HS));
    keel_cuda_note(cudaGetLastError(), what);
}

template <int HS>
static void tc_backward_at(float *dq, float *dk, float *dv, const float *dout, const float *lse, const float *Dv,
                           const float *q, const float *k, const float *v, int B, int T, int NH, int NKV,
                           const char *what) {
    const size_t smem = bwd_smem<HS>::bytes;
    const float scale = 1.0f / sqrtf((float)HS);
    const unsigned tiles = (unsigned)((T + TC_TILE - 1) / TC_TILE);
    keel_cuda_note(cudaFuncSetAttribute(tc_backward_dkdv<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                   what);
    keel_cuda_note(cudaFuncSetAttribute(tc_backward_dq<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                   what);
    tc_backward_dkdv<HS><<<dim3((unsigned)NKV, (unsigned)B, tiles), TC_THREADS, smem>>>(dk, dv, dout, lse, Dv, q, k,
                                                                                        v, T, NH, NKV, scale);
    keel_cuda_note(cudaGetLastError(), what);
    tc_backward_dq<HS><<<dim3((unsigned)NH, (unsigned)B, tiles), TC_THREADS, smem>>>(dq, dout, lse, Dv, q, k, v, T,
                                                                                     NH, NKV, scale);
    keel_cuda_note(cudaGetLastError(), what);
}

extern "C" void keel_cuda_attention_forward_bf16_tc(float *out, float *lse, const float *q, const float *k,
                                                    const float *v, int B, int T, int NH, int NKV, int HS) {
    const char *what = "attention_forward_bf16 (tensor cores)";
    if (B <= 0 || T <= 0 || NH <= 0 || !tc_shape_ok(what, B, T, NH, NKV, HS)) return;
    if (HS == 64) tc_forward_at<64>(out, lse, q, k, v, B, T, NH, NKV, what);
    else tc_forward_at<128>(out, lse, q, k, v, B, T, NH, NKV, what);
}

extern "C" void keel_cuda_attention_backward_bf16_tc(float *dq, float *dk, float *dv, const float *dout,
                                                     const float *out, const float *lse, const float *q,
                                                     const float *k, const float *v, int B, int T, int NH, int NKV,
                                                     int HS) {
    const char *what = "attention_backward_bf16 (tensor cores)";
    if (B <= 0 || T <= 0 || NH <= 0 || !tc_shape_ok(what, B, T, NH, NKV, HS)) return;
    const float *Dv = keel_cuda_attention_rowdot(dout, out, B, T, NH, HS, true, what);
    if (!Dv) return;
    if (HS == 64) tc_backward_at<64>(dq, dk, dv, dout, lse, Dv, q, k, v, B, T, NH, NKV, what);
    else tc_backward_at<128>(dq, dk, dv, dout, lse, Dv, q, k, v, B, T, NH, NKV, what);
}
