/* The CUDA backend's kernels against the CPU references (keel/kernels.h), on
 * random inputs of awkward sizes (rows shorter and longer than a block, n
 * not a multiple of it), forward and backward. Tolerances: the kernels sum in
 * fp32 where the references sum in double — RMSNorm 1e-5 relative (forward,
 * dx), 1e-4 (dw, summed over rows with atomics in any order); RoPE 1e-6
 * against the CPU kernel with the same table; SwiGLU 1e-6; cross-entropy
 * 1e-5 (the loss) and 1e-6 (the gradient); AdamW 1e-6 after 3 steps. Needs a GPU: without one it exits 77 (ctest
 * SKIP) saying why; scripts/gpu-check.sh runs it on the device machine. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/cuda.h"
#include "keel/kernels.h"

#include "../testlib.h"

static float *rnd(int64_t n, unsigned *seed, float scale) {
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = scale * ((float)rand_r(seed) / RAND_MAX * 2 - 1);
    return x;
}

static float *dev(const float *h, int64_t n) {
    void *d = NULL;
    KEEL_CHECK(keel_cuda_malloc(&d, (size_t)n * sizeof(float)) == KEEL_OK, "cudaMalloc");
    if (h) KEEL_CHECK(keel_cuda_to_device(d, h, (size_t)n * sizeof(float)) == KEEL_OK, "copy");
    return d;
}

static float *back(const float *d, int64_t n) {
    float *h = malloc((size_t)n * sizeof *h);
    KEEL_CHECK(keel_cuda_sync() == KEEL_OK && keel_cuda_to_host(h, d, (size_t)n * sizeof(float)) == KEEL_OK,
               "copy back");
    return h;
}

/* max |a - b| / max(1, |b|) */
static double rel(const float *a, const float *b, int64_t n) {
    double worst = 0;
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)a[i] - b[i]) / fmax(1, fabs((double)b[i])));
    return worst;
}

static void test_rmsnorm(int N, int C) {
    unsigned seed = 7 + (unsigned)C;
    float *x = rnd((int64_t)N * C, &seed, 2), *w = rnd(C, &seed, 1), *dout = rnd((int64_t)N * C, &seed, 1);
    float *out = calloc((size_t)N * C, 4), *rstd = calloc(N, 4), *dx = calloc((size_t)N * C, 4), *dw = calloc(C, 4);
    keel_ref_rmsnorm_forward(out, rstd, x, w, N, C, 1e-5f);
    keel_ref_rmsnorm_backward(dx, dw, dout, x, w, rstd, N, C);
    float *dxg = dev(x, (int64_t)N * C), *dwg = dev(w, C), *dog = dev(dout, (int64_t)N * C);
    float *outg = dev(NULL, (int64_t)N * C), *rg = dev(NULL, N), *dxgg = dev(NULL, (int64_t)N * C), *dwgg = dev(NULL, C);
    float *zeros = calloc((size_t)N * C, 4);
    keel_cuda_to_device(dxgg, zeros, (size_t)N * C * 4);
    keel_cuda_to_device(dwgg, zeros, (size_t)C * 4);
    keel_cuda_rmsnorm_forward(outg, rg, dxg, dwg, N, C, 1e-5f);
    keel_cuda_rmsnorm_backward(dxgg, dwgg, dog, dxg, dwg, rg, N, C);
    float *o = back(outg, (int64_t)N * C), *r = back(rg, N), *a = back(dxgg, (int64_t)N * C), *b = back(dwgg, C);
    double eo = rel(o, out, (int64_t)N * C), er = rel(r, rstd, N), ea = rel(a, dx, (int64_t)N * C), eb = rel(b, dw, C);
    EXPECT(eo < 1e-5 && er < 1e-5 && ea < 1e-5 && eb < 1e-4,
           "rmsnorm N=%d C=%d: out %.2g rstd %.2g dx %.2g dw %.2g", N, C, eo, er, ea, eb);
    float *all[] = {x, w, dout, out, rstd, dx, dw, zeros, o, r, a, b};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    float *g[] = {dxg, dwg, dog, outg, rg, dxgg, dwgg};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) keel_cuda_free(g[i]);
}

static void test_swiglu(int64_t n) {
    unsigned seed = 11;
    float *gate = rnd(n, &seed, 6), *up = rnd(n, &seed, 2), *dh = rnd(n, &seed, 1);
    float *h = malloc((size_t)n * 4), *dg = malloc((size_t)n * 4), *du = malloc((size_t)n * 4);
    keel_ref_swiglu_forward(h, gate, up, n);
    keel_ref_swiglu_backward(dg, du, dh, gate, up, n);
    float *gg = dev(gate, n), *ug = dev(up, n), *dhg = dev(dh, n), *hg = dev(NULL, n), *dgg = dev(NULL, n),
          *dug = dev(NULL, n);
    keel_cuda_swiglu_forward(hg, gg, ug, n);
    keel_cuda_swiglu_backward(dgg, dug, dhg, gg, ug, n);
    float *a = back(hg, n), *b = back(dgg, n), *c = back(dug, n);
    double e1 = rel(a, h, n), e2 = rel(b, dg, n), e3 = rel(c, du, n);
    EXPECT(e1 < 1e-6 && e2 < 1e-6 && e3 < 1e-6, "swiglu n=%lld: h %.2g dgate %.2g dup %.2g", (long long)n, e1, e2, e3);
    float *all[] = {gate, up, dh, h, dg, du, a, b, c};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    float *g[] = {gg, ug, dhg, hg, dgg, dug};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) keel_cuda_free(g[i]);
}

static void test_rope(int B, int T, int H, int HS) {
    unsigned seed = 17;
    int64_t n = (int64_t)B * T * H * HS;
    float *x = rnd(n, &seed, 1), *cs = malloc((size_t)T * HS * sizeof *cs);
    keel_rope_table(cs, T, HS, 10000.0);
    float *xg = dev(x, n), *csg = dev(cs, (int64_t)T * HS);
    keel_cuda_rope_forward(xg, csg, B, T, H, HS);
    keel_rope_forward(x, cs, B, T, H, HS);
    float *a = back(xg, n);
    double ef = rel(a, x, n);
    keel_cuda_rope_backward(xg, csg, B, T, H, HS);
    keel_rope_backward(x, cs, B, T, H, HS);
    float *b = back(xg, n);
    double eb = rel(b, x, n);
    EXPECT(ef < 1e-6 && eb < 1e-6, "rope B=%d T=%d H=%d HS=%d: forward %.2g backward %.2g", B, T, H, HS, ef, eb);
    free(x), free(cs), free(a), free(b);
    keel_cuda_free(xg), keel_cuda_free(csg);
}

static void test_xent(int N, int V) {
    unsigned seed = 19;
    int64_t n = (int64_t)N * V;
    float *z = rnd(n, &seed, 8);
    int32_t *tg = malloc((size_t)N * sizeof *tg);
    for (int i = 0; i < N; i++) tg[i] = (int32_t)(rand_r(&seed) % V);
    float *zg = dev(z, n), *lg = dev(NULL, N);
    void *tgd = NULL;
    KEEL_CHECK(keel_cuda_malloc(&tgd, (size_t)N * sizeof *tg) == KEEL_OK, "cudaMalloc");
    keel_cuda_to_device(tgd, tg, (size_t)N * sizeof *tg);
    keel_cuda_xent_forward_backward(zg, lg, tgd, N, V, 1.0f / N);
    double want = keel_ref_xent_forward_backward(z, tg, N, V, 1.0f / N), got = 0;
    float *l = back(lg, N), *dz = back(zg, n);
    for (int i = 0; i < N; i++) got += l[i];
    double el = fabs(got - want) / fmax(1, fabs(want)), eg = rel(dz, z, n);
    EXPECT(el < 1e-5 && eg < 1e-6, "xent N=%d V=%d: loss %.6g vs %.6g (%.2g), gradient %.2g", N, V, got, want, el, eg);
    free(z), free(tg), free(l), free(dz);
    keel_cuda_free(zg), keel_cuda_free(lg), keel_cuda_free(tgd);
}

static void test_adamw(int64_t n) {
    unsigned seed = 13;
    float *p = rnd(n, &seed, 1), *m = calloc((size_t)n, 4), *v = calloc((size_t)n, 4);
    float *pg = dev(p, n), *mg = dev(m, n), *vg = dev(v, n);
    keel_adamw_step s = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                         .grad_scale = 0.5f};
    for (s.t = 1; s.t <= 3; s.t++) {
        float *g = rnd(n, &seed, 1), *gd = dev(g, n);
        keel_ref_adamw_update(p, g, m, v, n, &s);
        keel_cuda_adamw_update(pg, gd, mg, vg, n, s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, s.grad_scale, s.t);
        KEEL_CHECK(keel_cuda_sync() == KEEL_OK, "adamw");
        keel_cuda_free(gd);
        free(g);
    }
    float *a = back(pg, n), *b = back(mg, n), *c = back(vg, n);
    double e1 = rel(a, p, n), e2 = rel(b, m, n), e3 = rel(c, v, n);
    EXPECT(e1 < 1e-6 && e2 < 1e-6 && e3 < 1e-6, "adamw n=%lld, 3 steps: param %.2g m %.2g v %.2g", (long long)n, e1,
           e2, e3);
    float *all[] = {p, m, v, a, b, c};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    keel_cuda_free(pg), keel_cuda_free(mg), keel_cuda_free(vg);
}

int main(void) {
    char why[512];
    if (keel_cuda_device_count(why, sizeof why) == 0) {
        printf("SKIP: %s\n", why);
        return 77;
    }
    test_rmsnorm(3, 7);
    test_rmsnorm(5, 300);
    test_rmsnorm(64, 4096);
    test_rope(1, 1, 1, 2);
    test_rope(2, 37, 3, 64);
    test_rope(1, 2048, 32, 128);
    test_xent(1, 3);
    test_xent(7, 32000);
    test_xent(64, 50257);
    test_swiglu(1);
    test_swiglu(1000003);
    test_adamw(257);
    test_adamw(3000017);
    return test_summary("gpu_parity");
}
