/* backend/passthrough.h: the calls a wrapping backend (fenced.c, profiled.c)
 * passes on as they are, as X-macro lists. */
#ifndef KEEL_BACKEND_PASSTHROUGH_H
#define KEEL_BACKEND_PASSTHROUGH_H

#include "keel/backend.h"

/* The backend's calls that a wrapper passes on with their arguments
 * unchanged, as X(name, parameters, arguments): the GEMMs and attention
 * (which do the FLOPs), the other kernels and the copies, and the two that
 * return a double to the host. */
#define KEEL_ATT_FWD_PARAMS                                                                                            \
    (float *o, float *l, const float *q, const float *k, const float *v, const int32_t *ks, int B, int T, int NH, int NKV, \
     int HS)
#define KEEL_ATT_BWD_PARAMS                                                                                            \
    (float *dq, float *dk, float *dv, const float *dy, const float *o, const float *l, const float *q, const float *k,  \
     const float *v, const int32_t *ks, int B, int T, int NH, int NKV, int HS)
#define KEEL_BACKEND_FLOP_CALLS(X)                                                                                     \
    X(matmul_forward, (float *o, const float *i, const float *w, int M, int N, int K, bool acc),                       \
      (o, i, w, M, N, K, acc))                                                                                         \
    X(matmul_backward,                                                                                                 \
      (float *di, float *dw, const float *dy, const float *i, const float *w, int M, int N, int K, bool acc),          \
      (di, dw, dy, i, w, M, N, K, acc))                                                                                \
    X(gemm_bf16, (float *o, const keel_bf16 *a, bool at, const keel_bf16 *b, bool bt, int M, int N, int K, bool acc),  \
      (o, a, at, b, bt, M, N, K, acc))                                                                                 \
    X(matmul_few_rows, (float *o, const float *i, const float *w, int M, int N, int K, bool acc),                      \
      (o, i, w, M, N, K, acc))                                                                                         \
    X(matmul_few_rows_bf16, (float *o, const keel_bf16 *i, const keel_bf16 *w, int M, int N, int K, bool acc),         \
      (o, i, w, M, N, K, acc))                                                                                         \
    X(attention_forward, KEEL_ATT_FWD_PARAMS, (o, l, q, k, v, ks, B, T, NH, NKV, HS))                                 \
    X(attention_forward_bf16, KEEL_ATT_FWD_PARAMS, (o, l, q, k, v, ks, B, T, NH, NKV, HS))                            \
    X(attention_backward, KEEL_ATT_BWD_PARAMS, (dq, dk, dv, dy, o, l, q, k, v, ks, B, T, NH, NKV, HS))                \
    X(attention_backward_bf16, KEEL_ATT_BWD_PARAMS, (dq, dk, dv, dy, o, l, q, k, v, ks, B, T, NH, NKV, HS))
#define KEEL_BACKEND_OTHER_CALLS(X)                                                                                    \
    X(zero, (void *p, size_t n), (p, n))                                                                               \
    X(copy, (void *d, const void *s, size_t n), (d, s, n))                                                             \
    X(to_device, (void *d, const void *s, size_t n), (d, s, n))                                                        \
    X(to_host, (void *d, const void *s, size_t n), (d, s, n))                                                          \
    X(f32_to_bf16, (keel_bf16 *d, const float *s, int64_t n), (d, s, n))                                              \
    X(bf16_to_f32, (float *d, const keel_bf16 *s, int64_t n), (d, s, n))                                               \
    X(rmsnorm_forward, (float *o, float *r, const float *x, const float *w, int N, int C, float eps),                  \
      (o, r, x, w, N, C, eps))                                                                                         \
    X(rmsnorm_backward,                                                                                                \
      (float *dx, float *dw, const float *dy, const float *x, const float *w, const float *r, int N, int C),           \
      (dx, dw, dy, x, w, r, N, C))                                                                                     \
    X(rope_forward, (float *x, const float *cs, int B, int T, int H, int HS), (x, cs, B, T, H, HS))                    \
    X(rope_backward, (float *x, const float *cs, int B, int T, int H, int HS), (x, cs, B, T, H, HS))                   \
    X(rope_at, (float *x, const float *cs, const int32_t *p, int N, int H, int HS), (x, cs, p, N, H, HS))             \
    X(attention_cached,                                                                                                \
      (float *o, const float *q, const float *k, const float *v, float *kc, float *vc, const int32_t *s,               \
       const int32_t *p, int N, int NH, int NKV, int HS, int TM),                                                      \
      (o, q, k, v, kc, vc, s, p, N, NH, NKV, HS, TM))                                                                  \
    X(attention_cached_bf16,                                                                                           \
      (float *o, const float *q, const float *k, const float *v, keel_bf16 *kc, keel_bf16 *vc, const int32_t *s,       \
       const int32_t *p, int N, int NH, int NKV, int HS, int TM),                                                      \
      (o, q, k, v, kc, vc, s, p, N, NH, NKV, HS, TM))                                                                  \
    X(swiglu_forward, (float *h, const float *g, const float *u, int64_t n), (h, g, u, n))                             \
    X(swiglu_backward, (float *dg, float *du, const float *dh, const float *g, const float *u, int64_t n),             \
      (dg, du, dh, g, u, n))                                                                                           \
    X(embedding_forward, (float *o, const float *t, const int32_t *tok, int N, int C), (o, t, tok, N, C))              \
    X(embedding_forward_bf16, (float *o, const keel_bf16 *t, const int32_t *tok, int N, int C), (o, t, tok, N, C))     \
    X(embedding_backward, (float *dt, const float *dy, const int32_t *tok, int N, int C), (dt, dy, tok, N, C))         \
    X(adamw_update, (float *p, const float *g, float *m, float *v, int64_t n, const keel_adamw_step *s),               \
      (p, g, m, v, n, s))                                                                                              \
    X(accumulate, (float *d, const float *s, int64_t n), (d, s, n))                                                    \
    X(accumulate_bf16, (float *d, const keel_bf16 *s, int64_t n), (d, s, n))                                          \
    X(scale_masked, (float *o, const float *x, int64_t n, float m, float p, uint64_t k, bool acc),                     \
      (o, x, n, m, p, k, acc))
#define KEEL_BACKEND_DOUBLE_CALLS(X)                                                                                   \
    X(xent_forward_backward, (float *logits, const int32_t *targets, int N, int V, float dscale),                      \
      (logits, targets, N, V, dscale))                                                                                 \
    X(sumsq, (const float *x, int64_t n), (x, n))

#endif
