/* kernels: the math of one Llama 2 layer, fast and reference versions.
 *
 * Letters used for shapes everywhere in keel:
 *   B batch (sequences), T sequence length, N = B*T rows, C model dim,
 *   NH query heads, NKV key/value heads, HS head size, F SwiGLU hidden size,
 *   V vocabulary, L layers.
 * Matrices are row-major; weights are (out, in) as in PyTorch/Hugging Face.
 *
 * Fast versions use OpenBLAS sgemm and keel's thread pool; every other kernel
 * also has a keel_ref_* version written plainly (double accumulation) that the
 * tests compare against. Call keel_kernels_init once before use.
 */
#ifndef KEEL_KERNELS_H
#define KEEL_KERNELS_H

#include "keel/core.h"

/* Set BLAS and pool threads (0 = all cores). Returns the thread count used. */
int keel_kernels_init(int threads);
void keel_kernels_shutdown(void);

/* ---- instruction sets (isa.c) ---------------------------------------------
 * keel is compiled for x86-64-v3 (AVX2 + FMA); every wider path is chosen at
 * run time from what the CPU and OS offer, capped by the environment variable
 * KEEL_MAX_ISA=avx2|avx512|avx512_bf16|amx (an unknown value is ignored with
 * a warning). The cap also caps oneDNN (dnnl_set_max_cpu_isa, before its
 * first use); OpenBLAS chooses its kernels when loaded, so a cap below
 * AVX-512 wants OPENBLAS_CORETYPE=Haswell beside it (warned about). */
typedef enum {
    KEEL_ISA_AVX2,        /* AVX2 + FMA: the baseline, 256-bit */
    KEEL_ISA_AVX512,      /* + AVX-512 F, DQ, BW, VL */
    KEEL_ISA_AVX512_BF16, /* + AVX512_BF16 (VDPBF16PS): native bf16 GEMMs */
    KEEL_ISA_AMX,         /* + AMX-TILE, AMX-BF16 (with the kernel's permission) */
} keel_isa;
/* What this CPU and its OS support. */
keel_isa keel_isa_cpu(void);
/* What the kernels use: keel_isa_cpu() capped by KEEL_MAX_ISA. */
keel_isa keel_isa_active(void);
/* "avx2", "avx512", "avx512_bf16", "amx"; keel_isa_parse is its inverse
 * (case-insensitive), false for anything else. */
const char *keel_isa_name(keel_isa isa);
bool keel_isa_parse(const char *name, keel_isa *out);

/* ---- the MFU yardstick (peak.c) --------------------------------------------
 * The FLOP/s this rank's keel_kernels_init threads can do in the precision
 * the GEMMs run in (bf16: only where bf16 GEMMs run on bf16 instructions,
 * else they are fp32 GEMMs): the higher of (a) one core's best of five ~10 ms
 * runs of a kernel on the instruction set the GEMMs use — AVX2 FMA with
 * 32-byte vectors, AVX-512 FMA, VDPBF16PS or AMX TDPBF16PS — times the thread
 * count, and (b) the GEMM library's own best rate over a few large GEMMs on
 * all threads. KEEL_PEAK_FLOPS (FLOP/s, all threads) overrides it. Measured
 * once per machine and cached in $XDG_CACHE_HOME/keel/peak.json (else
 * ~/.cache/keel), keyed by CPU, instruction set, cap, threads and precision; a
 * damaged cache is ignored and rewritten. Call after keel_kernels_init. */
double keel_peak_flops(bool bf16);
/* A step of `ranks` ranks just ran at achieved FLOP/s against the yardstick
 * peak (FLOP/s of all ranks). Returns peak when achieved <= peak; otherwise
 * the yardstick was wrong (measured while the machine was busy, a stale
 * cache): measures again (the first time only), logs it once, caches the
 * result and returns max(remeasured, achieved), so that MFU never exceeds 1. */
double keel_peak_revise(double peak, double achieved, int ranks, bool bf16);
/* The parts of the measurement, per rank, without cache or override: the
 * instruction-set kernel (one core x threads) and the library's GEMMs (all
 * threads). For tests and benchmarks. */
double keel_peak_kernel_flops(bool bf16);
double keel_peak_library_flops(bool bf16);

/* ---- GEMM (OpenBLAS) ------------------------------------------------------ */
/* out (M,N) = in (M,K) · w (N,K)ᵀ, plus out if accumulate. */
void keel_matmul_forward(float *out, const float *in, const float *w, int M, int N, int K,
                         bool accumulate);
/* d_in (M,K) = d_out (M,N) · w (N,K) (plus d_in if accumulate_in; skipped if
 * d_in is NULL); d_w (N,K) += d_outᵀ · in (always accumulates; skipped if d_w
 * is NULL: a frozen weight). */
void keel_matmul_backward(float *d_in, float *d_w, const float *d_out, const float *in,
                          const float *w, int M, int N, int K, bool accumulate_in);

/* ---- GEMMs of a few rows (generation's decode steps; gemm_few_rows.c) -----
 * out (M,N) = in (M,K) · w (N,K)ᵀ, plus out if accumulate — keel_matmul_forward's
 * contract, for a small M (one row per sequence of a decode step): each pool
 * thread streams its share of w's rows from memory once, for all M rows,
 * where sgemm would first copy (pack) all of w. Any M is correct; sgemm is
 * faster from a few tens of rows on. fp32 sums whose order depends on K only:
 * a row's result is the same whatever M, the thread count or the rows beside
 * it. The _bf16 form: in and w in bf16, products exact and summed in fp32 (as
 * keel_gemm_bf16(out, in, false, w, true, ...), up to the order of the sums).
 * Training uses keel_matmul_forward and keel_gemm_bf16, never these. */
void keel_matmul_few_rows(float *out, const float *in, const float *w, int M, int N, int K, bool accumulate);
void keel_matmul_few_rows_bf16(float *out, const keel_bf16 *in, const keel_bf16 *w, int M, int N, int K,
                               bool accumulate);
/* Free the bf16 form's widened input (keel_kernels_shutdown). */
void keel_matmul_few_rows_release(void);

/* ---- bf16 GEMM ------------------------------------------------------------
 * bf16 inputs, fp32 accumulation and output: the GEMMs of fsdp.mixed_precision
 * "bf16". Runs on keel's pool like the fp32 GEMMs: oneDNN's matmul where the
 * active instruction set has bf16 (AVX512_BF16 or AMX) and oneDNN agrees;
 * elsewhere an emulation with the same semantics (gemm_bf16_emulated.c: the
 * bf16 operands widened to fp32, exactly, and multiplied by OpenBLAS sgemm
 * with fp32 sums). Either way it never fails for a missing instruction.
 * Like every kernel, called from one thread at a time. */
/* True when bf16 GEMMs run on bf16 instructions here; *path (if not NULL)
 * names the path: "oneDNN AMX", "oneDNN AVX512_BF16", or "emulated ..." with
 * the reason. */
bool keel_bf16_native(const char **path);
/* out (M,N) = a · b, plus out if accumulate. a is (M,K) row-major, or with
 * a_t stored as (K,M); b is (K,N) row-major, or with b_t stored as (N,K). */
void keel_gemm_bf16(float *out, const keel_bf16 *a, bool a_t, const keel_bf16 *b, bool b_t, int M,
                    int N, int K, bool accumulate);
/* Free oneDNN's primitives, streams and scratchpads (keel_kernels_shutdown). */
void keel_gemm_bf16_release(void);

/* ---- RMSNorm: out = x / sqrt(mean(x²) + eps) * w ------------------------- */
void keel_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int C,
                          float eps);
/* dx (N,C) += ..., dw (C) += ... (dw NULL: a frozen weight, skipped) */
void keel_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x,
                           const float *w, const float *rstd, int N, int C);
void keel_ref_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N,
                              int C, float eps);
void keel_ref_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x,
                               const float *w, const float *rstd, int N, int C);

/* ---- RoPE, Hugging Face rotate-half layout --------------------------------
 * x (B,T,H,HS) rotated in place: pair (i, i+HS/2) of position t by angle
 * t * theta^(-2i/HS). cos_sin is (T, HS/2, 2) from keel_rope_table. */
void keel_rope_table(float *cos_sin, int T, int HS, double theta, const keel_rope_scaling *scaling);
/* RoPE's inverse frequency of pair i < HS/2: theta^(-2i/HS), then, when
 * scaling is on (NULL or .on false: none), Llama 3's rule as transformers
 * applies it (_compute_llama3_parameters): with wavelength w = 2 pi / f and
 * L = original_max_position_embeddings, f is kept when w < L / high_freq_factor,
 * divided by factor when w > L / low_freq_factor, and in between blended,
 * (1 - s) f / factor + s f with s = (L / w - low) / (high - low). In float, as
 * transformers computes it. */
float keel_rope_inv_freq(int i, int HS, double theta, const keel_rope_scaling *scaling);
void keel_rope_forward(float *x, const float *cos_sin, int B, int T, int H, int HS);
/* The same for N rows of H heads at any positions: row i by pos[i] (generation). */
void keel_rope_at(float *x, const float *cos_sin, const int32_t *pos, int N, int H, int HS);
/* The gradient of a rotation is the inverse rotation, in place on dx. */
void keel_rope_backward(float *dx, const float *cos_sin, int B, int T, int H, int HS);
void keel_ref_rope_forward(float *x, int B, int T, int H, int HS, double theta);

/* ---- causal attention with grouped-query heads (flash-style) --------------
 * q (B,T,NH*HS), k and v (B,T,NKV*HS), out (B,T,NH*HS); query head h reads kv
 * head h / (NH/NKV). Computed a tile of queries x keys at a time with an
 * online softmax (FlashAttention-2): the (T,T) probabilities are never stored.
 * lse (B,NH,T) gets each query's log-sum-exp of its scaled scores
 * (log Σ_j exp(q·k_j / sqrt(HS)) over the keys it sees), which is all that
 * backward needs beside out. kv_start (B, T), or NULL: document masking —
 * query t of sequence b sees keys [kv_start[b*T + t], t] only (0 <=
 * kv_start <= t: the first token of its document), so packed documents do
 * not attend to each other. Scratch: a few tiles per pool thread
 * (keel_attention_workspace_bytes), allocated on first use and kept. */
void keel_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                            const int32_t *kv_start, int B, int T, int NH, int NKV, int HS);
/* dq, dk, dv overwritten, from dout and forward's out and lse (the
 * probabilities are recomputed tile by tile). */
void keel_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                             const float *lse, const float *q, const float *k, const float *v,
                             const int32_t *kv_start, int B, int T, int NH, int NKV, int HS);
/* The same with bf16 product inputs and fp32 sums (fsdp.mixed_precision bf16):
 * q, k, v, dout, the probabilities and the softmax gradient are rounded to
 * bf16 as inputs of the tiles' products; the softmax, its backward, out and
 * lse stay fp32. An AVX512_BF16 microkernel where the active instruction set
 * has it; elsewhere the same roundings into fp32 operands of OpenBLAS sgemm. */
void keel_attention_forward_bf16(float *out, float *lse, const float *q, const float *k,
                                 const float *v, const int32_t *kv_start, int B, int T, int NH, int NKV,
                                 int HS);
void keel_attention_backward_bf16(float *dq, float *dk, float *dv, const float *dout,
                                  const float *out, const float *lse, const float *q, const float *k,
                                  const float *v, const int32_t *kv_start, int B, int T, int NH, int NKV,
                                  int HS);
/* Attention for generation, against a KV cache: kcache and vcache are (S,
 * NKV, T_max, HS), S sequences of up to T_max positions, each kv head's
 * positions one after another (a decode row reads them as one stream, where
 * rows of NKV*HS put a 4 KiB page between every position or two of a head:
 * attention was 11% of a bf16 decode token that way). Row i of N new rows
 * is sequence seq[i]'s position pos[i]: its k and v rows (NKV*HS) are stored
 * at that place first (every row's before any row attends), then its query
 * heads (q row i, NH*HS) attend causally to the sequence's positions
 * 0..pos[i], which must all be in the cache by then. out (N, NH*HS). fp32,
 * an online softmax over tiles of keys: no scores are stored. */
void keel_attention_cached(float *out, const float *q, const float *k, const float *v, float *kcache, float *vcache,
                           const int32_t *seq, const int32_t *pos, int N, int NH, int NKV, int HS, int T_max);
/* The same with the cache in bf16: k and v rounded to bf16 as they are
 * stored; scores and sums fp32. */
void keel_attention_cached_bf16(float *out, const float *q, const float *k, const float *v, keel_bf16 *kcache,
                                keel_bf16 *vcache, const int32_t *seq, const int32_t *pos, int N, int NH, int NKV,
                                int HS, int T_max);
/* Bytes of scratch the attention keeps for `threads` pool threads: tiles
 * and one kv head's K and V, (T, HS) each, per thread. */
int64_t keel_attention_workspace_bytes(int T, int HS, int threads, bool bf16);
/* Free the attention's scratch (keel_kernels_shutdown). */
void keel_attention_release(void);
/* The plain O(T²) reference: att (B,NH,T,T) gets the probabilities (0 above
 * the diagonal, and before kv_start's key when given) and lse (B,NH,T) the
 * log-sum-exp, both from double sums. */
void keel_ref_attention_forward(float *out, float *att, float *lse, const float *q, const float *k,
                                const float *v, const int32_t *kv_start, int B, int T, int NH, int NKV,
                                int HS);
void keel_ref_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                                 const float *q, const float *k, const float *v,
                                 const float *att, int B, int T, int NH, int NKV, int HS);

/* ---- SwiGLU: h = silu(gate) * up, all (N,F) ------------------------------ */
void keel_swiglu_forward(float *h, const float *gate, const float *up, int64_t n);
/* dgate, dup overwritten. */
void keel_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate,
                          const float *up, int64_t n);
void keel_ref_swiglu_forward(float *h, const float *gate, const float *up, int64_t n);
void keel_ref_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate,
                              const float *up, int64_t n);

/* ---- token embedding (embedding.c) -----------------------------------------
 * out row i = table row tokens[i], N rows of C, from an fp32 or a bf16 table. */
void keel_embedding_forward(float *out, const float *table, const int32_t *tokens, int N, int C);
void keel_embedding_forward_bf16(float *out, const keel_bf16 *table, const int32_t *tokens, int N, int C);
/* dtable row tokens[i] += dout row i for i = 0, 1, ..., N-1 in that order, so
 * repeated tokens add up in the same order every run. */
void keel_embedding_backward(float *dtable, const float *dout, const int32_t *tokens, int N, int C);

/* ---- softmax cross-entropy ------------------------------------------------
 * logits (N,V), targets (N). Returns the summed loss over the N rows (double).
 * If dscale != 0, logits are overwritten with dloss/dlogits * dscale, i.e.
 * (softmax - onehot) * dscale. A negative target is ignored (a masked one):
 * its row adds no loss and its gradient row is 0. */
double keel_xent_forward_backward(float *logits, const int32_t *targets, int N, int V,
                                  float dscale);
double keel_ref_xent_forward_backward(float *logits, const int32_t *targets, int N, int V,
                                      float dscale);

/* ---- AdamW (decoupled weight decay), one tensor or shard ------------------
 * step t >= 1 for bias correction; decay is lr * weight_decay * param; the
 * gradient is multiplied by grad_scale first (clipping, fused: one pass). */
typedef struct {
    float lr, beta1, beta2, eps, weight_decay, grad_scale;
    int64_t t;
} keel_adamw_step;
void keel_adamw_update(float *param, const float *grad, float *m, float *v, int64_t n,
                       const keel_adamw_step *s);
void keel_ref_adamw_update(float *param, const float *grad, float *m, float *v, int64_t n,
                           const keel_adamw_step *s);
/* Sum of squares (double accumulation) for the global gradient norm. */
double keel_sumsq(const float *x, int64_t n);

/* ---- whole-buffer passes (passes.c): on the pool, the compute thread's only ---- */
/* dst[i] += src[i] (an fp32 or a bf16 src): a reduce-scatter's result added
 * into a gradient shard. One fp32 add per element, so any order of elements
 * gives the same bits. */
void keel_accumulate(float *dst, const float *src, int64_t n);
void keel_accumulate_bf16(float *dst, const keel_bf16 *src, int64_t n);
/* memset(dst, 0, bytes) and memmove(dst, src, bytes) on the pool's threads. */
void keel_zero(void *dst, size_t bytes);
void keel_copy(void *dst, const void *src, size_t bytes);
/* keel_bf16_from_float / keel_bf16_to_float (core.h) over arrays. */
void keel_f32_to_bf16(keel_bf16 *dst, const float *src, int64_t n);
void keel_bf16_to_f32(float *dst, const keel_bf16 *src, int64_t n);

/* ---- LoRA's scale and dropout (scale_masked.c) ------------------------------
 * out[i] = keep(i) ? mult · x[i] : 0, plus out[i]'s old value when
 * accumulate; out may be x. keep(i) is false with probability p: element i's
 * 53-bit draw, splitmix64 of (key, i), below p · 2^53 drops it — the same
 * mask for any slice, thread count or device; p = 0 keeps every element. */
void keel_scale_masked(float *out, const float *x, int64_t n, float mult, float p, uint64_t key, bool accumulate);
static inline uint64_t keel_mask_threshold(float p) {
    return p <= 0 ? 0 : (uint64_t)((double)p * 9007199254740992.0);
}
static inline bool keel_mask_keeps(uint64_t key, int64_t i, uint64_t drop_below) {
    return keel_hash64(key + 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1)) >> 11 >= drop_below;
}

#endif
