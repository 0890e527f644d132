/* bf16 GEMM against a double-precision product of the same bf16-rounded
 * inputs, every layout (a_t, b_t) and accumulate, ragged shapes, 1 and 2
 * threads; and the fp32 <-> bf16 rounding rules. The path is the machine's
 * (oneDNN where the CPU has bf16 instructions, else the emulation); ctest
 * also runs it as test_gemm_bf16_avx2 (KEEL_MAX_ISA=avx2), so the emulation
 * is checked on every machine. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/kernels.h"

#include "../testlib.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static float bits_to_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void test_rounding(void) {
    struct { uint32_t in; keel_bf16 want; const char *what; } cases[] = {
        {0x3f800000u, 0x3f80, "1.0 exact"},
        {0x3f808000u, 0x3f80, "tie rounds to even (down)"},
        {0x3f818000u, 0x3f82, "tie rounds to even (up)"},
        {0x3f808001u, 0x3f81, "above the tie rounds up"},
        {0xbf807fffu, 0xbf80, "negative below the tie rounds down"},
        {0x7f7fffffu, 0x7f80, "largest float rounds to +inf"},
        {0x7f800000u, 0x7f80, "+inf stays +inf"},
        {0x00000001u, 0x0000, "smallest subnormal rounds to zero"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        keel_bf16 got = keel_bf16_from_float(bits_to_float(cases[i].in));
        EXPECT(got == cases[i].want, "to bf16: %-36s 0x%08x -> 0x%04x (want 0x%04x)", cases[i].what,
               cases[i].in, got, cases[i].want);
    }
    float nan = bits_to_float(0x7f800001u); /* a NaN whose payload would round away */
    EXPECT(isnan(keel_bf16_to_float(keel_bf16_from_float(nan))), "NaN stays NaN");
    float x[100], back[100];
    keel_bf16 h[100];
    for (int i = 0; i < 100; i++) x[i] = frand() * 1e3f;
    keel_f32_to_bf16(h, x, 100);
    keel_bf16_to_f32(back, h, 100);
    bool ok = true;
    for (int i = 0; i < 100; i++) ok &= fabsf(back[i] - x[i]) <= fabsf(x[i]) * (1.0f / 256) &&
                                      h[i] == keel_bf16_from_float(x[i]);
    EXPECT(ok, "vector conversion == scalar, relative error <= 2^-8");
}

/* a (M,K) or stored (K,M); b (K,N) or stored (N,K); all bf16-rounded. */
static void test_gemm(int M, int N, int K, bool a_t, bool b_t, bool accumulate) {
    int64_t na = (int64_t)M * K, nb = (int64_t)K * N, nc = (int64_t)M * N;
    keel_bf16 *a = malloc(2 * (size_t)na), *b = malloc(2 * (size_t)nb);
    float *out = malloc(4 * (size_t)nc), *init = malloc(4 * (size_t)nc);
    for (int64_t i = 0; i < na; i++) a[i] = keel_bf16_from_float(frand());
    for (int64_t i = 0; i < nb; i++) b[i] = keel_bf16_from_float(frand());
    for (int64_t i = 0; i < nc; i++) out[i] = init[i] = frand();
    keel_gemm_bf16(out, a, a_t, b, b_t, M, N, K, accumulate);
    double worst = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double want = accumulate ? init[(int64_t)i * N + j] : 0, mag = fabs(want);
            for (int k = 0; k < K; k++) {
                double x = keel_bf16_to_float(a_t ? a[(int64_t)k * M + i] : a[(int64_t)i * K + k]);
                double y = keel_bf16_to_float(b_t ? b[(int64_t)j * K + k] : b[(int64_t)k * N + j]);
                want += x * y;
                mag += fabs(x * y);
            }
            double err = fabs(out[(int64_t)i * N + j] - want) / (mag + 1e-30);
            worst = testlib_worst(worst, err);
        }
    /* fp32 accumulation of exact bf16 products: error ~ K x 2^-24 of the magnitudes */
    EXPECT(worst <= 1e-5, "gemm bf16 M=%d N=%d K=%d a_t=%d b_t=%d acc=%d threads=%d: err/sum|ab| %.1e",
           M, N, K, a_t, b_t, accumulate, keel_pool_threads(), worst);
    free(a); free(b); free(out); free(init);
}

int main(void) {
    keel_kernels_init(1);
    const char *path;
    bool native = keel_bf16_native(&path);
    /* which path ran is test_isa_dispatch's; this says which one is checked here */
    EXPECT(native == (keel_isa_active() >= KEEL_ISA_AVX512_BF16), "bf16 GEMMs at %s: %s",
           keel_isa_name(keel_isa_active()), path);
    keel_kernels_shutdown();
    test_rounding();
    for (int threads = 1; threads <= 2; threads++) {
        keel_kernels_init(threads);
        for (int layout = 0; layout < 4; layout++)
            for (int acc = 0; acc < 2; acc++) test_gemm(37, 200, 45, layout & 1, layout & 2, acc);
        test_gemm(64, 1000, 288, false, true, false); /* a forward-like shape, split over threads */
        test_gemm(288, 130, 64, true, false, true);   /* a weight-gradient-like shape */
        /* past the emulation's tiles (256 rows, 256 deep, 1024 columns a chunk) in every layout */
        for (int layout = 0; layout < 4; layout++) test_gemm(260, 2100, 270, layout & 1, layout & 2, true);
        keel_kernels_shutdown();
    }
    return test_summary("test_gemm_bf16");
}
