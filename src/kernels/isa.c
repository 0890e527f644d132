/* kernels/isa.c: which x86 instruction sets keel's kernels may use — what the
 * CPU and its OS offer, capped by KEEL_MAX_ISA — and the same cap handed to
 * oneDNN, so that one machine can run every path below its own.
 *
 * keel is compiled for x86-64-v3 (AVX2 + FMA, docs/cpus.md); everything wider
 * lives in functions compiled with __attribute__((target(...))) and is only
 * called when keel_isa_active() says so. The build and CI machines change
 * from day to day (AVX2 only; AVX-512 + AVX512_BF16; + AMX), so each path
 * must be chosen here at run time, never by the compiler's -march. */
#include <cblas.h>
#include <cpuid.h>
#include <dnnl.h>
#include <pthread.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "keel/kernels.h"

#define LEVELS (KEEL_ISA_AMX + 1)
static const char *const NAMES[LEVELS] = {"avx2", "avx512", "avx512_bf16", "amx"};

static struct {
    pthread_once_t once;
    keel_isa cpu, active;
    bool capped; /* KEEL_MAX_ISA is below what the CPU offers */
} isa = {.once = PTHREAD_ONCE_INIT};

const char *keel_isa_name(keel_isa level) {
    return level >= KEEL_ISA_AVX2 && level <= KEEL_ISA_AMX ? NAMES[level] : "unknown";
}

bool keel_isa_parse(const char *name, keel_isa *out) {
    for (int i = 0; i < LEVELS; i++)
        if (!strcasecmp(name, NAMES[i])) {
            *out = (keel_isa)i;
            return true;
        }
    return false;
}

/* The OS saves a register file only if XCR0 says so; a CPU flag alone is not
 * enough (a hypervisor or kernel may leave AVX-512 or AMX state off). */
static uint64_t xcr0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t)hi << 32 | lo;
}

/* The highest level the CPU and OS support, from CPUID and XCR0 directly (so
 * that AMX, which GCC 12's __builtin_cpu_supports does not know, is judged
 * like the rest). Dies with a clear message below AVX2 + FMA: keel is
 * compiled for x86-64-v3 and would fault on its first vector instruction. */
static keel_isa detect(void) {
    unsigned a, b, c, d;
    bool avx2 = false, fma = false, avx512 = false, bf16 = false, amx = false;
    if (__get_cpuid(1, &a, &b, &c, &d) && (c & bit_OSXSAVE) && __get_cpuid_max(0, NULL) >= 7) {
        uint64_t xcr = xcr0();
        bool ymm = (xcr & 0x6) == 0x6;          /* SSE + AVX state */
        bool zmm = (xcr & 0xe6) == 0xe6;        /* + opmask, upper ZMM0-15, ZMM16-31 */
        bool tiles = (xcr & 0x60000) == 0x60000; /* XTILECFG + XTILEDATA */
        fma = ymm && (c & bit_FMA);
        __cpuid_count(7, 0, a, b, c, d);
        avx2 = ymm && (b & bit_AVX2);
        avx512 = zmm && (b & bit_AVX512F) && (b & bit_AVX512DQ) && (b & bit_AVX512BW) &&
                 (b & bit_AVX512VL);
        amx = tiles && (d & bit_AMX_TILE) && (d & bit_AMX_BF16);
        if (a >= 1) { /* subleaf 1 exists */
            __cpuid_count(7, 1, a, b, c, d);
            bf16 = a & bit_AVX512BF16;
        }
    }
    if (!avx2 || !fma) { /* not a bug in keel, and nothing to recover: say why, then stop */
        keel_errorf("this CPU lacks AVX2 or FMA, which this build of keel needs (x86-64-v3; "
                    "docs/cpus.md)");
        abort();
    }
    if (!avx512) return KEEL_ISA_AVX2;
    if (!bf16) return KEEL_ISA_AVX512;
    return amx ? KEEL_ISA_AMX : KEEL_ISA_AVX512_BF16;
}

/* Linux hands out the AMX tile registers only on request (arch_prctl
 * ARCH_REQ_XCOMP_PERM for XTILEDATA, kernel >= 5.16); before that a tile
 * instruction faults. oneDNN asks for itself; keel's own AMX code (the peak
 * kernel) needs it too. */
static bool amx_permitted(void) {
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

/* oneDNN reads its own cap once, when it first dispatches: set it before
 * keel's first oneDNN call (everything oneDNN goes through keel_isa_active). */
static void cap_onednn(keel_isa level) {
    static const dnnl_cpu_isa_t map[LEVELS] = {dnnl_cpu_isa_avx2, dnnl_cpu_isa_avx512_core,
                                               dnnl_cpu_isa_avx512_core_bf16,
                                               dnnl_cpu_isa_avx512_core_amx};
    if (dnnl_set_max_cpu_isa(map[level]) != dnnl_success)
        keel_log_warn("KEEL_MAX_ISA=%s: oneDNN did not take the cap (it was already in use, or "
                      "built without DNNL_ENABLE_MAX_CPU_ISA)", NAMES[level]);
}

/* OpenBLAS picks its kernels when it is loaded, before main, from
 * OPENBLAS_CORETYPE or the CPU; it cannot be capped from here. Say so when it
 * runs AVX-512 kernels under a lower cap (shared/notes/cpu.md: never force
 * the core type otherwise, Haswell costs 40% on AVX-512 machines). */
static void check_openblas(keel_isa level) {
    const char *core = openblas_get_corename();
    static const char *const avx512_cores[] = {"skylakex", "cooperlake", "sapphirerapids"};
    for (size_t i = 0; i < sizeof avx512_cores / sizeof *avx512_cores; i++)
        if (core && level < KEEL_ISA_AVX512 && !strcasecmp(core, avx512_cores[i]))
            keel_log_warn("KEEL_MAX_ISA=%s, but OpenBLAS runs its %s (AVX-512) kernels: set "
                          "OPENBLAS_CORETYPE=Haswell as well to keep the fp32 GEMMs on AVX2",
                          NAMES[level], core);
}

static void init(void) {
    isa.cpu = isa.active = detect();
    const char *env = getenv("KEEL_MAX_ISA");
    keel_isa cap;
    if (env && *env) {
        if (!keel_isa_parse(env, &cap))
            keel_log_warn("KEEL_MAX_ISA=%s is not one of avx2, avx512, avx512_bf16, amx: ignored",
                          env);
        else if (cap < isa.cpu)
            isa.active = cap, isa.capped = true;
    }
    if (isa.active == KEEL_ISA_AMX && !amx_permitted()) {
        keel_log_warn("the kernel refused AMX tile state (arch_prctl XTILEDATA; Linux >= 5.16 "
                      "needed): using avx512_bf16");
        isa.active = KEEL_ISA_AVX512_BF16, isa.capped = true;
    }
    if (isa.capped) {
        cap_onednn(isa.active);
        check_openblas(isa.active);
    }
}

keel_isa keel_isa_cpu(void) {
    pthread_once(&isa.once, init);
    return isa.cpu;
}

keel_isa keel_isa_active(void) {
    pthread_once(&isa.once, init);
    return isa.active;
}
