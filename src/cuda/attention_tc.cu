// cuda/attention_tc.cu: attention.cu's bf16 flash attention on the tensor
// cores, for head sizes 64 and 128 (keel_cuda_attention_*_bf16_tc, keel/cuda.h;
// and the keel_cuda_attention_*_bf16 entry points, which take them there unless
// KEEL_CUDA_ATTENTION=simt and attention.cu's CUDA-core kernels elsewhere).
// The same contract and algorithm (FlashAttention-2 forward with an online
// softmax; backward recomputing P from lse, dK and dV per key tile, dQ per
// query tile), with every product on the tensor cores, bf16 operands into
// fp32 accumulators: exactly the bf16 semantics (operands rounded to nearest
// even, sums in fp32), up to the order of the fp32 sums. The softmax and its
// backward stay fp32.
//
// Built on warp_mma.h's PTX, whose register layouts are documented
// (mma.m16n8k16, ldmatrix, cp.async), so a product's result stays in
// registers for the row-wise math after it, and a result's accumulator tiles
// are already the A fragments of the next product (P V, Pᵀ dO, dSᵀ Q, dS K).
// Blocks of 4 warps (128 threads), tiles of 64 queries x 64 keys; a warp owns
// 16 rows of its block's result and everything about them (a row's values
// in the 4 lanes of a quad: a max or a sum takes two shuffles), so
// __syncthreads comes only around the tiles all warps read. The operands are
// rounded to bf16 copies first (keel_cuda_f32_to_bf16, into a scratch kept
// between calls), which cp.async copies into shared memory as they are, in
// two stages: the next tile lands while this one is used. Tiles are
// [64][HS + 8] bf16 (the row stride moves each row 16 bytes on, so an
// ldmatrix's 8 rows hit distinct banks).
//   forward   block = (head, batch, query tile), heavy tiles first; warp w
//             rows 16w..16w+15: Q's fragments (loaded once), S, P, O, m, l in
//             registers. Per key tile up to the diagonal: S = Q Kᵀ, the
//             online softmax, O = O corr + P V; at the end out = O / l,
//             lse = m + log l. Q + 2 x (K, V): 46,080 B (HS 64, 3 blocks/SM
//             by registers), 87,040 B (HS 128, 2 blocks/SM).
//   dK, dV    block = (kv head, batch, key tile), heavy tiles first; warp w
//             keys 16w..16w+15, their dK and dV in registers. Over the
//             group's query heads and each one's query tiles at or past the
//             diagonal (Q, dO, lse, D in two stages), per 32 queries:
//             Sᵀ = K Qᵀ, dPᵀ = V dOᵀ, Pᵀ and dSᵀ in the same registers, then
//             dV += Pᵀ dO, dK += dSᵀ Q.
//   dQ        block = (head, batch, query tile), heavy tiles first; warp w
//             queries 16w..16w+15: Q and dO fragments (loaded once) and dQ in
//             registers. Per key tile up to the diagonal, per 32 keys: S, dP,
//             dS, then dQ += dS K.
//             Both: 2 tiles + 2 stages of 2 (+ lse, D of each stage):
//             56,320 B (HS 64, 3 blocks/SM), 105,472 B (HS 128, 2 blocks/SM).
//             D = rowsum(dO ∘ O) is attention.cu's kernel and scratch.
// Results go from the accumulators to global memory, rows < T only, each lane
// 2 adjacent floats of every 8 columns. Deterministic: every output element
// has one owner warp, which adds its terms in a fixed order (dK, dV over the
// group's heads and query tiles in turn, like attention.cu); no atomics, and
// each element is written once.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#define _Noreturn __attribute__((noreturn)) // C11's, in keel/core.h; nvcc compiles C++
#include "keel/cuda.h"
}
#include "common.h"
#include "warp_mma.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "attention_tc.cu: bf16 WMMA needs sm_80 or newer (KEEL_CUDA_ARCHITECTURES)"
#endif

typedef __nv_bfloat16 bf16;

#define TC_THREADS 128 // 4 warps
#define TC_TILE 64     // queries and keys per tile

// The tiles in shared memory: [64][HS + 8] bf16 (the row stride moves each
// row 16 bytes on, so an ldmatrix's 8 rows hit distinct banks)
template <int HS> struct tc_tile {
    static constexpr int LD = HS + 8;
    static constexpr size_t bytes = (size_t)TC_TILE * LD * sizeof(bf16);
};

// ---- fragments: loads, products, results -------------------------------------

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

// A fragment: rows r0..r0+15, columns c0..c0+15 of a tile (row-major)
template <int HS> __device__ __forceinline__ static void load_a(uint32_t a[4], const bf16 *tile, int r0, int c0) {
    const int lane = threadIdx.x % 32;
    ldmatrix_x4(a, tile + (r0 + lane % 16) * tc_tile<HS>::LD + c0 + lane / 16 * 8);
}
// B fragments of two 8-column tiles, B(k, n) = tile[n][k]: rows n0..n0+15 read as n, columns k0..k0+15 as k;
// b[0..1] for n0..n0+7, b[2..3] for n0+8..n0+15
template <int HS> __device__ __forceinline__ static void load_bt(uint32_t b[4], const bf16 *tile, int n0, int k0) {
    const int lane = threadIdx.x % 32;
    ldmatrix_x4(b, tile + (n0 + lane % 8 + lane / 16 * 8) * tc_tile<HS>::LD + k0 + lane / 8 % 2 * 8);
}
// B fragments of two 8-column tiles, B(k, n) = tile[k][n]: rows k0..k0+15, columns n0..n0+15
template <int HS> __device__ __forceinline__ static void load_b(uint32_t b[4], const bf16 *tile, int k0, int n0) {
    const int lane = threadIdx.x % 32;
    ldmatrix_x4_trans(b, tile + (k0 + lane % 16) * tc_tile<HS>::LD + n0 + lane / 16 * 8);
}
// acc[dt] += a B for the 8-column tiles dt of B(k, n) = tile[k0 + k][n] (row-major), every n < HS
template <int HS>
__device__ __forceinline__ static void mma_rows(float (*acc)[4], const uint32_t a[4], const bf16 *tile, int k0) {
#pragma unroll
    for (int dp = 0; dp < HS / 16; dp++) {
        uint32_t r[4];
        load_b<HS>(r, tile, k0, 16 * dp);
        const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
        mma_bf16_16816(acc[2 * dp], a, b0);
        mma_bf16_16816(acc[2 * dp + 1], a, b1);
    }
}
// x += a B₁ and y += c B₂ over k = 16kk..16kk+15, for the 32 columns n0..n0+31 (4 tiles of 8) of
// B(k, n) = t1[n][k] and t2[n][k]
template <int HS>
__device__ __forceinline__ static void mma_32cols(float (*x)[4], const uint32_t a[4], const bf16 *t1, float (*y)[4],
                                                  const uint32_t c[4], const bf16 *t2, int n0, int kk) {
#pragma unroll
    for (int np = 0; np < 2; np++) {
        uint32_t r[4];
        load_bt<HS>(r, t1, n0 + 16 * np, 16 * kk);
        const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
        mma_bf16_16816(x[2 * np], a, b0);
        mma_bf16_16816(x[2 * np + 1], a, b1);
        load_bt<HS>(r, t2, n0 + 16 * np, 16 * kk);
        const uint32_t d0[2] = {r[0], r[1]}, d1[2] = {r[2], r[3]};
        mma_bf16_16816(y[2 * np], c, d0);
        mma_bf16_16816(y[2 * np + 1], c, d1);
    }
}
// The A fragment of columns 16kc..16kc+15 of a 16-row result held as accumulator tiles: tiles 2kc, 2kc + 1
__device__ __forceinline__ static void acc_to_a(uint32_t a[4], const float (*c)[4], int kc) {
    a[0] = pack_bf16(c[2 * kc][0], c[2 * kc][1]);
    a[1] = pack_bf16(c[2 * kc][2], c[2 * kc][3]);
    a[2] = pack_bf16(c[2 * kc + 1][0], c[2 * kc + 1][1]);
    a[3] = pack_bf16(c[2 * kc + 1][2], c[2 * kc + 1][3]);
}
// A warp's 16 result rows (row0.., those < T) from its accumulator tiles to dst (row stride ld)
template <int HS>
__device__ __forceinline__ static void store_rows(float *dst, int64_t ld, int row0, int T, const float (*acc)[4]) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int r = row0 + g + 8 * hr;
        if (r >= T) continue;
#pragma unroll
        for (int d = 0; d < HS / 8; d++) { // two stores: dst need only be a float's alignment
            float *at = dst + (int64_t)r * ld + 8 * d + 2 * t;
            at[0] = acc[d][2 * hr], at[1] = acc[d][2 * hr + 1];
        }
    }
}

// ---- forward -----------------------------------------------------------------

template <int HS> struct fwd_smem {
    static constexpr size_t tile = tc_tile<HS>::bytes;
    static constexpr size_t bytes = 5 * tile; // Q, K and V twice (the tile in use and the next, landing)
};

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
    constexpr int KT = HS / 16, DT = HS / 8, NT = TC_TILE / 8;
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
            for (int kk = 0; kk < KT; kk++) load_a<HS>(qf[kk], Qs, 16 * w, 16 * kk);
        // S = Q Kᵀ: B(d, key) = K[key][d], K's rows read as B by plain ldmatrix
        float s[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KT; kk++)
#pragma unroll
            for (int np = 0; np < NT / 2; np++) { // keys 16np..16np+15: two 8-key tiles
                uint32_t r[4];
                load_bt<HS>(r, Kt, 16 * np, 16 * kk);
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
            uint32_t a[4];
            acc_to_a(a, s, kc);
            mma_rows<HS>(o, a, Vt, 16 * kc);
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
        for (int d = 0; d < DT; d++) // two stores: out need only be a float's alignment
            row[8 * d + 2 * t] = o[d][2 * hr] * inv, row[8 * d + 2 * t + 1] = o[d][2 * hr + 1] * inv;
        if (t == 0) lse[((int64_t)b * NH + h) * T + qi[hr]] = m[hr] + logf(l[hr]);
    }
}

// ---- backward ----------------------------------------------------------------

template <int HS> struct bwd_smem {
    static constexpr size_t tile = tc_tile<HS>::bytes;
    // 2 tiles for the block's own rows, 2 stages of 2 for the tiles it loops over, and (dK, dV) the
    // lse and D of each stage's queries
    static constexpr size_t bytes = 6 * tile + 2 * 2 * TC_TILE * sizeof(float);
};

// Block = (kv head, batch, key tile), heavy tiles first; warp w owns keys
// 16w..16w+15 and their dK and dV (registers). It loops over the group's query
// heads and, for each, the query tiles at or past the diagonal, the next
// (Q, dO, lse, D) landing while this one is used; per 32 queries: Sᵀ = K Qᵀ,
// dPᵀ = V dOᵀ, then Pᵀ = exp(scale Sᵀ - lse) and dSᵀ = scale Pᵀ ∘ (dPᵀ - D)
// in the same registers, which are the A fragments of dV += Pᵀ dO and
// dK += dSᵀ Q.
template <int HS>
__global__ static void __launch_bounds__(TC_THREADS)
    tc_backward_dkdv(float *dk, float *dv, const bf16 *dout, const float *lse, const float *Dv, const bf16 *q,
                     const bf16 *k, const bf16 *v, int T, int NH, int NKV, float scale) {
    typedef bwd_smem<HS> L;
    constexpr int KT = HS / 16, DT = HS / 8;
    extern __shared__ __align__(128) unsigned char smem[];
    // K, V; then Q and dO of stage 0, of stage 1; then lse and D of stage 0, of stage 1: [64] each
    const bf16 *Ks = (const bf16 *)smem, *Vs = (const bf16 *)(smem + L::tile);
    auto Qs = [&](int stage) { return (bf16 *)(smem + (2 + 2 * stage) * L::tile); };
    auto dOs = [&](int stage) { return (bf16 *)(smem + (3 + 2 * stage) * L::tile); };
    auto LDs = [&](int stage) { return (float *)(smem + 6 * L::tile) + 2 * TC_TILE * stage; };
    const int g = blockIdx.x, b = blockIdx.y, k0 = blockIdx.z * TC_TILE; // the longest columns first
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, t = lane % 4;
    const int group = NH / NKV, ntq = (T - k0 + TC_TILE - 1) / TC_TILE, iters = group * ntq;
    const int64_t ldq = (int64_t)NH * HS, ldkv = (int64_t)NKV * HS, at = (int64_t)b * T * ldkv + (int64_t)g * HS;
    // iteration i: query head g group + i / ntq, queries k0 + 64 (i % ntq)..; into stage i % 2
    auto issue = [&](int i) {
        const int h = g * group + i / ntq, q0 = k0 + i % ntq * TC_TILE, stage = i % 2;
        const int64_t qat = (int64_t)b * T * ldq + (int64_t)h * HS;
        copy_rows_async<HS>(Qs(stage), q + qat, ldq, q0, T);
        copy_rows_async<HS>(dOs(stage), dout + qat, ldq, q0, T);
        if (threadIdx.x < TC_TILE) { // plain stores: the barrier before the stage's use shows them
            const int qi = q0 + (int)threadIdx.x;
            const int64_t li = ((int64_t)b * NH + h) * T + qi;
            LDs(stage)[threadIdx.x] = qi < T ? lse[li] : 0.0f;
            LDs(stage)[TC_TILE + threadIdx.x] = qi < T ? Dv[li] : 0.0f;
        }
    };
    copy_rows_async<HS>((bf16 *)Ks, k + at, ldkv, k0, T);
    copy_rows_async<HS>((bf16 *)Vs, v + at, ldkv, k0, T);
    issue(0);
    cp_async_commit();

    const int kw = 16 * w; // the warp's first key in the tile
    float dK[DT][4], dV[DT][4];
#pragma unroll
    for (int d = 0; d < DT; d++)
#pragma unroll
        for (int c = 0; c < 4; c++) dK[d][c] = dV[d][c] = 0.0f;
    for (int i = 0; i < iters; i++) {
        const int q0 = k0 + i % ntq * TC_TILE, stage = i % 2;
        if (i + 1 < iters) {
            issue(i + 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads(); // iteration i's tiles (and K, V) landed for every thread
        const bf16 *Qt = Qs(stage), *dOt = dOs(stage);
        const float *lse_s = LDs(stage), *D_s = lse_s + TC_TILE;
#pragma unroll 1
        for (int half = 0; half < 2; half++) { // queries 32 half..32 half + 31: 4 tiles of 8
            float sT[4][4], dpT[4][4];
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int c = 0; c < 4; c++) sT[n][c] = dpT[n][c] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KT; kk++) { // B(d, query) = Q[query][d], dO[query][d]
                uint32_t ka[4], va[4];
                load_a<HS>(ka, Ks, kw, 16 * kk);
                load_a<HS>(va, Vs, kw, 16 * kk);
                mma_32cols<HS>(sT, ka, Qt, dpT, va, dOt, 32 * half, kk);
            }
            // Pᵀ and dSᵀ (zero where masked): element (key k0 + kw + gr + 8 hr, query q0 + r)
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = 32 * half + 8 * n + 2 * t + e % 2, qi = q0 + r, key = k0 + kw + gr + 8 * (e / 2);
                    float p = 0.0f, ds = 0.0f;
                    if (qi < T && key <= qi) {
                        p = expf(sT[n][e] * scale - lse_s[r]);
                        ds = scale * p * (dpT[n][e] - D_s[r]);
                    }
                    sT[n][e] = p, dpT[n][e] = ds;
                }
            // dV += Pᵀ dO, dK += dSᵀ Q over these 32 queries: B(query, d) = dO[query][d], Q[query][d]
#pragma unroll
            for (int kc = 0; kc < 2; kc++) {
                uint32_t pa[4], sa[4];
                acc_to_a(pa, sT, kc);
                acc_to_a(sa, dpT, kc);
                mma_rows<HS>(dV, pa, dOt, 32 * half + 16 * kc);
                mma_rows<HS>(dK, sa, Qt, 32 * half + 16 * kc);
            }
        }
        __syncthreads(); // every warp is done with stage i % 2 before it takes iteration i + 2
    }
    store_rows<HS>(dv + at, ldkv, k0 + kw, T, dV);
    store_rows<HS>(dk + at, ldkv, k0 + kw, T, dK);
}

// Block = (head, batch, query tile), heavy tiles first; warp w owns queries
// 16w..16w+15: their Q and dO fragments (loaded once) and dQ in registers.
// Per key tile up to the diagonal (the next landing while this one is used),
// per 32 keys: S = Q Kᵀ, dP = dO Vᵀ, dS = scale P ∘ (dP - D) in the same
// registers, the A fragments of dQ += dS K.
template <int HS>
__global__ static void __launch_bounds__(TC_THREADS)
    tc_backward_dq(float *dq, const bf16 *dout, const float *lse, const float *Dv, const bf16 *q, const bf16 *k,
                   const bf16 *v, int T, int NH, int NKV, float scale) {
    typedef bwd_smem<HS> L;
    constexpr int KT = HS / 16, DT = HS / 8;
    extern __shared__ __align__(128) unsigned char smem[];
    // Q, dO; then K and V of stage 0, of stage 1
    const bf16 *Qs = (const bf16 *)smem, *dOs = (const bf16 *)(smem + L::tile);
    auto Ks = [&](int stage) { return (bf16 *)(smem + (2 + 2 * stage) * L::tile); };
    auto Vs = [&](int stage) { return (bf16 *)(smem + (3 + 2 * stage) * L::tile); };
    const int h = blockIdx.x, b = blockIdx.y, nq = (T + TC_TILE - 1) / TC_TILE;
    const int q0 = (nq - 1 - (int)blockIdx.z) * TC_TILE; // the longest rows first
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, t = lane % 4;
    const int kvh = h / (NH / NKV);
    const int64_t ldq = (int64_t)NH * HS, ldkv = (int64_t)NKV * HS, qat = (int64_t)b * T * ldq + (int64_t)h * HS;
    const bf16 *kh = k + (int64_t)b * T * ldkv + (int64_t)kvh * HS, *vh = v + (int64_t)b * T * ldkv + (int64_t)kvh * HS;
    const int kend = min(T, q0 + TC_TILE), ntiles = (kend + TC_TILE - 1) / TC_TILE;
    copy_rows_async<HS>((bf16 *)Qs, q + qat, ldq, q0, T);
    copy_rows_async<HS>((bf16 *)dOs, dout + qat, ldq, q0, T);
    copy_rows_async<HS>(Ks(0), kh, ldkv, 0, T);
    copy_rows_async<HS>(Vs(0), vh, ldkv, 0, T);
    cp_async_commit();

    float lse_r[2], D_r[2]; // the lane's rows g and g + 8
    int qi[2];
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        qi[hr] = q0 + 16 * w + gr + 8 * hr;
        const int64_t li = ((int64_t)b * NH + h) * T + qi[hr];
        lse_r[hr] = qi[hr] < T ? lse[li] : 0.0f;
        D_r[hr] = qi[hr] < T ? Dv[li] : 0.0f;
    }
    float dQ[DT][4];
#pragma unroll
    for (int d = 0; d < DT; d++) dQ[d][0] = dQ[d][1] = dQ[d][2] = dQ[d][3] = 0.0f;
    uint32_t qf[KT][4], df[KT][4];
    for (int j = 0; j < ntiles; j++) {
        const int k0 = j * TC_TILE;
        const bf16 *Kt = Ks(j % 2), *Vt = Vs(j % 2);
        if (j + 1 < ntiles) {
            copy_rows_async<HS>(Ks((j + 1) % 2), kh, ldkv, k0 + TC_TILE, T);
            copy_rows_async<HS>(Vs((j + 1) % 2), vh, ldkv, k0 + TC_TILE, T);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads(); // tile j (and Q, dO) landed for every thread
        if (j == 0)
#pragma unroll
            for (int kk = 0; kk < KT; kk++) {
                load_a<HS>(qf[kk], Qs, 16 * w, 16 * kk);
                load_a<HS>(df[kk], dOs, 16 * w, 16 * kk);
            }
#pragma unroll 1
        for (int half = 0; half < 2; half++) { // keys 32 half..32 half + 31: 4 tiles of 8
            float s[4][4], dp[4][4];
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int c = 0; c < 4; c++) s[n][c] = dp[n][c] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KT; kk++) // B(d, key) = K[key][d], V[key][d]
                mma_32cols<HS>(s, qf[kk], Kt, dp, df[kk], Vt, 32 * half, kk);
            // dS (zero where masked): element (query qi[e / 2], key k0 + 32 half + 8 n + 2t + e % 2)
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int hr = e / 2, key = k0 + 32 * half + 8 * n + 2 * t + e % 2;
                    float ds = 0.0f;
                    if (qi[hr] < T && key <= qi[hr])
                        ds = scale * expf(s[n][e] * scale - lse_r[hr]) * (dp[n][e] - D_r[hr]);
                    s[n][e] = ds;
                }
            // dQ += dS K over these 32 keys: B(key, d) = K[key][d]
#pragma unroll
            for (int kc = 0; kc < 2; kc++) {
                uint32_t sa[4];
                acc_to_a(sa, s, kc);
                mma_rows<HS>(dQ, sa, Kt, 32 * half + 16 * kc);
            }
        }
        __syncthreads(); // every warp is done with tile j before its buffers take tile j + 2
    }
    store_rows<HS>(dq + qat, ldq, q0 + 16 * w, T, dQ);
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

// The operands rounded to bf16 (keel_cuda_f32_to_bf16) in a scratch kept
// between calls and grown when a call needs more: what cp.async copies into
// shared memory as it is. q, k, v, and dout unless NULL, in op[0..3]; false
// (noted under `what`) when the scratch cannot be had.
static bf16 *g_ops;
static size_t g_ops_elems;

static bool bf16_operands(const bf16 *op[4], const float *q, const float *k, const float *v, const float *dout, int B,
                          int T, int NH, int NKV, int HS, const char *what) {
    const int64_t nq = (int64_t)B * T * NH * HS, nkv = (int64_t)B * T * NKV * HS; // multiples of 64: 16-byte aligned
    const size_t need = (size_t)(nq + 2 * nkv + (dout ? nq : 0));
    if (need > g_ops_elems) {
        if (g_ops) keel_cuda_note(cudaFree(g_ops), what); // in order after the kernels that read it
        g_ops = NULL, g_ops_elems = 0;
        cudaError_t e = cudaMalloc((void **)&g_ops, need * sizeof(bf16));
        if (e != cudaSuccess) {
            g_ops = NULL;
            keel_cuda_note(e, "cudaMalloc of the tensor-core attention's bf16 operands");
            return false;
        }
        g_ops_elems = need;
    }
    const float *src[4] = {q, k, v, dout};
    const int64_t n[4] = {nq, nkv, nkv, nq};
    bf16 *at = g_ops;
    for (int i = 0; i < (dout ? 4 : 3); i++) {
        keel_cuda_f32_to_bf16((keel_bf16 *)at, src[i], n[i]);
        op[i] = at;
        at += n[i];
    }
    return true;
}

template <int HS>
static void tc_forward_at(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T,
                          int NH, int NKV, const char *what) {
    const bf16 *op[4];
    if (!bf16_operands(op, q, k, v, NULL, B, T, NH, NKV, HS, what)) return;
    const size_t smem = fwd_smem<HS>::bytes;
    keel_cuda_note(cudaFuncSetAttribute(tc_forward<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), what);
    dim3 grid((unsigned)NH, (unsigned)B, (unsigned)((T + TC_TILE - 1) / TC_TILE));
    tc_forward<HS><<<grid, TC_THREADS, smem>>>(out, lse, op[0], op[1], op[2], T, NH, NKV, 1.0f / sqrtf((float)HS));
    keel_cuda_note(cudaGetLastError(), what);
}

template <int HS>
static void tc_backward_at(float *dq, float *dk, float *dv, const float *dout, const float *lse, const float *Dv,
                           const float *q, const float *k, const float *v, int B, int T, int NH, int NKV,
                           const char *what) {
    const bf16 *op[4];
    if (!bf16_operands(op, q, k, v, dout, B, T, NH, NKV, HS, what)) return;
    const size_t smem = bwd_smem<HS>::bytes;
    const float scale = 1.0f / sqrtf((float)HS);
    const unsigned tiles = (unsigned)((T + TC_TILE - 1) / TC_TILE);
    keel_cuda_note(cudaFuncSetAttribute(tc_backward_dkdv<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                   what);
    keel_cuda_note(cudaFuncSetAttribute(tc_backward_dq<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                   what);
    tc_backward_dkdv<HS><<<dim3((unsigned)NKV, (unsigned)B, tiles), TC_THREADS, smem>>>(
        dk, dv, op[3], lse, Dv, op[0], op[1], op[2], T, NH, NKV, scale);
    keel_cuda_note(cudaGetLastError(), what);
    tc_backward_dq<HS><<<dim3((unsigned)NH, (unsigned)B, tiles), TC_THREADS, smem>>>(dq, op[3], lse, Dv, op[0], op[1],
                                                                                     op[2], T, NH, NKV, scale);
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

// ---- the bf16 entry points: the tensor cores, or attention.cu's kernels ----

// Whether KEEL_CUDA_ATTENTION leaves the tensor cores on (anything but
// "simt"): -1 until read, at the first bf16 call or the first after
// keel_cuda_attention_reread_env (a plain int: one thread calls).
static int g_tensor_cores = -1;

extern "C" void keel_cuda_attention_reread_env(void) { g_tensor_cores = -1; }

// these kernels where they apply: HS 64 or 128, not turned off
static bool tensor_cores(int HS) {
    if (HS != 64 && HS != 128) return false;
    if (g_tensor_cores < 0) {
        const char *e = getenv("KEEL_CUDA_ATTENTION");
        g_tensor_cores = !(e && strcmp(e, "simt") == 0);
        if (e && *e && strcmp(e, "simt") != 0 && strcmp(e, "tensor") != 0)
            keel_log_warn("KEEL_CUDA_ATTENTION=%s is neither simt nor tensor: the tensor cores are used", e);
    }
    return g_tensor_cores != 0;
}

extern "C" void keel_cuda_attention_forward_bf16(float *out, float *lse, const float *q, const float *k,
                                                 const float *v, int B, int T, int NH, int NKV, int HS) {
    if (tensor_cores(HS)) keel_cuda_attention_forward_bf16_tc(out, lse, q, k, v, B, T, NH, NKV, HS);
    else keel_cuda_attention_forward_bf16_simt(out, lse, q, k, v, B, T, NH, NKV, HS);
}

extern "C" void keel_cuda_attention_backward_bf16(float *dq, float *dk, float *dv, const float *dout,
                                                  const float *out, const float *lse, const float *q, const float *k,
                                                  const float *v, int B, int T, int NH, int NKV, int HS) {
    if (tensor_cores(HS)) keel_cuda_attention_backward_bf16_tc(dq, dk, dv, dout, out, lse, q, k, v, B, T, NH, NKV, HS);
    else keel_cuda_attention_backward_bf16_simt(dq, dk, dv, dout, out, lse, q, k, v, B, T, NH, NKV, HS);
}
