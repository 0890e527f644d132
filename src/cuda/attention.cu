// cuda/attention.cu: flash-style causal attention with grouped-query heads on
// the GPU, forward and backward, fp32 and bf16 (keel_attention_*'s contracts,
// keel/kernels.h; the CPU version is src/kernels/attention.c). The (T, T)
// scores never reach global memory: tiles of queries x keys live in shared
// memory and registers, forward keeps an online softmax, backward recomputes
// the probabilities from q, k and forward's log-sum-exp (FlashAttention-2).
//
// Kernels (256 threads each, seen as 16 x 16: tr = tid / 16, tc = tid % 16;
// every tile in shared memory is row-major with a row stride of D + 1 floats,
// so both the "row" reads (a few rows, one column) and the "column" reads (16
// rows, one column; or one row, 16 columns) hit distinct banks). D is HS
// rounded up to 32, 64 or 128 (a template parameter; the padding is zeros).
//   forward   block = (head, batch, query tile of 64), heavy tiles first; key
//             tiles of 64 up to the diagonal. S = Q Kᵀ in registers (each
//             thread 4 rows tr+16i x 4 keys tc+16j), the row max and sum over
//             the 16 threads of a row by shuffles, P to shared memory, then
//             acc += P V (each thread the same 4 rows x D/16 columns tc+16j).
//             K and V take turns in one buffer. Shared memory for D = 128:
//             Q 64x129 + K/V 64x129 + P 64x65 floats = 82,688 B (2 blocks/SM).
//   dot       D_i = rowsum(dO_i ∘ O_i) per query and head, a warp per row,
//             into scratch (B, NH, T) floats kept between calls.
//   dK, dV    block = (kv head, batch, key tile of 64), heavy tiles first:
//             it owns its keys' dK and dV (registers, 64 + 64 floats a
//             thread for D = 128) and loops over the query heads of its group
//             and their query tiles of 32 at or past the diagonal: S and dP
//             in registers, P then dS through one shared tile, dV += Pᵀ dO,
//             dK += dSᵀ Q. No atomics: deterministic, and dK, dV written once.
//   dQ        block = (head, batch, query tile of 32): S, dP and dS again for
//             its queries over the key tiles up to the diagonal, dQ += dS K.
//             (Recomputing S and dP for dQ instead of FA2's atomic adds makes
//             the result independent of the schedule.)
//             Both backward kernels, D = 128: K, V 64x129 + Q, dO 32x129 +
//             32x65 + 64 floats = 107,648 B (2 blocks/SM).
// The bf16 variants are the same kernels rounding q, k, v and dout as they
// are loaded, and the probabilities and dS as they are written for their
// products, to bf16 (keel_bf16_from_float's rounding), with fp32 sums; the
// softmax, its backward (with the unrounded P), out and lse stay fp32, and D
// takes the rounded dO — keel_attention_*_bf16's semantics.
// keel_cuda_attention_*_bf16 (attention_tc.cu) run these kernels (the _simt
// functions) only where the tensor-core ones do not apply (HS other than 64
// and 128), or when the environment has KEEL_CUDA_ATTENTION=simt.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#define _Noreturn __attribute__((noreturn)) // C11's, in keel/core.h; nvcc compiles C++
#include "keel/cuda.h"
}
#include "common.h"

#define ATT_THREADS 256
#define FWD_Q 64 // forward: queries per tile
#define FWD_K 64 // forward: keys per tile (== FWD_Q: every row sees a key of every tile it visits)
#define BWD_Q 32 // backward: queries per tile
#define BWD_K 64 // backward: keys per tile

// keel_bf16_from_float then back to fp32: round to nearest even, NaNs quietened
__device__ __forceinline__ static float round_bf16(float x) {
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __uint_as_float((u | 0x00400000u) & 0xffff0000u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return __uint_as_float(u & 0xffff0000u);
}

template <bool BF16> __device__ __forceinline__ static float rnd(float x) { return BF16 ? round_bf16(x) : x; }

// dst[r][d] (row stride D + 1) = src row r0 + r, column d (rows of stride ld),
// for r < rows; 0 past T or HS. Consecutive threads take consecutive d.
template <int D, bool BF16>
__device__ static void load_tile(float *dst, int rows, const float *src, int64_t ld, int r0, int T, int HS) {
    for (int e = threadIdx.x; e < rows * D; e += ATT_THREADS) {
        int r = e / D, d = e % D;
        float x = 0.0f;
        if (r0 + r < T && d < HS) x = rnd<BF16>(src[(int64_t)(r0 + r) * ld + d]);
        dst[r * (D + 1) + d] = x;
    }
}

// the sum / max over the 16 threads of a row (lanes 0-15 or 16-31 of a warp)
__device__ __forceinline__ static float row_sum(float x) {
    for (int o = 8; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ static float row_max(float x) {
    for (int o = 8; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// ---- forward -----------------------------------------------------------------

template <int D> static size_t forward_smem(void) {
    return sizeof(float) * (size_t)(2 * FWD_Q * (D + 1) + FWD_Q * (FWD_K + 1));
}

// acc[i][jj] += Σ_c S(tr + 16i, c) · X[c][tc + 16jj] over c < K, for this
// thread's rows and columns, with S(r, c) = S[r * SR + c * SC] and X
// ([K][D + 1]) in shared memory: S·X for SR = width + 1, SC = 1 (P·V, dS·K),
// Sᵀ·X for SR = 1, SC = width + 1 (Pᵀ·dO, dSᵀ·Q).
template <int R, int K, int D, int SR, int SC>
__device__ __forceinline__ static void add_product(float (&acc)[R][D / 16], const float *S, const float *X, int tr,
                                                   int tc) {
    constexpr int DJ = D / 16;
#pragma unroll 4
    for (int c = 0; c < K; c++) {
        float sv[R], xv[DJ];
#pragma unroll
        for (int i = 0; i < R; i++) sv[i] = S[(tr + 16 * i) * SR + c * SC];
#pragma unroll
        for (int jj = 0; jj < DJ; jj++) xv[jj] = X[c * (D + 1) + tc + 16 * jj];
#pragma unroll
        for (int i = 0; i < R; i++)
#pragma unroll
            for (int jj = 0; jj < DJ; jj++) acc[i][jj] = fmaf(sv[i], xv[jj], acc[i][jj]);
    }
}

template <int D, bool BF16>
__global__ static void __launch_bounds__(ATT_THREADS, 2)
    attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int T, int NH,
                      int NKV, int HS, float scale) {
    constexpr int RI = FWD_Q / 16, CJ = FWD_K / 16, DJ = D / 16;
    extern __shared__ float smem[];
    float *Qs = smem;                   // [FWD_Q][D + 1]
    float *KVs = Qs + FWD_Q * (D + 1);  // [FWD_K][D + 1]: K, then V
    float *Ps = KVs + FWD_K * (D + 1);  // [FWD_Q][FWD_K + 1]
    const int h = blockIdx.x, b = blockIdx.y, nq = (T + FWD_Q - 1) / FWD_Q;
    const int q0 = (nq - 1 - (int)blockIdx.z) * FWD_Q; // the longest rows first
    const int tr = threadIdx.x / 16, tc = threadIdx.x % 16, g = h / (NH / NKV);
    const int64_t ldq = (int64_t)NH * HS, ldkv = (int64_t)NKV * HS;
    const float *qh = q + (int64_t)b * T * ldq + (int64_t)h * HS;
    const float *kh = k + (int64_t)b * T * ldkv + (int64_t)g * HS, *vh = v + (int64_t)b * T * ldkv + (int64_t)g * HS;

    float acc[RI][DJ], m[RI], l[RI];
#pragma unroll
    for (int i = 0; i < RI; i++) {
        m[i] = -INFINITY, l[i] = 0.0f;
#pragma unroll
        for (int jj = 0; jj < DJ; jj++) acc[i][jj] = 0.0f;
    }
    load_tile<D, BF16>(Qs, FWD_Q, qh, ldq, q0, T, HS);
    const int kend = min(T, q0 + FWD_Q); // keys [0, kend): up to the tile's last query
    for (int k0 = 0; k0 < kend; k0 += FWD_K) {
        __syncthreads(); // the last tile's P V is done with KVs and Ps
        load_tile<D, BF16>(KVs, FWD_K, kh, ldkv, k0, T, HS);
        __syncthreads();
        float s[RI][CJ];
#pragma unroll
        for (int i = 0; i < RI; i++)
#pragma unroll
            for (int j = 0; j < CJ; j++) s[i][j] = 0.0f;
#pragma unroll 4
        for (int d = 0; d < D; d++) {
            float qv[RI], kv[CJ];
#pragma unroll
            for (int i = 0; i < RI; i++) qv[i] = Qs[(tr + 16 * i) * (D + 1) + d];
#pragma unroll
            for (int j = 0; j < CJ; j++) kv[j] = KVs[(tc + 16 * j) * (D + 1) + d];
#pragma unroll
            for (int i = 0; i < RI; i++)
#pragma unroll
                for (int j = 0; j < CJ; j++) s[i][j] = fmaf(qv[i], kv[j], s[i][j]);
        }
        // online softmax: scaled scores, masked above the diagonal; m, l and acc move on
#pragma unroll
        for (int i = 0; i < RI; i++) {
            const int qi = q0 + tr + 16 * i;
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < CJ; j++) {
                s[i][j] = k0 + tc + 16 * j <= qi ? s[i][j] * scale : -INFINITY;
                mx = fmaxf(mx, s[i][j]);
            }
            const float mnew = fmaxf(m[i], row_max(mx));
            const float base = mnew == -INFINITY ? 0.0f : mnew; // a row that has seen no key yet
            const float corr = expf(m[i] - base);               // 0 on the first tile (m = -inf)
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < CJ; j++) {
                const float p = expf(s[i][j] - base);
                sum += p;
                Ps[(tr + 16 * i) * (FWD_K + 1) + tc + 16 * j] = rnd<BF16>(p);
            }
            l[i] = l[i] * corr + row_sum(sum);
            m[i] = mnew;
#pragma unroll
            for (int jj = 0; jj < DJ; jj++) acc[i][jj] *= corr;
        }
        __syncthreads(); // every read of K done, P written
        load_tile<D, BF16>(KVs, FWD_K, vh, ldkv, k0, T, HS);
        __syncthreads();
        add_product<RI, FWD_K, D, FWD_K + 1, 1>(acc, Ps, KVs, tr, tc); // O += P V
    }
#pragma unroll
    for (int i = 0; i < RI; i++) {
        const int qi = q0 + tr + 16 * i;
        if (qi >= T) continue;
        const float inv = 1.0f / l[i];
        float *o = out + ((int64_t)b * T + qi) * ldq + (int64_t)h * HS;
#pragma unroll
        for (int jj = 0; jj < DJ; jj++)
            if (tc + 16 * jj < HS) o[tc + 16 * jj] = acc[i][jj] * inv;
        if (tc == 0) lse[((int64_t)b * NH + h) * T + qi] = m[i] + logf(l[i]);
    }
}

// ---- backward ------------------------------------------------------------------

// Dv[(b*NH + h)*T + t] = Σ_d dO ∘ O over query t's head h (dO rounded when BF16); a warp per row
template <bool BF16>
__global__ static void attention_dot(float *Dv, const float *dout, const float *out, int64_t rows, int T, int NH,
                                     int HS) {
    const int64_t row = (int64_t)blockIdx.x * (ATT_THREADS / 32) + threadIdx.x / 32; // (b, t, h) in memory order
    if (row >= rows) return;                                                          // the whole warp
    const int lane = threadIdx.x % 32;
    const float *o = out + row * HS, *d = dout + row * HS;
    float s = 0.0f;
    for (int i = lane; i < HS; i += 32) s += rnd<BF16>(d[i]) * o[i];
    for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) {
        const int h = (int)(row % NH);
        const int64_t bt = row / NH;
        Dv[(bt / T * NH + h) * T + bt % T] = s;
    }
}

template <int D> static size_t backward_smem(void) {
    return sizeof(float) * (size_t)(2 * BWD_K * (D + 1) + 2 * BWD_Q * (D + 1) + BWD_Q * (BWD_K + 1) + 2 * BWD_Q);
}

// A query tile's S = Q Kᵀ and dP = dO Vᵀ against a key tile, then P (masked,
// from lse) and dS = scale P ∘ (dP - D), each thread rows tr+16i, keys tc+16j.
template <int D>
__device__ __forceinline__ static void scores(float (&p)[BWD_Q / 16][BWD_K / 16], float (&ds)[BWD_Q / 16][BWD_K / 16],
                                              const float *Qs, const float *dOs, const float *Ks, const float *Vs,
                                              const float *lse_s, const float *D_s, int q0, int k0, int T,
                                              float scale) {
    constexpr int SI = BWD_Q / 16, SJ = BWD_K / 16;
    const int tr = threadIdx.x / 16, tc = threadIdx.x % 16;
    float s[SI][SJ], dp[SI][SJ];
#pragma unroll
    for (int i = 0; i < SI; i++)
#pragma unroll
        for (int j = 0; j < SJ; j++) s[i][j] = 0.0f, dp[i][j] = 0.0f;
#pragma unroll 4
    for (int d = 0; d < D; d++) {
        float qv[SI], ov[SI], kv[SJ], vv[SJ];
#pragma unroll
        for (int i = 0; i < SI; i++) qv[i] = Qs[(tr + 16 * i) * (D + 1) + d], ov[i] = dOs[(tr + 16 * i) * (D + 1) + d];
#pragma unroll
        for (int j = 0; j < SJ; j++) kv[j] = Ks[(tc + 16 * j) * (D + 1) + d], vv[j] = Vs[(tc + 16 * j) * (D + 1) + d];
#pragma unroll
        for (int i = 0; i < SI; i++)
#pragma unroll
            for (int j = 0; j < SJ; j++) s[i][j] = fmaf(qv[i], kv[j], s[i][j]), dp[i][j] = fmaf(ov[i], vv[j], dp[i][j]);
    }
#pragma unroll
    for (int i = 0; i < SI; i++) {
        const int r = tr + 16 * i, qi = q0 + r;
#pragma unroll
        for (int j = 0; j < SJ; j++) {
            const bool seen = qi < T && k0 + tc + 16 * j <= qi;
            p[i][j] = seen ? expf(s[i][j] * scale - lse_s[r]) : 0.0f;
            ds[i][j] = scale * p[i][j] * (dp[i][j] - D_s[r]);
        }
    }
}

// Q, dO, lse and D of query rows q0.. of head h into shared memory
template <int D, bool BF16>
__device__ static void load_queries(float *Qs, float *dOs, float *lse_s, float *D_s, const float *q, const float *dout,
                                    const float *lse, const float *Dv, int b, int h, int q0, int T, int NH, int HS) {
    const int64_t ldq = (int64_t)NH * HS, at = (int64_t)b * T * ldq + (int64_t)h * HS;
    load_tile<D, BF16>(Qs, BWD_Q, q + at, ldq, q0, T, HS);
    load_tile<D, BF16>(dOs, BWD_Q, dout + at, ldq, q0, T, HS);
    if (threadIdx.x < BWD_Q) {
        const int qi = q0 + threadIdx.x;
        const int64_t li = ((int64_t)b * NH + h) * T + qi;
        lse_s[threadIdx.x] = qi < T ? lse[li] : 0.0f;
        D_s[threadIdx.x] = qi < T ? Dv[li] : 0.0f;
    }
}

template <int D, bool BF16>
__global__ static void __launch_bounds__(ATT_THREADS, 2)
    attention_backward_dkdv(float *dk, float *dv, const float *dout, const float *lse, const float *Dv, const float *q,
                            const float *k, const float *v, int T, int NH, int NKV, int HS, float scale) {
    constexpr int AI = BWD_K / 16, DJ = D / 16, SI = BWD_Q / 16, SJ = BWD_K / 16;
    extern __shared__ float smem[];
    float *Ks = smem;                    // [BWD_K][D + 1]
    float *Vs = Ks + BWD_K * (D + 1);    // [BWD_K][D + 1]
    float *Qs = Vs + BWD_K * (D + 1);    // [BWD_Q][D + 1]
    float *dOs = Qs + BWD_Q * (D + 1);   // [BWD_Q][D + 1]
    float *PS = dOs + BWD_Q * (D + 1);   // [BWD_Q][BWD_K + 1]: P, then dS
    float *lse_s = PS + BWD_Q * (BWD_K + 1), *D_s = lse_s + BWD_Q;
    const int g = blockIdx.x, b = blockIdx.y, k0 = blockIdx.z * BWD_K; // the longest columns first
    const int tr = threadIdx.x / 16, tc = threadIdx.x % 16, group = NH / NKV;
    const int64_t ldkv = (int64_t)NKV * HS, at = (int64_t)b * T * ldkv + (int64_t)g * HS;
    load_tile<D, BF16>(Ks, BWD_K, k + at, ldkv, k0, T, HS);
    load_tile<D, BF16>(Vs, BWD_K, v + at, ldkv, k0, T, HS);

    float dK[AI][DJ], dV[AI][DJ]; // keys tr+16a, columns tc+16jj
#pragma unroll
    for (int a = 0; a < AI; a++)
#pragma unroll
        for (int jj = 0; jj < DJ; jj++) dK[a][jj] = 0.0f, dV[a][jj] = 0.0f;
    for (int h = g * group; h < (g + 1) * group; h++)
        for (int q0 = k0 / BWD_Q * BWD_Q; q0 < T; q0 += BWD_Q) { // the query tiles that see these keys
            __syncthreads(); // the last tile's products are done with Qs, dOs and PS
            load_queries<D, BF16>(Qs, dOs, lse_s, D_s, q, dout, lse, Dv, b, h, q0, T, NH, HS);
            __syncthreads();
            float p[SI][SJ], ds[SI][SJ];
            scores<D>(p, ds, Qs, dOs, Ks, Vs, lse_s, D_s, q0, k0, T, scale);
#pragma unroll
            for (int i = 0; i < SI; i++)
#pragma unroll
                for (int j = 0; j < SJ; j++) PS[(tr + 16 * i) * (BWD_K + 1) + tc + 16 * j] = rnd<BF16>(p[i][j]);
            __syncthreads();
            add_product<AI, BWD_Q, D, 1, BWD_K + 1>(dV, PS, dOs, tr, tc); // dV += Pᵀ dO
            __syncthreads(); // P read: dS takes its place
#pragma unroll
            for (int i = 0; i < SI; i++)
#pragma unroll
                for (int j = 0; j < SJ; j++) PS[(tr + 16 * i) * (BWD_K + 1) + tc + 16 * j] = rnd<BF16>(ds[i][j]);
            __syncthreads();
            add_product<AI, BWD_Q, D, 1, BWD_K + 1>(dK, PS, Qs, tr, tc); // dK += dSᵀ Q
        }
#pragma unroll
    for (int a = 0; a < AI; a++) {
        const int kj = k0 + tr + 16 * a;
        if (kj >= T) continue;
        float *dkr = dk + at + (int64_t)kj * ldkv, *dvr = dv + at + (int64_t)kj * ldkv;
#pragma unroll
        for (int jj = 0; jj < DJ; jj++)
            if (tc + 16 * jj < HS) dkr[tc + 16 * jj] = dK[a][jj], dvr[tc + 16 * jj] = dV[a][jj];
    }
}

template <int D, bool BF16>
__global__ static void __launch_bounds__(ATT_THREADS, 2)
    attention_backward_dq(float *dq, const float *dout, const float *lse, const float *Dv, const float *q,
                          const float *k, const float *v, int T, int NH, int NKV, int HS, float scale) {
    constexpr int SI = BWD_Q / 16, SJ = BWD_K / 16, DJ = D / 16;
    extern __shared__ float smem[];
    float *Ks = smem;                    // [BWD_K][D + 1]
    float *Vs = Ks + BWD_K * (D + 1);    // [BWD_K][D + 1]
    float *Qs = Vs + BWD_K * (D + 1);    // [BWD_Q][D + 1]
    float *dOs = Qs + BWD_Q * (D + 1);   // [BWD_Q][D + 1]
    float *Ss = dOs + BWD_Q * (D + 1);   // [BWD_Q][BWD_K + 1]: dS
    float *lse_s = Ss + BWD_Q * (BWD_K + 1), *D_s = lse_s + BWD_Q;
    const int h = blockIdx.x, b = blockIdx.y, nq = (T + BWD_Q - 1) / BWD_Q;
    const int q0 = (nq - 1 - (int)blockIdx.z) * BWD_Q; // the longest rows first
    const int tr = threadIdx.x / 16, tc = threadIdx.x % 16, g = h / (NH / NKV);
    const int64_t ldkv = (int64_t)NKV * HS, at = (int64_t)b * T * ldkv + (int64_t)g * HS;
    load_queries<D, BF16>(Qs, dOs, lse_s, D_s, q, dout, lse, Dv, b, h, q0, T, NH, HS);

    float dQ[SI][DJ]; // rows tr+16i, columns tc+16jj
#pragma unroll
    for (int i = 0; i < SI; i++)
#pragma unroll
        for (int jj = 0; jj < DJ; jj++) dQ[i][jj] = 0.0f;
    const int kend = min(T, q0 + BWD_Q);
    for (int k0 = 0; k0 < kend; k0 += BWD_K) {
        __syncthreads(); // the last tile's product is done with Ks and Ss
        load_tile<D, BF16>(Ks, BWD_K, k + at, ldkv, k0, T, HS);
        load_tile<D, BF16>(Vs, BWD_K, v + at, ldkv, k0, T, HS);
        __syncthreads();
        float p[SI][SJ], ds[SI][SJ];
        scores<D>(p, ds, Qs, dOs, Ks, Vs, lse_s, D_s, q0, k0, T, scale);
#pragma unroll
        for (int i = 0; i < SI; i++)
#pragma unroll
            for (int j = 0; j < SJ; j++) Ss[(tr + 16 * i) * (BWD_K + 1) + tc + 16 * j] = rnd<BF16>(ds[i][j]);
        __syncthreads();
        add_product<SI, BWD_K, D, BWD_K + 1, 1>(dQ, Ss, Ks, tr, tc); // dQ += dS K
    }
    const int64_t ldq = (int64_t)NH * HS;
#pragma unroll
    for (int i = 0; i < SI; i++) {
        const int qi = q0 + tr + 16 * i;
        if (qi >= T) continue;
        float *r = dq + ((int64_t)b * T + qi) * ldq + (int64_t)h * HS;
#pragma unroll
        for (int jj = 0; jj < DJ; jj++)
            if (tc + 16 * jj < HS) r[tc + 16 * jj] = dQ[i][jj];
    }
}

// ---- launches --------------------------------------------------------------------

static bool shape_ok(const char *what, int B, int T, int NH, int NKV, int HS) {
    if (NKV < 1 || NH % NKV != 0 || HS < 1 || HS > 128 || B > 65535 || (T + BWD_Q - 1) / BWD_Q > 65535) {
        keel_cuda_note_failure("%s: unsupported shape B=%d T=%d NH=%d NKV=%d HS=%d (NH a multiple of NKV, "
                               "HS 1..128)",
                               what, B, T, NH, NKV, HS);
        return false;
    }
    return true;
}

template <int D, bool BF16>
static void forward_at(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T, int NH,
                       int NKV, int HS, const char *what) {
    size_t smem = forward_smem<D>();
    keel_cuda_note(cudaFuncSetAttribute(attention_forward<D, BF16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)smem),
                   what);
    dim3 grid((unsigned)NH, (unsigned)B, (unsigned)((T + FWD_Q - 1) / FWD_Q));
    attention_forward<D, BF16><<<grid, ATT_THREADS, smem>>>(out, lse, q, k, v, T, NH, NKV, HS,
                                                           1.0f / sqrtf((float)HS));
    keel_cuda_note(cudaGetLastError(), what);
}

template <bool BF16>
static void forward(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T, int NH,
                    int NKV, int HS) {
    const char *what = BF16 ? "attention_forward_bf16" : "attention_forward";
    if (B <= 0 || T <= 0 || NH <= 0 || !shape_ok(what, B, T, NH, NKV, HS)) return;
    if (HS <= 32) forward_at<32, BF16>(out, lse, q, k, v, B, T, NH, NKV, HS, what);
    else if (HS <= 64) forward_at<64, BF16>(out, lse, q, k, v, B, T, NH, NKV, HS, what);
    else forward_at<128, BF16>(out, lse, q, k, v, B, T, NH, NKV, HS, what);
}

// D's scratch, (B, NH, T) floats, grown when a call needs more; attention_tc.cu's
// backward shares it (keel_cuda_attention_rowdot)
static float *g_dot;
static size_t g_dot_floats;

float *keel_cuda_attention_rowdot(const float *dout, const float *out, int B, int T, int NH, int HS, bool bf16,
                                  const char *what) {
    const int64_t rows = (int64_t)B * T * NH;
    if ((size_t)rows > g_dot_floats) {
        if (g_dot) keel_cuda_note(cudaFree(g_dot), what); // in order after the kernels that read it
        g_dot = NULL, g_dot_floats = 0;
        cudaError_t e = cudaMalloc((void **)&g_dot, (size_t)rows * sizeof(float));
        if (e != cudaSuccess) {
            g_dot = NULL;
            keel_cuda_note(e, "cudaMalloc of attention backward's rowsum(dO * O) scratch");
            return NULL;
        }
        g_dot_floats = (size_t)rows;
    }
    const int per_block = ATT_THREADS / 32;
    const unsigned blocks = (unsigned)((rows + per_block - 1) / per_block);
    if (bf16) attention_dot<true><<<blocks, ATT_THREADS>>>(g_dot, dout, out, rows, T, NH, HS);
    else attention_dot<false><<<blocks, ATT_THREADS>>>(g_dot, dout, out, rows, T, NH, HS);
    keel_cuda_note(cudaGetLastError(), what);
    return g_dot;
}

template <int D, bool BF16>
static void backward_at(float *dq, float *dk, float *dv, const float *dout, const float *lse, const float *q,
                        const float *k, const float *v, int B, int T, int NH, int NKV, int HS, const char *what) {
    size_t smem = backward_smem<D>();
    float scale = 1.0f / sqrtf((float)HS);
    keel_cuda_note(cudaFuncSetAttribute(attention_backward_dkdv<D, BF16>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                   what);
    keel_cuda_note(cudaFuncSetAttribute(attention_backward_dq<D, BF16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)smem),
                   what);
    dim3 kv_grid((unsigned)NKV, (unsigned)B, (unsigned)((T + BWD_K - 1) / BWD_K));
    attention_backward_dkdv<D, BF16><<<kv_grid, ATT_THREADS, smem>>>(dk, dv, dout, lse, g_dot, q, k, v, T, NH, NKV,
                                                                     HS, scale);
    keel_cuda_note(cudaGetLastError(), what);
    dim3 q_grid((unsigned)NH, (unsigned)B, (unsigned)((T + BWD_Q - 1) / BWD_Q));
    attention_backward_dq<D, BF16><<<q_grid, ATT_THREADS, smem>>>(dq, dout, lse, g_dot, q, k, v, T, NH, NKV, HS,
                                                                  scale);
    keel_cuda_note(cudaGetLastError(), what);
}

template <bool BF16>
static void backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                     const float *q, const float *k, const float *v, int B, int T, int NH, int NKV, int HS) {
    const char *what = BF16 ? "attention_backward_bf16" : "attention_backward";
    if (B <= 0 || T <= 0 || NH <= 0 || !shape_ok(what, B, T, NH, NKV, HS)) return;
    if (!keel_cuda_attention_rowdot(dout, out, B, T, NH, HS, BF16, what)) return;
    if (HS <= 32) backward_at<32, BF16>(dq, dk, dv, dout, lse, q, k, v, B, T, NH, NKV, HS, what);
    else if (HS <= 64) backward_at<64, BF16>(dq, dk, dv, dout, lse, q, k, v, B, T, NH, NKV, HS, what);
    else backward_at<128, BF16>(dq, dk, dv, dout, lse, q, k, v, B, T, NH, NKV, HS, what);
}

extern "C" void keel_cuda_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                                            int B, int T, int NH, int NKV, int HS) {
    forward<false>(out, lse, q, k, v, B, T, NH, NKV, HS);
}

extern "C" void keel_cuda_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                             const float *lse, const float *q, const float *k, const float *v, int B,
                                             int T, int NH, int NKV, int HS) {
    backward<false>(dq, dk, dv, dout, out, lse, q, k, v, B, T, NH, NKV, HS);
}

extern "C" void keel_cuda_attention_forward_bf16_simt(float *out, float *lse, const float *q, const float *k,
                                                      const float *v, int B, int T, int NH, int NKV, int HS) {
    forward<true>(out, lse, q, k, v, B, T, NH, NKV, HS);
}

extern "C" void keel_cuda_attention_backward_bf16_simt(float *dq, float *dk, float *dv, const float *dout,
                                                       const float *out, const float *lse, const float *q,
                                                       const float *k, const float *v, int B, int T, int NH, int NKV,
                                                       int HS) {
    backward<true>(dq, dk, dv, dout, out, lse, q, k, v, B, T, NH, NKV, HS);
}
