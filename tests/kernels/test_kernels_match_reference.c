/* Every fast kernel against its plain reference, on shapes with ragged tails
 * (C not a multiple of 16, T not a multiple of the chunking) and 1 and 2 threads. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/kernels.h"

#include "../testlib.h"

static uint64_t rng = 88172645463325252ull;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}
static float *rand_vec(int64_t n, float scale) {
    float *x = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = frand() * scale;
    return x;
}
static float *copy(const float *x, int64_t n) {
    float *y = malloc(sizeof(float) * (size_t)n);
    memcpy(y, x, sizeof(float) * (size_t)n);
    return y;
}

static void compare(const char *what, const float *got, const float *want, int64_t n, double tol) {
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    for (int64_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]) / (scale + 1e-30);
        worst = testlib_worst(worst, err);
    }
    EXPECT(worst <= tol, "%-28s n=%-8lld max_err/max|ref|=%.2e (tol %.0e)", what, (long long)n, worst, tol);
}

static void test_rmsnorm(void) {
    int N = 67, C = 100;
    float *x = rand_vec((int64_t)N * C, 2), *w = rand_vec(C, 1), *dy = rand_vec((int64_t)N * C, 1);
    float *o1 = calloc((size_t)N * C, 4), *o2 = calloc((size_t)N * C, 4), *r1 = calloc(N, 4), *r2 = calloc(N, 4);
    keel_rmsnorm_forward(o1, r1, x, w, N, C, 1e-5f);
    keel_ref_rmsnorm_forward(o2, r2, x, w, N, C, 1e-5f);
    compare("rmsnorm forward", o1, o2, (int64_t)N * C, 1e-6);
    float *dx1 = rand_vec((int64_t)N * C, 1), *dx2 = copy(dx1, (int64_t)N * C);
    float *dw1 = rand_vec(C, 1), *dw2 = copy(dw1, C);
    keel_rmsnorm_backward(dx1, dw1, dy, x, w, r2, N, C);
    keel_ref_rmsnorm_backward(dx2, dw2, dy, x, w, r2, N, C);
    compare("rmsnorm backward dx", dx1, dx2, (int64_t)N * C, 1e-6);
    compare("rmsnorm backward dw", dw1, dw2, C, 1e-5);
    free(x); free(w); free(dy); free(o1); free(o2); free(r1); free(r2); free(dx1); free(dx2); free(dw1); free(dw2);
}

static void test_rope(void) {
    int B = 2, T = 37, H = 3, HS = 10;
    int64_t n = (int64_t)B * T * H * HS;
    float *x = rand_vec(n, 1), *a = copy(x, n), *b = copy(x, n);
    float *cs = malloc(sizeof(float) * (size_t)T * HS);
    keel_rope_table(cs, T, HS, 10000.0, NULL);
    keel_rope_forward(a, cs, B, T, H, HS);
    keel_ref_rope_forward(b, B, T, H, HS, 10000.0);
    compare("rope forward", a, b, n, 1e-5);
    keel_rope_backward(a, cs, B, T, H, HS); /* inverse rotation restores x */
    compare("rope backward(forward(x))", a, x, n, 1e-6);
    free(x); free(a); free(b); free(cs);
}

/* Document masking's kv_start (B, T): each position's document's first
 * position. Sequence 0: documents of 1 to 60 tokens and ones starting at a
 * key tile's first key (256) and a query block's (640); sequence 1: a document
 * from before the row and one from position 300 on (so the query blocks past
 * 384 skip key tile 0 whole). */
static int32_t *doc_starts(int B, int T) {
    int32_t *ks = malloc(sizeof(int32_t) * (size_t)B * T);
    uint64_t x = 12345;
    for (int b = 0; b < B; b++)
        for (int t = 0, from = 0; t < T; t++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            bool start = b == 0 ? (x >> 33) % 30 == 0 || t == 256 || t == 640 : t == 300;
            if (start) from = t;
            ks[(int64_t)b * T + t] = from;
        }
    return ks;
}

/* Flash attention (tiles of 128 queries x 256 keys, online softmax) against
 * the O(T²) reference: T below, at and past one tile, ragged last tiles,
 * grouped-query heads, with document masking or without. Backward reads
 * forward's own out and lse, as the model does, and must overwrite dq, dk,
 * dv (they start as garbage). */
static void test_attention(int T, int NH, int NKV, bool docs) {
    int B = 2, HS = 12;
    int32_t *ks = docs ? doc_starts(B, T) : NULL;
    int64_t nq = (int64_t)B * T * NH * HS, nkv = (int64_t)B * T * NKV * HS, na = (int64_t)B * NH * T * T;
    int64_t nl = (int64_t)B * NH * T;
    float *q = rand_vec(nq, 1), *k = rand_vec(nkv, 1), *v = rand_vec(nkv, 1), *dout = rand_vec(nq, 1);
    float *o1 = calloc(nq, 4), *o2 = calloc(nq, 4), *att = calloc(na, 4);
    float *l1 = calloc(nl, 4), *l2 = calloc(nl, 4);
    keel_attention_forward(o1, l1, q, k, v, ks, B, T, NH, NKV, HS);
    keel_ref_attention_forward(o2, att, l2, q, k, v, ks, B, T, NH, NKV, HS);
    char what[80];
    snprintf(what, sizeof what, "attention fwd T=%d NH=%d NKV=%d%s", T, NH, NKV, docs ? " documents" : "");
    compare(what, o1, o2, nq, 1e-5);
    compare("attention log-sum-exp", l1, l2, nl, 1e-5);
    float *dq1 = rand_vec(nq, 9), *dq2 = calloc(nq, 4), *dk1 = rand_vec(nkv, 9), *dk2 = calloc(nkv, 4);
    float *dv1 = rand_vec(nkv, 9), *dv2 = calloc(nkv, 4);
    keel_attention_backward(dq1, dk1, dv1, dout, o1, l1, q, k, v, ks, B, T, NH, NKV, HS);
    keel_ref_attention_backward(dq2, dk2, dv2, dout, q, k, v, att, B, T, NH, NKV, HS);
    compare("attention backward dq", dq1, dq2, nq, 1e-5);
    compare("attention backward dk", dk1, dk2, nkv, 1e-5);
    compare("attention backward dv", dv1, dv2, nkv, 1e-5);
    free(q); free(k); free(v); free(dout); free(o1); free(o2); free(att); free(l1); free(l2);
    free(dq1); free(dq2); free(dk1); free(dk2); free(dv1); free(dv2); free(ks);
}

static void test_swiglu(void) {
    int64_t n = 10007;
    float *g = rand_vec(n, 4), *u = rand_vec(n, 2), *dh = rand_vec(n, 1);
    float *h1 = calloc(n, 4), *h2 = calloc(n, 4), *dg1 = calloc(n, 4), *dg2 = calloc(n, 4);
    float *du1 = calloc(n, 4), *du2 = calloc(n, 4);
    keel_swiglu_forward(h1, g, u, n);
    keel_ref_swiglu_forward(h2, g, u, n);
    compare("swiglu forward", h1, h2, n, 1e-6);
    keel_swiglu_backward(dg1, du1, dh, g, u, n);
    keel_ref_swiglu_backward(dg2, du2, dh, g, u, n);
    compare("swiglu backward dgate", dg1, dg2, n, 1e-6);
    compare("swiglu backward dup", du1, du2, n, 1e-6);
    free(g); free(u); free(dh); free(h1); free(h2); free(dg1); free(dg2); free(du1); free(du2);
}

static void test_xent(void) {
    int N = 45, V = 1001;
    float *z = rand_vec((int64_t)N * V, 8), *z1 = copy(z, (int64_t)N * V), *z2 = copy(z, (int64_t)N * V);
    int32_t *y = malloc(sizeof(int32_t) * N);
    for (int i = 0; i < N; i++) y[i] = (int32_t)((i * 7919) % V);
    double l1 = keel_xent_forward_backward(z1, y, N, V, 0.25f);
    double l2 = keel_ref_xent_forward_backward(z2, y, N, V, 0.25f);
    float fl1 = (float)l1, fl2 = (float)l2;
    compare("cross-entropy loss", &fl1, &fl2, 1, 1e-6);
    compare("cross-entropy dlogits", z1, z2, (int64_t)N * V, 1e-6);
    free(z); free(z1); free(z2); free(y);
}

static void test_adamw(void) {
    int64_t n = 70001;
    float *p1 = rand_vec(n, 1), *p2 = copy(p1, n), *g = rand_vec(n, 0.1f);
    float *m1 = calloc(n, 4), *m2 = calloc(n, 4), *v1 = calloc(n, 4), *v2 = calloc(n, 4);
    for (int t = 1; t <= 3; t++) {
        keel_adamw_step s = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                             .weight_decay = 0.1f, .grad_scale = 0.5f, .t = t};
        keel_adamw_update(p1, g, m1, v1, n, &s);
        keel_ref_adamw_update(p2, g, m2, v2, n, &s);
    }
    compare("adamw params (3 steps)", p1, p2, n, 1e-6);
    compare("adamw v", v1, v2, n, 1e-6);
    /* The vector path (aligned, streaming stores) and the scalar edges give the
     * same bits: updating [0, k) and [k, n) separately equals one update. */
    float *pa = keel_xmalloc(4 * (size_t)n, "p"), *ma = keel_xcalloc(4 * (size_t)n, "m");
    float *va = keel_xcalloc(4 * (size_t)n, "v"), *ga = keel_xmalloc(4 * (size_t)n, "g");
    float *pb = keel_xmalloc(4 * (size_t)n, "p"), *mb = keel_xcalloc(4 * (size_t)n, "m");
    float *vb = keel_xcalloc(4 * (size_t)n, "v");
    memcpy(pa, p1, 4 * (size_t)n), memcpy(pb, p1, 4 * (size_t)n), memcpy(ga, g, 4 * (size_t)n);
    for (int64_t i = 0; i < n; i++) { /* mid-run optimizer state, not zeros */
        ma[i] = mb[i] = 0.01f * frand();
        va[i] = vb[i] = 1e-4f * fabsf(frand());
    }
    keel_adamw_step st = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                          .weight_decay = 0.1f, .grad_scale = 0.7f, .t = 4};
    int64_t k = 12345;
    keel_adamw_update(pa, ga, ma, va, n, &st);
    keel_adamw_update(pb, ga, mb, vb, k, &st);
    keel_adamw_update(pb + k, ga + k, mb + k, vb + k, n - k, &st);
    bool same = !memcmp(pa, pb, 4 * (size_t)n) && !memcmp(ma, mb, 4 * (size_t)n) &&
                !memcmp(va, vb, 4 * (size_t)n);
    EXPECT(same, "adamw bits independent of the split");
    keel_free(pa), keel_free(ma), keel_free(va), keel_free(ga), keel_free(pb), keel_free(mb), keel_free(vb);
    double s1 = keel_sumsq(g, n), s2 = 0;
    for (int64_t i = 0; i < n; i++) s2 += (double)g[i] * g[i];
    float f1 = (float)s1, f2 = (float)s2;
    compare("sum of squares", &f1, &f2, 1, 1e-6);
    free(p1); free(p2); free(g); free(m1); free(m2); free(v1); free(v2);
}

/* The whole-buffer passes on the pool: bit for bit what one loop, memset and
 * memmove give, over a size that splits into chunks with a ragged end. */
static void test_passes(void) {
    int64_t n = (3 << 18) + 5; /* 3 MiB + 20 bytes of floats: more than two 1 MiB chunks */
    float *src = rand_vec(n, 1), *dst = rand_vec(n, 1), *want = copy(dst, n);
    keel_bf16 *half = malloc(sizeof(keel_bf16) * (size_t)n);
    for (int64_t i = 0; i < n; i++) half[i] = keel_bf16_from_float(src[i]);
    keel_accumulate(dst, src, n);
    for (int64_t i = 0; i < n; i++) want[i] += src[i];
    EXPECT(memcmp(dst, want, sizeof(float) * (size_t)n) == 0, "accumulate: the loop's sums");
    keel_accumulate_bf16(dst, half, n);
    for (int64_t i = 0; i < n; i++) want[i] += keel_bf16_to_float(half[i]);
    EXPECT(memcmp(dst, want, sizeof(float) * (size_t)n) == 0, "accumulate_bf16: the loop's sums");
    keel_bf16_to_f32(dst, half, n);
    for (int64_t i = 0; i < n; i++) want[i] = keel_bf16_to_float(half[i]);
    EXPECT(memcmp(dst, want, sizeof(float) * (size_t)n) == 0, "bf16_to_f32: every value");
    keel_copy(dst, src, sizeof(float) * (size_t)n);
    EXPECT(memcmp(dst, src, sizeof(float) * (size_t)n) == 0, "copy: every byte");
    keel_copy(dst + 1000, dst, sizeof(float) * (size_t)(n - 1000)); /* overlapping: memmove's result */
    memmove(want, src, sizeof(float) * (size_t)n);
    memmove(want + 1000, want, sizeof(float) * (size_t)(n - 1000));
    EXPECT(memcmp(dst, want, sizeof(float) * (size_t)n) == 0, "copy, overlapping: memmove's bytes");
    keel_zero(dst + 3, sizeof(float) * (size_t)(n - 4));
    bool zeros = dst[0] == want[0] && dst[n - 1] == want[n - 1];
    for (int64_t i = 3; i < n - 1; i++) zeros = zeros && dst[i] == 0;
    EXPECT(zeros, "zero: every byte asked for and none beside");
    free(src); free(dst); free(want); free(half);
}

int main(void) {
    for (int threads = 1; threads <= 2; threads++) {
        keel_kernels_init(threads);
        printf("-- %d thread(s)\n", threads);
        test_passes();
        test_rmsnorm();
        test_rope();
        for (int docs = 0; docs < 2; docs++) {
            test_attention(2, 2, 1, docs);    /* two queries (one alone has no softmax gradient) */
            test_attention(29, 4, 4, docs);   /* inside one tile */
            test_attention(29, 6, 2, docs);
            test_attention(128, 2, 1, docs);  /* exactly one query block */
            test_attention(129, 4, 2, docs);  /* a second query block of one row */
            test_attention(256, 2, 2, docs);  /* exactly one key tile */
            test_attention(300, 4, 2, docs);  /* several tiles, ragged last */
            test_attention(1000, 8, 2, docs); /* 8 query blocks, 4 key tiles, ragged last, group of 4 */
        }
        test_swiglu();
        test_xent();
        test_adamw();
        keel_kernels_shutdown();
    }
    return test_summary("test_kernels_match_reference");
}
