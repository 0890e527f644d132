/* Run-time instruction-set dispatch at the level KEEL_MAX_ISA names (ctest
 * registers this test once per level, and once uncapped):
 * - keel_isa_cpu() agrees with the kernel's view in /proc/cpuinfo;
 * - the kernels' level is exactly the cap (or the CPU's level uncapped), and
 *   a level above the CPU's is reported as a SKIP (exit 77) with the reason:
 *   that path cannot run here, and passing would say it was tested;
 * - oneDNN is capped too (its effective ISA has nothing above the level);
 * - the bf16 GEMMs run natively exactly from avx512_bf16 up, emulated below;
 * - the peak kernel of the level runs (AMX tiles, VDPBF16PS, AVX-512 or AVX2
 *   FMA) and reads at least what the GEMM library reaches on the same
 *   threads: a yardstick below the library (the old 64-byte-vector kernel on
 *   AVX2 read 12.7 GF/s against OpenBLAS's 85) would make MFU exceed 1.
 * The kernels' results on each path are test_gemm_bf16's and
 * test_attention_bf16's (also registered capped at avx2). */
#include <dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/kernels.h"

#include "../testlib.h"

#define SKIP 77

/* The level the kernel's /proc/cpuinfo flags describe. */
static keel_isa cpuinfo_level(void) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    static char line[1 << 14];
    char flags[1 << 14] = "";
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "flags", 5)) {
            snprintf(flags, sizeof flags, " %s ", strchr(line, ':') + 1);
            break;
        }
    if (f) fclose(f);
    flags[strcspn(flags, "\n")] = ' ';
#define HAS(x) (strstr(flags, " " x " ") != NULL)
    bool avx512 = HAS("avx512f") && HAS("avx512dq") && HAS("avx512bw") && HAS("avx512vl");
    if (!avx512) return KEEL_ISA_AVX2;
    if (!HAS("avx512_bf16")) return KEEL_ISA_AVX512;
    return HAS("amx_tile") && HAS("amx_bf16") ? KEEL_ISA_AMX : KEEL_ISA_AVX512_BF16;
#undef HAS
}

static void test_names(void) {
    bool ok = true;
    for (keel_isa l = KEEL_ISA_AVX2; l <= KEEL_ISA_AMX; l++) {
        keel_isa back;
        ok &= keel_isa_parse(keel_isa_name(l), &back) && back == l;
    }
    keel_isa x;
    EXPECT(ok && keel_isa_parse("AVX512_BF16", &x) && x == KEEL_ISA_AVX512_BF16 &&
               !keel_isa_parse("avx512bf16", &x) && !keel_isa_parse("sse4", &x) &&
               !keel_isa_parse("", &x),
           "level names round-trip, case-insensitive; unknown names are refused");
}

/* Nothing in oneDNN's effective ISA above the level. */
static void test_onednn_capped(keel_isa level) {
    dnnl_cpu_isa_t got = dnnl_get_effective_cpu_isa();
    bool above = false;
    if (level < KEEL_ISA_AVX512)
        above |= (got & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
    if (level < KEEL_ISA_AVX512_BF16)
        above |= (got & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
    if (level < KEEL_ISA_AMX)
        above |= (got & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx;
    EXPECT(!above, "oneDNN's effective ISA 0x%x stays within %s", (unsigned)got, keel_isa_name(level));
}

static void test_peak(bool bf16) {
    double kernel = keel_peak_kernel_flops(bf16), library = keel_peak_library_flops(bf16);
    const char *path;
    bool native = keel_bf16_native(&path);
    EXPECT(kernel > 1e9 && library > 1e8,
           "%s peak kernel %.1f GF/s, library GEMMs %.1f GF/s (%d threads)", bf16 ? "bf16" : "fp32",
           kernel / 1e9, library / 1e9, keel_pool_threads());
    /* the hardware's peak for the instruction set, above what the library
     * reaches on it; 0.7: one core's best against two busy ones, measured
     * in turn on a shared machine */
    EXPECT(kernel >= 0.7 * library, "%s yardstick kernel %.1f GF/s >= 0.7 x %s %.1f GF/s",
           bf16 ? "bf16" : "fp32", kernel / 1e9, bf16 && native ? "oneDNN" : "OpenBLAS",
           library / 1e9);
}

int main(void) {
    keel_kernels_init(2);
    keel_isa cpu = keel_isa_cpu(), want = cpu;
    const char *cap = getenv("KEEL_MAX_ISA");
    if (cap && *cap && !keel_isa_parse(cap, &want)) {
        printf("FAIL KEEL_MAX_ISA=%s is not a level\n", cap);
        return 1;
    }
    EXPECT(cpu == cpuinfo_level(), "CPU level %s (CPUID + XCR0) agrees with /proc/cpuinfo (%s)",
           keel_isa_name(cpu), keel_isa_name(cpuinfo_level()));
    test_names();
    if (want > cpu) {
        printf("SKIP: KEEL_MAX_ISA=%s needs %s instructions; this CPU offers %s, so that path "
               "cannot run here\n", cap, keel_isa_name(want), keel_isa_name(cpu));
        keel_kernels_shutdown();
        return failures ? 1 : SKIP;
    }
    keel_isa active = keel_isa_active();
    /* AMX also needs the kernel's permission; without it keel says so and steps down */
    EXPECT(active == want || (want == KEEL_ISA_AMX && active == KEEL_ISA_AVX512_BF16),
           "kernels run at %s (want %s)", keel_isa_name(active), keel_isa_name(want));
    test_onednn_capped(active);
    const char *path;
    bool native = keel_bf16_native(&path);
    EXPECT(native == (active >= KEEL_ISA_AVX512_BF16), "bf16 GEMMs at %s: %s",
           keel_isa_name(active), path);
    test_peak(false);
    test_peak(true);
    keel_kernels_shutdown();
    return test_summary("test_isa_dispatch");
}
