/* The CUDA backend's kernels against the CPU kernels (keel/kernels.h), on
 * random inputs of awkward sizes (rows shorter and longer than a block, n
 * not a multiple of it, T not a multiple of the attention tiles), forward
 * and backward. Tolerances, with why:
 *   - sums in fp32 where the references sum in double — RMSNorm 1e-5
 *     relative (forward, dx), 1e-4 (dw, summed over rows with atomics in any
 *     order); RoPE 1e-6 against the CPU kernel with the same table; SwiGLU
 *     1e-6; cross-entropy 1e-5 (the loss) and 1e-6 (the gradient); AdamW 1e-6
 *     after 3 steps (each max |a - b| / max(1, |b|));
 *   - GEMMs, max |a - b| / max |b|: fp32 (cuBLASLt FFMA vs OpenBLAS, other
 *     summation orders) 1e-5; bf16 1e-4 (exact bf16 products, fp32 sums in
 *     the tensor cores' order); a wrong transpose or ld is off by O(1);
 *   - bit-exact: the bf16 conversions (NaNs, infinities, ties, subnormals
 *     included), the embedding forward (fp32 and bf16 tables) and backward
 *     (repeated tokens add in the CPU's order), accumulate and
 *     accumulate_bf16 (one fp32 add each; a NaN result only has to be a NaN:
 *     the GPU's default NaN is not x86's);
 *   - sums: keel_cuda_sumsq 1e-6 against keel_sumsq (fp32 blocks there) and
 *     1e-9 against a double loop here, keel_cuda_sum 1e-9 of Σ|x|;
 *   - attention against keel_attention_* (the CPU's flash kernels), max
 *     |a - b| / max(max |b|, 0.01) per tensor (the floor: at T = 1, dq and
 *     dk are 0 up to rounding), and the mean |a - b| over the same scale:
 *     fp32 out and lse 2e-5, dq, dk, dv 1e-4, mean 1e-5 (fp32 sums in other
 *     orders, expf vs the CPU's keel_expf); bf16 lse 2e-5 (fp32 scores of
 *     the same rounded q and k), out, dq, dk, dv 1e-2 (test_attention_bf16's
 *     bound against fp32) and mean 2e-4: the two sides round the same
 *     operands, but a probability or dS within an ulp or two of a bf16
 *     rounding boundary can round the other way on one side, moving one
 *     product input by 2^-8 of itself, up to ~2e-3 of an early row's output
 *     (a CPU emulation of these kernels measured max 5.6e-4, mean 2.3e-5,
 *     at T = 77..1024). The backward gets the CPU's out and lse, so its
 *     errors are its own. dq, dk, dv start as NaN on the device (they must
 *     be overwritten) and a second backward must be bit-identical (no
 *     atomics). The public bf16 functions run the tensor-core kernels at
 *     HS 64 and 128, the CUDA-core ones at 48 and 16;
 *   - the tensor-core bf16 attention (keel_cuda_attention_*_bf16_tc, HS 64
 *     and 128) against the CPU's and against the CUDA-core kernels (_simt),
 *     at T = 1 (one query), 17 (less than a tile), 64 (one tile: the
 *     diagonal), 65 (one query past it), 200 and 1000 (ragged tiles), GQA
 *     and not, with the bf16 bounds above. The operands are the same bf16
 *     values on every side (round to nearest even); the fp32 sums run in
 *     another order (the tensor cores'), which moves a score by ~1e-6
 *     (lse: 2e-5 holds with margin). Two things then move P and dS across
 *     a bf16 rounding boundary: that noise, rarely (~1e-7 / 2^-8 ~ 3e-5 of
 *     them; one ulp, <= 2^-7 of the value; a P that is not its row's
 *     largest, exp(0) = 1 exactly, weighs < 1/2 of its row, so one such
 *     flip moves an out by < 2^-8 max |v|, 4e-3 of the scale here), and in
 *     forward the tiles: the CPU's are 256 keys, the GPU's 64, so a row
 *     past 64 keys rounds its P against another running max, every P
 *     independently — bf16 noise averaged over the row (a host emulation of
 *     these kernels against the CPU: out max 6.4e-4, mean 2.6e-5 at
 *     T = 200..1000; the gradients, whose P comes from the same lse on every
 *     side, max 6.7e-5 up to T = 300 and 1.2e-3 (dq; HS 128, GQA 8:2) at
 *     T = 1000): max 1e-2 and mean 2e-4 keep an 8x margin. tc and
 *     simt share the 64-key tiles, so they differ by the rare flips only;
 *     measured relative to each other, the same bounds.
 *     KEEL_CUDA_ATTENTION=simt makes the public functions the _simt ones
 *     bit for bit, and unset the _tc ones.
 * Needs a GPU: without one it exits 77 (ctest SKIP) saying why;
 * scripts/gpu-check.sh runs it on the device machine. The host CUDA
 * emulator (tests/cuemu) runs it as gpu_parity_cuemu with
 * KEEL_GPU_PARITY_SHAPES=small: the largest GEMMs and the attention at
 * T >= 1000 left out (minutes there). */
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

/* Waits for the kernels issued so far. A failure they left (its line is
 * printed) counts and the test goes on: a cuBLASLt status or a refused
 * launch leaves the device usable for the tests after it; after a fault the
 * next copy fails and aborts. */
static void synced(void) {
    if (keel_cuda_sync() != KEEL_OK) EXPECT(false, "CUDA reported an error (the line above)");
}

static float *back(const float *d, int64_t n) {
    float *h = malloc((size_t)n * sizeof *h);
    synced();
    KEEL_CHECK(keel_cuda_to_host(h, d, (size_t)n * sizeof(float)) == KEEL_OK, "copy back");
    return h;
}

static void *dev_bytes(const void *h, size_t bytes) {
    void *d = NULL;
    KEEL_CHECK(keel_cuda_malloc(&d, bytes) == KEEL_OK, "cudaMalloc");
    if (h) KEEL_CHECK(keel_cuda_to_device(d, h, bytes) == KEEL_OK, "copy");
    return d;
}

static void *back_bytes(const void *d, size_t bytes) {
    void *h = malloc(bytes);
    synced();
    KEEL_CHECK(keel_cuda_to_host(h, d, bytes) == KEEL_OK, "copy back");
    return h;
}

/* max |a - b| / max(max |b|, floor), and in *mean (if not NULL) the mean
 * |a - b| over the same scale; a NaN anywhere makes them NaN, which fails
 * every "<" */
static double relmax_floor(const float *a, const float *b, int64_t n, double floor, double *mean) {
    double worst = 0, scale = floor, sum = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)b[i]));
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        sum += e;
        worst = testlib_worst(worst, e);
    }
    if (scale <= 0) scale = 1;
    if (mean) *mean = n > 0 ? sum / (double)n / scale : 0;
    return worst / scale;
}

/* max |a - b| / max |b| */
static double relmax(const float *a, const float *b, int64_t n) { return relmax_floor(a, b, n, 0, NULL); }

/* max |a - b| / max(1, |b|) */
static double rel(const float *a, const float *b, int64_t n) {
    double worst = 0;
    for (int64_t i = 0; i < n; i++) worst = testlib_worst(worst, fabs((double)a[i] - b[i]) / fmax(1, fabs((double)b[i])));
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
    keel_rope_table(cs, T, HS, 10000.0, NULL);
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

/* ---- GEMMs ------------------------------------------------------------------- */

static void test_matmul(int M, int N, int K) {
    unsigned seed = 23 + (unsigned)(M * 7 + N * 3 + K);
    int64_t nin = (int64_t)M * K, nw = (int64_t)N * K, nout = (int64_t)M * N;
    float *in = rnd(nin, &seed, 1), *w = rnd(nw, &seed, 1), *out0 = rnd(nout, &seed, 1), *dout = rnd(nout, &seed, 1);
    float *din0 = rnd(nin, &seed, 1), *dw0 = rnd(nw, &seed, 1);
    float *ing = dev(in, nin), *wg = dev(w, nw), *doutg = dev(dout, nout);
    for (int acc = 0; acc <= 1; acc++) {
        /* forward, onto out0 when accumulating */
        float *out = malloc((size_t)nout * 4);
        memcpy(out, out0, (size_t)nout * 4);
        keel_matmul_forward(out, in, w, M, N, K, acc);
        float *outg = dev(out0, nout);
        keel_cuda_matmul_forward(outg, ing, wg, M, N, K, acc);
        float *o = back(outg, nout);
        double ef = relmax(o, out, nout);
        /* backward: d_in onto din0 when accumulating, d_w always onto dw0 */
        float *din = malloc((size_t)nin * 4), *dw = malloc((size_t)nw * 4);
        memcpy(din, din0, (size_t)nin * 4), memcpy(dw, dw0, (size_t)nw * 4);
        keel_matmul_backward(din, dw, dout, in, w, M, N, K, acc);
        float *ding = dev(din0, nin), *dwg = dev(dw0, nw);
        keel_cuda_matmul_backward(ding, dwg, doutg, ing, wg, M, N, K, acc);
        float *a = back(ding, nin), *b = back(dwg, nw);
        double ei = relmax(a, din, nin), ew = relmax(b, dw, nw);
        EXPECT(ef < 1e-5 && ei < 1e-5 && ew < 1e-5, "matmul M=%d N=%d K=%d accumulate=%d: out %.2g d_in %.2g d_w %.2g",
               M, N, K, acc, ef, ei, ew);
        free(out), free(o), free(din), free(dw), free(a), free(b);
        keel_cuda_free(outg), keel_cuda_free(ding), keel_cuda_free(dwg);
    }
    /* d_in NULL: only d_w, which still accumulates */
    float *dw = malloc((size_t)nw * 4);
    memcpy(dw, dw0, (size_t)nw * 4);
    keel_matmul_backward(NULL, dw, dout, in, w, M, N, K, false);
    float *dwg = dev(dw0, nw);
    keel_cuda_matmul_backward(NULL, dwg, doutg, ing, wg, M, N, K, false);
    float *b = back(dwg, nw);
    double ew = relmax(b, dw, nw);
    EXPECT(ew < 1e-5, "matmul backward without d_in M=%d N=%d K=%d: d_w %.2g", M, N, K, ew);
    /* d_w NULL (a frozen weight): only d_in */
    float *din = malloc((size_t)nin * 4);
    keel_matmul_backward(din, NULL, dout, in, w, M, N, K, false);
    float *ding = dev(NULL, nin);
    keel_cuda_matmul_backward(ding, NULL, doutg, ing, wg, M, N, K, false);
    float *a = back(ding, nin);
    double ei = relmax(a, din, nin);
    EXPECT(ei < 1e-5, "matmul backward of a frozen weight (no d_w) M=%d N=%d K=%d: d_in %.2g", M, N, K, ei);
    free(din), free(a);
    keel_cuda_free(ding);
    float *all[] = {in, w, out0, dout, din0, dw0, dw, b};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    keel_cuda_free(ing), keel_cuda_free(wg), keel_cuda_free(doutg), keel_cuda_free(dwg);
}

static keel_bf16 *rnd_bf16(int64_t n, unsigned *seed) {
    float *x = rnd(n, seed, 1);
    keel_bf16 *b = malloc((size_t)n * sizeof *b);
    keel_f32_to_bf16(b, x, n);
    free(x);
    return b;
}

/* all four transpose combinations, with and without accumulate */
static void test_gemm_bf16(int M, int N, int K) {
    unsigned seed = 29 + (unsigned)(M + N * 5 + K * 11);
    int64_t na = (int64_t)M * K, nb = (int64_t)K * N, nout = (int64_t)M * N;
    keel_bf16 *a = rnd_bf16(na, &seed), *b = rnd_bf16(nb, &seed);
    float *out0 = rnd(nout, &seed, 1);
    keel_bf16 *ag = dev_bytes(a, (size_t)na * 2), *bg = dev_bytes(b, (size_t)nb * 2);
    for (int c = 0; c < 8; c++) {
        bool a_t = c & 1, b_t = c & 2, acc = c & 4; /* the same values, read as (K,M) / (N,K) when transposed */
        float *out = malloc((size_t)nout * 4);
        memcpy(out, out0, (size_t)nout * 4);
        keel_gemm_bf16(out, a, a_t, b, b_t, M, N, K, acc);
        float *outg = dev(out0, nout);
        keel_cuda_gemm_bf16(outg, ag, a_t, bg, b_t, M, N, K, acc);
        float *o = back(outg, nout);
        double e = relmax(o, out, nout);
        EXPECT(e < 1e-4, "gemm_bf16 M=%d N=%d K=%d a_t=%d b_t=%d accumulate=%d: %.2g", M, N, K, a_t, b_t, acc, e);
        free(out), free(o);
        keel_cuda_free(outg);
    }
    free(a), free(b), free(out0);
    keel_cuda_free(ag), keel_cuda_free(bg);
}

/* ---- bf16 conversions, bit for bit ------------------------------------------------- */

static void test_bf16_convert(int64_t n) {
    unsigned seed = 31;
    float *x = malloc((size_t)n * 4);
    uint32_t *bits = malloc((size_t)n * 4);
    uint32_t special[] = {0x00000000u, 0x80000000u, 0x3f800000u, 0x3f808000u /* tie, even below */,
                          0x3f818000u /* tie, odd below: rounds up */, 0x3f807fffu, 0x3f808001u, 0x00000001u,
                          0x807fffffu /* subnormals */, 0x7f7fffffu /* max: rounds to inf */, 0x7f7f7fffu,
                          0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u /* signalling */,
                          0x7fbfffffu, 0xff80ffffu};
    int ns = (int)(sizeof special / sizeof special[0]);
    for (int64_t i = 0; i < n; i++)
        bits[i] = i < ns ? special[i] : (uint32_t)rand_r(&seed) * 2654435761u ^ (uint32_t)rand_r(&seed);
    memcpy(x, bits, (size_t)n * 4);
    keel_bf16 *want = malloc((size_t)n * 2);
    keel_f32_to_bf16(want, x, n);
    float *xg = dev(x, n);
    keel_bf16 *bg = dev_bytes(NULL, (size_t)n * 2);
    keel_cuda_f32_to_bf16(bg, xg, n);
    keel_bf16 *got = back_bytes(bg, (size_t)n * 2);
    int64_t bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++)
        if (got[i] != want[i]) bad = i;
    if (bad < 0) EXPECT(true, "f32_to_bf16 n=%lld bit-exact", (long long)n);
    else
        EXPECT(false, "f32_to_bf16 n=%lld bit-exact: element %lld, 0x%08x -> 0x%04x, CPU 0x%04x", (long long)n,
               (long long)bad, bits[bad], got[bad], want[bad]);
    /* every bf16 pattern back to fp32 */
    keel_bf16 all[65536];
    for (int i = 0; i < 65536; i++) all[i] = (keel_bf16)i;
    float *wantf = malloc(65536 * 4);
    keel_bf16_to_f32(wantf, all, 65536);
    keel_bf16 *allg = dev_bytes(all, sizeof all);
    float *fg = dev(NULL, 65536);
    keel_cuda_bf16_to_f32(fg, allg, 65536);
    float *gotf = back(fg, 65536);
    EXPECT(memcmp(gotf, wantf, 65536 * 4) == 0, "bf16_to_f32, all 65536 patterns bit-exact");
    free(x), free(bits), free(want), free(got), free(wantf), free(gotf);
    keel_cuda_free(xg), keel_cuda_free(bg), keel_cuda_free(allg), keel_cuda_free(fg);
}

/* ---- embedding, bit for bit ---------------------------------------------------------- */

static void test_embedding(int N, int C, int V) {
    unsigned seed = 37 + (unsigned)N;
    int32_t *tok = malloc((size_t)N * sizeof *tok);
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(rand_r(&seed) % V); /* N > V: repeats */
    float *table = rnd((int64_t)V * C, &seed, 1), *dout = rnd((int64_t)N * C, &seed, 1);
    float *dtable = rnd((int64_t)V * C, &seed, 1); /* backward adds onto it */
    keel_bf16 *tb = malloc((size_t)V * C * 2);
    keel_f32_to_bf16(tb, table, (int64_t)V * C);
    int32_t *tokg = dev_bytes(tok, (size_t)N * sizeof *tok);
    float *tableg = dev(table, (int64_t)V * C), *doutg = dev(dout, (int64_t)N * C), *dtg = dev(dtable, (int64_t)V * C);
    keel_bf16 *tbg = dev_bytes(tb, (size_t)V * C * 2);
    float *outg = dev(NULL, (int64_t)N * C), *outbg = dev(NULL, (int64_t)N * C);
    float *out = malloc((size_t)N * C * 4), *outb = malloc((size_t)N * C * 4);
    keel_embedding_forward(out, table, tok, N, C);
    keel_embedding_forward_bf16(outb, tb, tok, N, C);
    keel_embedding_backward(dtable, dout, tok, N, C);
    keel_cuda_embedding_forward(outg, tableg, tokg, N, C);
    keel_cuda_embedding_forward_bf16(outbg, tbg, tokg, N, C);
    keel_cuda_embedding_backward(dtg, doutg, tokg, N, C);
    float *a = back(outg, (int64_t)N * C), *b = back(outbg, (int64_t)N * C), *d = back(dtg, (int64_t)V * C);
    bool fa = memcmp(a, out, (size_t)N * C * 4) == 0, fb = memcmp(b, outb, (size_t)N * C * 4) == 0;
    bool bd = memcmp(d, dtable, (size_t)V * C * 4) == 0;
    EXPECT(fa && fb && bd, "embedding N=%d C=%d V=%d bit-exact: forward %s, forward bf16 %s, backward %s", N, C, V,
           fa ? "yes" : "NO", fb ? "yes" : "NO", bd ? "yes" : "NO");
    free(tok), free(table), free(dout), free(dtable), free(tb), free(out), free(outb), free(a), free(b), free(d);
    keel_cuda_free(tokg), keel_cuda_free(tableg), keel_cuda_free(doutg), keel_cuda_free(dtg), keel_cuda_free(tbg);
    keel_cuda_free(outg), keel_cuda_free(outbg);
}

/* ---- sums ----------------------------------------------------------------------------- */

static void test_sums(int64_t n) {
    unsigned seed = 41;
    float *x = rnd(n, &seed, 3);
    double sq = 0, sum = 0, mag = 0;
    for (int64_t i = 0; i < n; i++) sq += (double)x[i] * x[i], sum += x[i], mag += fabs(x[i]);
    double cpu = keel_sumsq(x, n);
    float *xg = dev(x, n);
    double gsq = keel_cuda_sumsq(xg, n), gsum = keel_cuda_sum(xg, n);
    synced();
    double e1 = fabs(gsq - cpu) / fmax(cpu, 1e-300), e2 = fabs(gsq - sq) / fmax(sq, 1e-300);
    double e3 = fabs(gsum - sum) / fmax(mag, 1e-300);
    EXPECT(e1 < 1e-6 && e2 < 1e-9 && e3 < 1e-9,
           "sums n=%lld: sumsq %.17g vs keel_sumsq %.2g, vs double %.2g; sum %.2g of sum |x|", (long long)n, gsq, e1,
           e2, e3);
    free(x);
    keel_cuda_free(xg);
}

/* ---- accumulation, bit for bit ---------------------------------------------------------- */

/* the first i where a and b differ, NaN matching any NaN; -1 when none */
static int64_t first_diff(const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], 4) != 0 && !(isnan(a[i]) && isnan(b[i]))) return i;
    return -1;
}

/* a random bit pattern that is not a NaN: any magnitude, subnormals, zeros, infinities */
static float any_but_nan(unsigned *seed) {
    uint32_t u;
    do u = (uint32_t)rand_r(seed) * 2654435761u ^ (uint32_t)rand_r(seed) << 7;
    while ((u & 0x7fffffffu) > 0x7f800000u);
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* dst and the fp32 src: odd elements any_but_nan, even ones uniform in (-4, 4)
 * (sums that round); the bf16 src: every pattern in turn */
static void test_accumulate(int64_t n) {
    unsigned seed = 47 + (unsigned)n;
    float *dst = malloc((size_t)n * 4), *src = malloc((size_t)n * 4);
    keel_bf16 *srcb = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) {
        if (i % 2) {
            dst[i] = any_but_nan(&seed), src[i] = any_but_nan(&seed);
        } else {
            dst[i] = 4 * ((float)rand_r(&seed) / RAND_MAX * 2 - 1);
            src[i] = 4 * ((float)rand_r(&seed) / RAND_MAX * 2 - 1);
        }
        srcb[i] = (keel_bf16)(i % 65536);
    }
    float *dg = dev(dst, n), *sg = dev(src, n), *dbg = dev(dst, n);
    keel_bf16 *sbg = dev_bytes(srcb, (size_t)n * 2);
    keel_cuda_accumulate(dg, sg, n);
    keel_cuda_accumulate_bf16(dbg, sbg, n);
    float *got = back(dg, n), *gotb = back(dbg, n), *wantb = malloc((size_t)n * 4);
    memcpy(wantb, dst, (size_t)n * 4);
    keel_accumulate(dst, src, n);
    keel_accumulate_bf16(wantb, srcb, n);
    int64_t bad = first_diff(got, dst, n), badb = first_diff(gotb, wantb, n);
    EXPECT(bad < 0 && badb < 0, "accumulate n=%lld bit-exact: fp32 %s (first bad %lld), bf16 %s (first bad %lld)",
           (long long)n, bad < 0 ? "yes" : "NO", (long long)bad, badb < 0 ? "yes" : "NO", (long long)badb);
    free(dst), free(src), free(srcb), free(got), free(gotb), free(wantb);
    keel_cuda_free(dg), keel_cuda_free(sg), keel_cuda_free(dbg), keel_cuda_free(sbg);
}

/* LoRA's scale and dropout: the mask is the CPU's bit for bit (the same
 * hash of key and index), in place or not, accumulating or not. */
static void test_scale_masked(int64_t n) {
    unsigned seed = 91 + (unsigned)n;
    float *x = rnd(n, &seed, 3), *acc = rnd(n, &seed, 1);
    int bad = 0;
    for (int v = 0; v < 4; v++) {
        float p = v % 2 ? 0.3f : 0.0f, mult = v % 2 ? 1.0f / 0.7f : 2.0f;
        bool accumulate = v >= 2;
        float *want = malloc((size_t)n * 4);
        memcpy(want, acc, (size_t)n * 4);
        keel_scale_masked(want, x, n, mult, p, 1234 + (uint64_t)v, accumulate);
        float *xg = dev(x, n), *og = dev(acc, n);
        keel_cuda_scale_masked(og, xg, n, mult, p, 1234 + (uint64_t)v, accumulate);
        float *got = back(og, n);
        bad += first_diff(got, want, n) >= 0;
        keel_cuda_scale_masked(xg, xg, n, mult, p, 1234 + (uint64_t)v, false); /* in place */
        float *inplace = back(xg, n), *want2 = malloc((size_t)n * 4);
        keel_scale_masked(want2, x, n, mult, p, 1234 + (uint64_t)v, false);
        bad += first_diff(inplace, want2, n) >= 0;
        free(want), free(got), free(inplace), free(want2);
        keel_cuda_free(xg), keel_cuda_free(og);
    }
    EXPECT(bad == 0, "scale_masked n=%lld: the CPU's mask and values bit for bit (p 0 and 0.3, accumulating, in place)",
           (long long)n);
    free(x), free(acc);
}

/* ---- attention -------------------------------------------------------------------------- */

static void test_attention(int B, int T, int NH, int NKV, int HS, bool bf16) {
    unsigned seed = 43 + (unsigned)(T * 3 + HS + NKV);
    int64_t nq = (int64_t)B * T * NH * HS, nkv = (int64_t)B * T * NKV * HS, nl = (int64_t)B * NH * T;
    float *q = rnd(nq, &seed, 1), *k = rnd(nkv, &seed, 1), *v = rnd(nkv, &seed, 1), *dout = rnd(nq, &seed, 1);
    float *out = malloc((size_t)nq * 4), *lse = malloc((size_t)nl * 4);
    float *dq = malloc((size_t)nq * 4), *dk = malloc((size_t)nkv * 4), *dv = malloc((size_t)nkv * 4);
    (bf16 ? keel_attention_forward_bf16 : keel_attention_forward)(out, lse, q, k, v, NULL, B, T, NH, NKV, HS);
    (bf16 ? keel_attention_backward_bf16 : keel_attention_backward)(dq, dk, dv, dout, out, lse, q, k, v, NULL, B, T, NH,
                                                                    NKV, HS);
    float *qg = dev(q, nq), *kg = dev(k, nkv), *vg = dev(v, nkv), *doutg = dev(dout, nq);
    float *outg = dev(NULL, nq), *lseg = dev(NULL, nl);
    float *nan = malloc((size_t)nq * 4);
    memset(nan, 0xff, (size_t)nq * 4); /* NaNs: backward must overwrite every element */
    float *dqg = dev(nan, nq), *dkg = dev(nan, nkv), *dvg = dev(nan, nkv);
    (bf16 ? keel_cuda_attention_forward_bf16 : keel_cuda_attention_forward)(outg, lseg, qg, kg, vg, B, T, NH, NKV, HS);
    /* backward from the CPU's out and lse, so that its errors are its own */
    float *outc = dev(out, nq), *lsec = dev(lse, nl);
    (bf16 ? keel_cuda_attention_backward_bf16 : keel_cuda_attention_backward)(dqg, dkg, dvg, doutg, outc, lsec, qg, kg,
                                                                              vg, B, T, NH, NKV, HS);
    float *o = back(outg, nq), *l = back(lseg, nl), *a = back(dqg, nq), *b = back(dkg, nkv), *c = back(dvg, nkv);
    /* again: bit-identical */
    (bf16 ? keel_cuda_attention_backward_bf16 : keel_cuda_attention_backward)(dqg, dkg, dvg, doutg, outc, lsec, qg, kg,
                                                                              vg, B, T, NH, NKV, HS);
    float *a2 = back(dqg, nq), *b2 = back(dkg, nkv), *c2 = back(dvg, nkv);
    bool same = memcmp(a, a2, (size_t)nq * 4) == 0 && memcmp(b, b2, (size_t)nkv * 4) == 0 &&
                memcmp(c, c2, (size_t)nkv * 4) == 0;
    /* scales floored at 0.01: at T = 1 dq and dk are 0 up to rounding noise */
    double mo, mq, mk, mv;
    double eo = relmax_floor(o, out, nq, 0.01, &mo), el = relmax(l, lse, nl), eq = relmax_floor(a, dq, nq, 0.01, &mq),
           ek = relmax_floor(b, dk, nkv, 0.01, &mk), ev = relmax_floor(c, dv, nkv, 0.01, &mv);
    double mean = fmax(fmax(mo, mq), fmax(mk, mv));
    double to = bf16 ? 1e-2 : 2e-5, tl = 2e-5, tg = bf16 ? 1e-2 : 1e-4, tm = bf16 ? 2e-4 : 1e-5;
    EXPECT(eo < to && el < tl && eq < tg && ek < tg && ev < tg && mean < tm && same,
           "attention%s B=%d T=%d NH=%d NKV=%d HS=%d: out %.2g lse %.2g (tol %.0g, %.0g) dq %.2g dk %.2g dv %.2g "
           "(tol %.0g), mean %.2g (tol %.0g), backward repeatable %s",
           bf16 ? " bf16" : "", B, T, NH, NKV, HS, eo, el, to, tl, eq, ek, ev, tg, mean, tm, same ? "yes" : "NO");
    float *all[] = {q, k, v, dout, out, lse, dq, dk, dv, nan, o, l, a, b, c, a2, b2, c2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    float *g[] = {qg, kg, vg, doutg, outg, lseg, dqg, dkg, dvg, outc, lsec};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) keel_cuda_free(g[i]);
}

/* ---- attention on the tensor cores ------------------------------------------------------ */

typedef void (*attention_fwd)(float *, float *, const float *, const float *, const float *, int, int, int, int,
                              int);
typedef void (*attention_bwd)(float *, float *, float *, const float *, const float *, const float *,
                              const float *, const float *, const float *, int, int, int, int, int);

/* One implementation's results on the host: forward from q, k, v; backward
 * from the CPU's out and lse (so that its errors are its own) into NaNs,
 * twice (repeatable: the second bit-identical to the first). */
typedef struct {
    float *out, *lse, *dq, *dk, *dv;
    bool repeatable;
} attention_run;

typedef struct {
    const float *q, *k, *v, *dout, *out, *lse; /* device; out and lse the CPU's */
    int B, T, NH, NKV, HS;
    int64_t nq, nkv, nl;
} attention_case;

static attention_run attention_on_device(const attention_case *c, attention_fwd fwd, attention_bwd bwd) {
    float *outg = dev(NULL, c->nq), *lseg = dev(NULL, c->nl);
    float *nan = malloc((size_t)c->nq * 4);
    memset(nan, 0xff, (size_t)c->nq * 4);
    float *dqg = dev(nan, c->nq), *dkg = dev(nan, c->nkv), *dvg = dev(nan, c->nkv);
    fwd(outg, lseg, c->q, c->k, c->v, c->B, c->T, c->NH, c->NKV, c->HS);
    bwd(dqg, dkg, dvg, c->dout, c->out, c->lse, c->q, c->k, c->v, c->B, c->T, c->NH, c->NKV, c->HS);
    attention_run r = {back(outg, c->nq), back(lseg, c->nl), back(dqg, c->nq), back(dkg, c->nkv),
                       back(dvg, c->nkv), false};
    bwd(dqg, dkg, dvg, c->dout, c->out, c->lse, c->q, c->k, c->v, c->B, c->T, c->NH, c->NKV, c->HS);
    float *a2 = back(dqg, c->nq), *b2 = back(dkg, c->nkv), *c2 = back(dvg, c->nkv);
    r.repeatable = memcmp(r.dq, a2, (size_t)c->nq * 4) == 0 && memcmp(r.dk, b2, (size_t)c->nkv * 4) == 0 &&
                   memcmp(r.dv, c2, (size_t)c->nkv * 4) == 0;
    free(nan), free(a2), free(b2), free(c2);
    keel_cuda_free(outg), keel_cuda_free(lseg), keel_cuda_free(dqg), keel_cuda_free(dkg), keel_cuda_free(dvg);
    return r;
}

static void attention_run_free(attention_run *r) { free(r->out), free(r->lse), free(r->dq), free(r->dk), free(r->dv); }

/* a bit for bit b (NaNs included: a kernel must leave none) */
static bool attention_same(const attention_run *a, const attention_run *b, const attention_case *c) {
    return memcmp(a->out, b->out, (size_t)c->nq * 4) == 0 && memcmp(a->lse, b->lse, (size_t)c->nl * 4) == 0 &&
           memcmp(a->dq, b->dq, (size_t)c->nq * 4) == 0 && memcmp(a->dk, b->dk, (size_t)c->nkv * 4) == 0 &&
           memcmp(a->dv, b->dv, (size_t)c->nkv * 4) == 0;
}

/* a against b (the reference) with test_attention's bf16 measures and bounds; what failed, in why */
static bool attention_close(const attention_run *a, const float *out, const float *lse, const float *dq,
                            const float *dk, const float *dv, const attention_case *c, char *why, size_t n) {
    double mo, mq, mk, mv;
    double eo = relmax_floor(a->out, out, c->nq, 0.01, &mo), el = relmax(a->lse, lse, c->nl),
           eq = relmax_floor(a->dq, dq, c->nq, 0.01, &mq), ek = relmax_floor(a->dk, dk, c->nkv, 0.01, &mk),
           ev = relmax_floor(a->dv, dv, c->nkv, 0.01, &mv);
    double mean = fmax(fmax(mo, mq), fmax(mk, mv));
    const double to = 1e-2, tl = 2e-5, tg = 1e-2, tm = 2e-4;
    snprintf(why, n, "out %.2g lse %.2g (tol %.0g, %.0g) dq %.2g dk %.2g dv %.2g (tol %.0g), mean %.2g (tol %.0g)",
             eo, el, to, tl, eq, ek, ev, tg, mean, tm);
    return eo < to && el < tl && eq < tg && ek < tg && ev < tg && mean < tm;
}

/* q, k, v, dout as test_attention's, the CPU's bf16 forward and backward,
 * and the device copies (with the CPU's out and lse) in *c */
typedef struct {
    float *q, *k, *v, *dout, *out, *lse, *dq, *dk, *dv;
} attention_host;

static attention_host attention_setup(attention_case *c, int B, int T, int NH, int NKV, int HS) {
    unsigned seed = 43 + (unsigned)(T * 3 + HS + NKV);
    *c = (attention_case){.B = B, .T = T, .NH = NH, .NKV = NKV, .HS = HS, .nq = (int64_t)B * T * NH * HS,
                          .nkv = (int64_t)B * T * NKV * HS, .nl = (int64_t)B * NH * T};
    attention_host h;
    h.q = rnd(c->nq, &seed, 1), h.k = rnd(c->nkv, &seed, 1), h.v = rnd(c->nkv, &seed, 1);
    h.dout = rnd(c->nq, &seed, 1);
    h.out = malloc((size_t)c->nq * 4), h.lse = malloc((size_t)c->nl * 4);
    h.dq = malloc((size_t)c->nq * 4), h.dk = malloc((size_t)c->nkv * 4), h.dv = malloc((size_t)c->nkv * 4);
    keel_attention_forward_bf16(h.out, h.lse, h.q, h.k, h.v, NULL, B, T, NH, NKV, HS);
    keel_attention_backward_bf16(h.dq, h.dk, h.dv, h.dout, h.out, h.lse, h.q, h.k, h.v, NULL, B, T, NH, NKV, HS);
    c->q = dev(h.q, c->nq), c->k = dev(h.k, c->nkv), c->v = dev(h.v, c->nkv), c->dout = dev(h.dout, c->nq);
    c->out = dev(h.out, c->nq), c->lse = dev(h.lse, c->nl);
    return h;
}

static void attention_teardown(attention_case *c, attention_host *h) {
    float *all[] = {h->q, h->k, h->v, h->dout, h->out, h->lse, h->dq, h->dk, h->dv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    const float *g[] = {c->q, c->k, c->v, c->dout, c->out, c->lse};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) keel_cuda_free((void *)g[i]);
}

static void test_attention_tc(int B, int T, int NH, int NKV, int HS) {
    attention_case c;
    attention_host h = attention_setup(&c, B, T, NH, NKV, HS);
    attention_run tc = attention_on_device(&c, keel_cuda_attention_forward_bf16_tc,
                                           keel_cuda_attention_backward_bf16_tc);
    attention_run simt = attention_on_device(&c, keel_cuda_attention_forward_bf16_simt,
                                             keel_cuda_attention_backward_bf16_simt);
    char cpu[256], other[256];
    bool ok_cpu = attention_close(&tc, h.out, h.lse, h.dq, h.dk, h.dv, &c, cpu, sizeof cpu);
    bool ok_simt = attention_close(&tc, simt.out, simt.lse, simt.dq, simt.dk, simt.dv, &c, other, sizeof other);
    EXPECT(ok_cpu && tc.repeatable, "attention tensor cores B=%d T=%d NH=%d NKV=%d HS=%d against the CPU: %s, "
           "backward repeatable %s", B, T, NH, NKV, HS, cpu, tc.repeatable ? "yes" : "NO");
    EXPECT(ok_simt, "attention tensor cores B=%d T=%d NH=%d NKV=%d HS=%d against the CUDA cores: %s", B, T, NH, NKV,
           HS, other);
    attention_run_free(&tc), attention_run_free(&simt);
    attention_teardown(&c, &h);
}

/* KEEL_CUDA_ATTENTION=simt makes keel_cuda_attention_*_bf16 the _simt
 * kernels, unset the _tc ones, bit for bit (both are deterministic); the two
 * differ somewhere, or the comparison could not tell them apart. The
 * variable is put back as it was. */
static void test_attention_path(void) {
    attention_case c;
    attention_host h = attention_setup(&c, 2, 100, 4, 2, 64);
    const char *was = getenv("KEEL_CUDA_ATTENTION");
    char *saved = was ? strdup(was) : NULL;
    attention_run tc = attention_on_device(&c, keel_cuda_attention_forward_bf16_tc,
                                           keel_cuda_attention_backward_bf16_tc);
    attention_run simt = attention_on_device(&c, keel_cuda_attention_forward_bf16_simt,
                                             keel_cuda_attention_backward_bf16_simt);
    setenv("KEEL_CUDA_ATTENTION", "simt", 1);
    keel_cuda_attention_reread_env();
    attention_run as_simt =
        attention_on_device(&c, keel_cuda_attention_forward_bf16, keel_cuda_attention_backward_bf16);
    unsetenv("KEEL_CUDA_ATTENTION");
    keel_cuda_attention_reread_env();
    attention_run as_tc =
        attention_on_device(&c, keel_cuda_attention_forward_bf16, keel_cuda_attention_backward_bf16);
    if (saved) setenv("KEEL_CUDA_ATTENTION", saved, 1);
    keel_cuda_attention_reread_env();
    free(saved);
    bool s = attention_same(&as_simt, &simt, &c), t = attention_same(&as_tc, &tc, &c);
    bool d = !attention_same(&tc, &simt, &c);
    EXPECT(s && t && d,
           "KEEL_CUDA_ATTENTION=simt: the CUDA-core kernels bit for bit %s; unset: the tensor-core ones %s "
           "(and the two differ: %s)",
           s ? "yes" : "NO", t ? "yes" : "NO", d ? "yes" : "NO");
    attention_run_free(&tc), attention_run_free(&simt), attention_run_free(&as_simt), attention_run_free(&as_tc);
    attention_teardown(&c, &h);
}

int main(void) {
    const char *shapes = getenv("KEEL_GPU_PARITY_SHAPES");
    const bool all = !shapes || strcmp(shapes, "small") != 0;
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
    keel_kernels_init(0); /* the CPU references below run on keel's pool and BLAS */
    test_bf16_convert(1000003);
    test_embedding(1, 1, 1);
    test_embedding(300, 288, 17);
    test_embedding(4096, 4096, 1000);
    test_sums(1);
    test_sums(3000017);
    test_scale_masked(1);
    test_scale_masked(100003);
    test_accumulate(1);
    test_accumulate(1000003); /* every bf16 pattern 15 times, over random dst */
    test_matmul(1, 1, 1);
    test_matmul(7, 13, 5);
    test_matmul(64, 96, 128);
    test_matmul(300, 257, 129);
    if (all) test_matmul(512, 4096, 1024);
    test_gemm_bf16(1, 1, 1);
    test_gemm_bf16(7, 13, 5);
    test_gemm_bf16(64, 96, 128);
    test_gemm_bf16(300, 257, 129);
    if (all) test_gemm_bf16(512, 2048, 1024);
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        test_attention(2, 77, 8, 2, 64, bf16);   /* GQA, T not a multiple of a tile */
        test_attention(2, 77, 8, 2, 128, bf16);  /* Llama 2's head size */
        test_attention(2, 200, 4, 4, 128, bf16); /* several tiles each way */
        test_attention(2, 64, 6, 6, 48, bf16);   /* the tiny config's heads (48: padded to 64), T one tile */
        test_attention(1, 33, 4, 1, 16, bf16);   /* HS <= 32, one kv head for four */
        test_attention(1, 1, 2, 1, 64, bf16);    /* T = 1 */
        if (all) test_attention(1, 1024, 4, 2, 128, bf16);
    }
    if (all) test_attention(1, 4096, 2, 1, 128, false); /* the longest T */
    const int tc_T[] = {1, 17, 64, 65, 200, 1000}, tc_heads[][2] = {{4, 4}, {8, 2}};
    for (int HS = 64; HS <= 128; HS *= 2)
        for (size_t i = 0; i < sizeof tc_T / sizeof tc_T[0] - !all; i++)
            for (int j = 0; j < 2; j++) test_attention_tc(2, tc_T[i], tc_heads[j][0], tc_heads[j][1], HS);
    test_attention_path();
    keel_kernels_shutdown();
    return test_summary("gpu_parity");
}
